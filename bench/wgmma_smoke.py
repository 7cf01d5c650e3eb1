"""Quick device check of one flash_kernel library: which path it takes, parity against float64 on
fresh random inputs (NaN-poisoned outputs, ragged shapes, both layouts, fp16/bf16, D 64/128), then
CUDA-event timing against SDPA's flash and cuDNN backends at two DiT shapes. A first look at a new
kernel before the full bench/device_kernel.sh run; prints a short table last.

    python3 bench/wgmma_smoke.py --lib build/x/sm_90a/libflash_kernel.so [--lib-b NAME=PATH ...]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import flash_kernel  # noqa: E402
from flash_kernel import _binding  # noqa: E402
from kernel_bench import sdpa, time_calls  # noqa: E402

TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}
SHAPES = [(1, 1, 128, 128), (2, 3, 77, 1000), (1, 2, 1000, 77), (2, 2, 1000, 1000), (1, 2, 4097, 4097), (2, 3, 1, 1)]


def parity(lib, dtype, d, layout, shape, gen) -> float:
    b, h, nq, nk = shape

    def t(n):
        x = torch.randn(b, h, n, d, generator=gen, device="cuda", dtype=torch.float32).to(dtype)
        return x if layout == "bhnd" else x.transpose(1, 2).contiguous()
    q, k, v = t(nq), t(nk), t(nk)
    o = torch.full_like(q, float("nan"))
    lib.run_into(q, k, v, o, _binding.resolve_scale(None, d), layout, False)
    torch.cuda.synchronize()
    if not torch.isfinite(o).all():
        return float("nan")
    qq, kk, vv = (x.double() if layout == "bhnd" else x.transpose(1, 2).double() for x in (q, k, v))
    ref = torch.softmax(qq @ kk.transpose(-1, -2) / math.sqrt(d), dim=-1) @ vv
    oo = o.double() if layout == "bhnd" else o.transpose(1, 2).double()
    return (torch.linalg.vector_norm(oo - ref) / torch.linalg.vector_norm(ref)).item()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--other", action="append", default=[], help="NAME=PATH: more libraries to time beside it")
    ap.add_argument("--shapes", default="1,12,32760,128 1,30,17776,64")
    ap.add_argument("--no-parity", action="store_true")
    a = ap.parse_args()
    lib = flash_kernel.load(a.lib)
    print(f"library {a.lib}: target {lib.target}, flash path {lib.flash_path}")
    gen = torch.Generator(device="cuda")
    gen.seed()
    print(f"seed {gen.initial_seed()}")
    bad = 0
    if not a.no_parity:
        for dtype in (torch.bfloat16, torch.float16):
            for d in (64, 128):
                for layout in ("bhnd", "bnhd"):
                    for shape in SHAPES:
                        err = parity(lib, dtype, d, layout, shape, gen)
                        ok = err <= TOL[dtype]
                        bad += not ok
                        if not ok:
                            print(f"PARITY FAIL {dtype} d={d} {layout} {shape}: relL2 {err:.3g}")
        print(f"parity: {bad} failures")
    libs = [("ours", lib)] + [(n, flash_kernel.load(p)) for n, p in (x.split("=", 1) for x in a.other)]
    rows = []
    for s in a.shapes.split():
        b, h, n, d = map(int, s.split(","))
        flops = 4 * b * h * n * n * d
        ins = [tuple(torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)) for _ in range(3)]
        methods = [(nm, (lambda L: lambda q, k, v: L.attention(q, k, v))(L)) for nm, L in libs]
        methods += [("sdpa_flash", sdpa(torch.nn.attention.SDPBackend.FLASH_ATTENTION)),
                    ("sdpa_cudnn", sdpa(torch.nn.attention.SDPBackend.CUDNN_ATTENTION))]
        ref = methods[-2][1](*ins[0]).float()
        res = {}
        for nm, fn in methods:
            out = fn(*ins[0]).float()
            err = (torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref)).item()
            ms = statistics.median(time_calls(fn, ins, 3, 10))
            res[nm] = ms
            rows.append((s, nm, ms, flops / ms / 1e9, err))
        for r in rows[-len(methods):]:
            print(f"{r[0]:>18} {r[1]:>12} {r[2]:8.3f} ms {r[3]:6.0f} TF/s  x flash {res['sdpa_flash'] / r[2]:.2f}"
                  f"  x cudnn {res['sdpa_cudnn'] / r[2]:.2f}  relL2 {r[4]:.1e}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
