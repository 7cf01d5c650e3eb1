"""The machine a measurement ran on: GPU, driver, clocks, CUDA/HIP, compilers, torch, CPU, host.

`capture()` never fails: whatever cannot be read is recorded as null with no guessing. Every
string is one line and bounded (they come from tools and may be rendered later: the renderer
escapes them).
"""

from __future__ import annotations

import datetime as _dt
import functools
import os
import platform
import shutil
import subprocess
import sys

SCHEMA = "sovereign-audit.environment/1"
_ENV_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "FLASH_KERNEL_TARGET",
             "FLASH_KERNEL_BUILD", "OMP_NUM_THREADS", "TORCH_CUDNN_V8_API_ENABLED")
_SMI_FIELDS = ("name", "driver_version", "memory.total", "clocks.sm", "clocks.mem",
               "clocks.max.sm", "clocks.max.mem", "power.limit", "temperature.gpu",
               "persistence_mode", "compute_mode", "pci.bus_id")


def _line(text: object, limit: int = 200) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _run(argv: list[str], timeout: float = 10.0) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                           errors="replace")
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout if p.returncode == 0 else None


@functools.lru_cache(maxsize=None)  # compilers do not change within a process; clocks do
def _version_line(argv: tuple[str, ...], pick: str | None = None) -> str | None:
    out = _run(list(argv))
    if not out:
        return None
    lines = [ln for ln in out.splitlines() if ln.strip()]
    if pick:
        lines = [ln for ln in lines if pick in ln] or lines
    return _line(lines[-1] if pick else lines[0]) if lines else None


_SMI_MINIMAL = ("name", "driver_version", "memory.total", "clocks.sm", "clocks.max.sm")


def nvidia_smi() -> list[dict] | None:
    """One dict per GPU; the field set shrinks to a minimal one if a driver rejects a name."""
    for fields in (_SMI_FIELDS, _SMI_MINIMAL):
        out = _run(["nvidia-smi", f"--query-gpu={','.join(fields)}",
                    "--format=csv,noheader,nounits"])
        if out and out.strip():
            return [{k.replace(".", "_"): _line(v.strip()) for k, v in zip(fields, row.split(","), strict=False)}
                    for row in out.strip().splitlines()]
    return None


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for ln in f:
                if ln.lower().startswith("model name"):
                    return _line(ln.split(":", 1)[1])
    except OSError:
        pass
    return _line(platform.processor()) or None


def torch_info() -> dict:
    try:
        import torch
    except Exception as exc:
        return {"available": False, "reason": _line(exc)}
    info = {"available": True, "version": torch.__version__,
            "cuda": getattr(torch.version, "cuda", None), "hip": getattr(torch.version, "hip", None),
            "git": _line(getattr(torch.version, "git_version", "") or "") or None,
            "threads": torch.get_num_threads(), "cuda_available": torch.cuda.is_available()}
    try:
        info["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:
        info["cudnn"] = None
    devices = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            devices.append({"index": i, "name": _line(p.name),
                            "capability": f"{p.major}.{p.minor}",
                            "memory_bytes": int(p.total_memory),
                            "multiprocessors": int(p.multi_processor_count)})
    info["devices"] = devices
    return info


def capture() -> dict:
    """The environment as a JSON-ready dict with `"schema": "sovereign-audit.environment/1"`."""
    try:
        import numpy
        numpy_version = numpy.__version__
    except Exception:
        numpy_version = None
    return {
        "schema": SCHEMA,
        "captured_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": _line(platform.node()),
        "os": _line(platform.platform()),
        "cpu": {"model": cpu_model(), "logical_cores": os.cpu_count(),
                "machine": platform.machine()},
        "python": _line(sys.version),
        "numpy": numpy_version,
        "torch": torch_info(),
        "gpus": nvidia_smi(),
        "toolchain": {
            "nvcc": _version_line(("nvcc", "--version"), pick="release"),
            "hipcc": _version_line(("hipcc", "--version"), pick="HIP version"),
            "gcc": _version_line(("gcc", "--version")),
            "rocm_smi": _version_line(("rocm-smi", "--showdriverversion"), pick="version"),
        },
        "env": {k: _line(os.environ[k]) for k in _ENV_VARS if k in os.environ},
    }
