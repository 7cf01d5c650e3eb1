"""Standalone cubins of the shapes FlashInfer ships, built by nvcc: a TensorRT-LLM (trtllm-gen)
GEMM named gemm_<out>_<a><b>_<acc>_..._t<tile>_s<stages>_..._sm100f, and a kernel of another
namespace composed from CuTe (DeepGEMM's deep_gemm::sm100_fp8_gemm_1d1d_impl<cute::UMMA::Major,
...>), marked only by a cute:: type among its template arguments. The CuTe mark counts only
where no rule names the kernel itself, and a CUTLASS numeric type alone is no mark.
"""

from __future__ import annotations

from pathlib import Path

from conftest import require_tool
from elf_fixtures import run

from audit.elf.reader import read_elf
from audit.linkage.check import check_paths
from audit.linkage.judging.policy import load_policy
from audit.linkage.resolution.ldso import ResolveOptions

TRT_GEMM = "gemm_Bfloat16_E4m3E4m3_Fp32_t128x8x256_s4_et128x8_m128x8x32_c1x1x1_rM_TN_transOut_schedS_sm100f"
# Stand-ins declared here for the CuTe and CUTLASS types (only their mangled names matter).
CUTE_TYPES = r"""
namespace cute { namespace UMMA { enum class Major { K = 0, MN = 1 }; } }
namespace cutlass { struct bfloat16_t { unsigned short x; }; }
"""
DEEP_GEMM = CUTE_TYPES + r"""
namespace deep_gemm {
template <cute::UMMA::Major A, unsigned BM, typename T>
__global__ void sm100_fp8_gemm_1d1d_impl(T* d) { d[threadIdx.x].x = BM; }
template __global__ void sm100_fp8_gemm_1d1d_impl<cute::UMMA::Major::K, 128, cutlass::bfloat16_t>(cutlass::bfloat16_t*);
}
"""
# our own kernel on a CUTLASS numeric type only; a flash:: kernel with a CuTe argument
NUMERIC_ONLY = CUTE_TYPES + r"""
namespace fk { template <typename T> __global__ void attention(T* o) { o[threadIdx.x].x = 1; }
template __global__ void attention<cutlass::bfloat16_t>(cutlass::bfloat16_t*); }
"""
FLASH_CUTE = CUTE_TYPES + r"""
namespace flash { template <cute::UMMA::Major A> __global__ void flash_fwd_kernel(float* o) { o[threadIdx.x] = 1; }
template __global__ void flash_fwd_kernel<cute::UMMA::Major::K>(float*); }
"""


def _cubin(d: Path, name: str, src: str) -> Path:
    nvcc = require_tool("nvcc")
    (d / f"{name}.cu").write_text(src)
    out = d / f"{name}.cubin"
    run([nvcc, "-cubin", "-arch=sm_80", "-o", str(out), str(d / f"{name}.cu")])
    return out


def _kernels(path: Path) -> dict[str, str]:
    (res,) = check_paths([str(path)], load_policy(None), ResolveOptions()).files
    return {f.rule: f.subject for f in res.findings if f.kind == "device-kernel"}


def test_trtllm_gen_gemm_export_is_tensorrt(tmp_path):
    cubin = _cubin(tmp_path, "gemm", f'extern "C" __global__ void {TRT_GEMM}(float* c) {{ c[threadIdx.x] = 0; }}\n')
    assert _kernels(cubin) == {"nvidia.tensorrt": TRT_GEMM}


def test_kernel_composed_from_cute_is_cutlass(tmp_path):
    cubin = _cubin(tmp_path, "deepgemm", DEEP_GEMM)
    (kernel,) = read_elf(cubin).device_code[0].kernels
    assert kernel.startswith("_ZN9deep_gemm24sm100_fp8_gemm_1d1d_impl") and "N4cute4UMMA5MajorE" in kernel
    assert _kernels(cubin) == {"nvidia.cutlass": kernel}


def test_a_cutlass_numeric_type_alone_is_no_mark(tmp_path):
    assert _kernels(_cubin(tmp_path, "numeric", NUMERIC_ONLY)) == {}


def test_a_kernel_a_rule_names_keeps_its_rule(tmp_path):
    kernels = _kernels(_cubin(tmp_path, "flash", FLASH_CUTE))
    assert list(kernels) == ["attention.flash-attn"] and "N4cute" in kernels["attention.flash-attn"]
