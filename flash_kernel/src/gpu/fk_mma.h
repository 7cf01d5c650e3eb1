// fk_mma.h: the NVIDIA tensor-core flash kernel (sm_80+, fp16/bf16).
//
// mma.sync.m16n8k16 through inline PTX; Q, K and V tiles in XOR-swizzled shared memory read with
// ldmatrix (.trans for V); K/V tiles fetched with cp.async so that V(j) lands while S = Q K(j)^T
// is computed and K(j+1) lands while P V(j) is; softmax in base 2 with log2(e) folded into the
// scale; P never leaves registers: the S accumulators are re-packed as the A operand of P V; the
// O rescale is skipped when no row maximum of the warp moved. Tile shapes: MmaTile in fk_traits.h.
// Compiled only by nvcc for __CUDA_ARCH__ >= 800 and without FK_FORCE_GENERIC.
#ifndef FK_MMA_H
#define FK_MMA_H

#include "gpu/fk_traits.h"

#if defined(FK_PLATFORM_NVIDIA) && !defined(FK_FORCE_GENERIC)
#define FK_HAVE_MMA 1

namespace fk {
namespace mma {

// The device pass for older architectures compiles the kernel to a trap (never launched: the
// build targets sm_80/sm_90 only).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define FK_MMA_DEVICE_OK 1
#endif

template <class E> struct Ptx;
template <> struct Ptx<F16> {
    static FK_DEVICE void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(FK_MMA_DEVICE_OK) && defined(__CUDA_ARCH__)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
    }
    // lo -> bits 0..15, hi -> bits 16..31 (cvt puts its first source in the upper half)
    static FK_DEVICE uint32_t pack(float lo, float hi) {
        uint32_t r = 0;
#if defined(FK_MMA_DEVICE_OK) && defined(__CUDA_ARCH__)
        asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#endif
        return r;
    }
};
template <> struct Ptx<BF16> {
    static FK_DEVICE void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(FK_MMA_DEVICE_OK) && defined(__CUDA_ARCH__)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
    }
    static FK_DEVICE uint32_t pack(float lo, float hi) {
        uint32_t r = 0;
#if defined(FK_MMA_DEVICE_OK) && defined(__CUDA_ARCH__)
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#endif
        return r;
    }
};

FK_DEVICE void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
#if defined(FK_MMA_DEVICE_OK) && defined(__CUDA_ARCH__)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
#endif
}
FK_DEVICE void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
#if defined(FK_MMA_DEVICE_OK) && defined(__CUDA_ARCH__)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
#endif
}
// 16-byte global->shared copy; src_bytes 0 zero-fills (ragged tiles) without reading global.
// FK_MMA_CP_L2_PREFETCH (fk_traits.h): the copy asks L2 to fetch the whole 128-byte line it falls in.
FK_DEVICE void cp_async16(uint32_t saddr, const void *g, int src_bytes) {
#if defined(FK_MMA_DEVICE_OK) && defined(__CUDA_ARCH__)
#if FK_MMA_CP_L2_PREFETCH
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(saddr), "l"(g), "r"(src_bytes) : "memory");
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(saddr), "l"(g), "r"(src_bytes) : "memory");
#endif
#endif
}
FK_DEVICE void cp_async_commit() {
#if defined(FK_MMA_DEVICE_OK) && defined(__CUDA_ARCH__)
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N> FK_DEVICE void cp_async_wait() {
#if defined(FK_MMA_DEVICE_OK) && defined(__CUDA_ARCH__)
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
FK_DEVICE float ex2(float x) {
    float y;
#if defined(__CUDA_ARCH__)
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
#else
    y = x;
#endif
    return y;
}
// 2^x for x <= 9 on the FMA pipe instead of MUFU (FlashAttention-4's idea): n, the nearest integer
// to x, from one add of 1.5 * 2^23 (n lands in the low mantissa bits); a cubic for 2^(x - n) on
// [-0.5, 0.5]; n shifted into the exponent bits. Relative error <= 1.4e-4 over every float in
// [-126, 9] (checked exhaustively on the host against exp2); below -126, -inf included, 2^-126. One
// MUFU.EX2 takes the issue slots of 8 FMA-pipe instructions (16 against 128 lanes an SM a clock),
// this ~7 FMA-pipe ones, so a share of a softmax's exponentials here unloads the pipe that bounds it.
FK_DEVICE float ex2_fma(float x) {
    constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
    x = fmaxf(x, -126.0f);
    const float t = x + kMagic;
    const float f = x - (t - kMagic);
    const float y = fmaf(fmaf(fmaf(0.055028843f, f, 0.24225878f), f, 0.693253244f), f, 0.999951254f);
    return __uint_as_float(__float_as_uint(y) + (__float_as_uint(t) << 23));
}

// Byte offset of 16-byte chunk c of row r in a [rows][D] 16-bit tile. Chunks are swizzled within
// aligned groups of 8 (128 bytes): the chunk index is XORed with r mod 8, so the 8 row addresses of
// one ldmatrix phase fall in 8 different bank groups. A row of D = 32 (mod 64) ends in a group of 4
// (D 32, 96, 160): there the index is XORed with (r / 2) mod 4. Rows of such D are 64 bytes (mod 128)
// long, so rows r and r + 1 already sit half a bank period apart, and both rules keep 8
// consecutive rows apart.
// swz2 is the same for chunk c0 + b of an ldmatrix pair (c0 even, from the unrolled loop indices; b
// 0 or 1, from the lane), whose group c0 alone decides, so that the rule folds at compile time.
template <int D> FK_DEVICE uint32_t swz2(int r, int c0, int b) {
    constexpr int C = D / 8;
    const int x = C % 8 == 0 || (c0 | 7) < C ? r & 7 : (r >> 1) & 3;
    return uint32_t(r * (D * 2) + (((c0 + b) ^ x) << 4));
}
template <int D> FK_DEVICE uint32_t swz(int r, int c) { return swz2<D>(r, c, 0); }

// The cp.async copies of one BM|BN x D tile. TC threads span a row (the largest power of 2 that
// divides its C = D / 8 chunks, at most TCMAX: MmaTile::kCopyRowThreads); each thread keeps the chunk columns c, c + TC, ... (CPT of them,
// c = tid % TC) of rows tid / TC + i * RP (RP = NT / TC): per copy one 64-bit pointer step and one
// cp.async; the bound test only on a ragged tile (where RP > ROWS, threads past the tile's rows copy
// nothing). Where RP is a multiple of 8 the swizzle of a
// chunk is the same on every row the thread copies (one offset per chunk column); else (RP 4) it
// is recomputed per copy from the unrolled i.
// (A loop over i = tid, tid + NT, ... recomputing row, chunk and bound per copy was ~25 SASS
// instructions a copy, ~400 per tile: 16-20 % slower, docs/perf.md "Fast loader".)
// Masked rows, and chunk columns past the head dim d (the bucket's padding), zero-fill from row 0,
// chunk 0 of the head: never a read past the tensor.
template <int D, int ROWS, int NT, bool kPad, int TCMAX = 32>
struct TileCopy {
    static constexpr int C = D / 8;
    static constexpr int TC0 = (C & -C) < NT ? (C & -C) : NT;
    static constexpr int TC = TC0 < TCMAX ? TC0 : TCMAX;
    static constexpr int CPT = C / TC, RP = NT / TC;
    static constexpr bool kIdle = RP > ROWS;  // more rows of threads than the tile has: the rest sit out
    static constexpr int IT = kIdle ? 1 : ROWS / RP;
    static constexpr bool kOk = C % TC == 0 && (kIdle || ROWS % RP == 0);
    uint32_t soff[CPT];  // byte offset of this thread's chunk columns in its first row
    int row;             // its first row (tid / TC)
    int c;               // its first chunk column
    uint32_t live;       // bit k: chunk column c + k * TC holds data (is below d); 0 bits zero-fill
    int64_t step;        // elements between its consecutive rows (RP rows; 0 when no column is live)
    FK_DEVICE TileCopy(int64_t rs, int d) {
        c = threadIdx.x % TC;
        row = threadIdx.x / TC;
        live = 0;
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            soff[k] = swz<D>(row, c + k * TC);
            if (!kPad || (c + k * TC) * 8 < d) live |= 1u << k;
        }
        step = live ? RP * rs : 0;
    }
    FK_DEVICE uint32_t off(int i, int k) const {
        return RP % 8 == 0 ? soff[k] + i * RP * D * 2 : swz<D>(row + i * RP, c + k * TC);
    }
    // gt: this thread's first element of the tile (tile row `row`, chunk c); g0: a safe source
    // for zero-filled copies (row 0 of the head); rem: rows of the tile still inside the tensor.
    // Threads with no live column pass gt == g0 (see src()).
    FK_DEVICE void load(uint32_t sbase, const uint16_t *gt, const uint16_t *g0, int64_t rem) const {
        if (kIdle && row >= ROWS) return;
        if (rem >= ROWS) {
#pragma unroll
            for (int i = 0; i < IT; ++i)
#pragma unroll
                for (int k = 0; k < CPT; ++k) {
                    const bool on = !kPad || (live >> k) & 1;
                    cp_async16(sbase + off(i, k), on ? gt + i * step + k * TC * 8 : g0, on ? 16 : 0);
                }
        } else {
#pragma unroll
            for (int i = 0; i < IT; ++i)
#pragma unroll
                for (int k = 0; k < CPT; ++k) {
                    const bool on = row + i * RP < rem && (!kPad || (live >> k) & 1);
                    cp_async16(sbase + off(i, k), on ? gt + i * step + k * TC * 8 : g0, on ? 16 : 0);
                }
        }
    }
    // This thread's source in a head: chunk c of row r, or row 0 chunk 0 when no column is live.
    FK_DEVICE const uint16_t *src(const uint16_t *head, int64_t r, int64_t rs) const {
        return live ? head + r * rs + c * 8 : head;
    }
};

// D: the head-dim bucket (the row length of the shared-memory tiles). kPad: the head dim p.d is
// below it (run-time tests skip the padding); without it the kernel is compiled for p.d == D
// alone, with no such test. KD < D: the columns the MMAs run over, fixed at compile time
// (MmaTile::kNarrowKD: head dims up to KD of the bucket), no run-time tests in the loops.
template <class E, int D, bool kPad, int KD = D>
__global__ void __launch_bounds__(MmaTile<D, FK_MMA_ARCH>::kThreads, MmaTile<D, FK_MMA_ARCH>::kMinBlocks)
    flash_mma_kernel(FlashParams p) {
#if defined(FK_MMA_DEVICE_OK)
    using Tile = MmaTile<D, FK_MMA_ARCH>;  // this cubin's tile (the host launches with the same one)
    constexpr int BM = Tile::BM, BN = Tile::BN, NT = Tile::kThreads, MT = Tile::MT;
    constexpr bool kQInRegs = Tile::kQInRegs;
    static_assert(KD % 16 == 0 && KD <= D && (KD == D || kPad), "mma path: narrow kernels are padded");
    constexpr int KS = KD / 16;  // k-steps of Q K^T
    // k-steps whose Q fragments stay in registers (all of them with kQInRegs; the rest re-read from shared memory)
    constexpr int QRS = kQInRegs ? KS : (Tile::kQRegSteps < KS ? Tile::kQRegSteps : KS);
    constexpr int NS = BN / 8;   // n8 tiles of S
    constexpr int DT = KD / 8;   // n8 tiles of O
    constexpr bool kSkip = kPad && KD == D && Tile::kPadSkip;  // run-time loop bounds
    constexpr bool kShift = Tile::kShiftPV;
    constexpr int kStages = Tile::kStages;  // 2: K and V double-buffered (plain order)
    constexpr bool kEarlyK = Tile::kEarlyK && kStages == 1;
    constexpr bool kLdsmBases = Tile::kLdsmBases && (D / 8) % 8 == 0;  // chunk groups of 8 (see swz2)
    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t sq = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    // kShift: V(j) in sv + (j & 1) * BN * D * 2; kStages 2: K(j) and V(j) in sk / sv + (j & 1) * BN * D * 2
    const uint32_t sk = sq + BM * D * 2, sv = sk + kStages * BN * D * 2;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t bh = p.bh0 + blockIdx.y, b = bh / p.heads, h = bh % p.heads;
    const int64_t q0 = int64_t(blockIdx.x) * BM;
    const uint16_t *q = static_cast<const uint16_t *>(p.q) + b * p.qs[0] + h * p.qs[1];
    const uint16_t *k = static_cast<const uint16_t *>(p.k) + b * p.ks[0] + h * p.ks[1];
    const uint16_t *v = static_cast<const uint16_t *>(p.v) + b * p.vs[0] + h * p.vs[1];
    uint16_t *o = static_cast<uint16_t *>(p.o) + b * p.os[0] + h * p.os[1];

    using CopyQ = TileCopy<D, BM, NT, kPad, Tile::kCopyRowThreads>;
    using CopyKV = TileCopy<D, BN, NT, kPad, Tile::kCopyRowThreads>;
    static_assert(CopyQ::kOk && CopyKV::kOk, "tile copy: needs the rows of one pass (threads / TC) to divide BM and BN");
    const int dh = kPad ? p.d : D;       // the head dim: columns dh..D-1 are zero padding
    // k16 steps of Q K^T, and pairs of n8 tiles of O, that hold data (all of them without FK_MMA_PAD_SKIP)
    const int ksteps = kSkip ? (dh + 15) / 16 : KS;
    const int dsteps = kSkip ? (dh + 15) / 16 : DT / 2;
    const CopyQ cq(p.qs[2], dh);
    const CopyKV ck(p.ks[2], dh), cv(p.vs[2], dh);
    const uint16_t *const k00 = ck.src(k, 0, 0), *const v00 = cv.src(v, 0, 0);  // row 0: source of zero-filled rows
    const uint16_t *kt = ck.src(k, ck.row, p.ks[2]), *vt = cv.src(v, cv.row, p.vs[2]);  // this thread's rows of tile j
    const int64_t kstep = ck.live ? BN * p.ks[2] : 0, vstep = cv.live ? BN * p.vs[2] : 0;
    cq.load(sq, cq.src(q, q0 + cq.row, p.qs[2]), cq.src(q, 0, 0), p.nq - q0);
    cp_async_commit();
    ck.load(sk, kt, k00, p.nk);
    if (kStages == 2) {  // V(0) in the same group as K(0)
        cv.load(sv, vt, v00, p.nk);
        vt += vstep;
    }
    // kShift: the first step multiplies a zero P by "V(-1)": zero-fill its buffer (no global read)
    if (kShift) cv.load(sv + BN * D * 2, v00, v00, 0);
    cp_async_commit();

    cp_async_wait<1>();  // Q landed (K may still be in flight)
    __syncthreads();
    // Q fragments (A operand, row-major): matrices (rows 0-7|8-15) x (cols k0|k0+8). This warp's
    // m16 tiles are rows warp*16*MT + mt*16.
    const int qrow = warp * 16 * MT + (lane % 8) + 8 * ((lane / 8) % 2);
    uint32_t qf[QRS > 0 ? QRS : 1][MT][4];
    if (QRS > 0) {
#pragma unroll
        for (int ks = 0; ks < QRS; ++ks)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
                if (ks < ksteps) ldmatrix_x4(qf[ks][mt], sq + swz2<D>(qrow + mt * 16, 2 * ks, lane / 16));
    }

    float acc[MT][DT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int d = 0; d < DT; ++d) acc[mt][d][0] = acc[mt][d][1] = acc[mt][d][2] = acc[mt][d][3] = 0.0f;
    float mrow[MT][2], lrow[MT][2];  // rows lane/4 and lane/4 + 8 of each m16 tile (log2 domain)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) mrow[mt][0] = mrow[mt][1] = -INFINITY, lrow[mt][0] = lrow[mt][1] = 0.0f;
    const float sl2 = p.scale_log2;
    const int64_t ntiles = (p.nk + BN - 1) / BN;

    // S = Q K^T for the K tile in shared memory.
    auto qk = [&](float (&s)[MT][NS][4], uint32_t skb) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int n = 0; n < NS; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
        // K fragments (B operand, "col" = K row-major): (rows n0|n0+8) x (cols k0|k0+8).
        const int rr = (lane % 8) + 8 * (lane / 16), cc = (lane / 8) % 2;
        // kLdsmBases: the swizzled offset of k-step ks is that of ks % 4 plus 128 * (ks / 4) bytes
        // (a row's chunk groups of 8 are swizzled alike), so four bases a operand serve every step
        // with immediate offsets; else ptxas recomputes the XOR on each step.
        uint32_t qb[4], kb[4];
        if (kLdsmBases)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                qb[r] = sq + swz2<D>(qrow, 2 * r, lane / 16);
                kb[r] = skb + swz2<D>(rr, 2 * r, cc);
            }
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            if (ks >= ksteps) break;  // padding columns: zero in Q and K, nothing to add
            uint32_t qt[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                if (ks < QRS) {
#pragma unroll
                    for (int x = 0; x < 4; ++x) qt[mt][x] = qf[ks < QRS ? ks : 0][mt][x];
                } else if (kLdsmBases) {
                    ldmatrix_x4(qt[mt], qb[ks % 4] + (ks / 4) * 128 + mt * 16 * D * 2);
                } else {
                    ldmatrix_x4(qt[mt], sq + swz2<D>(qrow + mt * 16, 2 * ks, lane / 16));
                }
            }
#pragma unroll
            for (int np = 0; np < NS / 2; ++np) {
                uint32_t kf[4];
                if (kLdsmBases)
                    ldmatrix_x4(kf, kb[ks % 4] + (ks / 4) * 128 + np * 16 * D * 2);
                else
                    ldmatrix_x4(kf, skb + swz2<D>(np * 16 + rr, 2 * ks, cc));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    Ptx<E>::mma(s[mt][2 * np], qt[mt], kf[0], kf[1]);
                    Ptx<E>::mma(s[mt][2 * np + 1], qt[mt], kf[2], kf[3]);
                }
            }
        }
    };
    // Online softmax of S (keys k0..): new row maxima, P packed as the A operand of P V (one k16
    // step per pair of n8 tiles), running sums, and the O rescale.
    auto softmax = [&](float (&s)[MT][NS][4], uint32_t (&pf)[MT][NS / 2][4], int64_t k0) {
        if (k0 + BN > p.nk) {  // ragged last tile: keys past nk get no weight
            const int t2 = 2 * (lane % 4);
#pragma unroll
            for (int n = 0; n < NS; ++n) {
                const int64_t c = k0 + n * 8 + t2;
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    if (c >= p.nk) s[mt][n][0] = s[mt][n][2] = -INFINITY;
                    if (c + 1 >= p.nk) s[mt][n][1] = s[mt][n][3] = -INFINITY;
                }
            }
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
            for (int n = 0; n < NS; ++n) {
                mx0 = fmaxf(mx0, fmaxf(s[mt][n][0], s[mt][n][1]));
                mx1 = fmaxf(mx1, fmaxf(s[mt][n][2], s[mt][n][3]));
            }
            mx0 = fmaxf(mx0, fk_shfl_xor(mx0, 1));
            mx0 = fmaxf(mx0, fk_shfl_xor(mx0, 2));
            mx1 = fmaxf(mx1, fk_shfl_xor(mx1, 1));
            mx1 = fmaxf(mx1, fk_shfl_xor(mx1, 2));
            // finite: every tile holds at least one valid key
            const float mn0 = fmaxf(mrow[mt][0], mx0 * sl2), mn1 = fmaxf(mrow[mt][1], mx1 * sl2);
            const float a0 = ex2(mrow[mt][0] - mn0), a1 = ex2(mrow[mt][1] - mn1);
            mrow[mt][0] = mn0;
            mrow[mt][1] = mn1;
            float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
            for (int n = 0; n < NS; ++n) {
                const float e0 = ex2(fmaf(s[mt][n][0], sl2, -mn0)), e1 = ex2(fmaf(s[mt][n][1], sl2, -mn0));
                const float e2 = ex2(fmaf(s[mt][n][2], sl2, -mn1)), e3 = ex2(fmaf(s[mt][n][3], sl2, -mn1));
                sum0 += e0 + e1;
                sum1 += e2 + e3;
                pf[mt][n / 2][(n % 2) * 2 + 0] = Ptx<E>::pack(e0, e1);
                pf[mt][n / 2][(n % 2) * 2 + 1] = Ptx<E>::pack(e2, e3);
            }
            lrow[mt][0] = lrow[mt][0] * a0 + sum0;  // per-thread partial; the quad's four are summed at the end
            lrow[mt][1] = lrow[mt][1] * a1 + sum1;
            // Once the row maxima settle most tiles leave them unchanged (alpha 1): skip the O
            // rescale when no row of this warp moved (a warp-uniform branch; x * 1 is exact).
            if (__any_sync(0xffffffffu, a0 != 1.0f || a1 != 1.0f))
#pragma unroll
            for (int d = 0; d < DT; ++d) {
                acc[mt][d][0] *= a0;
                acc[mt][d][1] *= a0;
                acc[mt][d][2] *= a1;
                acc[mt][d][3] *= a1;
            }
        }
    };
    // O += P V for the V tile at svb.
    auto pv = [&](const uint32_t (&pf)[MT][NS / 2][4], uint32_t svb) {
        // V fragments (B operand from row-major V via .trans): (keys k0|k0+8) x (cols d0|d0+8).
        const int rr = (lane % 8) + 8 * ((lane / 8) % 2), cc = lane / 16;
#pragma unroll
        for (int kk = 0; kk < NS / 2; ++kk)
#pragma unroll
            for (int dp = 0; dp < DT / 2; ++dp) {
                if (dp >= dsteps) break;  // padding columns of O: never stored
                uint32_t vf[4];
                ldmatrix_x4_trans(vf, svb + swz2<D>(kk * 16 + rr, 2 * dp, cc));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    Ptx<E>::mma(acc[mt][2 * dp], pf[mt][kk], vf[0], vf[1]);
                    Ptx<E>::mma(acc[mt][2 * dp + 1], pf[mt][kk], vf[2], vf[3]);
                }
            }
    };

    if constexpr (kStages == 2) {
        // Step j: K(j+1) and V(j+1) load into the other buffers during all of step j.
        for (int64_t j = 0; j < ntiles; ++j) {
            const int64_t k0 = j * BN;
            const uint32_t cur = uint32_t(j & 1) * (BN * D * 2), nxt = uint32_t((j + 1) & 1) * (BN * D * 2);
            cp_async_wait<0>();  // K(j) and V(j) landed
            __syncthreads();     // ... for every thread; and every warp is done with step j-1's buffers
            if (j + 1 < ntiles) {
                kt += kstep;
                ck.load(sk + nxt, kt, k00, p.nk - k0 - BN);
                cv.load(sv + nxt, vt, v00, p.nk - k0 - BN);
                vt += vstep;
                cp_async_commit();
            }
            float s[MT][NS][4];
            qk(s, sk + cur);
            uint32_t pf[MT][NS / 2][4];
            softmax(s, pf, k0);
            pv(pf, sv + cur);
        }
    } else if constexpr (!kShift) {
        // Step j: S(j) while V(j) lands, softmax, then P(j) V(j) while K(j+1) lands.
        for (int64_t j = 0; j < ntiles; ++j) {
            const int64_t k0 = j * BN;
            cp_async_wait<0>();  // K(j) landed
            __syncthreads();     // ... for every thread; and every warp is done with V(j-1)
            cv.load(sv, vt, v00, p.nk - k0);
            vt += vstep;
            cp_async_commit();
            float s[MT][NS][4];
            qk(s, sk);
            // kEarlyK: V(j) waited for and K(j+1) issued before the softmax (FlashAttention-2's order)
            auto next_k = [&] {
                cp_async_wait<0>();  // V(j) landed
                __syncthreads();     // ... for every thread; and every warp is done with K(j)
                if (j + 1 < ntiles) {
                    kt += kstep;
                    ck.load(sk, kt, k00, p.nk - k0 - BN);
                    cp_async_commit();
                }
            };
            if (kEarlyK) next_k();
            uint32_t pf[MT][NS / 2][4];
            softmax(s, pf, k0);
            if (!kEarlyK) next_k();
            pv(pf, sv);
        }
    } else {
        // Step j: S(j), then P(j-1) V(j-1) and the softmax of S(j) in one basic block, so that the
        // exponentials issue while the P V MMAs run (they do not depend on each other). V is double
        // buffered (V(j) lands during step j, is used in step j+1); K(j+1) lands during the overlap.
        uint32_t pf[MT][NS / 2][4];  // P(j-1); zero before step 0 (times a zero-filled V buffer)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int kk = 0; kk < NS / 2; ++kk) pf[mt][kk][0] = pf[mt][kk][1] = pf[mt][kk][2] = pf[mt][kk][3] = 0u;
        for (int64_t j = 0; j < ntiles; ++j) {
            const int64_t k0 = j * BN;
            const uint32_t svj = sv + uint32_t(j & 1) * (BN * D * 2), svp = sv + uint32_t((j + 1) & 1) * (BN * D * 2);
            cp_async_wait<0>();  // K(j) and V(j-1) landed
            __syncthreads();     // ... for every thread; and every warp is done with V(j-2)'s buffer
            cv.load(svj, vt, v00, p.nk - k0);
            vt += vstep;
            cp_async_commit();
            float s[MT][NS][4];
            qk(s, sk);
            __syncthreads();  // every warp is done with K(j)
            if (j + 1 < ntiles) {
                kt += kstep;
                ck.load(sk, kt, k00, p.nk - k0 - BN);
                cp_async_commit();
            }
            pv(pf, svp);          // P(j-1) V(j-1), into O scaled to the maxima of step j-1
            softmax(s, pf, k0);   // then O *= alpha(j), P(j)
        }
        cp_async_wait<0>();  // V(last) landed
        __syncthreads();
        pv(pf, sv + uint32_t((ntiles - 1) & 1) * (BN * D * 2));
    }

    const int c = 2 * (lane % 4);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        float l0 = lrow[mt][0], l1 = lrow[mt][1];
        l0 += fk_shfl_xor(l0, 1);
        l0 += fk_shfl_xor(l0, 2);
        l1 += fk_shfl_xor(l1, 1);
        l1 += fk_shfl_xor(l1, 2);
        const float i0 = 1.0f / l0, i1 = 1.0f / l1;
        const int64_t r0 = q0 + warp * 16 * MT + mt * 16 + lane / 4, r1 = r0 + 8;
        if (p.lse != nullptr && lane % 4 == 0) {  // a quad holds a row: its first lane writes it
            float *lse = p.lse + b * p.ls[0] + h * p.ls[1];
            if (r0 < p.nq) lse[r0 * p.ls[2]] = row_lse(mrow[mt][0], l0);
            if (r1 < p.nq) lse[r1 * p.ls[2]] = row_lse(mrow[mt][1], l1);
        }
#pragma unroll
        for (int d = 0; d < DT; ++d) {
            if (d * 8 >= dh) break;  // padding columns
            if (r0 < p.nq)
                *reinterpret_cast<uint32_t *>(o + r0 * p.os[2] + d * 8 + c) = Ptx<E>::pack(acc[mt][d][0] * i0, acc[mt][d][1] * i0);
            if (r1 < p.nq)
                *reinterpret_cast<uint32_t *>(o + r1 * p.os[2] + d * 8 + c) = Ptx<E>::pack(acc[mt][d][2] * i1, acc[mt][d][3] * i1);
        }
    }
#else
    __trap();
#endif
}

}  // namespace mma
}  // namespace fk

#endif  // FK_PLATFORM_NVIDIA && !FK_FORCE_GENERIC
#endif  // FK_MMA_H
