"""Conda packages as inputs: `.conda` (a zip holding pkg-*.tar.zst and info-*.tar.zst) and the
older `.tar.bz2`. The package's ELF files and the symlinks between them are written to a
temporary folder laid out as the package would be installed into a prefix (lib/, bin/, ...),
then audited like a wheel's members: RUNPATH $ORIGIN/../lib finds the package's own lib/, a
NEEDED ld.so does not reach falls back to the package's members, then to `--conda-prefix`'s lib/.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tarfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager

from audit.errors import InputError

_MAX_MEMBERS = 500_000
ELF_MAGIC = b"\x7fELF"


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


def extract_conda(path: str, dest: str, member_bytes: int, total_bytes: int) -> list[tuple[str, str, bool]]:
    """Write the package's ELF files and symlinks under `dest`; [(member name, written path,
    whether to audit it: an ELF file's first name)] in archive order. Raises InputError for an
    unreadable or hostile package, or one whose ELF files unpack to more than `member_bytes`
    each or `total_bytes` in all (check's archive limits)."""
    out: list[tuple[str, str, bool]] = []
    total = 0
    top = os.path.realpath(dest)

    def place(target: str) -> str:
        """Create target's folder; refuse one that symlinks lead outside `dest`."""
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not (os.path.realpath(os.path.dirname(target)) + os.sep).startswith(top + os.sep):
            where = os.path.relpath(target, dest)
            raise InputError(f"{path}: member {where} lies behind a symlink leaving the package")
        return target
    try:
        with _package_tar(path) as tf:
            for n, m in enumerate(tf):
                if n >= _MAX_MEMBERS:
                    raise InputError(f"{path}: more than {_MAX_MEMBERS} members")
                name = _safe(path, m.name)
                target = os.path.join(dest, *name.split("/"))
                if m.issym():
                    _check_link(path, name, m.linkname)
                    if not m.linkname.startswith("/"):  # an absolute one names the installing host
                        os.symlink(m.linkname, place(target))
                        out.append((name, target, False))
                elif m.islnk():
                    source = os.path.join(dest, *_safe(path, m.linkname).split("/"))
                    if os.path.isfile(source) and os.path.realpath(source).startswith(top + os.sep):
                        os.link(source, place(target))
                        out.append((name, target, False))  # found by name; its bytes are audited once
                elif m.isreg():
                    fh = tf.extractfile(m)
                    head = fh.read(4)
                    if head != ELF_MAGIC:
                        continue
                    total += m.size
                    if m.size > member_bytes:
                        raise InputError(f"{path}: member {name} unpacks to {m.size} bytes, over the "
                                         f"{member_bytes}-byte limit (--max-member-size)")
                    if total > total_bytes:
                        raise InputError(f"{path}: the package's ELF members unpack to more than {total_bytes} "
                                         f"bytes (--max-archive-size)")
                    with open(place(target), "xb") as w:
                        w.write(head)
                        shutil.copyfileobj(fh, w, 1 << 20)
                    out.append((name, target, True))
    except InputError:
        raise
    except (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise InputError(f"{path}: cannot read conda package: {_line(exc)}") from None
    except Exception as exc:  # zstandard.ZstdError, bz2's own
        if type(exc).__module__.startswith("zstandard"):
            raise InputError(f"{path}: cannot read conda package: {_line(exc)}") from None
        raise
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
