"""Host cost of one attention call: ours (public call, loaded library, registered op) beside
PyTorch's SDPA backends, at shapes short enough that the host, not the GPU, sets the pace.

For each method and shape, two figures per call:
  wall    wall-clock time of N back-to-back eager calls, divided by N (synchronised at both ends):
          what a host-bound loop pays per call;
  device  the same call replayed from a CUDA graph (no host work per call), CUDA-event time / N:
          the kernel's own time.
host = wall - device is what the call costs beyond its kernel. Methods take turns round by round
(ABAB...), and each figure is the median over rounds.

    python3 bench/host_overhead.py --build build            # needs a CUDA GPU and a built library
    python3 bench/host_overhead.py --shapes 1,1,128,64 1,24,4608,128 --calls 200 --rounds 15
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def parse_shape(text: str) -> tuple[int, int, int, int]:
    parts = tuple(int(x) for x in text.split(","))
    if len(parts) != 4:
        raise argparse.ArgumentTypeError(f"shape {text!r}: want B,H,N,D")
    return parts


def methods(torch, flash_kernel, lib):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    F = torch.nn.functional
    path = lib.path

    def sdpa(backend):
        def call(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v)
        return call

    return [
        ("ours: flash_kernel.attention", lambda q, k, v: flash_kernel.attention(q, k, v)),
        ("ours: load(path).attention", lambda q, k, v: lib.attention(q, k, v)),
        ("ours: torch.ops op", lambda q, k, v: torch.ops.flash_kernel.attention(q, k, v, 0.0, "bhnd", path)),
        ("sdpa (default)", lambda q, k, v: F.scaled_dot_product_attention(q, k, v)),
        ("sdpa cuDNN (in context)", sdpa(SDPBackend.CUDNN_ATTENTION)),
        ("sdpa flash (in context)", sdpa(SDPBackend.FLASH_ATTENTION)),
    ]


def breakdown(torch, flash_kernel, lib, shape, dtype, calls: int) -> list[tuple[str, float]]:
    """Host time of each step of the public call, alone, in a loop (us per step): where it goes."""
    from flash_kernel import _binding as B

    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(3))
    o = torch.empty_like(q)
    api = B._torch_api()

    def filled(q, k, v):
        a = B.fill_args(q, k, v, o, "bhnd", 0.0, None)
        a.stream = api.raw_stream(q.device.index or 0)
        return a

    args = filled(q, k, v)
    # four sets of tensors in turn: 12 tensor maps, more than the library keeps, so every call encodes three
    sets = [filled(*(torch.randn(shape, device="cuda", dtype=dtype) for _ in range(3))) for _ in range(4)]
    turn = iter(range(1 << 62))
    fn = lib._forwards[0]

    def key():
        return (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype,
                q.device, k.device, v.device, "bhnd", None, None)

    last = key()  # equal, other objects: what the public call compares against

    def args_of_call():
        a = B._copy_args(args)
        B._pack_pointers(a, B._POINTERS_AT, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr())
        a.scale = 0.0
        return a

    def idle(call):  # the GPU idle when the call starts (as in a host-bound loop), the call alone timed
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        return time.perf_counter() - t0

    steps = [
        ("library_for(device) (first calls only)", lambda: flash_kernel.library_for(q.device)),
        ("input key, compared with the last", lambda: key() == last),
        ("output: empty_like(q) (as called)", lambda: torch.empty_like(q)),
        ("output: empty_like, contiguous_format", lambda: torch.empty_like(q, memory_format=torch.contiguous_format)),
        ("args copy + 4 data_ptr + scale", args_of_call),
        ("current stream + device", lambda: (api.raw_stream(0), api.current_device())),
        ("full checks (first call of a kind)", lambda: B.check_inputs(q, k, v, "bhnd", lib.head_dims)),
        ("C call (validate, maps cached, launch)", lambda: fn(args)),
        ("C call, 3 maps encoded (new tensors)", lambda: fn(sets[next(turn) % 4])),
    ]
    out = []
    for name, step in steps:
        for _ in range(50):
            step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            step()
        out.append((name, (time.perf_counter() - t0) / calls))
        torch.cuda.synchronize()
    for name, call in (("C call, GPU idle at the call (median)", lambda: fn(args)),
                       ("public call, GPU idle at the call (median)", lambda: flash_kernel.attention(q, k, v))):
        out.append((name, statistics.median(idle(call) for _ in range(calls))))
    return out


def wall_per_call(torch, fn, args, calls: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls


def graph_of(torch, fn, args, calls: int):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(*args)  # warm-up outside the capture (allocator, lazy init)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn(*args)
    return g


def device_per_call(torch, graph, calls: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / calls


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.environ.get("FLASH_KERNEL_BUILD", "build"),
                    help="build folder holding <target>/libflash_kernel.so (FLASH_KERNEL_BUILD)")
    ap.add_argument("--shapes", nargs="+", type=parse_shape,
                    default=[(1, 1, 128, 64), (1, 8, 512, 128), (1, 24, 4608, 128)])
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--calls", type=int, default=200, help="calls per timed loop")
    ap.add_argument("--rounds", type=int, default=11, help="rounds of every method in turn")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("host_overhead: needs a CUDA GPU", file=sys.stderr)
        return 2
    os.environ["FLASH_KERNEL_BUILD"] = args.build
    import flash_kernel

    lib = flash_kernel.library_for("cuda")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    print(f"library {lib.target} ({lib.flash_path}) {lib.path}; {torch.cuda.get_device_name()}; "
          f"torch {torch.__version__}; {args.calls} calls x {args.rounds} rounds, medians")
    rows = []
    for shape in args.shapes:
        q, k, v = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(3))
        table = methods(torch, flash_kernel, lib)
        graphs, walls = {}, {name: [] for name, _ in table}
        for name, fn in table:
            try:
                graphs[name] = graph_of(torch, fn, (q, k, v), args.calls)
            except Exception as exc:  # a backend that refuses the shape or the capture
                graphs[name] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:60]}"
        for _ in range(args.rounds):
            for name, fn in table:
                if not isinstance(graphs[name], str):
                    walls[name].append(wall_per_call(torch, fn, (q, k, v), args.calls))
        for name, _ in table:
            g = graphs[name]
            if isinstance(g, str):
                rows.append((shape, name, None, None, g))
                continue
            dev = statistics.median(device_per_call(torch, g, args.calls) for _ in range(args.rounds))
            rows.append((shape, name, statistics.median(walls[name]), dev, ""))
        del graphs
    print(f"\nsteps of the public call at {args.shapes[0]}, alone (us each):")
    for name, t in breakdown(torch, flash_kernel, lib, args.shapes[0], dtype, args.calls):
        print(f"  {name:<42} {t * 1e6:7.1f}")
    print(f"\n{'shape (B,H,N,D)':<18} {'method':<30} {'wall us':>9} {'device us':>10} {'host us':>8}")
    for shape, name, wall, dev, note in rows:
        s = ",".join(map(str, shape))
        if wall is None:
            print(f"{s:<18} {name:<30} {'-':>9} {'-':>10} {'-':>8}  {note}")
        else:
            print(f"{s:<18} {name:<30} {wall * 1e6:9.1f} {dev * 1e6:10.1f} {max(wall - dev, 0) * 1e6:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
