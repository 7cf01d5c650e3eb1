"""A large symbol table selected in a forked child while this process reads everything else.

The pattern scan over a big `.symtab` (libtorch_cpu.so: 530k entries, a 76 MB string table) is
regex work that holds the GIL, so a thread cannot share it; a forked child can, on the second
core. The child runs exactly the in-process code (audit.elf.symbols.select and names_text) on the
same mapped file and sends back the selected indices, name ends and warnings, and the names
through a shared anonymous map (raw, decoded on each side);
the parent builds the symbols as usual. Meanwhile the parent selects the other tables and hands
their selections over (`give`: index arrays through a shared anonymous map, so no pipe fills
up while both sides write); then the child runs the caller's `then` (the reader's
forwarding-stub decoding, which needs every table's selection) and sends its answer as a second
message. Anything unusual (no fork, another thread
already running, a child that fails or dies) leaves the work to be done in process: the result
is the same either way, only slower. So does a machine with no CPU free for the child
(audit.elf.idle): there the child would only add its own cost to the same CPU time.
"""

from __future__ import annotations

import mmap
import os
import pickle
import struct
import threading
from collections.abc import Callable

import numpy as np

from audit import forking
from audit.elf import idle
from audit.elf.parse import decode
from audit.elf.symbols import SymbolTable, names_raw, select, split_names

MIN_ENTRIES = 200_000  # below this, forking costs more than it saves
_LEN = struct.Struct("<Q")
_FAILED = object()


class Prescan:
    def __init__(self, pid: int, fd: int, index: int, given_fd: int, shared: mmap.mmap, back: mmap.mmap):
        self.pid, self.index = pid, index
        self._fh = os.fdopen(fd, "rb")
        self._given_fd: int | None = given_fd
        self._shared = shared
        self._back = back
        self._answers: list = []  # what the child has sent, in order
        self._reaped = False

    def _message(self, n: int):
        """The child's n-th message (0, 1), or _FAILED if it never came."""
        while len(self._answers) <= n and self._fh is not None:
            try:
                head = self._fh.read(_LEN.size)
                size = _LEN.unpack(head)[0] if len(head) == _LEN.size else -1
                data = self._fh.read(size) if size > 0 else b""
                # a message cut short (the child died while writing) is no answer
                self._answers.append(pickle.loads(data) if size > 0 and len(data) == size else _FAILED)
            except (OSError, pickle.UnpicklingError, ValueError, EOFError, struct.error):
                self._answers.append(_FAILED)
            if self._answers[-1] is _FAILED:
                self._finish()
        return self._answers[n] if len(self._answers) > n else _FAILED

    def give(self, selections: dict) -> None:
        """Hand the child the other tables' selections ({index: (idx, ends, names, warnings)}):
        their index arrays and names (NUL-joined, UTF-8) through the shared map, so the child
        does not read them again, the rest through a pipe (a few bytes)."""
        if self._given_fd is None:
            return
        head, at = [], 0
        try:
            for index, (idx, ends, names, warnings) in selections.items():
                n = len(idx)
                if at + 16 * n > len(self._shared):
                    return  # more than start() was told: the child is left without (it stops)
                self._shared[at:at + 8 * n] = np.asarray(idx, dtype=np.int64).tobytes()
                self._shared[at + 8 * n:at + 16 * n] = np.asarray(ends, dtype=np.int64).tobytes()
                at += 16 * n
                text = "\0".join(names).encode("utf-8") if n else b""
                if at + len(text) <= len(self._shared):
                    self._shared[at:at + len(text)] = text
                    head.append((index, n, len(text), warnings))
                    at += -(-len(text) // 8) * 8  # the next table's arrays start 8-byte aligned
                else:  # no room: the child reads the names itself
                    head.append((index, n, -1, warnings))
            data = memoryview(pickle.dumps(head, protocol=pickle.HIGHEST_PROTOCOL))
            while data:
                data = data[os.write(self._given_fd, data):]
        except OSError:
            pass
        finally:
            os.close(self._given_fd)
            self._given_fd = None

    def result(self):
        """(idx, ends, names, warnings) from the child, or None if it did not deliver."""
        got = self._message(0)
        if got is _FAILED:
            return None
        idx, ends, text, warnings = got
        if isinstance(text, int):  # the raw names' length in the shared map
            text = decode(self._back[:text])
        self._back.close()
        return idx, ends, split_names(text, len(idx)), warnings

    def then(self):
        """What the caller's `then` returned in the child, or None if it did not deliver."""
        if self._given_fd is not None:  # never handed over: the child must not wait for it
            os.close(self._given_fd)
            self._given_fd = None
        got = self._message(1)
        self._finish()
        return None if got is _FAILED else got

    def _finish(self) -> None:
        if self._given_fd is not None:  # never handed over: the child stops waiting
            os.close(self._given_fd)
            self._given_fd = None
        if self._fh is not None:
            fh, self._fh = self._fh, None
            try:
                fh.close()  # a child still writing gets EPIPE and exits
            except OSError:
                pass
        if not self._reaped:
            self._reaped = True
            try:
                os.waitpid(self.pid, 0)
            except OSError:
                pass

    def close(self) -> None:
        """Reap the child (the parent is done with it, or stopped on an error)."""
        self._finish()


def _send(fd: int, value) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_LEN.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def candidate(tables: list[SymbolTable], pattern) -> SymbolTable | None:
    """The table worth selecting in a child (the largest, if large enough, a fork can be taken
    now and a CPU is free for it: audit.elf.idle), or None."""
    if pattern is None or not tables or not hasattr(os, "fork") or threading.active_count() > 1:
        return None
    table = max(tables, key=len)
    return table if len(table) >= MIN_ENTRIES and idle.spare() else None


def start(img, table: SymbolTable, pattern, keep_imports: bool, then: Callable | None = None,
          rows: int = 0, text: int = 0, names_room: int | None = None) -> Prescan | None:
    """Fork a child selecting `table` (see candidate), or return None if the fork fails.
    `then((idx, ends, names, warnings), given)`, if given, runs in the child afterwards, with the
    table's selection and what the parent handed over with `Prescan.give` (the selections of the
    other tables, of `rows` entries at most in all, their string tables `text` bytes in all:
    {index: (idx, ends, names or None, warnings)}); its (picklable) result is `Prescan.then()`'s.
    `names_room`: bytes of shared map for the child's names (default: twice its string table;
    names that do not fit go through the pipe)."""
    r, w = os.pipe()
    given_r, given_w = os.pipe()
    # anonymous and shared: the parent's arrays and names, no pipe to fill (pages never written
    # cost nothing, so the names get twice their string tables' size: escapes make them longer)
    shared = mmap.mmap(-1, 16 * max(rows, 1) + 2 * text + 8)
    # and the other way, the child's names as raw bytes: no pickling, no pipe to pass them through
    back = mmap.mmap(-1, (2 * table.str_size if names_room is None else names_room) + 8)
    try:
        pid = forking.fork()
    except OSError:
        for fd in (r, w, given_r, given_w):
            os.close(fd)
        return None
    if pid == 0:  # the child: compute, send, exit without running any of the parent's cleanup
        code = 1
        try:
            forking.release()  # a Ctrl-C since the fork lands here, in this try
            os.close(r)
            os.close(given_w)
            warnings: list[str] = []
            idx, ends = select(img, table, pattern, keep_imports, warnings)
            raw = names_raw(img, table, table.syms["st_name"][idx].tolist(), ends.tolist())
            text = decode(raw)
            if len(raw) <= len(back):  # the names through the shared map, their length sent
                back[:len(raw)] = raw
                _send(w, (idx, ends, len(raw), warnings))
            else:  # no room (names overlap in the table): as one string, split after sending
                _send(w, (idx, ends, text, warnings))
            del raw
            names = split_names(text, len(idx))
            del text
            if then is not None:
                given = _given(given_r, shared)
                if given is not None:  # None: the parent stopped before handing them over
                    _send(w, then((idx, ends, names, warnings), given))
            code = 0
        except BaseException:  # noqa: BLE001  (any failure: the parent does the rest itself)
            pass
        os._exit(code)
    os.close(w)
    os.close(given_r)
    return Prescan(pid, r, table.index, given_w, shared, back)


def _given(fd: int, shared: mmap.mmap) -> dict | None:
    """What the parent handed over (see Prescan.give): {index: (idx, ends, names, warnings)},
    names None where they did not fit."""
    with os.fdopen(fd, "rb") as fh:
        data = fh.read()
    if not data:
        return None
    out, at = {}, 0
    for index, n, size, warnings in pickle.loads(data):
        idx = np.frombuffer(shared, dtype=np.int64, count=n, offset=at).copy()
        ends = np.frombuffer(shared, dtype=np.int64, count=n, offset=at + 8 * n).copy()
        at += 16 * n
        names = None
        if size >= 0:
            names = split_names(shared[at:at + size].decode("utf-8"), n)
            at += -(-size // 8) * 8
        out[index] = (idx, ends, names, warnings)
    return out
