"""The FP8 kernel's workspace read back: what its quantization stage left for the attention stage.

The kernel (src/gpu/fk_fp8.h) runs in two stages through one caller buffer; reading the buffer
after a call separates a quantization bug from an attention bug. This module mirrors the C
side's `Layout` (every region 1 KiB aligned, in this order) and undoes its shared-memory image:
128-byte rows, 16-byte chunk c of row r stored at chunk c ^ (r % 8); V transposed (one row per
channel, BN keys along it) with the keys of every 32 in P V's order (`permuted_key`).
"""

from __future__ import annotations

from dataclasses import dataclass

Q_BLOCK, BN, ROW_BYTES, MAX_DIM, STAT_KEYS = 64, 128, 128, 128, 256
_REGIONS = ("q_img", "k_img", "v_img", "q_scale", "k_scale", "k_mean", "v_scale", "q_shift", "k_part", "v_part")


def permuted_key(c: int) -> int:
    """The key (0..31 of its group of 32) that P V's k column `c` multiplies (fk_fp8.h)."""
    return (c // 16) * 16 + ((c % 4) // 2) * 8 + 2 * ((c % 16) // 4) + (c % 2)


def bucket(d: int) -> int:
    return 64 if d <= 64 else 128


@dataclass(frozen=True)
class Layout:
    bh: int
    nq: int
    nk: int
    dbucket: int
    offsets: dict[str, int]
    total: int

    @property
    def qblocks(self) -> int:
        return -(-self.nq // Q_BLOCK)

    @property
    def ntiles(self) -> int:
        return -(-self.nk // BN)


def layout(bh: int, nq: int, nk: int, d: int) -> Layout:
    """The byte offset of every region for these sizes, as fk::fp8::layout_for computes them."""
    db = bucket(d)
    qblocks, ntiles, chunks = -(-nq // Q_BLOCK), -(-nk // BN), -(-nk // STAT_KEYS)
    sizes = (qblocks * Q_BLOCK * ROW_BYTES, ntiles * BN * ROW_BYTES, ntiles * db * ROW_BYTES,
             qblocks * 4, ntiles * 4, MAX_DIM * 4, MAX_DIM * 4, nq * 4, chunks * MAX_DIM * 4, chunks * MAX_DIM * 4)
    offsets, at = {}, 0
    for name, size in zip(_REGIONS, sizes):
        offsets[name] = at
        at += -(-(size * bh) // 1024) * 1024
    return Layout(bh, nq, nk, db, offsets, at)


def _region(ws, lay: Layout, name: str, nbytes: int):
    start = lay.offsets[name]
    return ws[start:start + nbytes]


def _floats(ws, lay: Layout, name: str, count: int):
    import torch

    return _region(ws, lay, name, 4 * count).cpu().contiguous().view(torch.float32)


def unswizzle(img):
    """(..., rows * 128) uint8 in the 128-byte swizzled image -> (..., rows, 128) in row order."""
    import torch

    rows = img.shape[-1] // ROW_BYTES
    r = torch.arange(rows).view(rows, 1, 1)
    c = torch.arange(8).view(1, 8, 1)
    e = torch.arange(16).view(1, 1, 16)
    src = (r * ROW_BYTES + ((c ^ (r % 8)) * 16) + e).reshape(rows, ROW_BYTES)
    return img[..., src.reshape(-1)].reshape(*img.shape[:-1], rows, ROW_BYTES)


@dataclass
class Quantized:
    """The operands as the attention stage reads them (CPU tensors, (BH, ...))."""

    q: object        # int8 (BH, qblocks*64, 128): rows past nq and columns past D must be 0
    q_scale: object  # float32 (BH, qblocks)
    k: object        # int8 (BH, ntiles*128, 128), K with its mean subtracted
    k_scale: object  # float32 (BH, ntiles)
    k_mean: object   # float32 (BH, 128)
    v: object        # uint8 e4m3 bits (BH, ntiles*128, dbucket): V in key order (permutation undone)
    v_scale: object  # float32 (BH, 128)


def read(ws, lay: Layout) -> Quantized:
    """Decode the quantized operands from workspace `ws` (a uint8 tensor, any device)."""
    import torch

    ws = ws.cpu()
    bh, qb, nt, db = lay.bh, lay.qblocks, lay.ntiles, lay.dbucket
    q = unswizzle(_region(ws, lay, "q_img", bh * qb * Q_BLOCK * ROW_BYTES).view(bh, qb, Q_BLOCK * ROW_BYTES))
    k = unswizzle(_region(ws, lay, "k_img", bh * nt * BN * ROW_BYTES).view(bh, nt, BN * ROW_BYTES))
    vt = unswizzle(_region(ws, lay, "v_img", bh * nt * db * ROW_BYTES).view(bh, nt, db * ROW_BYTES))
    # vt: (bh, nt, channel, column); column col of tile t multiplies key t*128 + key_of[col]
    key_of = torch.tensor([(c // 32) * 32 + permuted_key(c % 32) for c in range(BN)])
    v = torch.empty(bh, nt, BN, db, dtype=torch.uint8)
    v[:, :, key_of, :] = vt.transpose(-1, -2)
    return Quantized(
        q=q.reshape(bh, qb * Q_BLOCK, ROW_BYTES).view(torch.int8),
        q_scale=_floats(ws, lay, "q_scale", bh * qb).view(bh, qb),
        k=k.reshape(bh, nt * BN, ROW_BYTES).view(torch.int8),
        k_scale=_floats(ws, lay, "k_scale", bh * nt).view(bh, nt),
        k_mean=_floats(ws, lay, "k_mean", bh * MAX_DIM).view(bh, MAX_DIM),
        v=v.reshape(bh, nt * BN, db),
        v_scale=_floats(ws, lay, "v_scale", bh * MAX_DIM).view(bh, MAX_DIM),
    )
