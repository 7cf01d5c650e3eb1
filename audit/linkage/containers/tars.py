"""Tar members read as a stream (compressed layers, conda packages, tarballs: sdists, a build's).

tarfile steps over a member it is not asked for by reading its declared size, block by block,
and goes on reading when the stream has already ended: a header declaring exabytes over a
short stream would loop for ever. No member may end past what the stream may unpack to.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator

from audit.errors import InputError, printable
from audit.linkage.containers.compressed import compression, inflation_limit, is_stream_error, open_reader


def bounded_members(tf: tarfile.TarFile, limit: int, why: str) -> Iterator[tarfile.TarInfo]:
    """tf's members in order; InputError for the first whose data would end more than `limit`
    bytes into the stream (checked before tarfile steps over it), `why` saying which limit."""
    for m in tf:
        if m.offset_data + m.size > limit:
            raise InputError(f"{why}: member {printable(m.name)} declares {m.size} bytes")
        yield m


_MAX_TAR_MEMBERS = 200_000  # members of a tar met in a folder or wheel, whose first bytes are read


class _Bounded:
    """Passes reads through, refusing to pass more than `limit` bytes (a stream that inflates
    without end); no single read asks for more than the limit allows."""

    def __init__(self, raw, limit: int, why: str):
        self.raw, self.limit, self.why, self.count = raw, limit, why, 0

    def read(self, n: int = -1) -> bytes:
        left = self.limit - self.count + 1
        n = left if n is None or n < 0 else min(n, left)
        data = self.raw.read(n)
        self.count += len(data)
        if self.count > self.limit:
            raise InputError(self.why)
        return data


def tar_members(fh, compressed: int, ratio: float, total_bytes: int):
    """(TarInfo, its data stream) of each regular member of the tar read from `fh` (plain, gzip,
    xz, bzip2 or zstd; known by its first bytes), in order. The stream is bounded as an image
    layer's: the smaller of the archive limit and the member ratio times the compressed size
    (never below 64 MiB), and 200,000 members. Raises InputError for an unreadable tar or one past
    a limit."""
    how = compression(fh.read(10))
    fh.seek(0)
    limit, why = inflation_limit("tar", compressed, ratio, total_bytes)
    try:
        # uncompressed: read where it lies (its size bounds it; member data is stepped over)
        raw = fh if how is None else open_reader(how, fh)
        in_place = how is None and isinstance(fh, io.BufferedReader)  # a file here, not an archive's member
        stream = fh if in_place else _Bounded(raw, limit, why)
        with tarfile.open(fileobj=stream, mode="r:" if in_place else "r|") as tf:
            for n, m in enumerate(tf if in_place else bounded_members(tf, limit, why)):
                if n >= _MAX_TAR_MEMBERS:
                    raise InputError(f"tar has more than {_MAX_TAR_MEMBERS} members")
                if m.isreg():
                    yield m, tf.extractfile(m)
    except InputError:
        raise
    except Exception as exc:
        text = tar_read_error(exc)
        if text is None:
            raise
        raise InputError(text) from None


def tar_read_error(exc: BaseException) -> str | None:
    """The one line for an exception reading a tar stream (zstandard's, lzma's and bz2's own
    included), or None for one that is not about the data."""
    if isinstance(exc, OSError) and exc.strerror and not isinstance(exc, EOFError):
        return f"cannot read: {exc.strerror}"
    if isinstance(exc, tarfile.TarError) or is_stream_error(exc):
        return f"cannot read tar: {' '.join(str(exc).split()) or type(exc).__name__}"
    return None


def safe_member(name: str) -> str | None:
    """A tar member's name as a relative path with no `..`, or None where it is not one."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if name.startswith("/") or "\\" in name or "\0" in name or ".." in parts or not parts:
        return None
    return "/".join(parts)
