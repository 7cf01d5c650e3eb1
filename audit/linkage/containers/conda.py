"""Conda packages as inputs: `.conda` (a zip holding pkg-*.tar.zst and info-*.tar.zst) and the
older `.tar.bz2`. The package's binaries of an audited format (ELF, PE, Mach-O) and the
symlinks between them are written to a temporary folder laid out as the package would be
installed into a prefix (lib/, bin/, Library/bin/, ...), then audited like a wheel's members:
RUNPATH $ORIGIN/../lib finds the package's own lib/, a NEEDED ld.so does not reach falls back to
the package's members, then to `--conda-prefix`'s lib/; a DLL's imports are searched in its own
folder and the package's Library/bin/, a dylib's @rpath/@loader_path inside the package.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from audit.binformat import HEAD_BYTES, Kind
from audit.linkage.containers.category import READ, member_category
from audit.errors import InputError
from audit.linkage.containers.tars import bounded_members
from audit.python_source.reader import stream_may_load

_MAX_MEMBERS = 500_000
_MAX_HOPS = 40  # symlinks followed in one path, as ld.so's kernel allows (ELOOP)


def is_conda(path: str) -> bool:
    return path.endswith((".conda", ".tar.bz2"))


@contextmanager
def _package_tar(path: str) -> Iterator[tarfile.TarFile]:
    """The tar stream holding the package's files (not its info/ metadata)."""
    if path.endswith(".tar.bz2"):
        with tarfile.open(path, mode="r|bz2") as tf:
            yield tf
        return
    with zipfile.ZipFile(path) as zf:
        names = [n for n in zf.namelist() if n.startswith("pkg-") and n.endswith(".tar.zst") and "/" not in n]
        if len(names) != 1:
            raise InputError(f"{path}: not a .conda package (expected one pkg-*.tar.zst, found {len(names)})")
        import zstandard

        with zf.open(names[0]) as raw, zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True) as z, \
                tarfile.open(fileobj=z, mode="r|") as tf:
            yield tf


def extract_conda(path: str, dest: str, member_bytes: int, total_bytes: int) -> list[Extracted]:
    """Write the package's audited binaries (ELF, PE, Mach-O) and the links between them under `dest` (a folder this
    creates; a private one for the bytes meanwhile is made beside it), in archive order. Raises InputError for an unreadable or hostile package, or one whose ELF files unpack
    to more than `member_bytes` each or `total_bytes` in all (check's archive limits).

    Nothing is created under `dest` until the whole package has been read and every member path
    and symlink has been resolved against the package's own root (never the host's): a chain of
    symlinks that each look harmless but together lead out of it is refused before a folder
    exists."""
    tree = _Tree(path)
    out: list[Extracted] = []
    total = 0
    blobs = tempfile.mkdtemp(prefix=".blobs-", dir=os.path.dirname(os.path.abspath(dest)))
    try:
        try:
            with _package_tar(path) as tf:
                for n, m in enumerate(bounded_members(
                        tf, total_bytes, f"{path}: the package unpacks to more than {total_bytes} bytes "
                                         "(--max-archive-size)")):
                    if n >= _MAX_MEMBERS:
                        raise InputError(f"{path}: more than {_MAX_MEMBERS} members")
                    name = _safe(path, m.name)
                    if m.issym():
                        _check_link(path, name, m.linkname)
                        tree.add(name, _Node("link", target=m.linkname))
                    elif m.islnk():
                        tree.hard_link(name, _safe(path, m.linkname))
                    elif m.isdir():
                        tree.add(name, _Node("dir"))
                    elif m.isreg():
                        fh = tf.extractfile(m)
                        head = fh.read(HEAD_BYTES)
                        # as every container's members: ELF, PE (Library/bin/*.dll), Mach-O
                        # (lib/*.dylib), Python loaders, zips (jars), tarballs, packages, compressed files
                        category = member_category(head, m.size, name)
                        if category not in READ or category == "static":
                            tree.add(name, _Node("file"))  # replaces what was there; not written
                            if isinstance(category, Kind) or category == "static":  # static: read again later
                                kind = category if isinstance(category, Kind) else Kind.STATIC_ARCHIVE
                                out.append(Extracted(name, None, False, f"{kind.value}: format not audited", kind))
                            continue
                        total += m.size
                        if m.size > member_bytes:
                            raise InputError(f"{path}: member {name} unpacks to {m.size} bytes, over the "
                                             f"{member_bytes}-byte limit (--max-member-size)")
                        if total > total_bytes:
                            raise InputError(f"{path}: the package's ELF members unpack to more than "
                                             f"{total_bytes} bytes (--max-archive-size)")
                        blob = os.path.join(blobs, str(n))
                        with open(blob, "xb") as w:
                            w.write(head)
                            shutil.copyfileobj(fh, w, 1 << 20)
                        if category == "python":  # kept where it calls a loader
                            with open(blob, "rb") as r:
                                if not stream_may_load(r):
                                    os.unlink(blob)
                                    total -= m.size
                                    tree.add(name, _Node("file"))
                                    continue
                        tree.add(name, _Node("file", blob=blob, category=category))
                    else:  # a device or FIFO: never created
                        tree.add(name, _Node("file"))
        except InputError:
            raise
        except (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
            raise InputError(f"{path}: cannot read conda package: {_line(exc)}") from None
        except Exception as exc:  # zstandard.ZstdError, bz2's own
            if type(exc).__module__.startswith("zstandard"):
                raise InputError(f"{path}: cannot read conda package: {_line(exc)}") from None
            raise
        tree.check_links()
        try:
            os.mkdir(dest)
            out += tree.write(dest)
        except OSError as exc:
            raise InputError(f"{path}: cannot unpack conda package: {_line(exc)}") from None
    finally:
        shutil.rmtree(blobs, ignore_errors=True)
    return out


@dataclass(frozen=True)
class Extracted:
    name: str  # the member's name in the package
    written: str | None  # where it was written (None: not written)
    audited: bool  # an ELF file's first name (its other names are found by name only)
    error: str | None = None  # why it is an error (a binary whose format is not audited)
    kind: Kind = Kind.ELF
    category: str = "binary"  # member_category's (category.READ): binary, python (calls a loader), zip, tar, ...


@dataclass
class _Node:
    kind: str  # "dir" | "file" | "link"
    target: str | None = None  # of a link
    blob: str | None = None  # of a member to read: where its bytes wait (a hard link shares them); others are not written
    category: str = "binary"  # of a written file (member_category)


class _Tree:
    """The package as it would be installed, held in memory: paths relative to the package root,
    every folder part free of symlinks (a member under a symlinked folder is placed where the link
    leads, as extraction would place it, but only after the link is resolved here)."""

    def __init__(self, path: str):
        self.path = path
        self.nodes: dict[str, _Node] = {"": _Node("dir")}
        self.children: dict[str, set[str]] = {"": set()}  # of each folder: what to drop when it is replaced

    def resolve(self, rel: str, what: str, follow_last: bool = True, hops: int = 0) -> str | None:
        """`rel` with its symlinks followed inside the package: the path with no symlink in it,
        or None where it reaches nothing (as ld.so would find nothing). Raises InputError where a
        step leaves the package."""
        parts = [p for p in rel.split("/") if p not in ("", ".")]
        here: list[str] = []
        for k, part in enumerate(parts):
            if part == "..":
                if not here:
                    raise InputError(f"{self.path}: {what} passes through a symlink leaving the package")
                here.pop()
                continue
            cur = "/".join(here + [part])
            node = self.nodes.get(cur)
            last = k == len(parts) - 1
            if node is None:
                if not last:
                    return None
                here.append(part)
            elif node.kind == "link" and (follow_last or not last):
                if hops >= _MAX_HOPS or node.target.startswith("/"):  # a loop; an absolute one is not written
                    return None
                rest = "/".join(parts[k + 1:])
                inner = posixpath.join("/".join(here), node.target, rest) if rest else \
                    posixpath.join("/".join(here), node.target)
                return self.resolve(inner, what, follow_last, hops + 1)
            elif node.kind != "dir" and not last:
                return None
            else:
                here.append(part)
        return "/".join(here)

    def _parent(self, name: str) -> str:
        """Where the member's folder is, created in the tree as extraction would; refused when
        reaching it leaves the package or passes through a file."""
        parts = name.split("/")
        here = ""
        for part in parts[:-1]:
            cur = f"{here}/{part}" if here else part
            node = self.nodes.get(cur)
            if node is None:
                self._put(cur, _Node("dir"))
            elif node.kind == "link":
                real = self.resolve(cur, f"member {name}")
                if real is None or self.nodes.get(real) is None or self.nodes[real].kind != "dir":
                    raise InputError(f"{self.path}: member {name} lies behind a symlink that leads to no folder "
                                     "of the package")
                cur = real
            elif node.kind != "dir":
                raise InputError(f"{self.path}: member {name} lies under {cur}, which is a file")
            here = cur
        return here

    def add(self, name: str, node: _Node) -> None:
        where = self._parent(name)
        full = f"{where}/{name.rsplit('/', 1)[-1]}" if where else name
        old = self.nodes.get(full)
        if old is not None and old.kind == "dir" and node.kind == "dir":
            return
        if old is not None:  # a later member replaces an earlier one (and a folder's contents)
            self._drop(full)
        self._put(full, node)

    def _put(self, key: str, node: _Node) -> None:
        self.nodes[key] = node
        self.children[key.rpartition("/")[0]].add(key)
        if node.kind == "dir":
            self.children[key] = set()

    def _drop(self, key: str) -> None:
        """Remove a member and, for a folder, all under it (without recursion: a package may nest
        deep). A folder's children go with it, so a removed child's own parent may be gone."""
        stack = [key]
        while stack:
            cur = stack.pop()
            stack.extend(self.children.pop(cur, ()))
            self.nodes.pop(cur, None)
            self.children.get(cur.rpartition("/")[0], set()).discard(cur)

    def hard_link(self, name: str, source: str) -> None:
        real = self.resolve(source, f"hard link {name}", follow_last=False)
        node = self.nodes.get(real) if real is not None else None
        if node is not None and node.kind == "file" and node.blob is not None:
            self.add(name, _Node("file", blob=node.blob))  # the same bytes
        elif node is not None and node.kind == "file":
            self.add(name, _Node("file"))

    def check_links(self) -> None:
        """Every symlink of the final tree, followed to its end, stays inside the package."""
        for key, node in self.nodes.items():
            if node.kind == "link" and not node.target.startswith("/"):
                self.resolve(key, f"symlink {key} -> {node.target!r}")

    def write(self, dest: str) -> list[Extracted]:
        """Lay the tree out under `dest`: folders, then ELF files, then symlinks (none of which
        leads out). A path here never passes through a symlink, so nothing is created elsewhere."""
        out: list[Extracted] = []
        for key in sorted(k for k, n in self.nodes.items() if n.kind == "dir" and k):
            os.mkdir(os.path.join(dest, *key.split("/")))
        placed: dict[str, str] = {}
        for key, node in self.nodes.items():
            target = os.path.join(dest, *key.split("/"))
            if node.kind == "file" and node.blob is not None:
                if node.blob in placed:
                    os.link(placed[node.blob], target)
                    out.append(Extracted(key, target, False))  # found by name; its bytes are audited once
                else:
                    os.rename(node.blob, target)
                    placed[node.blob] = target
                    out.append(Extracted(key, target, True, category=node.category))
            elif node.kind == "link" and not node.target.startswith("/"):  # an absolute one names the host
                os.symlink(node.target, target)
                out.append(Extracted(key, target, False))
        return out


def _safe(path: str, name: str) -> str:
    raw = name
    while name.startswith("./"):
        name = name[2:]
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if name.startswith("/") or ".." in parts or "\\" in name or "\0" in name or not parts:
        raise InputError(f"{path}: unsafe member path {raw!r}")
    return "/".join(parts)


def _check_link(path: str, name: str, target: str) -> None:
    """A relative symlink must stay inside the package (it is written to disk)."""
    if target.startswith("/"):
        return
    norm = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
    if norm == ".." or norm.startswith("../"):
        raise InputError(f"{path}: symlink {name} -> {target!r} escapes the package")


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
