"""FP8 attention: the quantization numerics, as a CPU reference the GPU kernel must reproduce.

`attention(q, k, v, precision="fp8")` on CPU tensors runs `reference()` with the chosen scheme
(`CHOSEN`); on CUDA tensors it runs the FP8 kernel (src/gpu/fk_fp8.h, sm_90a on cc 9.0), whose GPU
tests use `reference()` as their oracle. The reference walks the keys in the
Hopper kernel's K/V tiles with the online softmax, so each rounding happens where the kernel's
would: Q and K quantized per block once per call, S dequantized per (Q block, K tile), P rounded
to e4m3 after it is exponentiated against the running row maximum, P V accumulated per tile.

Schemes (measured in docs/kernel.md, "FP8 attention"):
* `int8-smooth` (CHOSEN): K smoothed (its mean over the keys subtracted, per head and channel:
  softmax is invariant to it), Q and K rounded to INT8 with one scale per block (Q: the 64 rows
  of a consumer warpgroup; K: one K/V tile), Q K^T exact in int32; P scaled by 448 and V by one
  scale per channel, both e4m3, P V accumulated in FP32 across tiles (two-level: the tensor
  core's FP8 accumulator only inside a tile).
* `e4m3`: Q, K, V in e4m3 with the same block scales, both GEMMs accumulated by the FP8 tensor
  core (single-level: the running O is the wgmma accumulator).
* `e4m3-smooth`: `e4m3` with K smoothed.

The Hopper FP8 tensor core does not accumulate in full FP32: products are summed with about 13
mantissa bits kept (an FP22 accumulator, as SageAttention2 measured). `accumulator="fp22"`
models that by truncating the running sum to 13 mantissa bits after every k=32 step of a wgmma;
`"fp32"` is the ideal accumulator. INT8 products accumulate exactly in int32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

E4M3_MAX = 448.0  # largest finite float8_e4m3fn
INT8_MAX = 127.0  # symmetric INT8 (-128 is never produced)
P_SCALE = E4M3_MAX  # P in [0, 1] is multiplied by this before its e4m3 rounding (static scale)
Q_BLOCK = 64  # query rows per Q scale: one consumer warpgroup's wgmma (M = 64)
MMA_K = 32  # reduction depth of one FP8 wgmma (k = 32): the accumulator is rounded after each
FP22_DROP_BITS = 10  # float32 keeps 23 mantissa bits, the FP8 accumulator about 13
PRECISIONS = ("exact", "fp8")


def check_precision(precision: str) -> str:
    """`precision` itself, or a ValueError naming the ones there are."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(map(repr, PRECISIONS))}, not {precision!r}")
    return precision


def kv_tile(head_dim: int) -> int:
    """Keys per K/V tile of the Hopper kernel at this head dim (docs/kernel.md, the Hopper path)."""
    if head_dim <= 128:
        return 128
    return 112 if head_dim <= 192 else 80


@dataclass(frozen=True)
class Scheme:
    name: str
    qk: str  # "int8" | "e4m3" | "none" (no rounding: checks the tiled softmax itself)
    smooth_k: bool
    pv: str  # "e4m3" | "none"
    accumulator: str  # "fp32" | "fp22": the FP8 tensor core's accumulator model
    two_level: bool  # P V summed in FP32 across tiles (True) or in the running wgmma accumulator
    q_block: int = Q_BLOCK
    k_block: int | None = None  # None: kv_tile(D)
    # head dims above this sum P V in one level whatever two_level says (64: the kernel's bucket
    # 128 built with FK_FP8_SINGLE_LEVEL_D128=1, bucket 64 two-level); None: two_level everywhere
    one_level_above: int | None = None
    # V's mean over the keys (per head and channel) subtracted before its e4m3 rounding and added
    # back to the output (softmax's weights sum to one): P V then sums values centred on zero,
    # which the FP8 accumulator keeps far better than a sum that grows with Nk. Not in the kernel.
    smooth_v: bool = False
    # two-level: the FP8 accumulator carries P V across this many K/V tiles (rescaled with O when
    # a row maximum moves) before it is added into the float32 O; 1: a fresh accumulator a tile
    flush_tiles: int = 1
    # each row's sum of P: "fp32", P unrounded summed in float32 (a softmax's FADDs); "mma", P as
    # rounded summed by the tensor core beside P V (V with a column of ones), in P V's accumulator
    rowsum: str = "fp32"

    def two_level_at(self, head_dim: int) -> bool:
        """Whether P V is summed two-level at this head dim."""
        return self.two_level and (self.one_level_above is None or head_dim <= self.one_level_above)

    def describe(self) -> str:
        return (f"{self.name}: Q K^T {self.qk}{' (K smoothed)' if self.smooth_k else ''}, "
                f"P V {self.pv}, {self.accumulator} accumulator"
                f"{', two-level' if self.two_level else ''}"
                f"{f' (one level above head dim {self.one_level_above})' if self.two_level and self.one_level_above else ''}"
                f"{f', added into O every {self.flush_tiles} tiles' if self.flush_tiles > 1 else ''}"
                f"{', V smoothed' if self.smooth_v else ''}"
                f"{', row sums in the tensor core' if self.rowsum == 'mma' else ''}")


SCHEMES = {
    "int8-smooth": Scheme("int8-smooth", "int8", True, "e4m3", "fp22", True),
    "e4m3": Scheme("e4m3", "e4m3", False, "e4m3", "fp22", False),
    "e4m3-smooth": Scheme("e4m3-smooth", "e4m3", True, "e4m3", "fp22", False),
    "unquantized": Scheme("unquantized", "none", False, "none", "fp32", True),
}
CHOSEN = SCHEMES["int8-smooth"]


class Fp8Unavailable(NotImplementedError):
    """precision="fp8" asked of a device this build has no FP8 kernel for."""


def _torch():
    import torch

    return torch


def fp22(x):
    """A float32 tensor with its lowest 10 mantissa bits cleared (truncation toward zero): the
    precision the FP8 tensor core keeps in its accumulator."""
    torch = _torch()
    bits = x.contiguous().view(torch.int32)
    return (bits & ~((1 << FP22_DROP_BITS) - 1)).view(torch.float32)


def scales_for(amax, qmax: float):
    """Per-block scales amax / qmax (float32); a block of zeros gets 1, never 0 (no 0/0)."""
    torch = _torch()
    amax = amax.to(torch.float32)
    return torch.where(amax > 0, amax / qmax, torch.ones_like(amax))


def to_e4m3(x):
    """x (already divided by its scale) rounded to float8_e4m3fn, saturated at +-448 as the
    kernel's cvt.satfinite does (a plain cast would make NaN past 448)."""
    torch = _torch()
    return x.to(torch.float32).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def to_int8(x):
    """x (already divided by its scale) rounded to nearest even, clamped to +-127, as int8."""
    torch = _torch()
    return torch.round(x.to(torch.float32)).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)


def quantize_blocks(x, rows: int, kind: str):
    """x (..., N, D) float32 -> (values, scales): one scale per `rows` consecutive rows (all D
    channels), values in `kind` ("int8" | "e4m3"); scales (..., ceil(N / rows)) float32.
    Dequantized: values.float() * scales repeated over each block's rows."""
    torch = _torch()
    n = x.shape[-2]
    nb = -(-n // rows)
    pad = nb * rows - n
    xp = torch.nn.functional.pad(x, (0, 0, 0, pad)) if pad else x
    amax = xp.reshape(*x.shape[:-2], nb, rows * x.shape[-1]).abs().amax(dim=-1)
    qmax = INT8_MAX if kind == "int8" else E4M3_MAX
    s = scales_for(amax, qmax)
    per_row = s.repeat_interleave(rows, dim=-1)[..., :n].unsqueeze(-1)
    scaled = x / per_row
    return (to_int8(scaled) if kind == "int8" else to_e4m3(scaled)), s


def _mma(a, b, accumulator: str, acc=None):
    """a @ b^T of quantized operands (float64 holding their exact values: every product sum
    here is exact in float64), accumulated as the tensor core would: `fp32` rounds the exact sum
    once; `fp22` adds k=32 slices one at a time into an accumulator truncated after each add."""
    torch = _torch()
    if accumulator == "fp32":
        out = (a @ b.transpose(-1, -2)).to(torch.float32)
        return out if acc is None else acc + out
    depth = a.shape[-1]
    run = acc if acc is not None else torch.zeros(*a.shape[:-1], b.shape[-2], dtype=torch.float32)
    for k0 in range(0, depth, MMA_K):
        part = a[..., k0:k0 + MMA_K] @ b[..., k0:k0 + MMA_K].transpose(-1, -2)
        run = fp22((run.double() + part).to(torch.float32))
    return run


def reference(q, k, v, scale: float | None = None, scheme: Scheme = CHOSEN, return_lse: bool = False):
    """FP8 attention of (B, H, N, D) tensors (any float dtype; computed from their float32
    values) with `scheme`'s numerics. Returns float32 (B, H, Nq, D) and, with return_lse, the
    float32 (B, H, Nq) natural-log log-sum-exp of the scores the kernel saw."""
    torch = _torch()
    q = q.to(torch.float32)
    k = k.to(torch.float32)
    v = v.to(torch.float32)
    nq, d = q.shape[-2], q.shape[-1]
    nk = k.shape[-2]
    sm_scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    kb = scheme.k_block or kv_tile(d)

    shift = None
    if scheme.smooth_k:
        k_mean = k.mean(dim=-2, keepdim=True)
        k = k - k_mean
        # every score of a row moved by scale * q . mean(K): softmax does not see it, the lse does
        shift = (q @ k_mean.transpose(-1, -2)) * sm_scale
    if scheme.qk == "none":
        qv, sq = q.double(), torch.ones(*q.shape[:-2], 1, dtype=torch.float32)
        kv_, sk = k.double(), torch.ones(*k.shape[:-2], -(-nk // kb), dtype=torch.float32)
        q_rows = torch.ones(*q.shape[:-1], 1, dtype=torch.float32)
    else:
        qv, sq = quantize_blocks(q, scheme.q_block, scheme.qk)
        kv_, sk = quantize_blocks(k, kb, scheme.qk)
        qv, kv_ = qv.double(), kv_.double()
        q_rows = sq.repeat_interleave(scheme.q_block, dim=-1)[..., :nq].unsqueeze(-1)
    v_mean = None
    if scheme.smooth_v:
        v_mean = v.mean(dim=-2, keepdim=True)
        v = v - v_mean
    if scheme.pv == "none":
        vv, sv = v.double(), torch.ones(*v.shape[:-2], 1, d, dtype=torch.float32)
    else:
        sv = scales_for(v.abs().amax(dim=-2, keepdim=True), E4M3_MAX)  # per channel
        vv = to_e4m3(v / sv).double()
    p_scale = P_SCALE if scheme.pv == "e4m3" else 1.0
    # the QK^T accumulator: exact int32 for INT8, else the FP8 tensor core's
    qk_acc = "fp32" if scheme.qk in ("int8", "none") else scheme.accumulator

    lead = q.shape[:-2]
    # rowsum "mma": V^T gains a row of ones, so O's column d is l (times p_scale), summed as P V is
    mma_rows = scheme.rowsum == "mma" and scheme.pv == "e4m3"
    m = torch.full((*lead, nq, 1), -math.inf, dtype=torch.float32)
    l = torch.zeros((*lead, nq, 1), dtype=torch.float32)
    o = torch.zeros((*lead, nq, d + mma_rows), dtype=torch.float32)
    run = None  # the FP8 accumulator of the current group of tiles
    for t, k0 in enumerate(range(0, nk, kb)):
        acc = _mma(qv, kv_[..., k0:k0 + kb, :], qk_acc)
        s = acc * (q_rows * (sk[..., t:t + 1].unsqueeze(-1) * sm_scale))
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        alpha = torch.exp(m - m_new)
        p = torch.exp(s - m_new)
        if not mma_rows:
            l = l * alpha + p.sum(dim=-1, keepdim=True)
        pq = (to_e4m3(p * p_scale) if scheme.pv == "e4m3" else p).double()
        vt = vv[..., k0:k0 + kb, :].transpose(-1, -2)
        if mma_rows:
            vt = torch.cat([vt, torch.ones_like(vt[..., :1, :])], dim=-2)
        if scheme.pv == "none" or scheme.accumulator == "fp32":
            o = o * alpha + (pq @ vt.transpose(-1, -2)).to(torch.float32)
        elif scheme.two_level_at(d):
            group = scheme.flush_tiles
            run = _mma(pq, vt, "fp22", acc=None if t % group == 0 else run * alpha)
            o = o * alpha
            if t % group == group - 1 or k0 + kb >= nk:  # a group's last tile, or Nk's
                o = o + run
        else:
            o = _mma(pq, vt, "fp22", acc=o * alpha)
        m = m_new
    if mma_rows:
        o, l = o[..., :d], o[..., d:] / p_scale
    out = o / (l * p_scale) * sv
    if v_mean is not None:
        out = out + v_mean
    if return_lse:
        lse = m + torch.log(l)
        return out, (lse if shift is None else lse + shift).squeeze(-1)
    return out


def check_device(device, library=None):
    """Refuse precision="fp8" where there is no FP8 kernel: no silent fallback to exact attention.
    CPU runs the reference numerics; CUDA runs the library's FP8 kernel where it has one (an sm_90a
    library on a cc 9.0 device; the library refuses what else it cannot run, such as head dims past
    128); every other device is refused. Returns the library that runs it on CUDA (None on CPU)."""
    kind = getattr(device, "type", None) or str(device).split(":", 1)[0]
    if kind == "cpu":
        return None
    if kind == "cuda":
        why, lib = _gpu_refusal(device, library)
        if why is None:
            return lib
        raise Fp8Unavailable(f"precision='fp8' is not available on {device}: {why}; the FP8 kernel needs "
                             f"an sm_90a library on an NVIDIA cc 9.0 device (use precision='exact' on "
                             f"this device)")
    raise Fp8Unavailable(
        f"precision='fp8' is not available on {device}: the FP8 kernel needs FP8 tensor cores "
        f"(an sm_90a library on an NVIDIA cc 9.0 device) and is not in this build; only the CPU "
        f"reference runs fp8 elsewhere (use precision='exact' on this device)")


def _gpu_refusal(device, library) -> tuple[str | None, object]:
    """(why the FP8 kernel cannot run on CUDA `device` with `library` (None: ours for the device),
    or None; the library looked up)."""
    torch = _torch()
    from flash_kernel import _binding  # the package's lookup, handed to the binding at import

    if not torch.cuda.is_available():
        return "CUDA is not available to torch here", None
    try:
        lib = library if library is not None else _binding.library_lookup(torch.device(device))
    except _binding.KernelError as exc:
        return str(exc), None
    if lib.target != "sm_90a":
        return f"the FP8 kernel is in sm_90a libraries only (this one is {lib.target})", lib
    cc = torch.cuda.get_device_capability(torch.device(device))
    if tuple(cc) != (9, 0):
        return f"the FP8 kernel needs a cc 9.0 device (Hopper), this one is cc {cc[0]}.{cc[1]}", lib
    return None, lib


def attention(q, k, v, scale=None, layout: str = "bhnd", return_lse: bool = False,
              scheme: Scheme = CHOSEN, library=None):
    """The public precision="fp8" call: tensors of one float dtype in `layout` (bhnd or bnhd),
    output in that dtype and layout (lse float32 (B, H, Nq)). CPU tensors run `reference` with
    `scheme`; CUDA tensors the FP8 kernel of `library` (None: ours for the device), whose numerics
    are CHOSEN's."""
    torch = _torch()
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    lib = check_device(q.device, library)  # CUDA: the library whose kernel runs it
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
    dtypes = {q.dtype, k.dtype, v.dtype}
    if len(dtypes) != 1 or q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"precision='fp8' takes float16, bfloat16 or float32 inputs of one dtype, "
                        f"not {', '.join(sorted(str(d) for d in dtypes))}")
    if layout not in ("bhnd", "bnhd"):
        raise ValueError(f"layout must be 'bhnd' or 'bnhd', not {layout!r}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k and v must be 4-D")
    if layout == "bnhd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    b, h, nq, d = q.shape
    if k.shape[:2] != (b, h) or v.shape[:2] != (b, h) or k.shape[-1] != d or v.shape[-1] != d \
            or k.shape[2] != v.shape[2] or k.shape[2] == 0 or nq == 0:
        raise ValueError(f"shapes do not match: q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)} (as (B, H, N, D))")
    if scale is not None and not (isinstance(scale, (int, float)) and not isinstance(scale, bool)
                                  and math.isfinite(scale) and scale > 0):
        # as the exact call: None means 1/sqrt(D), anything else a positive finite number
        raise ValueError(f"scale must be positive and finite, not {scale!r} (None means 1/sqrt(D))")
    if q.device.type == "cuda":
        if scheme != CHOSEN:
            raise ValueError(f"the FP8 kernel runs {CHOSEN.name} only, not {scheme.name}")
        return _kernel(q, k, v, scale, layout, return_lse, lib)
    with torch.no_grad():
        res = reference(q, k, v, scale, scheme, return_lse)
    out, lse = res if return_lse else (res, None)
    out = out.to(q.dtype)
    if layout == "bnhd":  # out and lse dense in q's layout, as the exact path returns them
        out = out.transpose(1, 2).contiguous()
        if lse is not None:
            lse = lse.transpose(1, 2).contiguous().transpose(1, 2)
    return (out, lse) if return_lse else out


def _kernel(q, k, v, scale, layout, return_lse, lib):
    """`lib`'s FP8 kernel on (B, H, N, D) views of the caller's tensors; its refusals (a head dim
    or build without the kernel) are Fp8Unavailable."""
    from flash_kernel import _binding

    if layout == "bnhd":  # the checks above took (B, H, N, D) views; the kernel takes the caller's
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    try:
        return lib.fp8_attention(q, k, v, scale, layout, return_lse)
    except _binding.KernelError as exc:
        if exc.status in (_binding.FK_ERR_PRECISION, _binding.FK_ERR_HEAD_DIM):
            raise Fp8Unavailable(f"precision='fp8' is not available for this call: {exc}") from None
        raise


DIT_K_OFFSET = 5.0  # std of the constant offset per K channel
DIT_Q_ROW_EVERY, DIT_Q_ROW_FACTOR = 16, 10.0  # every 16th query row 10x the rest


def dit_shaped_inputs(b: int, h: int, nq: int, nk: int, d: int, generator, dtype=None, device="cpu"):
    """(B, H, N, D) q, k, v shaped like DiT activations (as SageAttention documents them): K with
    a constant offset per head channel (N(0, 5^2), the same for every key), every 16th query row
    10x larger than the rest; otherwise N(0, 1). Generated in float32, returned in `dtype`."""
    torch = _torch()
    q = torch.randn(b, h, nq, d, generator=generator, device=device)
    k = torch.randn(b, h, nk, d, generator=generator, device=device)
    k = k + DIT_K_OFFSET * torch.randn(b, h, 1, d, generator=generator, device=device)
    v = torch.randn(b, h, nk, d, generator=generator, device=device)
    q[:, :, ::DIT_Q_ROW_EVERY] *= DIT_Q_ROW_FACTOR
    dtype = dtype or torch.bfloat16
    return q.to(dtype), k.to(dtype), v.to(dtype)


def with_blocks(scheme: Scheme, q_block: int | None = None, k_block: int | None = None) -> Scheme:
    """`scheme` with other block sizes (the measurement sweeps them)."""
    return replace(scheme, q_block=q_block or scheme.q_block, k_block=k_block or scheme.k_block)
