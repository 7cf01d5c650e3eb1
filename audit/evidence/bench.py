"""`bench`: op timing of the selected kernel against our naive path, torch eager and (the vendor
A/B, not sovereign) PyTorch SDPA's flash, cuDNN and efficient backends; on request
(`--backend fa4`), FlashAttention-4 where it is installed.

Method: CUDA events on the GPU (perf_counter with nothing pending on the CPU); warm-up calls;
several input sets rotated so a cache does not hold what is timed; the order of backends rotates
every repeat (interleaved); raw samples kept; speedups as ratios of medians with seeded bootstrap
95% CIs. A backend that is out of memory or unsupported is skipped with its reason; a shape our
library refuses (a head dim it lacks) is a "refused" row with the library's reason, and the
other backends still run on it.

Our library is timed through the public call `flash_kernel.attention`, as users call it, when
that call resolves to the selected library (the default build for the device); otherwise (an
explicit --lib or --target the public call would not pick) through the loaded library object.
Each shape records the flash path the library's dispatch ran (wgmma, mma_sync, generic, cpu),
read back from the library after the calls.
"""

from __future__ import annotations

import datetime as _dt
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable

from audit.errors import UsageError
from audit.evidence import fa4
from audit.evidence import metrics as M
from audit.evidence.backend_names import BACKEND_NAMES, DEFAULT_BACKENDS, SDPA_BACKENDS
from audit.evidence.environment import capture
from audit.evidence.parity import is_oom
from audit.evidence.presets import Shape
from audit.evidence.selection import Backend, Selection, oracle_supports, torch_dtype
from audit.evidence.stats import RatioCI, Summary, bootstrap_ratio_ci, summarize

SCHEMA = "sovereign-audit.bench/1"
ROTATION_BYTES = 256 << 20  # input bytes rotated through: beyond any L2 (H200: 60 MB) / LLC
MAX_SETS = 64  # small shapes: many small sets, so that together they still exceed a cache


@dataclass
class BackendResult:
    name: str
    sovereign: bool
    vendor: bool
    about: str
    status: str  # ok | skipped | refused (our library said no: a head dim it lacks, ...)
    reason: str = ""
    summary: Summary | None = None  # milliseconds
    tflops: float | None = None  # at the median
    repeats: int | None = None  # timed calls planned: fewer than asked when a time cap applied

    def to_dict(self) -> dict:
        return {"name": self.name, "sovereign": self.sovereign, "vendor": self.vendor,
                "about": self.about, "status": self.status, "reason": self.reason,
                "repeats": self.repeats,
                "unit": "ms", "timing": self.summary.to_dict() if self.summary else None,
                "median_ms": self.summary.median if self.summary else None,
                "tflops": self.tflops}


@dataclass
class Speedup:
    """How many times faster `subject` is than `baseline`: median(baseline) / median(subject)."""

    subject: str
    baseline: str
    ci: RatioCI

    def to_dict(self) -> dict:
        return {"subject": self.subject, "baseline": self.baseline, **self.ci.to_dict()}


@dataclass
class ShapeBench:
    shape: Shape
    input_sets: int
    set_bytes: int
    seed: int
    backends: list[BackendResult] = field(default_factory=list)
    speedups: list[Speedup] = field(default_factory=list)
    # The flash path our library ran on this shape: wgmma | mma_sync | generic | cpu, "refused",
    # "+"-joined when calls differed, None when unknown (a candidate, or a library that cannot say).
    path: str | None = None

    def backend(self, name: str) -> BackendResult | None:
        return next((b for b in self.backends if b.name == name), None)

    def to_dict(self) -> dict:
        from audit.evidence.presets import about

        return {"shape": self.shape.to_dict(), "about": about(self.shape), "path": self.path,
                "input_sets": self.input_sets, "set_bytes": self.set_bytes, "seed": self.seed,
                "backends": [b.to_dict() for b in self.backends],
                "speedups": [s.to_dict() for s in self.speedups]}


@dataclass
class BenchReport:
    selection: dict
    dtype: str
    device: str
    repeats: int
    warmup: int
    seed: int
    timer: str
    shapes: list[ShapeBench]
    started: str
    finished: str
    torch_version: str = ""
    device_name: str = ""
    primary: str = ""
    environment: dict | None = None  # environment.capture(), schema sovereign-audit.environment/1
    layout: str = "bhnd"  # bnhd: inputs stored (B,N,H,D), passed as strided (B,H,N,D) views
    primary_call: str = ""  # how our library was called (the public call or the library object)
    precision: str = "exact"  # what the measured kernel computed at: exact | fp8

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "selection": self.selection, "primary": self.primary,
                "primary_call": self.primary_call, "precision": self.precision,
                "dtype": self.dtype, "device": self.device, "device_name": self.device_name,
                "torch": self.torch_version, "repeats": self.repeats, "warmup": self.warmup,
                "seed": self.seed, "timer": self.timer, "layout": self.layout,
                "flops": "4*B*H*Nq*Nk*D per call", "order": "interleaved, rotated each repeat",
                "started": self.started, "finished": self.finished,
                "shapes": [s.to_dict() for s in self.shapes], "environment": self.environment}


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _sdpa(enum_name: str) -> Callable:
    def fn(q, k, v, scale=None):
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(getattr(SDPBackend, enum_name)):
            return F.scaled_dot_product_attention(q, k, v, scale=scale)

    return fn


@dataclass
class Unavailable:
    """A backend asked for that cannot run here: a skipped row, with why."""

    sovereign: bool
    vendor: bool
    about: str
    reason: str


def backends_for(sel: Selection, head_dim: int, wanted: tuple[str, ...] | None = None,
                 dtype: str | None = None) -> list:
    """(name, Backend or Unavailable) in timing order; `wanted` picks from BACKEND_NAMES
    [default: DEFAULT_BACKENDS]."""
    wanted = tuple(wanted or DEFAULT_BACKENDS)
    for w in wanted:
        if w not in BACKEND_NAMES:
            raise UsageError(f"unknown backend {w!r}; known: {', '.join(BACKEND_NAMES)}")
    out: list = []
    if "primary" in wanted:
        out.append((sel.primary.name, primary_backend(sel)[0]))
    if "naive" in wanted and sel.primary.name != "naive":
        if oracle_supports(sel, head_dim):
            out.append(("naive", sel.oracle))
        else:
            out.append(("naive", Unavailable(True, False, "our naive forward",
                                             sel.oracle_note or f"our naive path lacks head dim {head_dim}")))
    if "eager" in wanted:
        out.append(("eager", Backend(
            "eager", lambda q, k, v, scale=None: M.eager_attention(q, k, v, scale),
            sovereign=False, about="torch eager softmax(QK^T)V: matmuls in the input dtype, fp32 "
            "softmax, chunked over heads/rows so the scores fit (framework BLAS)")))
    for name, enum_name in SDPA_BACKENDS.items():
        if name in wanted:
            out.append((name, Backend(name, _sdpa(enum_name), sovereign=False, vendor=True,
                                      about=f"PyTorch SDPA {enum_name} (vendor A/B, not sovereign)")))
    if fa4.NAME in wanted:
        why = fa4.unavailable(sel.device, dtype)
        if why:
            out.append((fa4.NAME, Unavailable(False, True, "FlashAttention-4 (A/B, not sovereign)", why)))
        else:
            out.append((fa4.NAME, Backend(fa4.NAME, fa4.attention, sovereign=False, vendor=True,
                                          about=fa4.about())))
    return out


def input_sets_for(shape: Shape, elem: int, device: str, sets: int | None) -> tuple[int, int]:
    """(number of input sets, bytes per set): enough to exceed ROTATION_BYTES, within memory."""
    set_bytes = (shape.numel_q() + 2 * shape.numel_kv()) * elem
    if sets is not None:
        return sets, set_bytes
    n = max(2, min(MAX_SETS, math.ceil(ROTATION_BYTES / max(1, set_bytes))))
    if device == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info()
        limit = free // 4  # the rest is for outputs, workspaces and the eager scores
    else:
        limit = 2 << 30
    while n > 1 and n * set_bytes > limit:
        n -= 1
    return n, set_bytes


# PyTorch's words when a forced SDPA backend has no kernel for the device or inputs.
NO_SDPA_KERNEL = "No viable backend for scaled_dot_product_attention"


def _reason(exc: BaseException, caught: list, device: str | None = None) -> str:
    msg = " ".join(str(exc).split())[:300]
    if NO_SDPA_KERNEL in msg:
        why = [" ".join(str(w.message).split())[:200] for w in caught]
        return (f"not available: this PyTorch has no kernel of this backend for these inputs"
                + (f" on {device}" if device else "") + (f" ({why[0]})" if why else ""))
    head = "out of memory" if is_oom(exc) else type(exc).__name__
    why = [" ".join(str(w.message).split())[:200] for w in caught]
    return f"{head}: {msg}" + (f" ({why[0]})" if why else "")


class _Timer:
    def __init__(self, device: str):
        import torch

        self.cuda = device == "cuda"
        self.torch = torch
        self.name = ("cuda events (ms), synchronised before each call" if self.cuda
                     else "time.perf_counter (ms) around the call")

    def time(self, fn, q, k, v) -> float:
        torch = self.torch
        if self.cuda:
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn(q, k, v)
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            out = fn(q, k, v)
            ms = (time.perf_counter() - t0) * 1e3
        del out
        return float(ms)


def _call(be: Backend):
    return lambda q, k, v: be.fn(q, k, v, scale=None)


PUBLIC_CALL = "flash_kernel.attention (the public call)"
LIBRARY_CALL = "Library.attention of the selected library (the public call would pick another)"


def our_library(sel: Selection):
    """The loaded library the selection measures (None for a user's candidate function)."""
    path = sel.library.get("path") if sel.kind in ("target", "lib") else None
    if not path:
        return None
    import flash_kernel

    return flash_kernel.load(path)


def primary_backend(sel: Selection) -> tuple[Backend, str]:
    """The backend timed as ours, and how it is called: through `flash_kernel.attention` when that
    resolves to the selected library for the device, else through the library object."""
    lib = our_library(sel)
    if lib is None or sel.primary.name != "flash":
        return sel.primary, ""
    import flash_kernel

    try:
        public = flash_kernel.library_for(sel.device)
    except Exception:  # no default build for the device: only the library object can be called
        public = None
    if public is not lib:
        return sel.primary, LIBRARY_CALL
    p = sel.primary
    be = Backend(p.name, lambda q, k, v, scale=None: flash_kernel.attention(q, k, v, scale=scale),
                 p.sovereign, p.vendor, p.about + ", through flash_kernel.attention", p.writer)
    return be, PUBLIC_CALL


def _refusal(exc: BaseException) -> str | None:
    """Our library's refusal of a call (KernelError with its status), as one line; None if the
    exception is something else (out of memory, a launch failure: those are skips)."""
    status = getattr(exc, "status_name", None)
    if status is None or is_oom(exc) or status == "FK_ERR_LAUNCH":
        return None
    return f"{status}: " + " ".join(str(exc).split())[:300]


def bench_shape(sel: Selection, shape: Shape, dtype_name: str, repeats: int, warmup: int,
                seed: int, sets: int | None = None, wanted=None, tick: Callable | None = None,
                bootstrap_seed: int = 0, max_backend_s: float | None = None,
                layout: str = "bhnd") -> ShapeBench:
    import torch

    from audit.evidence.parity import random_inputs

    dtype = torch_dtype(dtype_name)
    timer = _Timer(sel.device)
    n_sets, set_bytes = input_sets_for(shape, torch.empty((), dtype=dtype).element_size(),
                                       sel.device, sets)
    res = ShapeBench(shape, n_sets, set_bytes, seed)
    try:
        inputs = [random_inputs(shape, dtype, sel.device, seed + j, layout) for j in range(n_sets)]
    except Exception as exc:
        if not is_oom(exc):
            raise
        for name, be in backends_for(sel, shape.head_dim, wanted, dtype_name):
            res.backends.append(BackendResult(name, getattr(be, "sovereign", False),
                                              getattr(be, "vendor", False),
                                              getattr(be, "about", ""), "skipped",
                                              f"inputs do not fit: {_reason(exc, [])}"))
        return res
    active: list[tuple[BackendResult, Backend]] = []
    samples: dict[str, list[float]] = {}
    lib = our_library(sel)
    paths: list[str] = []

    def ran(name: str) -> None:  # the path our library's last call took (same thread, right after)
        if lib is not None and name == sel.primary.name:
            p = lib.last_flash_path()
            if p and p not in paths:
                paths.append(p)

    for name, be in backends_for(sel, shape.head_dim, wanted, dtype_name):
        if isinstance(be, Unavailable):
            res.backends.append(BackendResult(name, be.sovereign, be.vendor, be.about, "skipped",
                                              be.reason))
            continue
        br = BackendResult(name, be.sovereign, be.vendor, be.about, "ok")
        res.backends.append(br)
        fn = _call(be)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for w in range(max(1, warmup)):
                    last = timer.time(fn, *inputs[w % n_sets])
                    ran(name)
        except Exception as exc:  # unsupported or out of memory: recorded, the rest goes on
            refused = _refusal(exc) if be.sovereign else None
            br.status, br.reason = ("refused", refused) if refused else ("skipped", _reason(exc, caught, sel.device))
            if refused and name == sel.primary.name:
                res.path = "refused"
            _release(sel.device)
            if tick:
                tick(repeats + warmup)
            continue
        br.repeats = repeats
        if max_backend_s is not None and last * 1e-3 * repeats > max_backend_s:
            # A slow baseline (the naive path at N ~ 1e5) must not eat the run: fewer repeats,
            # never fewer than 3, and the JSON says so.
            br.repeats = min(repeats, max(3, int(max_backend_s / (last * 1e-3))))
            br.reason = (f"repeats capped at {br.repeats} of {repeats}: a warm-up call took "
                         f"{last:.1f} ms (--max-backend-seconds {max_backend_s:g})")
        active.append((br, be))
        samples[name] = []
        if tick:
            tick(warmup + repeats - br.repeats)
    calls = 0
    for r in range(repeats):
        k = len(active)
        order = active[r % k:] + active[: r % k] if k else []
        for br, be in order:
            if br.status != "ok" or len(samples[br.name]) >= br.repeats:
                continue
            # Sets taken in turn over all calls: two calls in a row never read the same set, and
            # as the order rotates each backend moves through the sets.
            x = inputs[calls % n_sets]
            calls += 1
            try:
                samples[br.name].append(timer.time(_call(be), *x))
                ran(br.name)
            except Exception as exc:
                br.status, br.reason = "skipped", f"failed at repeat {r}: {_reason(exc, [])}"
                _release(sel.device)
            if tick:
                tick(1)
    del inputs
    if paths:
        res.path = "+".join(paths)
    for br, _ in active:
        if br.status == "ok" and samples[br.name]:
            br.summary = summarize(samples[br.name])
            med = br.summary.median
            br.tflops = shape.flops / (med * 1e-3) / 1e12 if med > 0 else None
        elif br.status == "ok":
            br.status, br.reason = "skipped", "no samples"
    prim = res.backend(sel.primary.name)
    if prim is not None and prim.summary is not None:
        for i, br in enumerate(res.backends):
            if br is prim or br.summary is None or br.summary.min <= 0 or prim.summary.min <= 0:
                continue
            ci = bootstrap_ratio_ci(br.summary.samples, prim.summary.samples,
                                    seed=bootstrap_seed + i)
            res.speedups.append(Speedup(prim.name, br.name, ci))
    _release(sel.device)
    return res


def _release(device: str) -> None:
    if device == "cuda":
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()


def run_bench(selection: Selection, shapes: list[Shape], dtype: str = "fp32",
              device: str | None = None, repeats: int = 10, warmup: int = 2, seed: int = 0,
              sets: int | None = None, backends: tuple[str, ...] | None = None,
              progress: bool | None = None, capture_environment: bool = True,
              max_backend_s: float | None = None,
              checkpoint: Callable | None = None, layout: str = "bhnd") -> BenchReport:
    """Time every backend over `shapes`; shape i uses input seeds from `seed + 1000*i`.

    progress: True/False, or None for a rich progress bar on stderr only when it is a terminal.
    checkpoint(report): called with the shapes done so far after each one (a killed run still
    leaves them on disk).
    """

    if device is not None and device != selection.device:
        raise UsageError(f"run_bench: device {device} differs from the selection's "
                         f"{selection.device}")
    if repeats < 1:
        raise UsageError("--repeats must be >= 1")
    if warmup < 0:
        raise UsageError("--warmup must be >= 0")
    if layout not in ("bhnd", "bnhd"):
        raise UsageError(f"unknown layout {layout!r}; use bhnd or bnhd")
    if max_backend_s is not None and not (max_backend_s > 0):
        raise UsageError("--max-backend-seconds must be > 0")
    if sets is not None and not (1 <= sets <= MAX_SETS):
        raise UsageError(f"--sets must be between 1 and {MAX_SETS}")
    # No head-dim check up front: a shape our library lacks is a "refused" row, timed for the others.
    backends_for(selection, 0, backends, dtype)  # validates names early
    started = _now()
    results: list[ShapeBench] = []
    per_shape = len(backends or DEFAULT_BACKENDS) * (repeats + max(1, warmup))
    with _progress(progress, len(shapes) * per_shape) as tick:
        for i, shape in enumerate(shapes):
            results.append(bench_shape(selection, shape, dtype, repeats, warmup,
                                       seed + 1000 * i, sets, backends, tick,
                                       bootstrap_seed=seed + 100 * i,
                                       max_backend_s=max_backend_s, layout=layout))
            if checkpoint:
                checkpoint(_report(selection, dtype, repeats, warmup, seed, results, started,
                                   None, layout))
    return _report(selection, dtype, repeats, warmup, seed, results, started,
                   capture() if capture_environment else None, layout)


def _report(selection, dtype, repeats, warmup, seed, results, started, env,
            layout) -> BenchReport:
    import torch

    name = torch.cuda.get_device_name() if selection.device == "cuda" else ""
    timer = _Timer(selection.device).name
    return BenchReport(selection.to_dict(), dtype, selection.device, repeats, warmup, seed, timer,
                       list(results), started, _now(), torch.__version__, name,
                       selection.primary.name, env, layout, primary_backend(selection)[1],
                       selection.precision)


class _progress:
    """A rich progress bar on stderr, or nothing (not a terminal, or turned off)."""

    def __init__(self, enabled: bool | None, total: int):
        self.enabled, self.total, self.bar = enabled, total, None

    def __enter__(self):
        from rich.console import Console

        console = Console(stderr=True)
        on = console.is_terminal if self.enabled is None else self.enabled
        if not on:
            return None
        from rich.progress import Progress

        self.bar = Progress(console=console, transient=True)
        self.bar.start()
        task = self.bar.add_task("bench", total=self.total)
        return lambda n=1: self.bar.advance(task, n)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False
