"""Adapters from `run` to each stage's API, and what this machine can run.

Each adapter calls the stage's public function with the run's settings, so a stage's signature
change fails here (and in tests/test_run.py), in one place. The evidence stages import torch, so
they are imported when their stage starts: a machine without torch still builds and audits, and
the stage is recorded as not available.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Callable

from audit.kernel_build.builder import BuildResult, ensure_built
from audit.kernel_build.targets import cuda_cubins
from audit.errors import InputError, UsageError, one_line
from audit.files import sha256_file
from audit.linkage.check import check_paths
from audit.linkage.model import CheckReport
from audit.linkage.judging.policy import load_policy
from audit.linkage.resolution.ldso import ResolveOptions
from audit.run.record import Artifact

# Small CPU presets: the whole run must finish within 10 minutes on 2 cores with no GPU.
CPU_PARITY_PRESETS = ("tiny-128", "tiny-64", "tiny-cross")
CPU_BENCH_PRESETS = ("tiny-128", "tiny-64")
GPU_PRESETS = ("wan2.1-1.3b-480p", "cogvideox-5b")


# --------------------------------------------------------------------------------------------
# the machine


def resolve_device(requested: str) -> str:
    if requested not in ("auto", "cpu", "cuda"):
        raise UsageError(f"unknown device {requested!r}: expected auto, cpu or cuda")
    if requested == "cpu":
        return "cpu"
    try:
        import torch

        has_cuda = bool(torch.cuda.is_available())
    except Exception:  # torch missing or broken: there is no GPU we could use
        has_cuda = False
    if requested == "cuda" and not has_cuda:
        raise UsageError("--device cuda: no CUDA GPU is available here (use --device cpu or auto)")
    return "cuda" if has_cuda else "cpu"


def host_facts() -> dict:
    # A minimal, dependency-free description kept in run.json even when environment capture fails.
    return {"hostname": platform.node(), "system": platform.system(), "release": platform.release(),
            "machine": platform.machine(), "processor": platform.processor(),
            "python": platform.python_version(), "cpu_count": os.cpu_count()}


# A plain sm_XY cubin runs on cc X.y for y >= Y; an arch-specific sm_XYa cubin only on cc X.Y.
def _cubin_runs(cubin: str, major: int, minor: int) -> bool:
    digits = cubin[3:].rstrip("a")
    if len(digits) < 2 or not digits.isdigit():
        return False
    want_major, want_minor = int(digits[:-1]), int(digits[-1])
    if cubin.endswith("a"):
        return (major, minor) == (want_major, want_minor)
    return major == want_major and minor >= want_minor


def cuda_can_run(target: str, capability: tuple[int, int] | None = None) -> bool:
    """Does a CUDA target's library hold a cubin this GPU (or `capability`) can run?"""
    if capability is None:
        try:
            import torch

            capability = torch.cuda.get_device_capability()
        except Exception:
            return False
    cubins = cuda_cubins(target) or (target.split("-")[0],)  # the target's own gencode flags
    return any(_cubin_runs(c, *capability) for c in cubins)


def runnable_libraries(device: str, built: list[tuple[str, str]],
                       artifacts: list[Artifact]) -> list[tuple[str, str]]:
    """(label, path) of the libraries this device can run: ours for the device's targets, plus
    --artifact objects with our C ABI. An artifact left out gets its `abi_reason`."""
    libs = []
    for target, lib in built:
        if device == "cpu" and target == "cpu":
            libs.append((target, lib))
        elif device == "cuda" and target.startswith("sm_") and cuda_can_run(target):
            libs.append((target, lib))
    for a in artifacts:
        if a.abi is None:
            continue
        # An artifact runs only where its target does: a gfx1030 object is audited, never run here.
        if (device == "cpu" and a.abi == "cpu") or (
                device == "cuda" and a.abi.startswith("sm_") and cuda_can_run(a.abi)):
            libs.append((f"artifact:{a.name}", a.path))
        elif not a.abi_reason:
            a.abi_reason = f"audited only: built for {a.abi}, which this {device} machine cannot run"
    return libs


def describe_artifact(path: Path) -> Artifact:
    try:
        st = path.stat()
        if not path.is_file():
            raise InputError(f"--artifact {path}: not a regular file")
        digest = sha256_file(path)
    except OSError as exc:
        raise InputError(f"--artifact {path}: cannot read it ({exc.strerror or exc})") from None
    return Artifact(path=str(path), name=path.name, sha256=digest, size=st.st_size)


def probe_abi(art: Artifact) -> None:
    """Does this object export our C ABI? (flash_kernel.load; loading runs its constructors.)"""
    try:
        import flash_kernel

        art.abi = flash_kernel.load(art.path).target or "unknown"
    except Exception as exc:
        art.abi = None
        art.abi_reason = f"not checked for parity or timed: does not load as our C ABI ({one_line(exc)})"


# --------------------------------------------------------------------------------------------
# the stages


def environment() -> dict:
    from audit.evidence.environment import capture

    return capture()


def build(targets: tuple[str, ...], build_dir: Path) -> BuildResult:
    # Reuses a target whose provenance proves it current (same sources, compiler, flags and
    # library digest: its reason says so); builds the rest.
    return ensure_built(list(targets) or None, build_dir)


def linkage(paths: list[str]) -> CheckReport:
    return check_paths(paths, load_policy(None), ResolveOptions())


def run_dtype(device: str) -> str:
    # The CPU path is timed in fp32 (its native type); GPUs in bf16, the video DiTs' precision.
    return "fp32" if device == "cpu" else "bf16"


def shapes(device: str, cpu_presets: tuple[str, ...]) -> list:
    from audit.evidence.presets import preset

    return [preset(n) for n in (cpu_presets if device == "cpu" else GPU_PRESETS)]


def parity(lib: str, device: str, precision: str = "exact"):
    """ParityReport of `lib` on the device's shapes (the precision's default gates, seed 0)."""
    from audit.evidence import precision as P
    from audit.evidence.parity import run_parity
    from audit.evidence.selection import select

    return run_parity(selection=P.apply(select(lib=lib, device=device), precision), shapes=shapes(device, CPU_PARITY_PRESETS),
                      dtype=run_dtype(device), device=device, gates=None, seed=0)


def bench(lib: str, device: str, repeats: int, precision: str = "exact"):
    """BenchReport of `lib` on the device's shapes."""
    from audit.evidence import precision as P
    from audit.evidence.bench import run_bench
    from audit.evidence.selection import select

    return run_bench(selection=P.apply(select(lib=lib, device=device), precision), shapes=shapes(device, CPU_BENCH_PRESETS),
                     dtype=run_dtype(device), device=device, repeats=repeats, seed=0, progress=False)


def pipeline(lib: str, device: str, preset: str | None, steps: int | None, checkpoint: Callable,
             precision: str = "exact"):
    """PipelineReport of the DiT pipeline with `lib` as our flash core; `checkpoint(report)` gets
    the partial report after each of the pipeline's own stages."""
    from audit.evidence.pipeline import run_pipeline

    return run_pipeline(preset=preset or ("tiny" if device == "cpu" else "wan-480p"), steps=steps or 2,
                        device=device, lib=lib, checkpoint=checkpoint, precision=precision)
