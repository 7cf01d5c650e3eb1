"""Fixture binaries for the ELF reader tests, built at test time by the real compilers.

Session-scoped: each group is compiled once into `fixture_root`, builds of one group run in
parallel. A missing compiler skips the tests that need it (with the reason); a compiler that
is present but fails is a test error (its stderr is shown), never a silent skip.

What the tests may assert comes from the sources here and in tests/fixtures/device/, never
from the reader's own output: kernel names fk_probe_kernel and fk_probe_scale, the sonames,
runpaths, strings and symbol names written below.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from conftest import require_tool

DEVICE_SRC = Path(__file__).parent / "fixtures" / "device"
KERNELS = ("fk_probe_kernel", "fk_probe_scale")

# -- host (gcc) fixtures: what each one contains is written right here ------------------------
DEP_C = "int fk_dep_value(void) { return 42; }\n"
MAIN_C = r"""
#include <dlfcn.h>
#include <stdio.h>
extern int fk_dep_value(void);
/* a library name handed to dlopen: the reader must find it in .rodata */
static const char vendor_lib[] = "libcublas.so.12";
const char *fk_other_name = "libMIOpen.so";
/* vendor-named definitions: one exported, one local (only in .symtab) */
int cublasFakeGemm(int x) { return x * 2 + fk_dep_value(); }
static int __attribute__((noinline, used)) mkl_local_helper(int x) { return x + 7; }
/* a tail the linker may share: mkl_tail's name can point into xmkl_tail's */
int xmkl_tail(void) { return 1; }
int mkl_tail(void) { return 2; }
void *fk_load(void) { printf("%d\n", mkl_local_helper(1)); return dlopen(vendor_lib, RTLD_NOW); }
"""
PROG_C = "int main(void) { return 0; }\n"
VER_C = "int fk_v1(void) { return 1; }\nint fk_v2(void) { return 2; }\n"
VER_MAP = "FK_1.0 { global: fk_v1; local: *; };\nFK_2.0 { global: fk_v2; } FK_1.0;\n"
TINY_C = "int fk_tiny(int x) { return x + 1; }\n"


# Test modules import these fixtures, and pytest then keeps one session fixture per importing
# module: this cache makes every group compile once per test session all the same.
_BUILT: dict[str, dict[str, Path]] = {}


def once(key: str, build) -> dict[str, Path]:
    if key not in _BUILT:
        _BUILT[key] = build()
    return _BUILT[key]


def run(cmd: list[str], cwd: Path | None = None, env: dict | None = None) -> None:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"fixture build failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")


def run_parallel(cmds: list[list[str]], env: dict | None = None) -> None:
    procs = [(c, subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
             for c in cmds]
    failed = []
    for cmd, p in procs:
        _out, err = p.communicate(timeout=900)
        if p.returncode != 0:
            failed.append(f"{' '.join(cmd)}\n{err[-2000:]}")
    if failed:
        pytest.fail("fixture build failed:\n" + "\n".join(failed))


@pytest.fixture(scope="session")
def host_libs(fixture_root) -> dict[str, Path]:
    """gcc-built: libfkdep.so, libfkmain.so (needs libfkdep, soname libfkmain.so.1, RUNPATH
    $ORIGIN:/opt/fk/lib, dlopen of "libcublas.so.12", string "libMIOpen.so", exported
    cublasFakeGemm, local mkl_local_helper), librpath.so (DT_RPATH /opt/fk/rpath), prog (a PIE
    with an interpreter), fkmain.o (the same source as a relocatable object) and libfkver.so
    (fk_v1 at version FK_1.0, fk_v2 at FK_2.0, by a version script)."""
    return once("host_libs", lambda: _build_host_libs(fixture_root))


def _build_host_libs(fixture_root) -> dict[str, Path]:
    gcc = require_tool("gcc")
    d = fixture_root / "host"
    d.mkdir(exist_ok=True)
    (d / "dep.c").write_text(DEP_C)
    (d / "main.c").write_text(MAIN_C)
    (d / "prog.c").write_text(PROG_C)
    run([gcc, "-shared", "-fPIC", "-o", "libfkdep.so", "dep.c", "-Wl,-soname,libfkdep.so"], cwd=d)
    run([gcc, "-shared", "-fPIC", "-O1", "-o", "libfkmain.so", "main.c", "-L.", "-lfkdep", "-ldl",
         "-Wl,-soname,libfkmain.so.1", "-Wl,--enable-new-dtags", "-Wl,-rpath,$ORIGIN:/opt/fk/lib"], cwd=d)
    run([gcc, "-shared", "-fPIC", "-o", "librpath.so", "dep.c", "-Wl,--disable-new-dtags",
         "-Wl,-rpath,/opt/fk/rpath"], cwd=d)
    run([gcc, "-o", "prog", "prog.c"], cwd=d)
    (d / "ver.c").write_text(VER_C)
    (d / "ver.map").write_text(VER_MAP)
    run([gcc, "-shared", "-fPIC", "-o", "libfkver.so", "ver.c", "-Wl,--version-script=ver.map",
         "-Wl,-soname,libfkver.so.1"], cwd=d)
    run([gcc, "-c", "-fPIC", "-O1", "-o", "fkmain.o", "main.c"], cwd=d)
    return {"dep": d / "libfkdep.so", "main": d / "libfkmain.so", "rpath": d / "librpath.so",
            "prog": d / "prog", "object": d / "fkmain.o", "versioned": d / "libfkver.so"}


@pytest.fixture(scope="session")
def cross_libs(fixture_root) -> dict[str, Path]:
    """clang+lld cross builds of one function fk_tiny: a big-endian ppc64 .so and an i386 .so."""
    return once("cross_libs", lambda: _build_cross_libs(fixture_root))


def _build_cross_libs(fixture_root) -> dict[str, Path]:
    clang = require_tool("clang-15")
    lld = require_tool("ld.lld-15")
    d = fixture_root / "cross"
    d.mkdir(exist_ok=True)
    (d / "tiny.c").write_text(TINY_C)
    out = {}
    for name, target, soname in (("be64", "powerpc64-linux-gnu", "libbe64.so.1"),
                                 ("x86_32", "i686-linux-gnu", "libx86_32.so.1")):
        run([clang, f"--target={target}", "-c", "-fPIC", "-o", f"{name}.o", "tiny.c"], cwd=d)
        run([lld, "-shared", "-soname", soname, "-o", f"lib{name}.so", f"{name}.o"], cwd=d)
        out[name] = d / f"lib{name}.so"
    return out


def hip_env() -> dict:
    env = dict(os.environ)
    env["HIP_PLATFORM"] = "amd"  # hipcc would pick the NVIDIA platform when nvcc is on PATH
    return env


@pytest.fixture(scope="session")
def hip_libs(fixture_root) -> dict[str, Path]:
    """hipcc-built shared objects of fk_probe.hip: gfx1030 alone, gfx90a alone, and both in one
    .so (there the gfx90a code object is built as gfx90a:sramecc+:xnack-)."""
    return once("hip_libs", lambda: _build_hip_libs(fixture_root))


def _build_hip_libs(fixture_root) -> dict[str, Path]:
    hipcc = require_tool("hipcc")
    d = fixture_root / "hip"
    d.mkdir(exist_ok=True)
    src = str(DEVICE_SRC / "fk_probe.hip")
    builds = {
        "gfx1030": ["--offload-arch=gfx1030"],
        "gfx90a": ["--offload-arch=gfx90a"],
        "both": ["--offload-arch=gfx1030", "--offload-arch=gfx90a:sramecc+:xnack-"],
    }
    run_parallel([[hipcc, *archs, "-shared", "-fPIC", "-o", str(d / f"libfk_{name}.so"), src]
                  for name, archs in builds.items()], env=hip_env())
    return {name: d / f"libfk_{name}.so" for name in builds}


@pytest.fixture(scope="session")
def cuda_libs(fixture_root) -> dict[str, Path]:
    """nvcc-built shared objects of fk_probe.cu: sm_90 cubin (+ compute_90 PTX, nvcc's default),
    sm_90a cubin only, compute_90 PTX only, sm_90 with every entry LZ4-compressed, and an sm_100f
    family cubin."""
    return once("cuda_libs", lambda: _build_cuda_libs(fixture_root))


def _build_cuda_libs(fixture_root) -> dict[str, Path]:
    nvcc = require_tool("nvcc")
    d = fixture_root / "cuda"
    d.mkdir(exist_ok=True)
    src = str(DEVICE_SRC / "fk_probe.cu")
    builds = {
        "sm90": ["-arch=sm_90"],
        "sm90a": ["-gencode", "arch=compute_90a,code=sm_90a"],
        "ptx": ["-gencode", "arch=compute_90,code=compute_90"],
        "lz4": ["-arch=sm_90", "--compress-mode=speed", "-Xfatbin=-compress-all"],
        "sm100f": ["-gencode", "arch=compute_100f,code=sm_100f"],
    }
    run_parallel([[nvcc, *flags, "-shared", "-Xcompiler", "-fPIC", "-o", str(d / f"libfk_{name}.so"), src]
                  for name, flags in builds.items()])
    return {name: d / f"libfk_{name}.so" for name in builds}


# -- compressed offload bundles ----------------------------------------------------------------
def ccob(bundle: bytes, version: int, method: str) -> bytes:
    """A compressed clang offload bundle around `bundle`, laid out as LLVM's clang-offload-bundler
    writes it (`CCOB` header, versions 1-3; written here, independently of the reader)."""
    if method == "zlib":
        data, code = zlib.compress(bundle), 0
    else:
        import zstandard

        data, code = zstandard.ZstdCompressor().compress(bundle), 1
    h = 0x1234_5678_9ABC_DEF0  # the hash field is not checked by readers of the layout
    if version == 1:
        head = b"CCOB" + struct.pack("<HHIQ", 1, code, len(bundle), h)
    elif version == 2:
        head = b"CCOB" + struct.pack("<HHIIQ", 2, code, 24 + len(data), len(bundle), h)
    else:
        head = b"CCOB" + struct.pack("<HHQQQ", 3, code, 32 + len(data), len(bundle), h)
    return head + data


@pytest.fixture(scope="session")
def compressed_hip_libs(fixture_root, hip_libs, host_libs) -> dict[str, Path]:
    """Compressed bundles. Debian's hipcc 5.2 has no --offload-compress and its
    clang-offload-bundler-15 no -compress, so the compiler's own uncompressed `.hip_fatbin`
    (dumped by objcopy) is wrapped in CCOB v1/v2/v3 containers (zlib and zstd) and put back into
    a gcc-built library as its `.hip_fatbin` section, two bundles in one section."""
    return once("compressed_hip_libs", lambda: _build_compressed_hip_libs(fixture_root, hip_libs, host_libs))


def _build_compressed_hip_libs(fixture_root, hip_libs, host_libs) -> dict[str, Path]:
    objcopy = require_tool("objcopy")
    d = fixture_root / "hipz"
    d.mkdir(exist_ok=True)
    raw = d / "both.hip_fatbin"
    run([objcopy, "--dump-section", f".hip_fatbin={raw}", str(hip_libs["both"]), str(d / "scratch.so")])
    bundle = raw.read_bytes()
    end = _plain_bundle_end(bundle)
    bundle = bundle[:end]
    out = {}
    for version, method in ((1, "zlib"), (2, "zlib"), (2, "zstd"), (3, "zstd")):
        one = ccob(bundle, version, method)
        two = one + b"\0" * (-len(one) % 16) + ccob(bundle, version, method)
        sec = d / f"v{version}{method}.bin"
        sec.write_bytes(two)
        so = d / f"libccob_v{version}_{method}.so"
        run([objcopy, "--add-section", f".hip_fatbin={sec}", "--set-section-flags",
             ".hip_fatbin=alloc,readonly,data", str(host_libs["dep"]), str(so)])
        out[f"v{version}-{method}"] = so
    return out


def _plain_bundle_end(section: bytes) -> int:
    """Bytes of the first uncompressed bundle (header + entries), by the documented layout."""
    assert section.startswith(b"__CLANG_OFFLOAD_BUNDLE__")
    (count,) = struct.unpack_from("<Q", section, 24)
    pos, end = 32, 32
    for _ in range(count):
        off, size, idlen = struct.unpack_from("<QQQ", section, pos)
        pos += 24 + idlen
        end = max(end, pos, off + size)
    return end


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not on PATH (an independent cross-check)")
    return path
