"""The file system a dependency tree is resolved in: this machine's, or an archive's final tree.

The resolver (resolve.py) asks only these questions, so a container image's filesystem can be
searched as ld.so inside the container would search it, without writing it to disk.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from typing import Protocol

from audit.elf.model import ElfInfo


class FileSystem(Protocol):
    """What resolution reads. Paths are absolute in the file system's own namespace."""

    def kind(self, path: str) -> str | None:
        """"file" | "dir" | "link" | "other", without following a final symlink; None if missing."""

    def readlink(self, path: str) -> str: ...

    def head(self, path: str, n: int) -> bytes:
        """The first `n` bytes of a regular file (following symlinks); b"" when unreadable."""

    def read_text(self, path: str, limit: int) -> str | None: ...

    def listdir(self, path: str) -> list[str] | None:
        """Entry names of a directory (following symlinks); None if it is not one."""

    def read_elf(self, path: str, symbol_pattern, api_prefixes: tuple[bytes, ...] = (),
                 markers: tuple[bytes, ...] = ()) -> ElfInfo:
        """Parse the ELF file at `path` as audit.elf.reader.read_elf does (raises InputError)."""

    def size(self, path: str) -> int:
        """The size of a regular file (0 if unknown): the largest files are started first."""

    def shareable(self, path: str) -> bool:
        """Whether a forked worker process can read `path` as well as this process can."""


class HostFS:
    """This machine's file system."""

    def kind(self, path: str) -> str | None:
        try:
            mode = os.lstat(path).st_mode
        except (OSError, ValueError):
            return None
        if stat.S_ISLNK(mode):
            return "link"
        return "file" if stat.S_ISREG(mode) else "dir" if stat.S_ISDIR(mode) else "other"

    def readlink(self, path: str) -> str:
        return os.readlink(path)

    def head(self, path: str, n: int) -> bytes:
        data = read_regular(path, n)
        return b"" if data is None else data

    def read_text(self, path: str, limit: int) -> str | None:
        data = read_regular(path, limit)
        return None if data is None else data.decode("utf-8", errors="replace")

    def listdir(self, path: str) -> list[str] | None:
        try:
            return os.listdir(path)
        except (OSError, ValueError):
            return None

    def read_elf(self, path: str, symbol_pattern, api_prefixes: tuple[bytes, ...] = (),
                 markers: tuple[bytes, ...] = ()) -> ElfInfo:
        from audit.elf.reader import read_elf

        return read_elf(path, symbol_pattern=symbol_pattern, api_prefixes=api_prefixes, markers=markers)

    def size(self, path: str) -> int:
        try:
            return os.path.getsize(path)
        except OSError:
            return 0

    def shareable(self, path: str) -> bool:
        return True


HOST = HostFS()


def on_host(fs) -> bool:
    """Whether `fs`'s paths are this machine's (reports name its files as they name any file
    here), as opposed to an image's own namespace."""
    return fs is HOST or getattr(fs, "on_host", False)


class ConfinedFS(HostFS):
    """The files under one folder of this machine and nothing else: an archive found in a
    container image (a jar, a tarball, a .deb), written out and unpacked there. Its members
    resolve among themselves; the image's libraries are not searched, and this machine's are
    never seen (a path whose real location lies outside the folder does not exist here)."""

    on_host = True  # the paths are this machine's: reports name them as archive members, not image paths

    def __init__(self, root: str, read):
        self.root = os.path.realpath(root)
        self._read = read  # read_binary (audit.linkage.resolution.native): every audited format

    def inside(self, path: str) -> bool:
        real = os.path.realpath(path)
        return real == self.root or real.startswith(self.root + os.sep)

    def kind(self, path: str) -> str | None:
        path = path.rstrip("/") or "/"
        if path == "/" or self.root.startswith(path + "/"):  # a folder above the root: a way in, nothing else
            return "dir"
        if path != self.root and not path.startswith(self.root + "/"):  # the resolver follows links itself
            return None
        return super().kind(path)

    def head(self, path: str, n: int) -> bytes:
        return super().head(path, n) if self.inside(path) else b""

    def read_text(self, path: str, limit: int) -> str | None:
        return super().read_text(path, limit) if self.inside(path) else None

    def listdir(self, path: str) -> list[str] | None:
        return super().listdir(path) if self.inside(path) else None

    def read_elf(self, path: str, symbol_pattern, api_prefixes: tuple[bytes, ...] = (),
                 markers: tuple[bytes, ...] = (), **_ignored) -> ElfInfo:
        if not self.inside(path):
            from audit.errors import InputError

            raise InputError(f"{path}: outside the archive it was unpacked from")
        return self._read(path, symbol_pattern, api_prefixes, markers=markers)

    def size(self, path: str) -> int:
        return super().size(path) if self.inside(path) else 0


def read_regular(path: str, limit: int) -> bytes | None:
    """The first `limit` bytes of a regular file (following symlinks); None when it is missing,
    unreadable or not a regular file. Opened without blocking and checked once open: a FIFO or
    device put where a file was (ld.so.conf under --root) is never read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        parts, left = [], limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            parts.append(chunk)
            left -= len(chunk)
        return b"".join(parts)
    except OSError:
        return None
    finally:
        os.close(fd)


def glob(fs: FileSystem, pattern: str) -> list[str]:
    """Absolute glob (the `include` lines of ld.so.conf), sorted, over any FileSystem."""
    found = ["/"]
    for part in [p for p in pattern.split("/") if p]:
        nxt = []
        for base in found:
            if any(c in part for c in "*?["):
                names = fs.listdir(base) or []
                nxt += [os.path.join(base, n) for n in sorted(names)
                        if fnmatch.fnmatchcase(n, part) and (part.startswith(".") or not n.startswith("."))]
            elif fs.kind(os.path.join(base, part)) is not None:
                nxt.append(os.path.join(base, part))
        found = nxt
    return sorted(found)
