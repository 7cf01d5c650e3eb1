// fk_common.h: argument validation and the thread-local last error, shared by every target.
//
// Host code only (compiled by g++, hipcc and nvcc alike). Each fk_* entry point calls
// fk_validate() before touching memory or launching anything, so no argument value can cause an
// out-of-bounds access: that is the ABI's promise, and it lives here once.
#ifndef FK_COMMON_H
#define FK_COMMON_H

#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>

#include "flash_kernel.h"

namespace fk {

inline char *last_error_buffer() {
    static thread_local char buf[512] = "";
    return buf;
}

// Records the message and returns the status, so callers write `return fail(FK_ERR_X, ...)`.
inline int32_t fail(int32_t status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(last_error_buffer(), 512, fmt, ap);
    va_end(ap);
    return status;
}

// Head dims every target supports: 32 to 256 in steps of 8. A step of 8 keeps every row of every
// dtype a whole number of 16-byte chunks (8 fp16/bf16 or 4 fp32 elements), which the vector loads
// and the zero-filled padding of the GPU kernels (gpu/fk_traits.h, "Head-dim buckets") rely on.
constexpr int32_t kMinHeadDim = 32, kMaxHeadDim = 256, kHeadDimStep = 8;
constexpr int32_t kNumHeadDims = (kMaxHeadDim - kMinHeadDim) / kHeadDimStep + 1;

constexpr bool head_dim_supported(int64_t d) {
    return d >= kMinHeadDim && d <= kMaxHeadDim && d % kHeadDimStep == 0;
}

// fk_supported_head_dims of every target: the set, ascending, into dims[0..capacity).
inline int32_t supported_head_dims(int32_t *dims, int32_t capacity) {
    if (dims != nullptr)
        for (int32_t i = 0; i < kNumHeadDims && i < capacity; ++i) dims[i] = kMinHeadDim + i * kHeadDimStep;
    return kNumHeadDims;
}

inline int32_t ok() {
    last_error_buffer()[0] = '\0';
    return FK_OK;
}

// The flash path the last fk_flash_forward on this thread ran ("" when it refused or failed):
// what dispatch chose, read back by fk_last_flash_path() so a benchmark can name it per call.
inline const char *&ran_path() {
    static thread_local const char *path = "";
    return path;
}

// Returns `status`, recording `path` as the one that ran when it is FK_OK.
inline int32_t ran(int32_t status, const char *path) {
    if (status == FK_OK) ran_path() = path;
    return status;
}

inline int64_t dtype_size(int32_t dtype) {
    switch (dtype) {
        case FK_DTYPE_F32: return 4;
        case FK_DTYPE_F16: return 2;
        case FK_DTYPE_BF16: return 2;
        default: return 0;
    }
}

// a*b + c without signed overflow; false when the result does not fit in int64.
inline bool mul_add(int64_t a, int64_t b, int64_t c, int64_t *out) {
    if (a < 0 || b < 0 || c < 0) return false;
    if (a != 0 && b > (INT64_MAX - c) / a) return false;
    *out = a * b + c;
    return true;
}

// The largest element offset a (B, H, N, D) tensor with these strides touches, +1.
inline bool extent(const int64_t stride[3], int64_t b, int64_t h, int64_t n, int64_t d, int64_t *out) {
    int64_t e = d;  // D is contiguous
    if (!mul_add(b - 1, stride[0], e, &e)) return false;
    if (!mul_add(h - 1, stride[1], e, &e)) return false;
    if (!mul_add(n - 1, stride[2], e, &e)) return false;
    *out = e;
    return true;
}

struct Validated {
    float scale;         // resolved: 1/sqrt(D) when args->scale == 0
    int64_t elem_bytes;
};

// Checks everything the kernels rely on. `vector_bytes` is the load width of the vector path
// (0: none); pointers and the B/H/N strides must then be multiples of it.
inline int32_t validate(const fk_attention_args *a, int64_t vector_bytes, Validated *v) {
    if (a == nullptr) return fail(FK_ERR_NULL_POINTER, "args is NULL");
    if (a->abi_version != FK_ABI_VERSION)
        return fail(FK_ERR_ABI, "args.abi_version is %d; this library implements ABI %d",
                    (int)a->abi_version, FK_ABI_VERSION);
    if (a->precision != FK_PRECISION_EXACT && a->precision != FK_PRECISION_FP8)
        return fail(FK_ERR_PRECISION, "precision %d is not exact (0) or fp8 (1)", (int)a->precision);
    if (!a->q || !a->k || !a->v || !a->o) return fail(FK_ERR_NULL_POINTER, "q, k, v and o must be non-NULL");
    int64_t es = dtype_size(a->dtype);
    if (es == 0) return fail(FK_ERR_DTYPE, "dtype %d is not f32 (0), f16 (1) or bf16 (2)", (int)a->dtype);
    if (a->batch < 1 || a->heads < 1 || a->nq < 1 || a->nk < 1 || a->head_dim < 1)
        return fail(FK_ERR_SIZE, "batch, heads, nq, nk and head_dim must all be >= 1");
    if (!head_dim_supported(a->head_dim)) {
        char list[kNumHeadDims * 5 + 1] = "";  // "32, 40, ..., 256": at most 5 characters a dim
        int used = 0;
        for (int32_t i = 0; i < kNumHeadDims; ++i)
            used += std::snprintf(list + used, sizeof list - used, "%s%d", i ? ", " : "", (int)(kMinHeadDim + i * kHeadDimStep));
        return fail(FK_ERR_HEAD_DIM, "head_dim %lld is not supported by this build (supported: %s)",
                    (long long)a->head_dim, list);
    }
    const int64_t *strides[4] = {a->q_stride, a->k_stride, a->v_stride, a->o_stride};
    const char *names[4] = {"q", "k", "v", "o"};
    for (int t = 0; t < 4; ++t)
        for (int i = 0; i < 3; ++i)
            if (strides[t][i] < 0) return fail(FK_ERR_STRIDE, "%s_stride[%d] is negative", names[t], i);
    for (int t = 0; t < 4; ++t) {
        int64_t n = (t == 1 || t == 2) ? a->nk : a->nq, e = 0, bytes = 0;
        if (!extent(strides[t], a->batch, a->heads, n, a->head_dim, &e) || !mul_add(e, es, 0, &bytes))
            return fail(FK_ERR_SIZE, "%s: sizes and strides overflow a 64-bit byte offset", names[t]);
        // Rows must not overlap within a head, or the kernel's view of the tensor is ambiguous.
        if (n > 1 && strides[t][2] < a->head_dim)
            return fail(FK_ERR_STRIDE, "%s_stride[2] (%lld) is smaller than head_dim", names[t], (long long)strides[t][2]);
    }
    if (a->lse != nullptr) {  // the optional log-sum-exp: fp32 (B, H, nq) through its own strides
        for (int i = 0; i < 3; ++i)
            if (a->lse_stride[i] < 0) return fail(FK_ERR_STRIDE, "lse_stride[%d] is negative", i);
        int64_t e = 0, bytes = 0;
        if (!extent(a->lse_stride, a->batch, a->heads, a->nq, 1, &e) || !mul_add(e, 4, 0, &bytes))
            return fail(FK_ERR_SIZE, "lse: sizes and strides overflow a 64-bit byte offset");
        if (a->nq > 1 && a->lse_stride[2] < 1)
            return fail(FK_ERR_STRIDE, "lse_stride[2] is 0: the rows of a head would share one element");
        if (reinterpret_cast<uintptr_t>(a->lse) % 4 != 0) return fail(FK_ERR_ALIGNMENT, "lse is not 4-byte aligned");
    }
    if (!(std::isfinite(a->scale)) || a->scale < 0.0f)
        return fail(FK_ERR_SCALE, "scale must be 0 (default 1/sqrt(D)) or positive and finite");
    if (vector_bytes > 0) {
        const void *ptrs[4] = {a->q, a->k, a->v, a->o};
        for (int t = 0; t < 4; ++t) {
            if (reinterpret_cast<uintptr_t>(ptrs[t]) % vector_bytes != 0)
                return fail(FK_ERR_ALIGNMENT, "%s is not %lld-byte aligned", names[t], (long long)vector_bytes);
            for (int i = 0; i < 3; ++i)
                if ((strides[t][i] * es) % vector_bytes != 0)
                    return fail(FK_ERR_ALIGNMENT, "%s_stride[%d] * %lld bytes is not a multiple of %lld",
                                names[t], i, (long long)es, (long long)vector_bytes);
        }
    }
    v->scale = a->scale == 0.0f ? 1.0f / std::sqrt(static_cast<float>(a->head_dim)) : a->scale;
    v->elem_bytes = es;
    return FK_OK;
}

// The refusal of FK_PRECISION_FP8 where this build or path has no FP8 kernel.
inline int32_t no_fp8(const char *where) {
    return fail(FK_ERR_PRECISION, "precision fp8 is not available %s: the FP8 kernel needs FP8 tensor cores "
                "(an sm_90a build on a cc 9.0 device, head dims 32..128)", where);
}

}  // namespace fk

#endif  // FK_COMMON_H
