"""Decompressors for embedded device code and compressed sections, bounded against bombs.

Output is produced a chunk at a time and checked as it grows, so a hostile stream is refused
once it passes a limit, never after it has been held whole: at most MAX_OUTPUT bytes, and above
RATIO_FLOOR bytes no more than MAX_RATIO times the compressed input (a GiB of zeros compresses
~1000:1 with zlib and far more with zstd; real code objects and data compress well under 100:1).
zstandard and lz4 are regular dependencies, imported lazily: if one is missing all the same (a
broken install), the entry is reported with an error naming the package, never a crash.
"""

from __future__ import annotations

import zlib

# No single embedded code object or compressed section is this large; a bigger one is hostile.
MAX_OUTPUT = 256 << 20
MAX_RATIO = 200  # uncompressed / compressed, checked once the output passes RATIO_FLOOR
RATIO_FLOOR = 16 << 20
LZ4_MAX_RATIO = 255  # an LZ4 block cannot expand further: a larger claim is false
_CHUNK = 1 << 20
_ZSTD_PIECE = 512


class DecompressError(Exception):
    pass


def _check(algo: str, produced: int, compressed: int, limit: int, expected: int | None) -> None:
    if produced > limit:
        if expected is not None and limit == expected:
            raise DecompressError(f"{algo}: output larger than its declared size {expected}")
        raise DecompressError(f"{algo}: output over the {MAX_OUTPUT >> 20} MiB limit")
    if produced >= RATIO_FLOOR and produced > MAX_RATIO * max(compressed, 1):
        raise DecompressError(f"{algo}: compressed more than {MAX_RATIO}:1 ({compressed} bytes to "
                              f"over {produced} bytes), over the limit for device code and sections")


def inflate(algo: str, data, expected: int | None) -> tuple[bytes | bytearray, int]:
    """(decompressed bytes, input bytes consumed or 0 if unknown; a bytearray, not copied once
    more into bytes, where it was built a chunk at a time). Raises DecompressError,
    also for output past MAX_OUTPUT, past `expected` (a declared size), or expanding more than
    MAX_RATIO:1 beyond RATIO_FLOOR bytes."""
    if expected is not None and expected > MAX_OUTPUT:
        raise DecompressError(f"{algo}: claims {expected} bytes uncompressed (over the "
                              f"{MAX_OUTPUT >> 20} MiB limit)")
    limit = expected if expected is not None and expected > 0 else MAX_OUTPUT
    n = len(data)
    out = bytearray()
    if algo == "zlib":
        d = zlib.decompressobj()
        view = memoryview(data)
        fed = 0
        try:
            # the input is fed a piece at a time: unconsumed_tail copies what is left of a piece
            while fed < n and not d.eof:
                piece = view[fed:fed + _CHUNK]
                fed += len(piece)
                while piece and not d.eof:
                    out += d.decompress(piece, _CHUNK)
                    _check(algo, len(out), n, limit, expected)
                    piece = d.unconsumed_tail
        except zlib.error as exc:
            raise DecompressError(f"zlib: {exc}") from None
        if not d.eof:
            raise DecompressError("zlib: stream truncated or larger than its declared size")
        return out, fed - len(d.unused_data)
    if algo == "zstd":
        try:
            import zstandard
        except ImportError:
            raise DecompressError("zstd-compressed; install zstandard") from None
        d = zstandard.ZstdDecompressor().decompressobj()
        view = memoryview(data)
        fed = 0
        try:
            # small pieces: a zstd block of a few bytes can stand for 128 KiB, so a piece of
            # _ZSTD_PIECE bytes yields at most ~16 MiB before the limits are checked again
            while fed < n and not d.eof:
                piece = view[fed:fed + _ZSTD_PIECE]
                fed += len(piece)
                out += d.decompress(piece)
                _check(algo, len(out), n, limit, expected)
        except zstandard.ZstdError as exc:
            raise DecompressError(f"zstd: {exc}") from None
        if not d.eof:
            raise DecompressError("zstd: stream truncated")
        return out, fed - len(d.unused_data)
    if algo == "lz4":
        try:
            import lz4.block
        except ImportError:
            raise DecompressError("lz4-compressed; install lz4") from None
        if expected is None or expected <= 0:
            raise DecompressError("lz4: no uncompressed size recorded")
        # the block decoder allocates the declared size at once: check the claim before
        if expected > LZ4_MAX_RATIO * n + 64:
            raise DecompressError(f"lz4: claims {expected} bytes from {n} (more than an LZ4 block can hold)")
        _check(algo, expected, n, MAX_OUTPUT, None)
        try:
            res = lz4.block.decompress(data, uncompressed_size=limit)
        except lz4.block.LZ4BlockError as exc:
            raise DecompressError(f"lz4: {exc}") from None
        return res, n
    raise DecompressError(f"unknown compression {algo}")
