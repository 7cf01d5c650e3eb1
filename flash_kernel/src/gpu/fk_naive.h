// fk_naive.h: the pre-flash path (the seed's oracle). It materialises S = scale * Q K^T in an fp32
// workspace, softmaxes each row in place, then computes O = S V. Plain shared-memory tiled FMA:
// deliberately the "engine's own attention before flash", not a tuned GEMM.
#ifndef FK_NAIVE_H
#define FK_NAIVE_H

#include "gpu/fk_traits.h"

namespace fk {
namespace naive {

// One chunk of work: heads [bh0, bh0 + gridDim.z) and query rows [row0, row0 + rows).
struct NaiveParams {
    const void *q, *k, *v;
    void *o;
    float *ws;                  // [z][rows][nk]
    int64_t heads, nq, nk, d;
    int64_t qs[3], ks[3], vs[3], os[3];
    float scale;
    int64_t bh0, row0, rows;
    float *lse;                 // the log-sum-exp per row, or null
    int64_t ls[3];
};

// S[z][r][j] = scale * sum_d Q[row0 + r][d] K[j][d]: 64 x 64 tile per block, 4 x 4 per thread.
template <class E>
__global__ void __launch_bounds__(256) scores_kernel(NaiveParams p) {
    using T = typename E::storage;
    constexpr int TM = NaiveTile::TM, TN = NaiveTile::TN, TK = NaiveTile::TK;
    __shared__ float as[TK][TM + 1];
    __shared__ float bs[TK][TN + 1];
    const int64_t bh = p.bh0 + blockIdx.z, b = bh / p.heads, h = bh % p.heads;
    const T *q = static_cast<const T *>(p.q) + b * p.qs[0] + h * p.qs[1];
    const T *k = static_cast<const T *>(p.k) + b * p.ks[0] + h * p.ks[1];
    const int64_t m0 = int64_t(blockIdx.y) * TM, n0 = int64_t(blockIdx.x) * TN;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float c[4][4] = {};
    for (int64_t k0 = 0; k0 < p.d; k0 += TK) {
        for (int e = threadIdx.x; e < TM * TK; e += 256) {
            const int kk = e % TK, mm = e / TK;  // k fastest: contiguous along D in memory
            const int64_t r = m0 + mm, dd = k0 + kk;
            as[kk][mm] = (r < p.rows && dd < p.d) ? E::to_float(q[(p.row0 + r) * p.qs[2] + dd]) : 0.0f;
            const int64_t j = n0 + mm;
            bs[kk][mm] = (j < p.nk && dd < p.d) ? E::to_float(k[j * p.ks[2] + dd]) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TK; ++kk)
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) c[i][j] = fmaf(as[kk][ty + 16 * i], bs[kk][tx + 16 * j], c[i][j]);
        __syncthreads();
    }
    float *ws = p.ws + int64_t(blockIdx.z) * p.rows * p.nk;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int64_t r = m0 + ty + 16 * i, col = n0 + tx + 16 * j;
            if (r < p.rows && col < p.nk) ws[r * p.nk + col] = c[i][j] * p.scale;
        }
}

// Row softmax in place, one block per row of the workspace (row r of head z: block z * rows + r);
// the row's log-sum-exp (natural log: the scores are scaled already) where p.lse is set.
__global__ void __launch_bounds__(256) softmax_kernel(NaiveParams p) {
    constexpr int NT = NaiveTile::kSoftmaxThreads;
    __shared__ float red[NT];
    const int64_t nk = p.nk;
    float *row = p.ws + int64_t(blockIdx.x) * nk;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < nk; j += NT) mx = fmaxf(mx, row[j]);
    red[threadIdx.x] = mx;
    __syncthreads();
    for (int s = NT / 2; s > 0; s >>= 1) {
        if (int(threadIdx.x) < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
        __syncthreads();
    }
    mx = red[0];
    __syncthreads();
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < nk; j += NT) sum += expf(row[j] - mx);
    red[threadIdx.x] = sum;
    __syncthreads();
    for (int s = NT / 2; s > 0; s >>= 1) {
        if (int(threadIdx.x) < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    const float inv = 1.0f / red[0];
    if (p.lse != nullptr && threadIdx.x == 0) {
        const int64_t z = blockIdx.x / p.rows, r = blockIdx.x % p.rows, bh = p.bh0 + z;
        p.lse[(bh / p.heads) * p.ls[0] + (bh % p.heads) * p.ls[1] + (p.row0 + r) * p.ls[2]] = mx + logf(red[0]);
    }
    for (int64_t j = threadIdx.x; j < nk; j += NT) row[j] = expf(row[j] - mx) * inv;
}

// O[row0 + r][e] = sum_j P[z][r][j] V[j][e].
template <class E>
__global__ void __launch_bounds__(256) pv_kernel(NaiveParams p) {
    using T = typename E::storage;
    constexpr int TM = NaiveTile::TM, TN = NaiveTile::TN, TK = NaiveTile::TK;
    __shared__ float as[TK][TM + 1];
    __shared__ float bs[TK][TN + 1];
    const int64_t bh = p.bh0 + blockIdx.z, b = bh / p.heads, h = bh % p.heads;
    const T *v = static_cast<const T *>(p.v) + b * p.vs[0] + h * p.vs[1];
    T *o = static_cast<T *>(p.o) + b * p.os[0] + h * p.os[1];
    const float *ws = p.ws + int64_t(blockIdx.z) * p.rows * p.nk;
    const int64_t m0 = int64_t(blockIdx.y) * TM, n0 = int64_t(blockIdx.x) * TN;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float c[4][4] = {};
    for (int64_t k0 = 0; k0 < p.nk; k0 += TK) {
        for (int e = threadIdx.x; e < TM * TK; e += 256) {
            const int kk = e % TK, mm = e / TK;  // P: contiguous along keys
            const int64_t r = m0 + mm, j = k0 + kk;
            as[kk][mm] = (r < p.rows && j < p.nk) ? ws[r * p.nk + j] : 0.0f;
            const int nn = e % TN, kv = e / TN;  // V: contiguous along D
            const int64_t jj = k0 + kv, col = n0 + nn;
            bs[kv][nn] = (jj < p.nk && col < p.d) ? E::to_float(v[jj * p.vs[2] + col]) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TK; ++kk)
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) c[i][j] = fmaf(as[kk][ty + 16 * i], bs[kk][tx + 16 * j], c[i][j]);
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int64_t r = m0 + ty + 16 * i, col = n0 + tx + 16 * j;
            if (r < p.rows && col < p.d) o[(p.row0 + r) * p.os[2] + col] = E::from_float(c[i][j]);
        }
}

}  // namespace naive
}  // namespace fk

#endif  // FK_NAIVE_H
