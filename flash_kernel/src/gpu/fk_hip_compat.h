// fk_hip_compat.h: our kernels are written in the HIP dialect; this header lets nvcc compile them.
//
// hipcc (clang, AMD): the real HIP runtime headers. nvcc: a thin mapping of the few hip* names we
// use onto the CUDA runtime (the other way round from llama.cpp's vendors/hip.h). Debian's own HIP
// "nvidia" headers do not compile against CUDA 13, so we map only what fk_gpu.hip needs.
#ifndef FK_HIP_COMPAT_H
#define FK_HIP_COMPAT_H

#include <stdint.h>

#if defined(__NVCC__)
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#define FK_PLATFORM_NVIDIA 1
typedef cudaError_t hipError_t;
typedef cudaStream_t hipStream_t;
#define hipSuccess cudaSuccess
#define hipErrorOutOfMemory cudaErrorMemoryAllocation
#define hipMalloc cudaMalloc
#define hipFree cudaFree
#define hipGetLastError cudaGetLastError
#define hipGetErrorString cudaGetErrorString
#define hipStreamSynchronize cudaStreamSynchronize
#define hipFuncSetAttribute cudaFuncSetAttribute
#define hipFuncAttributeMaxDynamicSharedMemorySize cudaFuncAttributeMaxDynamicSharedMemorySize

#define FK_DEVICE __device__ __forceinline__

FK_DEVICE float fk_shfl_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
FK_DEVICE float fk_half_to_float(uint16_t h) { return __half2float(__ushort_as_half(h)); }
FK_DEVICE uint16_t fk_float_to_half(float f) { return __half_as_ushort(__float2half_rn(f)); }

#else  // hipcc for AMD targets
#include <hip/hip_runtime.h>

#define FK_PLATFORM_AMD 1
#define FK_DEVICE __device__ __forceinline__

// Width defaults to warpSize: masks below 16 stay inside a 16-lane group on wave32 and wave64.
FK_DEVICE float fk_shfl_xor(float v, int mask) { return __shfl_xor(v, mask); }
FK_DEVICE float fk_half_to_float(uint16_t h) { return static_cast<float>(__builtin_bit_cast(_Float16, h)); }
FK_DEVICE uint16_t fk_float_to_half(float f) { return __builtin_bit_cast(uint16_t, static_cast<_Float16>(f)); }

// v_dot2_f32_f16 (fp16 products, fp32 accumulation): RDNA2 gfx1030-gfx1036 and the CDNA/Vega
// parts that have dot2 instructions. Other targets use two FMAs.
#if defined(__gfx1030__) || defined(__gfx1031__) || defined(__gfx1032__) || defined(__gfx1033__) || \
    defined(__gfx1034__) || defined(__gfx1035__) || defined(__gfx1036__) || defined(__gfx906__) ||   \
    defined(__gfx908__) || defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx1011__) ||     \
    defined(__gfx1012__)
#define FK_HAVE_FDOT2 1
typedef _Float16 fk_half2_t __attribute__((ext_vector_type(2)));
#endif
#endif

// bf16 is the top half of an fp32: widening is a shift, narrowing rounds to nearest even.
FK_DEVICE float fk_bf16_to_float(uint16_t b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }
FK_DEVICE uint16_t fk_float_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN stays NaN
    return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

#endif  // FK_HIP_COMPAT_H
