// fk_generic.h: the generic tiled flash kernel (FMA, shared-memory tiles, online softmax).
// It is the RDNA2 (gfx1030) kernel; on NVIDIA it runs for fp32, and everywhere under
// -DFK_FORCE_GENERIC. D is the head-dim bucket (fk_traits.h); p.d <= D the real head dim.
#ifndef FK_GENERIC_H
#define FK_GENERIC_H

#include "gpu/fk_traits.h"

namespace fk {
namespace generic {

// Copies rows [r0, r0+rows) of a head (row stride rs elements) into smem words, 16 bytes per
// load; rows past `valid` and columns past the head dim dh (the bucket's padding) are zero-filled
// so masked lanes never read garbage (or NaN).
template <class E, int D, int W, int ROWS, int NT>
FK_DEVICE void load_tile(uint32_t *dst, const typename E::storage *base, int64_t rs, int64_t r0, int64_t valid, int dh) {
    constexpr int kPerVec = 16 / E::kBytes;             // elements per 16-byte load
    constexpr int kVecs = D / kPerVec;                  // per row
    constexpr int kWordsPerVec = 4;
    for (int i = threadIdx.x; i < ROWS * kVecs; i += NT) {
        const int r = i / kVecs, c = i % kVecs;
        uint4 x = make_uint4(0u, 0u, 0u, 0u);
        if (r0 + r < valid && c * kPerVec < dh) x = *reinterpret_cast<const uint4 *>(base + (r0 + r) * rs + c * kPerVec);
        uint32_t *d = dst + r * W + c * kWordsPerVec;
        d[0] = x.x; d[1] = x.y; d[2] = x.z; d[3] = x.w;
    }
}

// Dot product of one smem word of Q with one of K (1 fp32, or 2 fp16/bf16 elements).
template <class E> FK_DEVICE float dot_word(uint32_t a, uint32_t b, float acc);
template <> FK_DEVICE float dot_word<F32>(uint32_t a, uint32_t b, float acc) {
    return fmaf(__uint_as_float(a), __uint_as_float(b), acc);
}
template <> FK_DEVICE float dot_word<F16>(uint32_t a, uint32_t b, float acc) {
#if defined(FK_HAVE_FDOT2)
    // v_dot2_f32_f16: both fp16 products summed into the fp32 accumulator in one instruction.
    return __builtin_amdgcn_fdot2(__builtin_bit_cast(fk_half2_t, a), __builtin_bit_cast(fk_half2_t, b), acc, false);
#else
    acc = fmaf(fk_half_to_float(uint16_t(a & 0xffffu)), fk_half_to_float(uint16_t(b & 0xffffu)), acc);
    return fmaf(fk_half_to_float(uint16_t(a >> 16)), fk_half_to_float(uint16_t(b >> 16)), acc);
#endif
}
template <> FK_DEVICE float dot_word<BF16>(uint32_t a, uint32_t b, float acc) {
    acc = fmaf(__uint_as_float(a << 16), __uint_as_float(b << 16), acc);
    return fmaf(__uint_as_float(a & 0xffff0000u), __uint_as_float(b & 0xffff0000u), acc);
}

template <class E, int D>
__global__ void __launch_bounds__(128) flash_generic_kernel(FlashParams p) {
    using T = typename E::storage;
    using Tile = GenericTile<D, E::kBytes>;
    constexpr int BM = Tile::BM, BN = Tile::BN, RM = Tile::RM, CN = Tile::CN, DN = Tile::DN;
    constexpr int W = Tile::W, PW = Tile::PW, NT = Tile::kThreads;
    __shared__ uint32_t qs[BM * W];
    __shared__ uint32_t kv[BN * W];
    __shared__ float ps[BM * PW];

    const int tid = threadIdx.x, rg = tid / 16, cg = tid % 16;
    const int64_t bh = p.bh0 + blockIdx.y, b = bh / p.heads, h = bh % p.heads;
    const int64_t q0 = int64_t(blockIdx.x) * BM;
    const T *q = static_cast<const T *>(p.q) + b * p.qs[0] + h * p.qs[1];
    const T *k = static_cast<const T *>(p.k) + b * p.ks[0] + h * p.ks[1];
    const T *v = static_cast<const T *>(p.v) + b * p.vs[0] + h * p.vs[1];
    T *o = static_cast<T *>(p.o) + b * p.os[0] + h * p.os[1];

    // The head dim: columns dh..D-1 are zeros in shared memory. Q K^T and P V run over all D
    // columns (a run-time bound there cost the exact buckets their unrolled hot loop on RDNA2);
    // the padding costs FMA work only on head dims below their bucket.
    const int dh = p.d;
    load_tile<E, D, W, BM, NT>(qs, q, p.qs[2], q0, p.nq, dh);

    float acc[RM][DN], m[RM], l[RM];
#pragma unroll
    for (int i = 0; i < RM; ++i) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int d = 0; d < DN; ++d) acc[i][d] = 0.0f;
    }

    for (int64_t k0 = 0; k0 < p.nk; k0 += BN) {
        __syncthreads();  // the previous tile's P V is done with kv
        load_tile<E, D, W, BN, NT>(kv, k, p.ks[2], k0, p.nk, dh);
        __syncthreads();

        float s[RM][CN];
#pragma unroll
        for (int i = 0; i < RM; ++i)
#pragma unroll
            for (int j = 0; j < CN; ++j) s[i][j] = 0.0f;
#pragma unroll 4
        for (int w = 0; w < W - 1; ++w) {
            uint32_t qw[RM], kw[CN];
#pragma unroll
            for (int i = 0; i < RM; ++i) qw[i] = qs[(rg * RM + i) * W + w];
#pragma unroll
            for (int j = 0; j < CN; ++j) kw[j] = kv[(cg + 16 * j) * W + w];
#pragma unroll
            for (int i = 0; i < RM; ++i)
#pragma unroll
                for (int j = 0; j < CN; ++j) s[i][j] = dot_word<E>(qw[i], kw[j], s[i][j]);
        }

        // Online softmax in base 2: the row's 16 owners agree on max via xor-shuffles.
#pragma unroll
        for (int i = 0; i < RM; ++i) {
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < CN; ++j) {
                if (k0 + cg + 16 * j >= p.nk) s[i][j] = -INFINITY;
                mx = fmaxf(mx, s[i][j]);
            }
#pragma unroll
            for (int off = 8; off > 0; off >>= 1) mx = fmaxf(mx, fk_shfl_xor(mx, off));
            const float m_new = fmaxf(m[i], mx * p.scale_log2);  // finite: every tile has a valid key
            const float alpha = exp2f(m[i] - m_new);
            m[i] = m_new;
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < CN; ++j) {
                const float e = exp2f(fmaf(s[i][j], p.scale_log2, -m_new));
                sum += e;
                ps[(rg * RM + i) * PW + cg + 16 * j] = e;
            }
            l[i] = l[i] * alpha + sum;  // this lane's partial; summed over the group at the end
#pragma unroll
            for (int d = 0; d < DN; ++d) acc[i][d] *= alpha;
        }

        __syncthreads();  // P written, everyone done with K
        load_tile<E, D, W, BN, NT>(kv, v, p.vs[2], k0, p.nk, dh);
        __syncthreads();

        const T *vt = reinterpret_cast<const T *>(kv);
        constexpr int kRowElems = W * Tile::kPerWord;
#pragma unroll 2
        for (int n = 0; n < BN; ++n) {
            float pr[RM], vv[DN];
#pragma unroll
            for (int i = 0; i < RM; ++i) pr[i] = ps[(rg * RM + i) * PW + n];
#pragma unroll
            for (int d = 0; d < DN; ++d) vv[d] = E::to_float(vt[n * kRowElems + cg + 16 * d]);
#pragma unroll
            for (int i = 0; i < RM; ++i)
#pragma unroll
                for (int d = 0; d < DN; ++d) acc[i][d] = fmaf(pr[i], vv[d], acc[i][d]);
        }
    }

#pragma unroll
    for (int i = 0; i < RM; ++i) {
        float sum = l[i];
#pragma unroll
        for (int off = 8; off > 0; off >>= 1) sum += fk_shfl_xor(sum, off);
        const int64_t r = q0 + rg * RM + i;
        if (r < p.nq) {
            if (p.lse != nullptr && cg == 0) p.lse[b * p.ls[0] + h * p.ls[1] + r * p.ls[2]] = row_lse(m[i], sum);
            const float inv = 1.0f / sum;
#pragma unroll
            for (int d = 0; d < DN; ++d)
                if (cg + 16 * d < dh) o[r * p.os[2] + cg + 16 * d] = E::from_float(acc[i][d] * inv);
        }
    }
}

}  // namespace generic
}  // namespace fk

#endif  // FK_GENERIC_H
