// fk_fp8.h: FP8 attention on Hopper (sm_90a; precision FK_PRECISION_FP8; head dims 32..128).
//
// The numerics are flash_kernel/fp8.py's CHOSEN scheme, which the GPU tests use as the oracle:
// K smoothed (its mean over the keys subtracted, per (batch, head) and channel), Q and K rounded to
// INT8 with one scale per block (Q: 64 rows, one consumer warpgroup; K: one 128-key tile), Q K^T
// exact in int32; P (against the running maximum) scaled by 448 and V by one scale per channel,
// both e4m3; P V in the FP8 tensor core per tile, the tiles summed in fp32 (two-level).
//
// Two stages in one call, on the caller's stream, into the caller's workspace (fk_workspace_bytes):
//  1. Quantization: stats (per-chunk partial sums of K and maxima of |V|, then their reduction to
//     K's mean and V's scales), then Q, K and V written in the exact shared-memory image the
//     attention kernel reads: 128-byte rows (Q and K rows zero-padded past the head dim), the
//     128-byte swizzle (16-byte chunk c of row r at c ^ (r % 8)), V transposed (one row per channel,
//     keys along it) with the keys of every 32 permuted to match P's register fragments (below).
//     Every tile is contiguous, so the attention kernel loads it with one 1-D bulk copy: no tensor
//     map, and the caller's strides and layout matter only here.
//  2. Attention: warpgroup 0 produces (bulk copies into a ring of kStages K/V slots, mbarriers),
//     warpgroups 1 and 2 (and 3 at head dim 64) consume 64 query rows each, taking turns to issue
//     their GEMMs (ping-pong) so one's softmax overlaps another's tensor-core work; each turn issues S(j) = Q K(j)^T
//     (wgmma s8, k32) with P(j-1) V(j-1) (wgmma e4m3, P from registers).
//
// P from registers: the A fragment of a k32 wgmma holds, per thread, rows r and r + 8 and k columns
// 4(lane%4)..+3 and 16 + 4(lane%4)..+3; the S accumulator holds keys 8t + 2(lane%4) + {0, 1} of
// n8 tile t. A thread's four S values of rows r in n8 tiles 4g and 4g + 1 fill its k columns
// 4(lane%4)..+3 of k32 group g, so the P V reduction runs over keys in the order
//     k column c -> key (c / 16) * 16 + ((c % 4) / 2) * 8 + 2 ((c % 16) / 4) + (c % 2)
// and V^T's bytes of each 32 keys are stored in that order by the quantization (kPermutedKey).
#ifndef FK_FP8_H
#define FK_FP8_H

#include <climits>

#include "gpu/fk_wgmma.h"

#if defined(FK_HAVE_WGMMA)
#define FK_HAVE_FP8 1

namespace fk {
namespace fp8 {

constexpr int kQBlock = 64;       // query rows per Q scale: one consumer warpgroup (fp8.Q_BLOCK)
// Consumer warpgroups a block, taking turns to issue their GEMMs, per head-dim bucket: 3 at head
// dim 64 (192 query rows a block, 160 registers a consumer thread), so that with FP8's shorter
// GEMMs two consumers' softmax can run while the third's GEMMs do; 2 at 128, where three fit only
// with one level of P V (FK_FP8_SINGLE_LEVEL=1) and still spill (O, S and P take 144 registers).
// Measured on an H100 (docs/perf.md "FP8 attention on an H100"): two consumers took 1.07-1.33x
// the time of three at the head-dim-64 shapes of 4.4k tokens and more (0.92x at 4.2k tokens);
// three at head dim 128, with one level, 0.90-1.04x the time of two.
#ifndef FK_FP8_CONSUMERS_D64
#define FK_FP8_CONSUMERS_D64 3
#endif
#ifndef FK_FP8_CONSUMERS_D128
#define FK_FP8_CONSUMERS_D128 2
#endif
constexpr int kMaxConsumers = 3;
constexpr int BN = 128;           // keys per K/V tile and per K scale (fp8.kv_tile(D) for D <= 128)
constexpr int kRowBytes = 128;    // one swizzled row: Q and K rows (int8, padded), V^T rows (BN keys)
constexpr int kMaxDim = 128;      // head dims this kernel takes (bucket 64 up to 64, 128 above)
// keys per partial of the K mean / V maximum: 256 gives a short call's statistics enough blocks (at
// 1024, 4608 keys x 24 heads made 120 blocks of 64 dependent loads a thread: 70 us on an H100)
constexpr int kStatKeys = 256;
constexpr int kStages = 4;        // K/V slots in the ring
constexpr int kQTileBytes = kQBlock * kRowBytes;  // one consumer's Q
constexpr int kKTileBytes = BN * kRowBytes;
constexpr float kE4m3Max = 448.0f, kInt8Max = 127.0f;
// P in [0, 1] is scaled by 448 (fp8.P_SCALE) before its e4m3 rounding: the kernel exponentiates
// straight to 448 P, adding log2(448) to the exponent
constexpr float kLog2PScale = 8.807354922057604f;

template <int D> struct Fp8Tile {
    static_assert(D == 64 || D == 128, "fp8 buckets: 64 and 128");
    static constexpr int kConsumers = D == 64 ? FK_FP8_CONSUMERS_D64 : FK_FP8_CONSUMERS_D128;
    static_assert(kConsumers == 2 || kConsumers == 3, "fp8: two or three consumer warpgroups");
    static constexpr int BM = kQBlock * kConsumers;           // query rows per block
    static constexpr int kThreads = 128 * (1 + kConsumers);   // producer + consumers
    // setmaxnreg: the producer gives its registers to the consumers (24 * 128 + n * 128 * regs <= 64K)
    static constexpr int kConsumerRegs = kConsumers == 2 ? 240 : 160;
    static constexpr int kVTileBytes = D * kRowBytes;  // V^T: D rows of BN keys
    static constexpr int kQBytes = kConsumers * kQTileBytes;
    static constexpr int kSmemBytes = 1024 + kQBytes + kStages * (kKTileBytes + kVTileBytes) + 8 * (kConsumers + 3 * kStages);
    static constexpr int kKSteps = D / 32;  // k32 steps of Q K^T over the columns that can hold data
};

// The workspace, carved from one caller buffer: every region starts on a 1 KiB boundary.
struct Layout {
    int64_t bh, nq, nk, qblocks, ntiles, chunks;
    int64_t q_img, k_img, v_img, q_scale, k_scale, k_mean, v_scale, q_shift, k_part, v_part, total;
};

inline int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

// The byte offsets of every region for these sizes; false where they overflow int64.
inline bool layout_for(int64_t batch, int64_t heads, int64_t nq, int64_t nk, int dbucket, Layout *l) {
    l->bh = batch * heads;
    l->nq = nq;
    l->nk = nk;
    l->qblocks = (nq + kQBlock - 1) / kQBlock;
    l->ntiles = (nk + BN - 1) / BN;
    l->chunks = (nk + kStatKeys - 1) / kStatKeys;
    const int64_t sizes[10] = {
        l->qblocks * kQTileBytes, l->ntiles * kKTileBytes, l->ntiles * int64_t(dbucket) * kRowBytes,
        l->qblocks * 4, l->ntiles * 4, int64_t(kMaxDim) * 4, int64_t(kMaxDim) * 4, nq * 4,
        l->chunks * kMaxDim * 4, l->chunks * kMaxDim * 4};
    int64_t *offsets[10] = {&l->q_img, &l->k_img, &l->v_img, &l->q_scale, &l->k_scale,
                            &l->k_mean, &l->v_scale, &l->q_shift, &l->k_part, &l->v_part};
    int64_t at = 0;
    for (int i = 0; i < 10; ++i) {
        // per (batch, head) sizes times bh, each region 1 KiB aligned
        if (sizes[i] < 0 || (l->bh > 0 && sizes[i] > (INT64_MAX / 2) / l->bh)) return false;
        const int64_t bytes = align_up(sizes[i] * l->bh, 1024);
        *offsets[i] = at;
        if (at > INT64_MAX / 2 - bytes) return false;
        at += bytes;
    }
    l->total = at;
    return true;
}

struct Fp8Params {
    const void *q, *k, *v;
    void *o;
    int64_t heads, nq, nk;
    int64_t qs[3], ks[3], vs[3], os[3];
    int32_t d;           // the head dim (<= the bucket D)
    float scale;         // softmax scale (natural)
    float scale_log2;    // scale * log2(e)
    float *lse;          // the log-sum-exp per row, or null
    int64_t ls[3];
    int64_t bh0;         // first (batch * heads + head) of this launch
    int32_t qblocks, ntiles, chunks;
    unsigned char *ws;   // the workspace; regions at Layout's offsets
    Layout lay;
};

// Eight consecutive elements of a row (`row` points at its column 0) from column c0, a multiple of 8,
// as floats; zeros where c0 is past the head dim (8 | d, so a group is whole or absent). One or two
// 16-byte loads where the address is 16-byte aligned (any contiguous tensor, diffusers' (B, N, H, D)
// layout), else one load an element (views at an odd offset). The quantization kernels read their
// rows this way, a warp 512 bytes of consecutive rows a load: they ran at a quarter to a third of the
// memory bandwidth reading 2 bytes a load at a 32- or 64-byte stride across a warp.
template <class E> FK_DEVICE void load8(const typename E::storage *row, int c0, int d, float (&x)[8]) {
    using St = typename E::storage;
    if (c0 >= d) {
#pragma unroll
        for (int e = 0; e < 8; ++e) x[e] = 0.0f;
        return;
    }
    const St *at = row + c0;
    if (reinterpret_cast<uintptr_t>(at) % 16 == 0) {
        alignas(16) St v[8];
#pragma unroll
        for (int i = 0; i < int(sizeof(v) / 16); ++i) reinterpret_cast<uint4 *>(v)[i] = reinterpret_cast<const uint4 *>(at)[i];
#pragma unroll
        for (int e = 0; e < 8; ++e) x[e] = E::to_float(v[e]);
    } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) x[e] = E::to_float(at[e]);
    }
}

// A tensor's (batch, head) slice: element 0 of its row 0.
template <class E> FK_DEVICE const typename E::storage *head_base(const void *base, const int64_t (&st)[3], int64_t bh, int64_t heads) {
    return static_cast<const typename E::storage *>(base) + (bh / heads) * st[0] + (bh % heads) * st[1];
}

// Swizzled byte offset of 16-byte chunk `c` of row `r` in a 128-byte-row image.
FK_DEVICE int swz(int r, int c) { return r * kRowBytes + ((c ^ (r % 8)) * 16); }

// The key (0..31 within its group of 32) that P V's k column `c` multiplies (see the top).
FK_DEVICE int permuted_key(int c) { return (c / 16) * 16 + ((c % 4) / 2) * 8 + 2 * ((c % 16) / 4) + (c % 2); }

// Two floats as e4m3 (round to nearest even, saturated at +-448): `lo` in the low byte. (The
// sm_80 pass of an sm_90a build has no such conversion; its fp8 kernels are never launched.)
FK_DEVICE uint32_t e4m3x2(float lo, float hi) {
#if defined(FK_WGMMA_DEVICE_OK)
    uint16_t r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
#else
    (void)lo;
    (void)hi;
    __trap();
    return 0;
#endif
}
FK_DEVICE uint32_t e4m3x4(float a, float b, float c, float d) { return e4m3x2(a, b) | (e4m3x2(c, d) << 16); }

// A float as INT8 (fp8.to_int8: x / scale rounded half to even, clamped to +-127), in bits 0-7.
FK_DEVICE uint32_t int8_of(float x, float scale) {
    int q = __float2int_rn(x / scale);
    q = q > 127 ? 127 : (q < -127 ? -127 : q);
    return uint32_t(q) & 0xffu;
}
// Four floats as INT8, `a` in the lowest byte.
FK_DEVICE uint32_t int8x4(float a, float b, float c, float d, float scale) {
    return int8_of(a, scale) | (int8_of(b, scale) << 8) | (int8_of(c, scale) << 16) | (int8_of(d, scale) << 24);
}

// An INT8 Q K^T sum as a float, exactly. A sum of at most 128 products of two values in
// [-127, 127] lies within +-2^21, so I2F is exact; so is adding the sum to the bits of 1.5 * 2^23
// and subtracting 1.5 * 2^23 as a float (FK_FP8_EXACT_I2F=0), which keeps I2F off the pipe it
// shares with exp2 but costs two instructions for one. Measured on an H100 (docs/perf.md "FP8
// attention on an H100", medians over 19 shapes): the add-and-subtract 1.03x the time of I2F; a
// quarter of the exponentials on the FMA pipe (FK_FP8_POLY_EXP=1) 1.05x the time of none, half
// (2) 1.09x: every instruction a score adds costs time, whatever pipe it relieves (each turn's
// softmax is a chain of dependent instructions that the other consumer's FP8 GEMMs no longer hide).
#ifndef FK_FP8_EXACT_I2F
#define FK_FP8_EXACT_I2F 1
#endif
FK_DEVICE float qk_to_float(uint32_t bits) {
#if FK_FP8_EXACT_I2F
    return float(int32_t(bits));
#else
    constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23, bits 0x4B400000
    return __uint_as_float(bits + 0x4B400000u) - kMagic;
#endif
}

// FK_FP8_POLY_EXP of every 4 scores' exponentials on the FMA pipe (mma::ex2_fma), the rest on MUFU.
#ifndef FK_FP8_POLY_EXP
#define FK_FP8_POLY_EXP 0
#endif
// P V summed in one accumulator across the tiles, O itself, rescaled when a row maximum moves
// (FlashAttention-3's form; 1), or two-level (0): each tile's P V in a fresh accumulator added to O
// in float32. One level frees the 64 registers a thread of the tile accumulator and the 64 FMAs a
// tile of the add, and carries the FP8 tensor core's accumulator across all of Nk. Measured on an
// H100 (docs/perf.md "FP8 attention on an H100"): 0.88-0.98x the time at head dim 128, 0.87-1.06x
// at 64 (three consumers there). Off while fp8.reference, the GPU tests' oracle, models two levels:
// its 13-bit accumulator model overstates the one-level loss the H100 showed (docs/kernel.md, "The
// model against the hardware"). FK_FP8_SINGLE_LEVEL sets both buckets; _D64 / _D128 one each.
#ifndef FK_FP8_SINGLE_LEVEL
#define FK_FP8_SINGLE_LEVEL 0
#endif
#ifndef FK_FP8_SINGLE_LEVEL_D64
#define FK_FP8_SINGLE_LEVEL_D64 FK_FP8_SINGLE_LEVEL
#endif
#ifndef FK_FP8_SINGLE_LEVEL_D128
#define FK_FP8_SINGLE_LEVEL_D128 FK_FP8_SINGLE_LEVEL
#endif

// Two levels, the FP8 accumulator carried across this many K/V tiles (rescaled with O when a row
// maximum moves) before it is added into O (1: a fresh accumulator a tile). The add, 64 FMAs a tile
// at bucket 128 (one SASS instruction in nine of a turn), then comes once a group; fp8.reference
// models it (Scheme.flush_tiles): every 4 tiles, 2.12e-3 from float64 against 1.88e-3 at Nk 32768
// with V off zero mean, where one level is 2.39e-2 (docs/kernel.md). Compiled, not yet run on a GPU.
#ifndef FK_FP8_FLUSH_TILES_D64
#define FK_FP8_FLUSH_TILES_D64 1
#endif
#ifndef FK_FP8_FLUSH_TILES_D128
#define FK_FP8_FLUSH_TILES_D128 1
#endif

// Block-wide maximum of non-negative floats (every thread gets it). `red`: 32 floats of shared memory.
FK_DEVICE float block_max(float x, float *red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, fk_shfl_xor(x, o));
    const int w = threadIdx.x / 32, nw = blockDim.x / 32;
    __syncthreads();  // red may still be read by a previous call
    if (threadIdx.x % 32 == 0) red[w] = x;
    __syncthreads();
    float m = 0.0f;
    for (int i = 0; i < nw; ++i) m = fmaxf(m, red[i]);
    return m;
}

// ---------------- stage 1: quantization ----------------

// Per (chunk of kStatKeys keys, (b, h)): the sum of K and the maximum of |V| per channel. A thread
// reads 8 channels of every 16th key of the chunk (16 threads a 256-byte row), so a warp's load is
// two whole rows; the 16 partials of a channel meet in shared memory.
template <class E>
__global__ void __launch_bounds__(256) stats_kernel(Fp8Params p) {
    constexpr int kLanes = kMaxDim / 8, kRowsPerPass = 256 / kLanes;
    __shared__ float part[2][kRowsPerPass][kMaxDim];
    const int64_t bh = p.bh0 + blockIdx.y;
    const int c0 = 8 * (threadIdx.x % kLanes), rr = threadIdx.x / kLanes;
    const int64_t n0 = int64_t(blockIdx.x) * kStatKeys, n1 = n0 + kStatKeys < p.nk ? n0 + kStatKeys : p.nk;
    const auto *kb = head_base<E>(p.k, p.ks, bh, p.heads), *vb = head_base<E>(p.v, p.vs, bh, p.heads);
    float sum[8], vmax[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) sum[e] = vmax[e] = 0.0f;
#pragma unroll 4
    for (int64_t n = n0 + rr; n < n1; n += kRowsPerPass) {
        float xk[8], xv[8];
        load8<E>(kb + n * p.ks[2], c0, p.d, xk);
        load8<E>(vb + n * p.vs[2], c0, p.d, xv);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            sum[e] += xk[e];
            vmax[e] = fmaxf(vmax[e], fabsf(xv[e]));
        }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        part[0][rr][c0 + e] = sum[e];
        part[1][rr][c0 + e] = vmax[e];
    }
    __syncthreads();
    if (threadIdx.x < kMaxDim) {
        const int col = threadIdx.x;
        float s = 0.0f, m = 0.0f;
#pragma unroll
        for (int r = 0; r < kRowsPerPass; ++r) {
            s += part[0][r][col];
            m = fmaxf(m, part[1][r][col]);
        }
        const int64_t at = (bh * p.chunks + blockIdx.x) * kMaxDim + col;
        reinterpret_cast<float *>(p.ws + p.lay.k_part)[at] = s;
        reinterpret_cast<float *>(p.ws + p.lay.v_part)[at] = m;
    }
}

// Per (b, h): K's mean per channel and V's scale per channel (max |V| / 448; 1 for a zero channel).
__global__ void __launch_bounds__(kMaxDim) stats_finish_kernel(Fp8Params p) {
    const int64_t bh = p.bh0 + blockIdx.x;
    const int col = threadIdx.x;
    const float *kp = reinterpret_cast<const float *>(p.ws + p.lay.k_part) + bh * p.chunks * kMaxDim + col;
    const float *vp = reinterpret_cast<const float *>(p.ws + p.lay.v_part) + bh * p.chunks * kMaxDim + col;
    float sum = 0.0f, vmax = 0.0f;
#pragma unroll 8
    for (int c = 0; c < p.chunks; ++c) {
        sum += kp[int64_t(c) * kMaxDim];
        vmax = fmaxf(vmax, vp[int64_t(c) * kMaxDim]);
    }
    const bool real = col < p.d;
    reinterpret_cast<float *>(p.ws + p.lay.k_mean)[bh * kMaxDim + col] = real ? sum / float(p.nk) : 0.0f;
    reinterpret_cast<float *>(p.ws + p.lay.v_scale)[bh * kMaxDim + col] = real && vmax > 0.0f ? vmax / kE4m3Max : 1.0f;
}

// Q (kQBlock rows per block, grid (qblocks, bh)) or smoothed K (BN rows per block, grid (ntiles,
// bh)) as INT8 with one scale per block, in the attention kernel's swizzled image. Q also gets each
// row's shift scale * q . mean(K) where the log-sum-exp is asked for (softmax does not see it).
// A thread holds 8 consecutive channels of every kRowsPerPass-th row of the block (D / 8 threads a
// row: a warp's load is 2 (D 128) or 4 (D 64) whole rows), and writes their 8 INT8 bytes.
template <class E, bool kIsK, int D>
__global__ void __launch_bounds__(256) quant_qk_kernel(Fp8Params p) {
    constexpr int kRows = kIsK ? BN : kQBlock;
    constexpr int kLanes = D / 8, kRowsPerPass = 256 / kLanes, kPasses = kRows / kRowsPerPass;
    static_assert(kRows % kRowsPerPass == 0, "fp8: whole passes");
    __shared__ float red[32];
    const int64_t bh = p.bh0 + blockIdx.y;
    const int64_t r0 = int64_t(blockIdx.x) * kRows;
    const int64_t rows = kIsK ? p.nk : p.nq;
    const int c0 = 8 * (threadIdx.x % kLanes), rr = threadIdx.x / kLanes;
    const float *mean = reinterpret_cast<const float *>(p.ws + p.lay.k_mean) + bh * kMaxDim;
    const auto *base = head_base<E>(kIsK ? p.k : p.q, kIsK ? p.ks : p.qs, bh, p.heads);
    const int64_t stride = kIsK ? p.ks[2] : p.qs[2];
    float x[kPasses][8];
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
        const int64_t n = r0 + i * kRowsPerPass + rr;
        if (n < rows) {
            load8<E>(base + n * stride, c0, p.d, x[i]);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) x[i][e] = 0.0f;
        }
    }
    float mk[8];  // K's mean over these channels (0 past the head dim); Q's shift takes it too
#pragma unroll
    for (int e = 0; e < 8; ++e) mk[e] = mean[c0 + e];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
        const bool real = r0 + i * kRowsPerPass + rr < rows && c0 < p.d;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            if (kIsK && real) x[i][e] -= mk[e];
            amax = fmaxf(amax, fabsf(x[i][e]));
        }
    }
    amax = block_max(amax, red);
    const float scale = amax > 0.0f ? amax / kInt8Max : 1.0f;  // fp8.scales_for
    if (threadIdx.x == 0)
        reinterpret_cast<float *>(p.ws + (kIsK ? p.lay.k_scale : p.lay.q_scale))[bh * (kIsK ? p.ntiles : p.qblocks) + blockIdx.x] = scale;
    unsigned char *img = p.ws + (kIsK ? p.lay.k_img : p.lay.q_img) +
                         (bh * (kIsK ? p.ntiles : p.qblocks) + blockIdx.x) * int64_t(kRows * kRowBytes);
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
        const int r = i * kRowsPerPass + rr;
        const uint2 w = make_uint2(int8x4(x[i][0], x[i][1], x[i][2], x[i][3], scale),
                                   int8x4(x[i][4], x[i][5], x[i][6], x[i][7], scale));
        *reinterpret_cast<uint2 *>(img + swz(r, c0 / 16) + (c0 % 16)) = w;
        if (!kIsK && p.lse != nullptr) {
            float shift = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; ++e) shift = fmaf(x[i][e], mk[e], shift);
            // a row's kLanes threads are consecutive lanes of one warp
#pragma unroll
            for (int o = 1; o < kLanes; o <<= 1) shift += fk_shfl_xor(shift, o);
            if (threadIdx.x % kLanes == 0 && r0 + r < rows)
                reinterpret_cast<float *>(p.ws + p.lay.q_shift)[bh * p.nq + r0 + r] = shift * p.scale;
        }
    }
    // the columns past the bucket (D 64: 64..127 of every 128-byte row) are zero
    if constexpr (D < kRowBytes) {
        constexpr int kPad = (kRowBytes - D) / 16;  // 16-byte chunks a row
        for (int j = threadIdx.x; j < kRows * kPad; j += 256)
            *reinterpret_cast<uint4 *>(img + swz(j / kPad, D / 16 + j % kPad)) = make_uint4(0u, 0u, 0u, 0u);
    }
}

// V as e4m3 (each channel over its scale), transposed: D rows (channels) of BN keys per tile, the
// keys of every 32 in P V's order (permuted_key), swizzled. Grid (ntiles, bh); keys past nk and
// channels past the head dim are 0. V is read row by row (load8), the
// e4m3 pairs of consecutive keys go through shared memory transposed, and each 16-byte chunk of
// the image is gathered from there: permuted_key keeps keys 2t, 2t+1 (and 8+2t, 9+2t) adjacent.
template <class E, int D>
__global__ void __launch_bounds__(256) quant_v_kernel(Fp8Params p) {
    __shared__ uint16_t vt[D][BN / 2 + 1];  // [channel][key pair]: e4m3 of keys 2i (low), 2i+1 (high); +1: banks
    const int64_t bh = p.bh0 + blockIdx.y;
    const int64_t n0 = int64_t(blockIdx.x) * BN;
    const float *vsc = reinterpret_cast<const float *>(p.ws + p.lay.v_scale) + bh * kMaxDim;
    unsigned char *img = p.ws + p.lay.v_img + (bh * p.ntiles + blockIdx.x) * int64_t(D * kRowBytes);
    // a thread: 8 channels of keys 2i and 2i + 1 (D / 8 threads a key pair, a warp's load 2 or 4
    // whole rows), as e4m3 pairs into vt
    constexpr int kLanes = D / 8, kPairsPerPass = 256 / kLanes;
    const int c0 = 8 * (threadIdx.x % kLanes);
    const auto *base = head_base<E>(p.v, p.vs, bh, p.heads);
    float s[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) s[e] = vsc[c0 + e];  // 1 past the head dim, where V reads as 0
#pragma unroll
    for (int pair = threadIdx.x / kLanes; pair < BN / 2; pair += kPairsPerPass) {
        const int64_t n = n0 + 2 * pair;
        float x0[8], x1[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) x0[e] = x1[e] = 0.0f;
        if (n < p.nk) load8<E>(base + n * p.vs[2], c0, p.d, x0);
        if (n + 1 < p.nk) load8<E>(base + (n + 1) * p.vs[2], c0, p.d, x1);
#pragma unroll
        for (int e = 0; e < 8; ++e) vt[c0 + e][pair] = static_cast<uint16_t>(e4m3x2(x0[e] / s[e], x1[e] / s[e]));
    }
    __syncthreads();
    constexpr int kChunks = D * 8 / 256;
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
        const int j = i * 256 + threadIdx.x;
        const int row = j / 8, c = j % 8;  // channel, chunk: k columns 16c..16c+15
        uint32_t w[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {  // k columns 16c + 4q .. +3: keys 2t, 2t+1, 8+2t, 9+2t of their 16
            const int col = c * 16 + 4 * q;
            const int key = (col / 32) * 32 + permuted_key(col % 32);  // even: 2t of its 16
            w[q] = uint32_t(vt[row][key / 2]) | (uint32_t(vt[row][(key + 8) / 2]) << 16);
        }
        *reinterpret_cast<uint4 *>(img + swz(row, c)) = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

// ---------------- stage 2: attention ----------------

#if defined(FK_WGMMA_DEVICE_OK)
using wgmma::mbar_arrive;
using wgmma::mbar_expect_tx;
using wgmma::mbar_init;
using wgmma::mbar_wait;
using wgmma::named_arrive;
using wgmma::named_sync;
using wgmma::smem_desc;
using wgmma::smem_u32;
using wgmma::wg_commit;
using wgmma::wg_fence;
using wgmma::wg_wait;

// One contiguous tile of the workspace into shared memory, completing on `bar`.
FK_DEVICE void bulk_load(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(dst), "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(bar) : "memory");
}
template <int R> FK_DEVICE void fence_u32(uint32_t (&r)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+r"(r[i])::"memory");
}
#endif

// Grid (query tiles of Fp8Tile<D>::BM rows, (b, h) pairs from p.bh0); E: the output's element type.
template <class E, int D>
__global__ void __launch_bounds__(Fp8Tile<D>::kThreads, 1) attention_kernel(Fp8Params p) {
#if defined(FK_WGMMA_DEVICE_OK)
    using T = Fp8Tile<D>;
    constexpr int kConsumers = T::kConsumers;
    constexpr int S = kStages;
    extern __shared__ unsigned char smem_raw[];
    const uint32_t sq = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const uint32_t sk = sq + T::kQBytes;                 // slot s: sk + s * kKTileBytes
    const uint32_t sv = sk + S * kKTileBytes;            // slot s: sv + s * kVTileBytes
    const uint32_t q_full = sv + S * T::kVTileBytes;     // consumer c: + 8c
    const uint32_t k_full = q_full + 8 * kConsumers, v_full = k_full + 8 * S, empty = v_full + 8 * S;

    const int wg = threadIdx.x / 128, lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
    const int64_t bh = p.bh0 + blockIdx.y;
    const int ntiles = p.ntiles;
    const unsigned char *ws = p.ws;

    if (threadIdx.x == 0) {
        for (int c = 0; c < kConsumers; ++c) mbar_init(q_full + 8 * c, 1);
        for (int s = 0; s < S; ++s) {
            mbar_init(k_full + 8 * s, 1);
            mbar_init(v_full + 8 * s, 1);
            mbar_init(empty + 8 * s, 4 * kConsumers);  // lane 0 of every consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {  // ---------------- producer ----------------
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        if (warp == 0 && lane == 0) {
            for (int c = 0; c < kConsumers; ++c) {
                const int64_t qb = int64_t(blockIdx.x) * kConsumers + c;
                if (qb >= p.qblocks) {  // a Q block past nq: computed on stale data, never stored
                    mbar_arrive(q_full + 8 * c);
                    continue;
                }
                mbar_expect_tx(q_full + 8 * c, kQTileBytes);
                bulk_load(sq + c * kQTileBytes, ws + p.lay.q_img + (bh * p.qblocks + qb) * kQTileBytes, kQTileBytes,
                          q_full + 8 * c);
            }
            for (int j = 0; j < ntiles; ++j) {
                const int st = j % S;
                if (j >= S) mbar_wait(empty + 8 * st, ((j / S) - 1) & 1);
                const int64_t t = bh * ntiles + j;
                mbar_expect_tx(k_full + 8 * st, kKTileBytes);
                bulk_load(sk + st * kKTileBytes, ws + p.lay.k_img + t * kKTileBytes, kKTileBytes, k_full + 8 * st);
                mbar_expect_tx(v_full + 8 * st, T::kVTileBytes);
                bulk_load(sv + st * T::kVTileBytes, ws + p.lay.v_img + t * T::kVTileBytes, T::kVTileBytes, v_full + 8 * st);
            }
        }
        return;
    }

    // ---------------- consumers ----------------
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(T::kConsumerRegs));
    const int c = wg - 1;
    // named barrier 1 + c: consumer c's turn, given by the consumer before it in the rotation
    const int my_bar = 1 + c, other_bar = kConsumers == 2 ? 2 - c : 1 + (c + 1) % kConsumers;
    constexpr int kPair = 256;
    const uint32_t sq_wg = sq + c * kQTileBytes;
    const int64_t qb = int64_t(blockIdx.x) * kConsumers + c;
    const float qscale = qb < p.qblocks ? reinterpret_cast<const float *>(ws + p.lay.q_scale)[bh * p.qblocks + qb] : 0.0f;
    const float *kscale = reinterpret_cast<const float *>(ws + p.lay.k_scale) + bh * ntiles;
    const float f0 = qscale * p.scale_log2;  // times a tile's K scale: int32 score -> base-2 scaled score

    // S accumulators: n8 tile t holds rows r, r+8 x keys 8t + 2(lane%4) + {0,1}; int32 from the
    // wgmma, then (in place, as float bits) the scores and P: one register set, as the next S's
    // wgmma names them as inputs
    uint32_t si[BN / 2];
    float o[D / 2];          // O summed over the tiles so far (fp32), the accumulator layout over channels
    constexpr bool kSingle = (D == 64 ? FK_FP8_SINGLE_LEVEL_D64 : FK_FP8_SINGLE_LEVEL_D128) != 0;
    static_assert(kConsumers == 2 || kSingle || D == 64, "fp8: three consumers at head dim 128 fit their registers with one level of P V only");
    float ot[kSingle ? 1 : D / 2];  // one tile's P V (the FP8 tensor core's accumulator; single level: O's)
    // tiles a group whose P V the accumulator carries before O takes it (FK_FP8_FLUSH_TILES_*); with
    // groups, O and the accumulator follow the running maxima at once (no lag, as with one level)
    constexpr int kGroup = D == 64 ? FK_FP8_FLUSH_TILES_D64 : FK_FP8_FLUSH_TILES_D128;
    static_assert(kGroup >= 1, "fp8: a group is one tile or more");
    constexpr bool kGrouped = kGroup > 1 && !kSingle;
    uint32_t pf[BN / 32][4]; // P as e4m3 A fragments, one per k32 group of keys
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f, pa0 = 0.0f, pa1 = 0.0f;

    auto my_turn = [&] { named_sync(my_bar, kPair); };
    auto their_turn = [&] { named_arrive(other_bar, kPair); };
    auto issue_s = [&](int st) {
        const uint32_t kb = sk + st * kKTileBytes;
#pragma unroll
        for (int ks = 0; ks < T::kKSteps; ++ks)
            wgmma::OpsFp8::ss_s8_n128(si, smem_desc(sq_wg + ks * 32, 16, 1024), smem_desc(kb + ks * 32, 16, 1024), ks > 0);
    };
    auto issue_pv = [&](int st, int t) {  // tile t's P V from slot st
        const bool fresh = !kGrouped || t % kGroup == 0;  // the accumulator starts over
        const uint32_t vb = sv + st * T::kVTileBytes;
#pragma unroll
        for (int kk = 0; kk < BN / 32; ++kk) {
            const uint64_t db = smem_desc(vb + kk * 32, 16, 1024);
            if constexpr (kSingle) {
                if constexpr (D == 128) wgmma::OpsFp8::rs_e4m3_n128(o, pf[kk], db, 1);
                else wgmma::OpsFp8::rs_e4m3_n64(o, pf[kk], db, 1);
            } else {
                if constexpr (D == 128) wgmma::OpsFp8::rs_e4m3_n128(ot, pf[kk], db, kk > 0 || !fresh);
                else wgmma::OpsFp8::rs_e4m3_n64(ot, pf[kk], db, kk > 0 || !fresh);
            }
        }
    };
    // S(j) to 448 P (fp32 bits, in si) against the new running maxima; a0, a1: the rescale factors.
    // The row maxima are taken on the int32 sums (the dequantizing factor f is positive, so the
    // largest sum is the largest score), and each 448 P = 2^(f * sum - m + log2 448) is one
    // exact convert (qk_to_float), one fma and one exp2 (mma::ex2_fma for FK_FP8_POLY_EXP of every
    // 4, MUFU for the rest). l sums 448 P unrounded (fp8.reference sums P, unrounded).
    auto probs = [&](int j, float kscale_j, float &a0, float &a1) {
        const float f = f0 * kscale_j;
        const int n0 = j * BN;
        const bool ragged = n0 + BN > p.nk;
        const int t2 = 2 * (lane % 4);
        if (ragged) {  // keys past nk: the smallest sum, so no maximum (>= 1 valid key per tile)
#pragma unroll
            for (int t = 0; t < BN / 8; ++t) {
                const int col = n0 + t * 8 + t2;
                if (col >= p.nk) si[4 * t] = si[4 * t + 2] = 0x80000000u;
                if (col + 1 >= p.nk) si[4 * t + 1] = si[4 * t + 3] = 0x80000000u;
            }
        }
        int mx0 = INT_MIN, mx1 = INT_MIN;
#pragma unroll
        for (int t = 0; t < BN / 8; ++t) {
            mx0 = max(mx0, max(int32_t(si[4 * t]), int32_t(si[4 * t + 1])));
            mx1 = max(mx1, max(int32_t(si[4 * t + 2]), int32_t(si[4 * t + 3])));
        }
        mx0 = max(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = max(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = max(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = max(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float mn0 = fmaxf(m0, float(mx0) * f), mn1 = fmaxf(m1, float(mx1) * f);
        a0 = mma::ex2(m0 - mn0);
        a1 = mma::ex2(m1 - mn1);
        m0 = mn0;
        m1 = mn1;
        const float b0 = kLog2PScale - mn0, b1 = kLog2PScale - mn1;
        float sum0 = 0.0f, sum1 = 0.0f;
        // every exponential first, in one branch-free block, then the masked keys zeroed under one
        // test a tile, then the sums in two chains a row. (Masking inside the exponentials' loop
        // compiled to a branch for each n8 tile; this form took 0.86-0.96x its time at 13 of 18
        // shapes on an H100, 1.02-1.03x at the two CogVideoX ones.)
#pragma unroll
        for (int t = 0; t < BN / 8; ++t) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float x = fmaf(qk_to_float(si[4 * t + i]), f, i < 2 ? b0 : b1);
                si[4 * t + i] = __float_as_uint(i < FK_FP8_POLY_EXP ? mma::ex2_fma(x) : mma::ex2(x));
            }
        }
        if (ragged) {  // exactly 0 (f * INT_MIN need not be far below the maximum)
#pragma unroll
            for (int t = 0; t < BN / 8; ++t) {
                const int col = n0 + t * 8 + t2;
                if (col >= p.nk) si[4 * t] = si[4 * t + 2] = 0u;
                if (col + 1 >= p.nk) si[4 * t + 1] = si[4 * t + 3] = 0u;
            }
        }
        float sum0b = 0.0f, sum1b = 0.0f;
#pragma unroll
        for (int t = 0; t < BN / 8; ++t) {
            sum0 += __uint_as_float(si[4 * t]);
            sum0b += __uint_as_float(si[4 * t + 1]);
            sum1 += __uint_as_float(si[4 * t + 2]);
            sum1b += __uint_as_float(si[4 * t + 3]);
        }
        sum0 += sum0b;
        sum1 += sum1b;
        l0 = l0 * a0 + sum0;
        l1 = l1 * a1 + sum1;
    };
    // 448 P as e4m3 A fragments (the order of the top comment)
    auto pack_p = [&] {
#pragma unroll
        for (int g = 0; g < BN / 32; ++g) {
            float x[16];
#pragma unroll
            for (int i = 0; i < 16; ++i) x[i] = __uint_as_float(si[16 * g + i]);
            pf[g][0] = e4m3x4(x[0], x[1], x[4], x[5]);
            pf[g][1] = e4m3x4(x[2], x[3], x[6], x[7]);
            pf[g][2] = e4m3x4(x[8], x[9], x[12], x[13]);
            pf[g][3] = e4m3x4(x[10], x[11], x[14], x[15]);
        }
    };
    // O = O * (the factors that came with this P) + the tile's P V
    auto add_tile = [&] {
        if constexpr (kGrouped) {  // the group's sum, in O's scale already
#pragma unroll
            for (int i = 0; i < D / 2; ++i) o[i] += ot[i];
        } else if constexpr (!kSingle) {
#pragma unroll
            for (int t = 0; t < D / 8; ++t) {
                o[4 * t] = fmaf(o[4 * t], pa0, ot[4 * t]);
                o[4 * t + 1] = fmaf(o[4 * t + 1], pa0, ot[4 * t + 1]);
                o[4 * t + 2] = fmaf(o[4 * t + 2], pa1, ot[4 * t + 2]);
                o[4 * t + 3] = fmaf(o[4 * t + 3], pa1, ot[4 * t + 3]);
            }
        }
    };
    // single level: O (its P V done) rescaled to the new row maxima before the next P V adds to it,
    // skipped where no row maximum of the warp moved
    auto rescale_o = [&](float a0, float a1) {
        if (__any_sync(0xffffffffu, a0 != 1.0f || a1 != 1.0f)) wgmma::scale_rows(o, a0, a1);
    };
    auto fence_acc = [&] {  // the P V accumulator's registers, around its wgmma
        if constexpr (kSingle) wgmma::fence_regs(o);
        else wgmma::fence_regs(ot);
    };
    auto release = [&](int st) {  // both the K and the V of slot st are read
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + 8 * st);
    };

#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
    if (c == kConsumers - 1) named_arrive(1, kPair);  // consumer 0 takes the first turn
    mbar_wait(q_full + 8 * c, 0);
    // each tile's K scale is loaded before its S is waited for (a global load: its latency hides
    // behind the wgmma, not in front of the softmax)
    float ks_next = kscale[0];
    {  // S(0) alone
        mbar_wait(k_full, 0);
        my_turn();
        fence_u32(si);
        wg_fence();
        issue_s(0);
        wg_commit();
        their_turn();
        wg_wait<0>();
        fence_u32(si);
        probs(0, ks_next, pa0, pa1);  // pa: O is all zeros, so the first factors are never used
        pack_p();
    }
    for (int j = 1; j < ntiles; ++j) {
        const int st = j % S, pst = (j - 1) % S;
        ks_next = kscale[j];
        mbar_wait(k_full + 8 * st, (j / S) & 1);
        mbar_wait(v_full + 8 * pst, ((j - 1) / S) & 1);
        my_turn();
        fence_u32(si);
        fence_acc();
        wg_fence();
        issue_s(st);
        wg_commit();
        issue_pv(pst, j - 1);
        wg_commit();
        their_turn();
        wg_wait<1>();
        fence_u32(si);
        float a0, a1;
        probs(j, ks_next, a0, a1);
        wg_wait<0>();
        fence_acc();
        release(pst);
        if constexpr (kSingle) {
            rescale_o(a0, a1);
        } else if constexpr (kGrouped) {
            // tile j - 1 closes its group: O takes the sum and the accumulator starts over; then O
            // (and a group still open) to the new maxima before P(j) V adds to them
            const bool closes = (j - 1) % kGroup == kGroup - 1;
            if (closes) add_tile();
            if (__any_sync(0xffffffffu, a0 != 1.0f || a1 != 1.0f)) {
                wgmma::scale_rows(o, a0, a1);
                if (!closes) wgmma::scale_rows(ot, a0, a1);
            }
        } else {
            add_tile();
            pa0 = a0;
            pa1 = a1;
        }
        pack_p();
    }
    {  // the last P V alone
        const int pst = (ntiles - 1) % S;
        mbar_wait(v_full + 8 * pst, ((ntiles - 1) / S) & 1);
        my_turn();
        fence_acc();
        wg_fence();
        issue_pv(pst, ntiles - 1);
        wg_commit();
        their_turn();
        wg_wait<0>();
        fence_acc();
        release(pst);
        add_tile();
    }
    if (c == 0) named_sync(my_bar, kPair);  // the last consumer's last arrive: leave no barrier half-used

    // O / l * V's channel scale (O and l both carry the 448), stored in the output's dtype; rows
    // past nq are not stored
    l0 += fk_shfl_xor(l0, 1);
    l0 += fk_shfl_xor(l0, 2);
    l1 += fk_shfl_xor(l1, 1);
    l1 += fk_shfl_xor(l1, 2);
    const float i0 = 1.0f / l0, i1 = 1.0f / l1;
    const int64_t r0 = int64_t(blockIdx.x) * T::BM + 64 * c + 16 * warp + lane / 4, r1 = r0 + 8;
    const float *vsc = reinterpret_cast<const float *>(ws + p.lay.v_scale) + bh * kMaxDim;
    using Out = typename E::storage;
    Out *out = static_cast<Out *>(p.o) + (bh / p.heads) * p.os[0] + (bh % p.heads) * p.os[1];
    const int col = 2 * (lane % 4);
#pragma unroll
    for (int t = 0; t < D / 8; ++t) {
        const int cc = t * 8 + col;
        if (cc >= p.d) break;  // columns past the head dim (8 | d: a pair is whole)
        const float s0 = vsc[cc], s1 = vsc[cc + 1];
        if (r0 < p.nq) {
            out[r0 * p.os[2] + cc] = E::from_float(o[4 * t] * i0 * s0);
            out[r0 * p.os[2] + cc + 1] = E::from_float(o[4 * t + 1] * i0 * s1);
        }
        if (r1 < p.nq) {
            out[r1 * p.os[2] + cc] = E::from_float(o[4 * t + 2] * i1 * s0);
            out[r1 * p.os[2] + cc + 1] = E::from_float(o[4 * t + 3] * i1 * s1);
        }
    }
    if (p.lse != nullptr && lane % 4 == 0) {
        float *lse = p.lse + (bh / p.heads) * p.ls[0] + (bh % p.heads) * p.ls[1];
        const float *shift = reinterpret_cast<const float *>(ws + p.lay.q_shift) + bh * p.nq;
        // l = 448 sum(P): log2 l - log2 448 is the row's own
        if (r0 < p.nq) lse[r0 * p.ls[2]] = row_lse(m0 - kLog2PScale, l0) + shift[r0];
        if (r1 < p.nq) lse[r1 * p.ls[2]] = row_lse(m1 - kLog2PScale, l1) + shift[r1];
    }
#else
    __trap();  // the sm_80 pass of an sm_90a build: never launched (the host checks the device)
#endif
}

}  // namespace fp8
}  // namespace fk

#endif  // FK_HAVE_WGMMA
#endif  // FK_FP8_H
