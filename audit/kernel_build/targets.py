"""Every build target of flash_kernel/ and its exact compiler command, in one table.

The flag lists are the place to tune a target; the shape of `TargetSpec` and `command()` is the
builder's contract. Paths in commands are relative to the source root (the folder holding
flash_kernel/), which is the compiler's working directory, so command lines read as in the docs.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

CPU_SOURCE = "flash_kernel/src/fk_cpu.cpp"
GPU_SOURCE = "flash_kernel/src/fk_gpu.hip"
INCLUDES = ("-I", "flash_kernel/include", "-I", "flash_kernel/src")
LIBRARY_NAME = "libflash_kernel.so"

# No -march/-mtune: the CPU object must run on any x86-64 (baseline SSE2); see docs/kernel.md.
CPU_FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-pthread")
NVCC_FLAGS = ("-x", "cu", "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr")
HIPCC_FLAGS = ("-x", "hip", "-O3", "-std=c++17", "-fPIC", "-shared")
# Debian's hipcc picks the NVIDIA platform whenever nvcc is on PATH; the AMD build must say so.
HIPCC_ENV = {"HIP_PLATFORM": "amd"}

NVIDIA_ARCH = {
    "sm_90": ("-gencode", "arch=compute_90,code=sm_90"),
    "sm_80": ("-gencode", "arch=compute_80,code=sm_80"),
    # Two cubins: sm_90a (wgmma/TMA, the "a" features run on cc 9.0 only) and sm_80 (mma.sync, for
    # cc 8.x devices). No PTX: a device of another major version runs neither.
    "sm_90a": ("-gencode", "arch=compute_90a,code=sm_90a", "-gencode", "arch=compute_80,code=sm_80"),
}

# Where rocm-device-libs puts its per-ISA bitcode (Debian first, then ROCm's own layout).
DEVICE_LIB_DIRS = (
    "/usr/lib/x86_64-linux-gnu/amdgcn/bitcode",
    "/usr/lib/amdgcn/bitcode",
    "/usr/share/amdgcn/bitcode",
    "/opt/rocm/amdgcn/bitcode",
    "/opt/rocm/lib/amdgcn/bitcode",
)
# AMD targets that are always valid names (reported "skipped" where the device libraries lack them).
AMD_ALWAYS = ("gfx1030", "gfx90a")
_ISA_BC = re.compile(r"^oclc_isa_version_([0-9a-f]+)\.bc$")

INSTALL_HINT = {
    "g++": "apt install g++",
    "hipcc": "apt install hipcc libamdhip64-dev rocm-device-libs",
    "nvcc": "install the CUDA toolkit (nvcc on PATH, or /usr/local/cuda/bin/nvcc)",
}


@dataclass(frozen=True)
class TargetSpec:
    name: str
    kind: str  # "cpu" | "nvidia" | "amd"
    compiler: str  # "g++" | "nvcc" | "hipcc"
    source: str  # the translation unit, relative to the source root
    flags: tuple[str, ...]  # everything between the compiler and the include paths
    env: dict[str, str] = field(default_factory=dict)  # set for the compiler (recorded in provenance)
    flash_path: str = "cpu"  # what fk_flash_path() of the built library should say
    note: str = ""

    def command(self, output: str, depfile: str | None = None) -> list[str]:
        """The exact argv: compiler, flags, includes, source, dependency output, -o output."""
        argv = [self.compiler, *self.flags, *INCLUDES, self.source]
        if depfile is not None:
            argv += ["-MD", "-MF", depfile]  # the compiler lists every file the TU includes
        return argv + ["-o", output]

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "compiler": self.compiler, "source": self.source,
                "flags": list(self.flags), "includes": list(INCLUDES), "env": dict(self.env),
                "flash_path": self.flash_path, "note": self.note}


def device_lib_isas(dirs: tuple[str, ...] = DEVICE_LIB_DIRS) -> list[str]:
    """gfx targets the installed rocm-device-libs carry bitcode for (oclc_isa_version_1030.bc -> gfx1030)."""
    env = os.environ.get("FK_ROCM_DEVICE_LIBS")
    found: set[str] = set()
    for d in ((env,) if env else dirs):
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for n in names:
            m = _ISA_BC.match(n)
            if m:
                found.add("gfx" + m.group(1))
    return sorted(found, key=_gfx_key)


def _gfx_key(name: str):
    digits = name[3:]
    return (len(digits), digits)


def cpu_spec() -> TargetSpec:
    return TargetSpec("cpu", "cpu", "g++", CPU_SOURCE, CPU_FLAGS, flash_path="cpu",
                      note="baseline x86-64 (no -march): runs on any x86-64 machine")


def nvidia_spec(name: str) -> TargetSpec:
    if name == "sm_90-generic":
        return TargetSpec(name, "nvidia", "nvcc", GPU_SOURCE, NVCC_FLAGS + NVIDIA_ARCH["sm_90"] + ("-DFK_FORCE_GENERIC",),
                          flash_path="generic",
                          note="the generic (RDNA2) logic forced on NVIDIA sm_90: a proxy, never an RDNA2 figure")
    if name == "sm_90a":
        # -DFK_WGMMA compiles the Hopper kernel (its device code only in the sm_90a pass);
        # -DFK_TARGET: fk_target() would else name the lowest arch of __CUDA_ARCH_LIST__ (sm_80).
        return TargetSpec(name, "nvidia", "nvcc", GPU_SOURCE,
                          NVCC_FLAGS + NVIDIA_ARCH[name] + ("-DFK_WGMMA", '-DFK_TARGET="sm_90a"'),
                          flash_path="wgmma",
                          note="wgmma/TMA path from the sm_90a cubin on cc 9.0 (H100/H200); mma.sync from the "
                               "sm_80 cubin on cc 8.x; no PTX, so no other device runs it")
    return TargetSpec(name, "nvidia", "nvcc", GPU_SOURCE, NVCC_FLAGS + NVIDIA_ARCH[name], flash_path="mma_sync")


def cuda_cubins(name: str) -> tuple[str, ...]:
    """The cubins (sm_XY / sm_XYa) a CUDA target's library holds, read off its -gencode flags;
    () for a name that is not a CUDA target."""
    try:
        flags = nvidia_spec(name).flags
    except KeyError:
        return ()
    return tuple(f.split("code=", 1)[1] for f in flags if f.startswith("arch=") and "code=" in f)


def amd_spec(name: str) -> TargetSpec:
    return TargetSpec(name, "amd", "hipcc", GPU_SOURCE, HIPCC_FLAGS + (f"--offload-arch={name}", f'-DFK_TARGET="{name}"'),
                      env=dict(HIPCC_ENV), flash_path="generic")


# --define NAME=VALUE: one of the kernel's own switches (flash_kernel's FK_* macros, integers), so a
# variant is built through the same command and provenance as the default; nothing else reaches
# the compiler's command line.
_DEFINE = re.compile(r"(FK_[A-Z0-9_]{1,60})=(-?[0-9]{1,9})")


def parse_define(text: str) -> tuple[str, str]:
    """(NAME, VALUE) of one --define, or ValueError saying what a define must be."""
    m = _DEFINE.fullmatch(text)
    if m is None:
        raise ValueError(f"--define {text!r}: expected FK_NAME=INTEGER (one of the kernel's switches, "
                         f"e.g. FK_FP8_FLUSH_TILES_D128=4)")
    return m.group(1), m.group(2)


def with_defines(spec: TargetSpec, defines: tuple[tuple[str, str], ...]) -> TargetSpec:
    """spec with -DNAME=VALUE appended to its flags (recorded in provenance like the rest); a name
    the target itself defines (FK_TARGET, FK_WGMMA, ...) is a ValueError."""
    if not defines:
        return spec
    own = {f[2:].split("=", 1)[0] for f in spec.flags if f.startswith("-D")}
    names = [n for n, _ in defines]
    for name in names:
        if names.count(name) > 1:
            raise ValueError(f"--define {name}: given more than once")
        if name in own:
            raise ValueError(f"--define {name}: target {spec.name} sets {name} itself")
    extra = tuple(f"-D{n}={v}" for n, v in defines)
    return replace(spec, flags=spec.flags + extra, note=(spec.note + "; " if spec.note else "") +
                   "variant build: " + " ".join(extra))


def all_specs() -> dict[str, TargetSpec]:
    """Every valid target name -> its spec (AMD names from the installed device libraries)."""
    specs = {"cpu": cpu_spec()}
    for name in ("sm_90a", "sm_90", "sm_80", "sm_90-generic"):
        specs[name] = nvidia_spec(name)
    for name in sorted(set(AMD_ALWAYS) | set(device_lib_isas()), key=_gfx_key):
        specs[name] = amd_spec(name)
    return specs


# gfx1030, sm_90a and sm_90 only where their toolchains exist. sm_90a (the fastest path on cc 9.0)
# comes before sm_90 (the portable mma.sync path, kept to compare with): `run` treats the first
# library the device runs as the primary one.
DEFAULT_TARGETS = ("gfx1030", "sm_90a", "sm_90", "cpu")


def library_path(out: Path, target: str) -> Path:
    return Path(out) / target / LIBRARY_NAME
