"""Time flash_kernel's GPU paths side by side with PyTorch's attention on one CUDA device.

Run on the device machine (`bench/device.sh kernel` does). For each shape (B,H,N,D or B,H,Nq,Nk,D,
or --preset NAME|GROUP of audit/evidence/presets.py, e.g. --preset dit for the diffusion-transformer
table) in one process: ours through the public call flash_kernel.attention as users call it
(method "ours"; --no-public to leave it out), any library variants (--lib NAME=PATH, flash
forward; "variant NAME at" lines give ours' median over each one's), our forced-generic path and
our naive path (--generic-lib / --naive-lib), SDPA's flash and cuDNN backends, torch eager
softmax(QK^T)V (head-chunked so its fp32 score matrix stays under --eager-gib), and
FlashAttention-4 where it imports (`--torch-methods ...,fa4`; an "x FA4" column). --layout bnhd
stores the inputs (B,N,H,D), as video DiTs and FlashAttention-4 hold them. Each row names the flash path the library ran (wgmma, mma_sync, generic) or
"refused" with the library's reason (a head dim it lacks): never a crash. Each method:
warm-up, then CUDA-event times of --repeats calls over --rotate input sets (so no call finds its
inputs in L2), the methods taking turns call by call (no method owns the start or end of a run),
median reported. FLOPs are 4*B*H*Nq*Nk*D. Also measures the two ceilings (a bf16
8192^3 matmul and a device-to-device copy) in the same process. Each output is compared with
SDPA-flash's (SDPA-math's in fp32 where SDPA-flash lacks the head dim; relative L2) so a fast
wrong kernel cannot hide. --lse adds "ours_lse", the public call with return_lse=True, and reports
its cost over "ours" (median of ours_lse / median of ours, with a 95 % interval: the log-sum-exp
should cost nothing measurable). --fp8 adds "ours_fp8", the public call at precision="fp8" (the
FP8 kernel, its quantization inside the timed call), and reports its speedup over "ours" (median of
ours / median of ours_fp8, 95 % interval); its relL2 is against SDPA's exact output, so it shows
the FP8 error, not a fault. Prints a table; --json writes all.
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


def parse_shape(s: str) -> tuple[int, int, int, int, int]:
    """B,H,N,D (self-attention) or B,H,Nq,Nk,D -> (B, H, Nq, Nk, D)."""
    try:
        parts = tuple(int(x) for x in s.split(","))
    except ValueError:
        parts = ()
    if len(parts) not in (4, 5) or min(parts) < 1:
        raise argparse.ArgumentTypeError(f"shape must be B,H,N,D or B,H,Nq,Nk,D with positive ints, got {s!r}")
    if len(parts) == 4:
        b, h, n, d = parts
        return b, h, n, n, d
    return parts  # type: ignore[return-value]


def preset_shapes(name: str) -> list[tuple[tuple[int, int, int, int, int], str]]:
    """A preset or group of audit/evidence/presets.py -> [((B,H,Nq,Nk,D), what it is)]."""
    from audit.errors import UsageError
    from audit.evidence.presets import about, expand_preset

    try:
        shapes = expand_preset(name)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    return [((s.batch, s.heads, s.nq, s.nk, s.head_dim), about(s)) for s in shapes]


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


def path_of(lib) -> str | None:
    """The flash path `lib`'s last call on this thread ran (None: the library cannot say)."""
    return lib.last_flash_path() if lib is not None else None


def make_inputs(shape, dtype, layout: str, sets: int, seed: int, device: str = "cuda") -> list[tuple]:
    """`sets` random (q, k, v) of (B,H,N,D) shape; stored (B,N,H,D) where layout is bnhd, as video
    DiTs and FlashAttention-4 hold them, and handed over as transposed views of that storage."""
    b, h, nq, nk, d = shape
    gen = torch.Generator(device=device).manual_seed(seed)

    def tensor(n):
        if layout == "bnhd":
            return torch.randn(b, n, h, d, device=device, dtype=dtype, generator=gen).transpose(1, 2)
        return torch.randn(b, h, n, d, device=device, dtype=dtype, generator=gen)
    return [(tensor(nq), tensor(nk), tensor(nk)) for _ in range(sets)]


def bench_shape(shape, dtype, methods, args, what: str = "") -> list[dict]:
    b, h, nq, nk, d = shape
    flops = 4 * b * h * nq * nk * d
    inputs = make_inputs(shape, dtype, args.layout, args.rotate, args.seed)
    try:
        ref = sdpa(torch.nn.attention.SDPBackend.FLASH_ATTENTION)(*inputs[0])
    except Exception:  # SDPA-flash lacks this head dim: the math backend in fp32 is the reference
        ref = sdpa(torch.nn.attention.SDPBackend.MATH)(*(x.float() for x in inputs[0]))
    rows, timed = [], []
    for name, fn, reps, dims, lib in methods:
        if dims and d not in dims:
            continue
        row = {"method": name, "shape": list(shape), "what": what, "dtype": str(dtype)}
        try:
            out = fn(*inputs[0])
            if lib is not None:
                row["path"] = path_of(lib)
            torch.cuda.synchronize()
            row["rel_l2_vs_reference"] = rel_l2(out, ref)
            del out
            timed.append((row, fn, reps))
        except Exception as exc:  # a refused backend is a row, not a crash
            status = getattr(exc, "status_name", None)
            row["error"] = " ".join(str(exc).split())[:300]
            if status and status not in ("FK_ERR_LAUNCH", "FK_ERR_NO_MEMORY"):
                row["path"] = "refused"
                row["error"] = f"{status}: {row['error']}"
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
            for key, other in (("x_sdpa_flash", "sdpa_flash"), ("x_sdpa_cudnn", "sdpa_cudnn"), ("x_eager", "eager"),
                               ("x_fa4", "fa4")):
                if other in base:
                    r[key] = base[other]["median_ms"] / r["median_ms"]
                    r[key + "_ci95"] = ratio_ci(base[other]["times_ms"], r["times_ms"])
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", type=parse_shape, action="append", help="B,H,N,D or B,H,Nq,Nk,D (repeatable)")
    ap.add_argument("--preset", type=preset_shapes, action="append", default=[],
                    help="a preset or group of sovereign-audit's presets (repeatable; `dit`: the "
                    "diffusion-transformer table)")
    ap.add_argument("--no-public", action="store_true",
                    help="leave out 'ours', the public call flash_kernel.attention")
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
                    help="comma list of baselines to time (sdpa_flash, sdpa_cudnn, eager, fa4: "
                    "FlashAttention-4's flash_attn.cute where it imports; '' for none)")
    ap.add_argument("--layout", choices=("bhnd", "bnhd"), default="bhnd",
                    help="how inputs are stored: bnhd = (B,N,H,D), as video DiTs and FlashAttention-4 "
                    "take them, passed to every method as strided (B,H,N,D) views")
    ap.add_argument("--lse", action="store_true",
                    help="also time the public call with return_lse=True ('ours_lse') and report its cost over 'ours'")
    ap.add_argument("--lib-fp8-only", action="store_true",
                    help="with --fp8: time the --lib variants at precision fp8 only (variants of the FP8 "
                    "kernel, whose exact path is ours)")
    ap.add_argument("--fp8", action="store_true",
                    help="also time the public call at precision='fp8' and report its speedup over 'ours'")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if (args.lse or args.fp8) and args.no_public:
        ap.error("--lse and --fp8 time the public call: they cannot go with --no-public")
    if args.repeats < 10:
        ap.error("--repeats must be >= 10 (median of at least ten)")
    if not torch.cuda.is_available():
        print("error: no CUDA device", file=sys.stderr)
        return 3
    shapes = [(s, "") for s in args.shape or []] + [x for group in args.preset for x in group]
    if not shapes:
        shapes = [((1, 12, 32760, 32760, 128), "Wan2.1-T2V-1.3B"), ((1, 30, 17776, 17776, 64), "CogVideoX-2B")]
    dtype = DTYPES[args.dtype]
    from torch.nn.attention import SDPBackend

    methods = []
    if not args.no_public:  # as users call it: the library for the device, resolved by the call
        try:
            public_lib = flash_kernel.library_for("cuda")
            methods.append(("ours", lambda q, k, v: flash_kernel.attention(q, k, v), args.repeats, set(),
                            public_lib))
            if args.lse:  # the same call asking for the log-sum-exp too; its output is compared as ours is
                methods.append(("ours_lse", lambda q, k, v: flash_kernel.attention(q, k, v, return_lse=True)[0],
                                args.repeats, set(), public_lib))
            if args.fp8:  # the opt-in FP8 kernel, quantization included in the timed call
                methods.append(("ours_fp8", lambda q, k, v: flash_kernel.attention(q, k, v, precision="fp8"),
                                args.repeats, set(), public_lib))
        except flash_kernel.KernelError as exc:  # the --lib methods still run
            print(f"warning: 'ours' left out, the public call finds no library: {exc}", file=sys.stderr)
    lib_names = []  # each --lib variant's method name, in order
    for spec in args.lib:
        label, _, path = spec.partition("=")
        name, _, dims = label.partition("@")
        lib_names.append(name)
        try:
            only = {int(x) for x in dims.split(",")} if dims else set()
        except ValueError:
            ap.error(f"--lib {spec!r}: head dims after @ must be integers")
        lib = flash_kernel.load(path)
        if not (args.fp8 and args.lib_fp8_only):
            methods.append((name, lib.attention, args.repeats, only, lib))
        if args.fp8:  # a variant's FP8 kernel beside ours_fp8 (its quantization inside the call too)
            methods.append((f"{name}_fp8", lambda q, k, v, lib=lib: lib.fp8_attention(q, k, v), args.repeats,
                            only, lib))
    baselines = {"sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION), "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
                 "eager": lambda q, k, v: eager(q, k, v, 1 / math.sqrt(q.shape[-1]), args.eager_gib * 2**30)}
    from audit.evidence import fa4

    baselines["fa4"] = fa4.attention
    for name in filter(None, args.torch_methods.split(",")):
        if name not in baselines:
            ap.error(f"unknown --torch-methods entry {name!r} (choose from {', '.join(baselines)})")
        why = fa4.unavailable("cuda", args.dtype) if name == "fa4" else None
        if why:  # an optional A/B: left out with its reason, the rest still timed
            print(f"warning: fa4 left out: {why}", file=sys.stderr)
            continue
        methods.append((name, baselines[name], args.repeats, set(), None))
    if args.generic_lib:
        lib = flash_kernel.load(args.generic_lib)
        methods.append(("ours_generic", lib.attention, args.slow_repeats, set(), lib))
    if args.naive_lib:
        methods.append(("ours_naive", flash_kernel.load(args.naive_lib).naive_attention, args.slow_repeats, set(), None))

    dev = torch.cuda.get_device_properties(0)
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": dev.name,
              "sms": dev.multi_processor_count, "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "ceilings": ceilings(), "rows": []}
    for shape, what in shapes:
        result["rows"] += bench_shape(shape, dtype, methods, args, what)
    if args.lse:
        result["lse_cost"] = pair_ratios(result["rows"], "ours_lse", "ours")
    if args.fp8:
        result["fp8_speedup"] = pair_ratios(result["rows"], "ours", "ours_fp8")
        # each variant's FP8 kernel against ours: its median time over ours_fp8's (below 1.0: faster)
        result["fp8_variants"] = {name: pair_ratios(result["rows"], f"{name}_fp8", "ours_fp8") for name in lib_names}
    # each --lib variant against ours, the public call: median of ours over the variant's (above
    # 1.0: the variant is faster)
    result["variants"] = {} if args.no_public else {name: pair_ratios(result["rows"], "ours", name) for name in lib_names}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    c = result["ceilings"]
    print(f"# {result['device']} torch {result['torch']} cudnn {result['cudnn']}  ceilings: bf16 matmul "
          f"{c['bf16_matmul_8192_tflops']:.0f} TFLOP/s, copy {c['copy_4gib_tb_s']:.2f} TB/s")
    print(render(result["rows"]))
    for c in result.get("lse_cost", []):
        lo, hi = c["ci95"]
        print(f"return_lse cost at {','.join(map(str, c['shape']))}: {c['ratio']:.3f}x the time without "
              f"[{lo:.3f}, {hi:.3f}]")
    for c in result.get("fp8_speedup", []):
        lo, hi = c["ci95"]
        print(f"fp8 speedup at {','.join(map(str, c['shape']))}: {c['ratio']:.3f}x ours (exact) "
              f"[{lo:.3f}, {hi:.3f}]")
    for name, ratios in result["variants"].items():
        for c in ratios:
            lo, hi = c["ci95"]
            print(f"variant {name} at {','.join(map(str, c['shape']))}: {c['ratio']:.3f}x ours "
                  f"[{lo:.3f}, {hi:.3f}]")
    for name, ratios in result.get("fp8_variants", {}).items():
        for c in ratios:
            lo, hi = c["ci95"]
            print(f"fp8 {name} at {','.join(map(str, c['shape']))}: {c['ratio']:.3f}x the time of ours_fp8 "
                  f"[{lo:.3f}, {hi:.3f}]")
    return 0


def pair_ratios(rows, num: str, den: str) -> list[dict]:
    """Per shape timed both ways: median time of method `num` / median of `den`, with its 95 %
    bootstrap interval, from the raw times the two took in turns (--lse: ours_lse / ours, 1.0 is
    no cost; --fp8: ours / ours_fp8, the FP8 kernel's speedup; NAME_fp8 / ours_fp8, a --lib
    variant's FP8 kernel against ours; ours / NAME, a --lib variant's speedup over ours)."""
    out = []
    by_shape: dict[tuple, dict] = {}
    for r in rows:
        if r["method"] in (num, den) and "times_ms" in r:
            by_shape.setdefault(tuple(r["shape"]), {})[r["method"]] = r
    for shape, pair in by_shape.items():
        if len(pair) == 2:
            a, b = pair[num]["times_ms"], pair[den]["times_ms"]
            out.append({"shape": list(shape), "ratio": statistics.median(a) / statistics.median(b),
                        "ci95": list(ratio_ci(a, b))})
    return out


def render(rows) -> str:
    """The table: per shape and method, the path, TFLOP/s, and the ratio over SDPA-flash and
    SDPA-cuDNN (median time of theirs / ours) with 95% bootstrap intervals."""
    nan = (float("nan"), float("nan"))
    out = [f"{'shape (B,H,Nq,Nk,D)':<24} {'what':<22} {'method':<14} {'path':<9} {'ms':>9} {'TFLOP/s':>8} "
           f"{'x SDPA-flash':>12} {'95% CI':>13} {'x cuDNN':>8} {'95% CI':>13} {'x FA4':>6} {'95% CI':>13} {'relL2':>9}"]
    for r in rows:
        s = ",".join(map(str, r["shape"]))
        head = f"{s:<24} {r.get('what', '')[:22]:<22} {r['method']:<14} {r.get('path') or '-':<9}"
        if "error" in r:
            out.append(f"{head} error: {r['error'][:100]}")
            continue
        fl, fh = r.get("x_sdpa_flash_ci95", nan)
        cl, ch = r.get("x_sdpa_cudnn_ci95", nan)
        al, ah = r.get("x_fa4_ci95", nan)
        out.append(f"{head} {r['median_ms']:9.3f} {r['tflops']:8.1f} "
                   f"{r.get('x_sdpa_flash', float('nan')):12.2f} {f'[{fl:.2f},{fh:.2f}]':>13} "
                   f"{r.get('x_sdpa_cudnn', float('nan')):8.2f} {f'[{cl:.2f},{ch:.2f}]':>13} "
                   f"{r.get('x_fa4', float('nan')):6.2f} {f'[{al:.2f},{ah:.2f}]':>13} "
                   f"{r['rel_l2_vs_reference']:9.2e}")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
