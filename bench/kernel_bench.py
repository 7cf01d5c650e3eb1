"""Time flash_kernel's GPU paths side by side with PyTorch's attention on one CUDA device.

Run on the device machine (bench/device_kernel.sh does). For each shape (B,H,N,D) in one process:
our mma.sync path and any tuning variants (--lib NAME=PATH, flash forward), our forced-generic path
and our naive path (--generic-lib / --naive-lib), SDPA's flash and cuDNN backends, and torch eager
softmax(QK^T)V (head-chunked so its fp32 score matrix stays under --eager-gib). Each method:
warm-up, then CUDA-event times of --repeats calls over --rotate input sets (so no call finds its
inputs in L2), the methods taking turns call by call (no method owns the start or end of a run),
median reported. FLOPs are 4*B*H*Nq*Nk*D. Also measures the two ceilings (a bf16
8192^3 matmul and a device-to-device copy) in the same process. Each output is compared with
SDPA-flash's (relative L2) so a fast wrong kernel cannot hide. Prints a table; --json writes all.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import flash_kernel  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def parse_shape(s: str) -> tuple[int, int, int, int]:
    parts = tuple(int(x) for x in s.split(","))
    if len(parts) != 4 or min(parts) < 1:
        raise argparse.ArgumentTypeError(f"shape must be B,H,N,D with positive ints, got {s!r}")
    return parts  # type: ignore[return-value]


def time_interleaved(fns, reps, inputs, warmup: int) -> list[list[float]]:
    """Milliseconds of each call of each fn (CUDA events), the methods taking turns: round i runs
    every fn with i < its repeats once, starting at a different one each round, so that clock or
    thermal drift and the position in a sequence fall on every method alike."""
    for fn in fns:
        for i in range(warmup):
            fn(*inputs[i % len(inputs)])
    torch.cuda.synchronize()
    times: list[list[float]] = [[] for _ in fns]
    for i in range(max(reps, default=0)):
        args = inputs[i % len(inputs)]
        for m in (i + x for x in range(len(fns))):
            m %= len(fns)
            if i >= reps[m]:
                continue
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fns[m](*args)
            b.record()
            b.synchronize()
            times[m].append(a.elapsed_time(b))
    return times


def ceilings(warmup: int = 3, repeats: int = 10) -> dict:
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    t = statistics.median(time_interleaved([lambda x, y: x @ y], [repeats], [(a, b)], warmup)[0])
    x = torch.randn(1 << 30, device="cuda", dtype=torch.float32)  # 4 GiB
    y = torch.empty_like(x)
    c = statistics.median(time_interleaved([lambda s, d: d.copy_(s)], [repeats], [(x, y)], warmup)[0])
    del a, b, x, y
    torch.cuda.empty_cache()
    return {"bf16_matmul_8192_tflops": 2 * n**3 / (t * 1e-3) / 1e12, "bf16_matmul_ms": t,
            "copy_4gib_tb_s": 2 * (1 << 32) / (c * 1e-3) / 1e12, "copy_ms": c}


def eager(q, k, v, scale, max_bytes):
    b, h, nq, _ = q.shape
    per_head = b * nq * k.shape[2] * 4
    step = max(1, int(max_bytes // per_head))
    out = torch.empty_like(q)
    for h0 in range(0, h, step):
        qs, ks, vs = q[:, h0:h0 + step], k[:, h0:h0 + step], v[:, h0:h0 + step]
        s = torch.matmul(qs, ks.transpose(-1, -2)).float() * scale
        out[:, h0:h0 + step] = torch.matmul(torch.softmax(s, dim=-1).to(q.dtype), vs)
        del s
    return out


def sdpa(backend):
    from torch.nn.attention import sdpa_kernel

    def fn(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v)
    return fn


def rel_l2(x, ref) -> float:
    if not torch.isfinite(x).all():
        return float("nan")
    return (torch.linalg.vector_norm((x.float() - ref.float())) / torch.linalg.vector_norm(ref.float())).item()


def ratio_ci(base: list[float], ours: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of median(base) / median(ours), each resampled on its own."""
    import random

    rng = random.Random(seed)
    draws = sorted(statistics.median(rng.choices(base, k=len(base))) /
                   statistics.median(rng.choices(ours, k=len(ours))) for _ in range(n))
    return draws[int(0.025 * n)], draws[int(0.975 * n) - 1]


def bench_shape(shape, dtype, methods, args) -> list[dict]:
    b, h, n, d = shape
    flops = 4 * b * h * n * n * d
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    inputs = [tuple(torch.randn(b, h, n, d, device="cuda", dtype=dtype, generator=gen) for _ in range(3))
              for _ in range(args.rotate)]
    ref = sdpa(torch.nn.attention.SDPBackend.FLASH_ATTENTION)(*inputs[0])
    rows, timed = [], []
    for name, fn, reps, dims in methods:
        if dims and d not in dims:
            continue
        row = {"method": name, "shape": list(shape), "dtype": str(dtype)}
        try:
            out = fn(*inputs[0])
            torch.cuda.synchronize()
            row["rel_l2_vs_sdpa_flash"] = rel_l2(out, ref)
            del out
            timed.append((row, fn, reps))
        except Exception as exc:  # a refused backend is a row, not a crash
            row["error"] = " ".join(str(exc).split())[:300]
        rows.append(row)
    torch.cuda.empty_cache()
    try:
        times = time_interleaved([t[1] for t in timed], [t[2] for t in timed], inputs, args.warmup)
    except Exception as exc:
        for row, _, _ in timed:
            row["error"] = "timing: " + " ".join(str(exc).split())[:290]
        return rows
    for (row, _, reps), ts in zip(timed, times):
        ms = statistics.median(ts)
        row.update({"median_ms": ms, "min_ms": min(ts), "max_ms": max(ts), "repeats": reps,
                    "tflops": flops / (ms * 1e-3) / 1e12, "times_ms": ts})  # raw: for CIs of ratios later
    base = {r["method"]: r for r in rows if "median_ms" in r}
    for r in rows:
        if "median_ms" in r:
            for key, other in (("x_sdpa_flash", "sdpa_flash"), ("x_sdpa_cudnn", "sdpa_cudnn"), ("x_eager", "eager")):
                if other in base:
                    r[key] = base[other]["median_ms"] / r["median_ms"]
                    r[key + "_ci95"] = ratio_ci(base[other]["times_ms"], r["times_ms"])
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", type=parse_shape, action="append", help="B,H,N,D (repeatable)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--lib", action="append", default=[], metavar="NAME[@D,...]=PATH",
                    help="a flash library to time (with @64 or @64,128: only at those head dims)")
    ap.add_argument("--generic-lib", help="the sm_90-generic build (timed as 'ours_generic')")
    ap.add_argument("--naive-lib", help="library whose naive path is timed as 'ours_naive'")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--slow-repeats", type=int, default=10, help="repeats for the naive and generic paths")
    ap.add_argument("--rotate", type=int, default=3, help="input sets cycled through")
    ap.add_argument("--eager-gib", type=float, default=16.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--torch-methods", default="sdpa_flash,sdpa_cudnn,eager",
                    help="comma list of PyTorch baselines to time (sdpa_flash, sdpa_cudnn, eager; '' for none)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.repeats < 10:
        ap.error("--repeats must be >= 10 (median of at least ten)")
    if not torch.cuda.is_available():
        print("error: no CUDA device", file=sys.stderr)
        return 3
    shapes = args.shape or [(1, 12, 32760, 128), (1, 30, 17776, 64)]
    dtype = DTYPES[args.dtype]
    from torch.nn.attention import SDPBackend

    methods = []
    for spec in args.lib:
        label, _, path = spec.partition("=")
        name, _, dims = label.partition("@")
        try:
            only = {int(x) for x in dims.split(",")} if dims else set()
        except ValueError:
            ap.error(f"--lib {spec!r}: head dims after @ must be integers")
        methods.append((name, flash_kernel.load(path).attention, args.repeats, only))
    baselines = {"sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION), "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
                 "eager": lambda q, k, v: eager(q, k, v, 1 / math.sqrt(q.shape[-1]), args.eager_gib * 2**30)}
    for name in filter(None, args.torch_methods.split(",")):
        if name not in baselines:
            ap.error(f"unknown --torch-methods entry {name!r} (choose from {', '.join(baselines)})")
        methods.append((name, baselines[name], args.repeats, set()))
    if args.generic_lib:
        methods.append(("ours_generic", flash_kernel.load(args.generic_lib).attention, args.slow_repeats, set()))
    if args.naive_lib:
        methods.append(("ours_naive", flash_kernel.load(args.naive_lib).naive_attention, args.slow_repeats, set()))

    dev = torch.cuda.get_device_properties(0)
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": dev.name,
              "sms": dev.multi_processor_count, "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "ceilings": ceilings(), "rows": []}
    for shape in shapes:
        result["rows"] += bench_shape(shape, dtype, methods, args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    c = result["ceilings"]
    print(f"# {result['device']} torch {result['torch']} cudnn {result['cudnn']}  ceilings: bf16 matmul "
          f"{c['bf16_matmul_8192_tflops']:.0f} TFLOP/s, copy {c['copy_4gib_tb_s']:.2f} TB/s")
    print(f"{'shape':<18} {'method':<14} {'ms':>9} {'TFLOP/s':>8} {'x flash':>8} {'95% CI':>13} {'x cuDNN':>8} {'relL2':>9}")
    for r in result["rows"]:
        s = ",".join(map(str, r["shape"]))
        if "error" in r:
            print(f"{s:<18} {r['method']:<14} error: {r['error'][:80]}")
            continue
        lo, hi = r.get("x_sdpa_flash_ci95", (float("nan"), float("nan")))
        print(f"{s:<18} {r['method']:<14} {r['median_ms']:9.2f} {r['tflops']:8.1f} "
              f"{r.get('x_sdpa_flash', float('nan')):8.2f} {f'[{lo:.2f},{hi:.2f}]':>13} "
              f"{r.get('x_sdpa_cudnn', float('nan')):8.2f} {r['rel_l2_vs_sdpa_flash']:9.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
