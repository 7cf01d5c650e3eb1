"""Compressed streams: what every container that inflates something shares (a tarball's stream,
an RPM's payload, an image layer, a file compressed on its own): which compression a stream's
first bytes name, a reader for it, and how far it may inflate.

Files compressed on their own (`libx.so.gz`, a `.xz`, `.bz2` or `.zst` that is no tarball): a
loader can inflate one at run time and load what comes out, so its bytes are never taken for
data unseen: it is decompressed (bounded as a tar's stream is: the member ratio, the archive
size) and what it holds is read as that member would be.
"""

from __future__ import annotations

import bz2
import lzma
import os
import zlib

from audit.errors import InputError

RATIO_FLOOR = 64 << 20  # a member (or a tar's stream, a layer) may inflate to this whatever its ratio

_MAGICS = ((b"\x1f\x8b\x08", "gzip"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"))
_SUFFIXES = (".gz", ".xz", ".bz2", ".zst", ".zstd", ".z", ".Z")
_CHUNK = 1 << 20


def compression(head: bytes) -> str | None:
    """The compression a file's first bytes name ("gzip", "xz", "bzip2", "zstd"), or None. gzip
    must say deflate and bzip2 its level and first block (or end) magic: a text file that starts
    "BZh" is not taken for one."""
    if head[:3] == b"BZh" and head[3:4].isdigit() and head[3:4] != b"0" \
            and head[4:10] in (b"1AY&SY", b"\x17\x72\x45\x38\x50\x90"):
        return "bzip2"
    return next((name for magic, name in _MAGICS if head.startswith(magic)), None)


def inner_name(name: str) -> str:
    """What the decompressed file is called: the name without its compression suffix."""
    base = name.rsplit("/", 1)[-1]
    for suffix in _SUFFIXES:
        if base.endswith(suffix) and len(base) > len(suffix):
            return base[:-len(suffix)]
    return base + ".decompressed"


def open_reader(how: str, fh):
    """A stream of fh's bytes decompressed ("gzip", "xz", "lzma", "bzip2", "zstd"), whose reads
    return at most what they ask for."""
    if how == "gzip":
        import gzip

        return gzip.GzipFile(fileobj=fh, mode="rb")
    if how in ("xz", "lzma"):  # liblzma tells xz from the older .lzma ("alone") itself
        return lzma.LZMAFile(fh)
    if how == "bzip2":
        return bz2.BZ2File(fh)
    import zstandard

    return zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True)


def inflation_limit(subject: str, compressed: int, ratio: float, total_bytes: int) -> tuple[int, str]:
    """How far a stream of `compressed` bytes may inflate, and what is said past it: the smaller
    of `ratio` times its size (never below RATIO_FLOOR; --max-member-ratio) and `total_bytes`
    (--max-archive-size)."""
    by_ratio = max(RATIO_FLOOR, int(ratio * max(compressed, 1)))
    if by_ratio < total_bytes:
        return by_ratio, (f"{subject} inflates more than {ratio:g}:1 ({compressed} bytes compressed; "
                          "--max-member-ratio)")
    return total_bytes, f"{subject} unpacks to more than {total_bytes} bytes (--max-archive-size)"


def peek(path: str, n: int) -> bytes:
    """The first `n` bytes of the compressed file at `path`, decompressed (peek_stream); a zstd
    file's frames are walked first (zstandard's reader says nothing of a cut one)."""
    with open(path, "rb") as fh:
        if compression(fh.read(10)) == "zstd" and not _zstd_whole(fh, os.fstat(fh.fileno()).st_size):
            raise InputError("zstd stream ends early or is damaged (truncated)")
        fh.seek(0)
        return peek_stream(fh, n)


def peek_stream(fh, n: int) -> bytes:
    """The first `n` bytes of the compressed stream `fh` (read from where it is, forward only),
    decompressed: never more, so a bomb costs no more than `n`. InputError for a stream damaged
    or cut within them: what it holds is never judged on part of it."""
    magic = fh.read(10)
    how = compression(magic)
    if how is None:
        raise InputError("not a compressed file")
    out = b""
    try:
        with open_reader(how, _Prefixed(magic, fh)) as stream:
            while len(out) < n and (data := stream.read(n - len(out))):
                out += data
            return out
    except Exception as exc:  # noqa: BLE001  mapped where it is the stream's, else raised as it is
        raise _stream_error(exc, how) from None


def is_stream_error(exc: BaseException) -> bool:
    """Whether `exc` is what a decompressor or the stream under it raises on damaged, cut or
    unreadable data (zstandard's, lzma's, bz2's and zlib's own included), not a bug."""
    return isinstance(exc, (OSError, EOFError, ValueError, MemoryError, zlib.error, lzma.LZMAError)) \
        or type(exc).__module__.startswith(("zstandard", "_lzma", "lzma", "_bz2", "zlib"))


def _stream_error(exc: BaseException, how: str) -> BaseException:
    """InputError for what a decompressor raises on a damaged or cut stream; an InputError as it
    is; anything else (a bug) as it is."""
    if isinstance(exc, InputError):
        return exc
    if is_stream_error(exc):
        return InputError(f"cannot decompress {how} file: {' '.join(str(exc).split()) or type(exc).__name__}")
    return exc


class _Prefixed:
    """`prefix`, then the rest of `fh`: a stream whose first bytes were read to know it."""

    def __init__(self, prefix: bytes, fh):
        self.prefix, self.fh = prefix, fh

    def read(self, n: int = -1) -> bytes:
        if self.prefix:
            head = self.prefix if n is None or n < 0 else self.prefix[:n]
            self.prefix = self.prefix[len(head):]
            return head
        return self.fh.read(n)

    def readable(self) -> bool:
        return True


def _zstd_whole(fh, size: int) -> bool:
    """Whether the zstd frames in `fh` (of `size` bytes) end exactly at its end: each frame's
    header, blocks (3-byte headers: last flag, type, size) and checksum walked by their sizes,
    nothing decompressed. zstandard's reader says nothing of a cut stream; this does."""
    at = 0
    while at < size:
        fh.seek(at)
        magic = int.from_bytes(fh.read(4), "little")
        if 0x184D2A50 <= magic <= 0x184D2A5F:  # a skippable frame: its size follows
            at += 8 + int.from_bytes(fh.read(4), "little")
            continue
        if magic != 0xFD2FB528:
            return False
        desc = fh.read(1)
        if not desc:
            return False
        d = desc[0]
        single = bool(d & 0x20)
        fcs = (0, 2, 4, 8)[d >> 6] or (1 if single else 0)
        at += 4 + 1 + (0 if single else 1) + (0, 1, 2, 4)[d & 3] + fcs
        while True:  # the blocks
            fh.seek(at)
            head = fh.read(3)
            if len(head) < 3:
                return False
            h = int.from_bytes(head, "little")
            kind, length = (h >> 1) & 3, h >> 3
            if kind == 3:  # reserved
                return False
            at += 3 + (1 if kind == 1 else length)
            if h & 1:
                break
        at += 4 if d & 0x04 else 0  # the content checksum
    return at == size


def decompress(src: str, dest: str, ratio: float, total_bytes: int) -> None:
    """Write `src` decompressed to `dest` (created), never more than the smaller of `ratio` times
    its compressed size (at least RATIO_FLOOR) and `total_bytes`. Raises InputError for a stream
    that is damaged, truncated or inflates past that."""
    with open(src, "rb") as fh:
        how = compression(fh.read(10))
        if how is None:
            raise InputError("not a compressed file")
        size = os.fstat(fh.fileno()).st_size
        if how == "zstd" and not _zstd_whole(fh, size):
            raise InputError("zstd stream ends early or is damaged (truncated)")
        fh.seek(0)
        limit, why = inflation_limit(f"{how} file", size, ratio, total_bytes)
        written = 0
        try:
            with open_reader(how, fh) as stream, open(dest, "xb") as out:
                while data := stream.read(min(_CHUNK, limit - written + 1)):
                    written += len(data)
                    if written > limit:
                        raise InputError(why)
                    out.write(data)
        except Exception as exc:  # noqa: BLE001  mapped where it is the stream's, else raised as it is
            raise _stream_error(exc, how) from None
