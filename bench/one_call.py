"""Calls flash_kernel.attention on one shape a few times and exits: a program for a profiler
(`ncu -k regex:attention_kernel ...` for the FP8 kernel, `regex:flash_` for the exact ones) to
wrap, on the device machine.

    python3 bench/one_call.py 1,4,32760,128 [--precision fp8] [--dtype bf16] [--calls 3] [--lib PATH] [--kernels]

Inputs are random (B,H,N,D) tensors; every call is checked for errors (the binding raises) and
the output for finiteness and against PyTorch's SDPA (relative L2 at most 2e-2 exact, 1e-1 fp8),
so a profile of a failing kernel is never read as a result. --lib: a library file instead of the
public call's (a variant's smoke test before it is timed; under `timeout`, a hang is caught too).
--kernels: the calls under torch's profiler, then one line a GPU kernel (its mean time a call and
its share of the calls' GPU time): where an FP8 call's time goes between its quantization and its
attention, without ncu.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import flash_kernel  # noqa: E402
from kernel_bench import parse_shape  # noqa: E402  (this folder is on sys.path: a script's own)


def print_kernels(prof, calls: int) -> None:
    """One line a GPU kernel the profile saw: mean microseconds a call, share of the total."""
    rows = [(e.key, e.count, e.device_time_total) for e in prof.key_averages() if e.device_time_total > 0]
    total = sum(t for _, _, t in rows) or 1.0
    for name, count, t in sorted(rows, key=lambda r: -r[2]):
        print(f"kernel {t / calls:10.1f} us/call {100 * t / total:5.1f} %  x{count // calls}  {name[:90]}")
    print(f"kernel {total / calls:10.1f} us/call total")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shape", type=parse_shape, help="B,H,N,D or B,H,Nq,Nk,D")
    ap.add_argument("--precision", choices=("exact", "fp8"), default="exact")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--lib", help="a flash_kernel library file to call instead of the public call's")
    ap.add_argument("--kernels", action="store_true", help="time each GPU kernel of the calls (torch.profiler)")
    args = ap.parse_args(argv)
    b, h, nq, nk, d = args.shape
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    q = torch.randn(b, h, nq, d, device="cuda", dtype=dtype)
    k = torch.randn(b, h, nk, d, device="cuda", dtype=dtype)
    v = torch.randn(b, h, nk, d, device="cuda", dtype=dtype)
    if args.lib:
        lib = flash_kernel.load(args.lib)
        call = lib.fp8_attention if args.precision == "fp8" else lib.attention
    else:
        def call(q, k, v):
            return flash_kernel.attention(q, k, v, precision=args.precision)
    out = call(q, k, v)  # a warm-up call outside the profile (the first call's set-up)
    torch.cuda.synchronize()
    if args.kernels:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(args.calls):
                out = call(q, k, v)
            torch.cuda.synchronize()
        print_kernels(prof, args.calls)
    else:
        for _ in range(args.calls):
            out = call(q, k, v)
    torch.cuda.synchronize()
    if not torch.isfinite(out).all():
        print("error: non-finite output", file=sys.stderr)
        return 1
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    rel = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    if rel > (1e-1 if args.precision == "fp8" else 2e-2):
        print(f"error: relative L2 {rel:.3g} against SDPA", file=sys.stderr)
        return 1
    print(f"ok: {args.calls} calls at {b},{h},{nq},{nk},{d} {args.dtype} {args.precision}, relative L2 {rel:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
