#!/usr/bin/env python3
"""Tuning variants of the kernel against a float64 reference, before they are timed.

Each LABEL=PATH library runs every head dim of --dims in fp16 and bf16, in both layouts, on fresh
random inputs with NaN-poisoned outputs, and must match softmax(Q K^T / sqrt(d)) V in float64 within
the GPU tests' tolerances and report the expected flash path. One line per library:
`LABEL: ok (worst rel L2 / tolerance 0.23)` or `LABEL: FAIL (...) <the first failures>`; exit 1 if
any failed. The device runs `variants` and `wide` (bench/device.sh) run it.

    python3 bench/check_variants.py --dims 64,72,128 --cases many default=build/sm_90a/libflash_kernel.so v1=...
    python3 bench/check_variants.py --dims 136-256/8 --cases ragged ...
    python3 bench/check_variants.py --device cpu --path generic --dims 72 cpu=build/cpu/libflash_kernel.so
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TOL = {"fp16": 2e-3, "bf16": 1e-2}  # relative L2, as tests/test_kernel_gpu.py


def head_dims(spec: str) -> list[int]:
    """'64,72,128' or '136-256/8' (first-last/step)."""
    if "-" in spec:
        span, _, step = spec.partition("/")
        first, _, last = span.partition("-")
        return list(range(int(first), int(last) + 1, int(step or 8)))
    return [int(d) for d in spec.split(",") if d]


def cases(kind: str, units: int) -> list[tuple[str, tuple[int, int, int, int]]]:
    """(layout, (B, H, Nq, Nk)). many: more work items than the device has SMs (`units`), ragged
    tiles, long Nk; ragged: one short-long and one long-short shape."""
    if kind == "many":
        return [("bhnd", (1, units + 7, 300, 1000)), ("bnhd", (1, units + 1, 256, 512)),
                ("bhnd", (2, units + 3, 129, 100)), ("bnhd", (1, 3, 333, 4099)), ("bhnd", (1, 2, 1000, 9000))]
    return [("bhnd", (2, 3, 77, 1000)), ("bnhd", (1, 2, 1000, 333))]


def check(lib, dims, shapes, device, want_path, gen, torch, binding) -> tuple[float, list[str]]:
    worst, bad = 0.0, []
    for d in dims:
        for name, dt in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
            for layout, (b, h, nq, nk) in shapes:
                def draw(n):
                    x = torch.randn(b, h, n, d, generator=gen, device=device).to(dt)
                    return x if layout == "bhnd" else x.transpose(1, 2).contiguous()
                q, k, v = draw(nq), draw(nk), draw(nk)
                o = torch.full_like(q, float("nan"))
                lib.run_into(q, k, v, o, binding.resolve_scale(None, d), layout, False)
                if device == "cuda":
                    torch.cuda.synchronize()
                path = lib.last_flash_path()
                qq, kk, vv = ((x if layout == "bhnd" else x.transpose(1, 2)).double() for x in (q, k, v))
                ref = torch.softmax(qq @ kk.transpose(-1, -2) / math.sqrt(d), -1) @ vv
                oo = (o if layout == "bhnd" else o.transpose(1, 2)).double()
                err = ((torch.linalg.vector_norm(oo - ref) / torch.linalg.vector_norm(ref)).item()
                       if torch.isfinite(oo).all() else math.inf)
                worst = max(worst, err / TOL[name])
                if err > TOL[name] or path != want_path:
                    bad.append(f"d{d} {dt} {layout} {(b, h, nq, nk)} err {err:.3g} path {path}")
    return worst, bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("libs", nargs="+", metavar="LABEL=PATH")
    ap.add_argument("--dims", required=True, help="head dims: 64,72,128 or 136-256/8")
    ap.add_argument("--cases", choices=("many", "ragged"), default="ragged")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--path", default="wgmma", help="the flash path every call must report [wgmma]")
    a = ap.parse_args(argv)
    import torch

    import flash_kernel
    from flash_kernel import _binding

    gen = torch.Generator(device=a.device)
    gen.seed()
    print("seed", gen.initial_seed())
    units = torch.cuda.get_device_properties(0).multi_processor_count if a.device == "cuda" else 4
    shapes = cases(a.cases, units)
    failed = False
    for spec in a.libs:
        label, _, path = spec.partition("=")
        worst, bad = check(flash_kernel.load(path), head_dims(a.dims), shapes, a.device, a.path, gen, torch,
                           _binding)
        failed |= bool(bad)
        print(f"{label}: {'ok' if not bad else 'FAIL'} (worst rel L2 / tolerance {worst:.2f}) {'; '.join(bad[:4])}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
