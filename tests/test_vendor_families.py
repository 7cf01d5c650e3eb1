"""Vendor code found by what it is made of: kernels by the vendor types in their signature,
standalone device-code files (cubins, AMDGPU code objects) judged as device code, AMDGPU targets
named from e_flags, and the opt-in strict policy.

Every fixture is built here by a real compiler (gcc, hipcc, clang-offload-bundler, nvcc); the
names and targets asserted come from the sources below and the build flags.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest

from audit.elf.reader import read_elf
from audit.linkage.check import check_paths
from audit.linkage.judging.policy import load_policy, shipped_policies
from audit.linkage.resolution.ldso import ResolveOptions
from conftest import require_tool
from elf_fixtures import hip_env, run

# A rocSPARSE-style kernel: a file-local template outside any vendor namespace, marked only by
# the struct among its template arguments (rocSPARSE's own kernels look like this).
ROCSPARSE_HIP = r"""
#include <hip/hip_runtime.h>
template <typename T> struct rocsparse_complex_num { T x, y; };
template <unsigned BLOCK, typename I, typename T>
__global__ static void axpyi_kernel(I nnz, T* y) { if ((I)threadIdx.x < nnz) y[threadIdx.x].x += 1; }
void fk_launch(int n, rocsparse_complex_num<float>* y) {
  hipLaunchKernelGGL((axpyi_kernel<256, int, rocsparse_complex_num<float>>), dim3(1), dim3(256), 0, 0, n, y);
}
"""
# the same kernel templated on our own struct: no vendor type, no finding
OWN_HIP = ROCSPARSE_HIP.replace("rocsparse_complex_num", "fk_complex_num")
TENSILE_HIP = r"""
#include <hip/hip_runtime.h>
extern "C" __global__ void Cijk_Ailk_Bljk_SB_MT64x64x8_fk(float* c) { c[threadIdx.x] = 0.0f; }
"""
TRT_CU = r"""
extern "C" __global__ void fmhaSm100fKernel_QkvBfloat16_test(float* o) { o[threadIdx.x] = 1.0f; }
"""
OWN_CU = r"""
extern "C" __global__ void fk_attention_kernel(float* o) { o[threadIdx.x] = 1.0f; }
"""
CUFFT_STUB_C = "int cufftPlan1d(int *plan, int nx, int type, int batch) { return nx + type + batch; }\n"
CUFFT_USER_C = "extern int cufftPlan1d(int *, int, int, int);\nint fk_fft(void) { int p; return cufftPlan1d(&p, 8, 0, 1); }\n"


def _findings(path, policy=None):
    report = check_paths([str(path)], policy or load_policy(None), ResolveOptions())
    assert len(report.files) == 1
    return report.files[0]


def _device_kernels(result) -> dict[str, tuple[str, str]]:
    return {f.rule: (f.subject, f.where) for f in result.findings if f.kind == "device-kernel"}


def _hip_so(d: Path, name: str, src: str) -> Path:
    hipcc = require_tool("hipcc")
    (d / f"{name}.hip").write_text(src)
    out = d / f"lib{name}.so"
    run([hipcc, "--offload-arch=gfx1030", "-shared", "-fPIC", "-o", str(out), str(d / f"{name}.hip")], env=hip_env())
    return out


def _hip_code_object(d: Path, name: str, src: str) -> Path:
    """A gfx1030 code object on its own: the device-only bundle hipcc writes, unbundled."""
    hipcc = require_tool("hipcc")
    bundler = require_tool("clang-offload-bundler-15")
    (d / f"{name}.hip").write_text(src)
    bundle, co = d / f"{name}.bundle", d / f"{name}.co"
    run([hipcc, "--offload-arch=gfx1030", "--cuda-device-only", "-c", "-o", str(bundle), str(d / f"{name}.hip")],
        env=hip_env())
    run([bundler, "--unbundle", "--type=o", f"--input={bundle}", "--targets=hipv4-amdgcn-amd-amdhsa--gfx1030",
         f"--output={co}"])
    return co


def _cubin(d: Path, name: str, src: str, arch: str = "sm_80") -> Path:
    nvcc = require_tool("nvcc")
    (d / f"{name}.cu").write_text(src)
    out = d / f"{name}.cubin"
    run([nvcc, "-cubin", f"-arch={arch}", "-o", str(out), str(d / f"{name}.cu")])
    return out


# -- kernels by the vendor types in their signature ------------------------------------------


def test_kernel_templated_on_a_rocsparse_type_is_rocsparse(tmp_path):
    lib = _hip_so(tmp_path, "rsk", ROCSPARSE_HIP)
    kernels = _device_kernels(_findings(lib))
    assert set(kernels) == {"amd.rocsparse"}
    subject, where = kernels["amd.rocsparse"]
    assert "axpyi_kernel" in subject and "21rocsparse_complex_numIfE" in subject  # the struct, as written above
    assert where.endswith("amdgcn-code-object gfx1030")


def test_kernel_templated_on_our_own_type_passes(tmp_path):
    lib = _hip_so(tmp_path, "own", OWN_HIP)
    assert _device_kernels(_findings(lib)) == {}


def test_type_markers_keep_kernel_matching_fast():
    """librocsparse holds ~88k kernel names: judging each must not try every floating pattern
    along the whole name (one regex over all took ~50 us a name)."""
    import time

    pol = load_policy(None)
    names = [f"_ZL{12 + len(str(i))}axpyi_kernel{i}ILj256Ei21rocsparse_complex_numIfEEvT0_PT1_" for i in range(20000)]
    names += [f"_ZN2fk{8 + len(str(i))}kernel_a{i}IfEEvPT_S2_i" for i in range(20000)]
    pol.rule_for_kernel(names[0])
    start = time.process_time()
    got = {n: pol.rule_for_kernel(n) for n in names}
    spent = time.process_time() - start
    assert {r.id for r in got.values() if r} == {"amd.rocsparse"}
    assert sum(r is None for r in got.values()) == 20000
    assert spent < 2.0, f"{spent:.2f}s for 40k kernel names"


# -- standalone device-code files ----------------------------------------------------------------


def test_standalone_cubin_is_judged_as_device_code(tmp_path):
    cubin = _cubin(tmp_path, "trt", TRT_CU)
    info = read_elf(cubin)
    assert [(d.kind, d.target, d.kernels) for d in info.device_code] == \
        [("cubin", "sm_80", ("fmhaSm100fKernel_QkvBfloat16_test",))]
    kernels = _device_kernels(_findings(cubin))
    assert kernels == {"nvidia.tensorrt": ("fmhaSm100fKernel_QkvBfloat16_test", "file @0x0 cubin sm_80")}


def test_standalone_cubin_of_a_newer_abi_names_its_sm(tmp_path):
    # CUDA 12.8 on writes ELF ABI version 8 for every target: the SM number moved to e_flags bits 8-15
    cubin = _cubin(tmp_path, "trt100", TRT_CU, arch="sm_100f")
    assert [d.target for d in read_elf(cubin).device_code] == ["sm_100"]


def test_standalone_cubin_of_our_own_kernel_passes(tmp_path):
    cubin = _cubin(tmp_path, "own", OWN_CU)
    assert [d.kernels for d in read_elf(cubin).device_code] == [("fk_attention_kernel",)]
    assert _findings(cubin).verdict == "pass"


def test_standalone_code_object_is_judged_as_device_code(tmp_path):
    co = _hip_code_object(tmp_path, "tensile", TENSILE_HIP)
    info = read_elf(co)
    assert [(d.kind, d.target, d.kernels) for d in info.device_code] == \
        [("amdgcn-code-object", "gfx1030", ("Cijk_Ailk_Bljk_SB_MT64x64x8_fk",))]
    kernels = _device_kernels(_findings(co))
    assert kernels == {"amd.tensile": ("Cijk_Ailk_Bljk_SB_MT64x64x8_fk", "file @0x0 amdgcn-code-object gfx1030")}


def test_unreadable_standalone_cubin_is_an_error(tmp_path):
    cubin = _cubin(tmp_path, "trt", TRT_CU)
    data = bytearray(cubin.read_bytes())
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    struct.pack_into("<Q", data, 0x28, len(data) + 0x1000 if shoff else 0)  # section table past the end
    bad = tmp_path / "bad.cubin"
    bad.write_bytes(bytes(data))
    assert _findings(bad).verdict == "error"


# -- AMDGPU targets from e_flags ------------------------------------------------------------------


def _with_mach(co: Path, mach: int, dest: Path) -> Path:
    data = bytearray(co.read_bytes())
    (flags,) = struct.unpack_from("<I", data, 48)  # ELF64 e_flags
    struct.pack_into("<I", data, 48, (flags & ~0xFF) | mach)
    dest.write_bytes(bytes(data))
    return dest


@pytest.mark.parametrize("mach,target", [(0x49, "gfx1250"), (0x5A, "gfx1251"), (0x4E, "gfx1201"), (0x48, "gfx1200"),
                                         (0x4F, "gfx950"), (0x4C, "gfx942"), (0x4A, "gfx1151"),
                                         (0x5B, "gfx12-5-generic"), (0x50, "gfx1310")])
def test_newer_amdgpu_targets_are_named(tmp_path, mach, target):
    # hipcc 5.2 / clang-15 cannot target gfx12: a real gfx1030 code object with its machine byte changed
    co = _hip_code_object(tmp_path, "tensile", TENSILE_HIP)
    patched = _with_mach(co, mach, tmp_path / "patched.co")
    assert [d.target for d in read_elf(patched).device_code] == [target]


def test_a_machine_value_llvm_does_not_define_is_unknown(tmp_path):
    co = _hip_code_object(tmp_path, "tensile", TENSILE_HIP)
    patched = _with_mach(co, 0x7E, tmp_path / "patched.co")
    assert [d.target for d in read_elf(patched).device_code] == ["gfx-unknown-0x7e"]


# -- the strict policy ------------------------------------------------------------------------------


@pytest.fixture
def cufft_user(tmp_path) -> Path:
    gcc = require_tool("gcc")
    (tmp_path / "cufft.c").write_text(CUFFT_STUB_C)
    (tmp_path / "user.c").write_text(CUFFT_USER_C)
    run([gcc, "-shared", "-fPIC", "-o", "libcufft.so.11", "cufft.c", "-Wl,-soname,libcufft.so.11"], cwd=tmp_path)
    shutil.copy(tmp_path / "libcufft.so.11", tmp_path / "libcufft.so")
    run([gcc, "-shared", "-fPIC", "-o", "libfkfft.so", "user.c", "-L.", "-lcufft", "-Wl,-rpath,$ORIGIN"],
        cwd=tmp_path)
    return tmp_path / "libfkfft.so"


def test_strict_policy_is_shipped_and_extends_the_default():
    assert "strict" in shipped_policies()
    strict, default = load_policy("strict"), load_policy(None)
    ids = [r.id for r in strict.rules]
    assert ids[:len(default.rules)] == [r.id for r in default.rules]  # every default rule, in place
    for rid in ("nvidia.cufft", "nvidia.curand", "nvidia.cutensor", "nvidia.nccl", "nvidia.nvjpeg", "nvidia.npp",
                "amd.rocfft", "amd.rocrand", "intel.ipp"):
        assert rid in ids and strict.rule(rid).reason
        assert default.rule(rid) is None
    for name in ("libcufft.so.11", "cufft64_11.dll", "CUFFT64_11.DLL", "libcufft.dylib", "librocfft.so.0",
                 "libnccl.so.2", "librccl.so.1", "nppial64_12.dll", "libippcore.so", "libcurand.so.10"):
        assert strict.deny_rule_for_soname(name) is not None, name
        assert default.deny_rule_for_soname(name) is None, name
    # what the default denies stays denied by its own rule
    assert strict.deny_rule_for_soname("libcusparse.so.12").id == "nvidia.cusparse"
    assert strict.deny_rule_for_soname("libhipsparse.so.1").id == "amd.rocsparse"


def test_strict_catches_cufft_the_default_allows(cufft_user):
    assert _findings(cufft_user).verdict == "pass"
    result = _findings(cufft_user, load_policy("strict"))
    assert ("nvidia.cufft", "needed") in {(f.rule, f.kind) for f in result.findings}
    assert result.verdict == "fail"
