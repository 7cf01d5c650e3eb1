"""A file's sha256, computed beside the parse: in a forked child for a large file, else on a thread.

Hashing a 434 MB library takes as long as reading its tables, so it runs on the second core. A
forked child (rather than a thread) keeps this process single-threaded, which lets
audit.elf.prescan fork too; `prefetch` starts it before the policy is even loaded, as soon as a
command knows which files it will read. The child hashes the file a chunk at a time from a map
and lets each chunk's pages go, so it never holds the whole file. Anything unusual (no fork,
threads running, a child that fails) falls back to hashing on a thread, with the same result.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import threading

from audit import forking
from audit.elf.parse import release

MIN_FORK_BYTES = 64 << 20  # smaller files hash on a thread: a fork would cost more than it saves
_CHUNK = 1 << 22
_prefetched: dict[tuple, "_Child"] = {}


def hash_file(path: str) -> str | None:
    """The sha256 (hex) of the file at `path`; None if it cannot be read. Hashed from a map of
    the file (no copy into a buffer: a tenth less CPU), each chunk's pages let go once hashed
    (parse.release), so the resident set stays a chunk; a file that cannot be mapped is read."""
    try:
        with open(path, "rb", buffering=0) as fh:
            h = hashlib.sha256()
            try:
                mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError):  # empty, or not mappable: plain reads
                buf = bytearray(_CHUNK)
                view = memoryview(buf)
                while n := fh.readinto(buf):
                    h.update(view[:n])
                return h.hexdigest()
        with mm, memoryview(mm) as view:
            for pos in range(0, len(mm), _CHUNK):
                h.update(view[pos:pos + _CHUNK])
                release(mm, pos, pos + _CHUNK)
        return h.hexdigest()
    except OSError:
        return None


def _key(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class _Child:
    def __init__(self, pid: int, fd: int):
        self.pid, self.fd = pid, fd

    def result(self) -> str | None:
        try:
            with os.fdopen(self.fd, "rb") as fh:
                text = fh.read().decode("ascii", "replace")
            _, status = os.waitpid(self.pid, 0)
        except OSError:
            return None
        ok = os.waitstatus_to_exitcode(status) == 0 and len(text) == 64
        return text if ok else None


def _fork(path: str) -> _Child | None:
    if not hasattr(os, "fork") or threading.active_count() > 1:
        return None
    r, w = os.pipe()
    try:
        pid = forking.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return None
    if pid == 0:  # the child: hash, send, exit without running any of the parent's cleanup
        code = 1
        try:
            forking.release()  # a Ctrl-C since the fork lands here, in this try
            os.close(r)
            digest = hash_file(path)
            if digest:
                os.write(w, digest.encode("ascii"))
                code = 0
        except BaseException:  # noqa: BLE001  (the parent hashes it itself)
            pass
        os._exit(code)
    os.close(w)
    return _Child(pid, r)


def prefetch(path: str) -> None:
    """Start hashing a large ELF file now, to be collected by the next `Hasher(path)` in this
    process (a command that reads one file: forked workers must not inherit a pending child)."""
    key = _key(path)
    try:
        with open(path, "rb") as fh:
            if fh.read(4) != b"\x7fELF":
                return
    except OSError:
        return
    if key is not None and key not in _prefetched and key[3] >= MIN_FORK_BYTES:
        child = _fork(path)
        if child is not None:
            _prefetched[key] = child


class Hasher:
    """Hashes `path` beside the caller's work: `start()`, then `result()`."""

    def __init__(self, path: str):
        self.path = path
        self._child: _Child | None = None
        self._thread: threading.Thread | None = None
        self._digest: str | None = None

    def start(self) -> None:
        key = _key(self.path)
        self._child = _prefetched.pop(key, None) if key is not None else None
        if self._child is None and key is not None and key[3] >= MIN_FORK_BYTES:
            self._child = _fork(self.path)
        if self._child is None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        self._digest = hash_file(self.path)

    def result(self) -> str | None:
        if self._child is not None:
            child, self._child = self._child, None
            self._digest = child.result() or hash_file(self.path)
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        return self._digest
