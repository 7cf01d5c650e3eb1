"""FlashAttention-4 as an optional A/B baseline of `bench --backend fa4`.

FlashAttention-4 (the `flash-attn-4` package, imported as `flash_attn.cute`, kernels written in
NVIDIA's CuTe DSL and compiled on first call) is the strongest public Hopper attention forward a
user can install. It is not sovereign: a third-party attention library, and one the default policy
denies. It is timed only where it imports, the device is CUDA and the dtype is fp16/bf16; anywhere
else `bench` keeps a skipped row saying why, so a table shows what was compared and what was not.
"""

from __future__ import annotations

import functools
from typing import Callable

from audit.evidence.backend_names import FA4 as NAME

DTYPES = ("fp16", "bf16")


@functools.lru_cache(maxsize=1)
def _load() -> tuple[Callable | None, str]:
    """(flash_attn_func, its distribution and version) or (None, why not). Imported once: the CuTe
    DSL takes seconds to import."""
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as exc:  # not installed, or its CUDA pieces do not load here
        detail = " ".join(str(exc).split())[:200]
        return None, f"flash_attn.cute does not import ({type(exc).__name__}: {detail})"
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("flash-attn-4", "fa4", "flash-attn"):
        try:
            return flash_attn_func, f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return flash_attn_func, "flash_attn.cute (version unknown)"


def unavailable(device: str, dtype: str) -> str | None:
    """Why FlashAttention-4 cannot be timed here, or None when it can."""
    if device != "cuda":
        return f"FlashAttention-4 runs on CUDA GPUs only (device {device})"
    if dtype not in DTYPES:
        return f"FlashAttention-4 takes fp16 and bf16 only (dtype {dtype})"
    fn, why = _load()
    return None if fn is not None else f"not installed: {why}; pip install flash-attn-4"


def about() -> str:
    return (f"FlashAttention-4 forward ({_load()[1]}), flash_attn.cute.flash_attn_func on "
            "(B,N,H,D) views of the same inputs (A/B, not sovereign)")


def attention(q, k, v, scale=None):
    """softmax(scale Q K^T) V on (B,H,N,D) tensors through FlashAttention-4, which takes (B,N,H,D):
    the transposed views are passed as they are (no copy; a (B,N,H,D)-stored input, bench's
    --layout bnhd, is contiguous there), and the output is returned as a (B,H,N,D) view."""
    fn, why = _load()
    if fn is None:
        raise RuntimeError(why)
    out = fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=scale)
    if isinstance(out, tuple):  # (out, lse) in the versions that return both
        out = out[0]
    return out.transpose(1, 2)
