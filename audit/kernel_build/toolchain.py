"""Finding compilers and recording their versions (and the runtime packages they link against)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field

from audit.kernel_build.targets import HIPCC_ENV, INSTALL_HINT, device_lib_isas

# Debian packages whose versions go into provenance, per compiler (absent ones are left out).
PACKAGES = {
    "g++": ("g++", "g++-12", "libstdc++6", "libc6"),
    "hipcc": ("hipcc", "libamdhip64-5", "libamdhip64-dev", "rocm-device-libs", "clang-15", "llvm-15", "g++"),
    "nvcc": ("g++",),
}
EXTRA_PATHS = {"nvcc": ("/usr/local/cuda/bin/nvcc",)}


@dataclass
class Toolchain:
    name: str  # "g++", "hipcc", "nvcc"
    path: str
    version: str  # the short version, e.g. "12.2.0", "13.0.88", "5.2.21153-0"
    version_text: str  # the full `--version` output (first lines)
    details: dict[str, str] = field(default_factory=dict)  # clang / HIP / CUDA release
    packages: dict[str, str] = field(default_factory=dict)  # Debian package -> version

    def to_dict(self) -> dict:
        return asdict(self)


class ToolchainMissing(Exception):
    """A compiler (or its device libraries) is not installed; str() is the one-line reason."""


def which(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for p in EXTRA_PATHS.get(name, ()):
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def _run(argv: list[str], env: dict[str, str] | None = None) -> str:
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=60,
                            env={**os.environ, **(env or {})})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"({type(exc).__name__}: {exc})"
    return cp.stdout.strip()  # stderr may carry noise (hipcc's rocm_agent_enumerator traceback)


def dpkg_versions(packages) -> dict[str, str]:
    out: dict[str, str] = {}
    if shutil.which("dpkg-query") is None:
        return out
    for p in packages:
        try:
            cp = subprocess.run(["dpkg-query", "-W", "-f=${Status}\t${Version}", p], capture_output=True,
                                text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if cp.returncode == 0 and "\t" in cp.stdout:
            status, version = cp.stdout.split("\t", 1)
            if status.endswith(" installed") and version:
                out[p] = version.strip()
    return out


def find(name: str) -> Toolchain:
    """The toolchain for one compiler name, or ToolchainMissing naming the package to install."""
    path = which(name)
    if path is None:
        raise ToolchainMissing(f"{name} not found: {INSTALL_HINT[name]}")
    if name == "g++":
        text = _run([path, "--version"])
        first = text.splitlines()[0] if text else ""
        m = re.search(r"(\d+\.\d+\.\d+)\s*$", first)
        return Toolchain(name, path, m.group(1) if m else first, _head(text), {},
                         dpkg_versions(PACKAGES[name]))
    if name == "nvcc":
        text = _run([path, "--version"])
        m = re.search(r"release (\S+), V(\S+)", text)
        details = {"cuda_release": m.group(1).rstrip(",")} if m else {}
        details["runtime"] = "cudart linked statically by nvcc (no libcudart in DT_NEEDED)"
        return Toolchain(name, path, m.group(2) if m else _head(text, 1), _head(text), details,
                         dpkg_versions(PACKAGES[name]))
    if name == "hipcc":
        if not device_lib_isas():
            raise ToolchainMissing(f"rocm-device-libs bitcode not found: {INSTALL_HINT['hipcc']}")
        text = _run([path, "--version"], env=HIPCC_ENV)
        hip = re.search(r"HIP version:\s*(\S+)", text)
        clang = re.search(r"clang version\s*(\S+)", text)
        details = {}
        if hip:
            details["hip"] = hip.group(1)
        if clang:
            details["clang"] = clang.group(1)
        return Toolchain(name, path, hip.group(1) if hip else _head(text, 1), _head(text), details,
                         dpkg_versions(PACKAGES[name]))
    raise ToolchainMissing(f"unknown compiler {name!r}")


def _head(text: str, n: int = 8) -> str:
    return "\n".join(text.splitlines()[:n])
