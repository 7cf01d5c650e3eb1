"""Decompressors for embedded device code, bounded against decompression bombs.

zstandard and lz4 are regular dependencies, imported lazily: if one is missing all the same (a
broken install), the entry is reported with an error naming the package, never a crash.
"""

from __future__ import annotations

import io
import zlib

# No single embedded code object is this large; a bigger claim is treated as hostile.
MAX_OUTPUT = 1 << 30


class DecompressError(Exception):
    pass


def _limit(expected: int | None) -> int:
    if expected is not None and 0 < expected <= MAX_OUTPUT:
        return expected
    return MAX_OUTPUT


def inflate(algo: str, data: bytes, expected: int | None) -> tuple[bytes, int]:
    """(decompressed bytes, input bytes consumed or 0 if unknown). Raises DecompressError."""
    limit = _limit(expected)
    if expected is not None and expected > MAX_OUTPUT:
        raise DecompressError(f"{algo}: claims {expected} bytes uncompressed (over the {MAX_OUTPUT} limit)")
    if algo == "zlib":
        d = zlib.decompressobj()
        try:
            out = d.decompress(data, limit)
        except zlib.error as exc:
            raise DecompressError(f"zlib: {exc}") from None
        if not d.eof:
            raise DecompressError("zlib: stream truncated or larger than its declared size")
        return out, len(data) - len(d.unused_data)
    if algo == "zstd":
        try:
            import zstandard
        except ImportError:
            raise DecompressError("zstd-compressed; install zstandard") from None
        try:
            reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=False)
            out = reader.read(limit + 1)
        except zstandard.ZstdError as exc:
            raise DecompressError(f"zstd: {exc}") from None
        if len(out) > limit:
            raise DecompressError("zstd: output larger than its declared size")
        return out, 0
    if algo == "lz4":
        try:
            import lz4.block
        except ImportError:
            raise DecompressError("lz4-compressed; install lz4") from None
        if expected is None or expected <= 0:
            raise DecompressError("lz4: no uncompressed size recorded")
        try:
            out = lz4.block.decompress(data, uncompressed_size=limit)
        except lz4.block.LZ4BlockError as exc:
            raise DecompressError(f"lz4: {exc}") from None
        return out, len(data)
    raise DecompressError(f"unknown compression {algo}")
