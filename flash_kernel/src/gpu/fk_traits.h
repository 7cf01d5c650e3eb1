// fk_traits.h: element types and every tile shape of the GPU kernels, in one place (in the manner
// of FlashAttention's kernel traits). Change a shape here, nowhere else.
#ifndef FK_TRAITS_H
#define FK_TRAITS_H

#include "gpu/fk_hip_compat.h"

namespace fk {

// ---- element types: storage in memory, fp32 for arithmetic ----
struct F32 {
    using storage = float;
    static constexpr int kBytes = 4;
    static FK_DEVICE float to_float(float x) { return x; }
    static FK_DEVICE float from_float(float x) { return x; }
};
struct F16 {
    using storage = uint16_t;
    static constexpr int kBytes = 2;
    static FK_DEVICE float to_float(uint16_t x) { return fk_half_to_float(x); }
    static FK_DEVICE uint16_t from_float(float x) { return fk_float_to_half(x); }
};
struct BF16 {
    using storage = uint16_t;
    static constexpr int kBytes = 2;
    static FK_DEVICE float to_float(uint16_t x) { return fk_bf16_to_float(x); }
    static FK_DEVICE uint16_t from_float(float x) { return fk_float_to_bf16(x); }
};

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kVectorBytes = 16;  // global loads of the flash paths are 16 bytes wide

// ---- head-dim buckets ----
// Every head dim d of 32..256 in steps of 8 (fk_common.h) runs on a kernel compiled for a padded
// head dim DP >= d, its bucket: columns d..DP-1 of the Q, K and V tiles are zero-filled in shared
// memory (never read from global memory), so Q K^T and P V stay exact, and columns past d are
// never stored. The tensor-core kernels skip the k16 steps of Q K^T that hold only padding (and
// the n8 tiles / n64 column blocks of P V past d), so there a bucket costs shared memory and
// registers, and tensor-core work only up to the next multiple of 16 (of 64 for wgmma's P V in
// the wide buckets); they are compiled twice per bucket, for d == D with no such test and for d < D.
// Narrow kernels run fewer columns fixed at compile time, with no run-time test (MmaTile::kNarrowKD,
// WgmmaTile::kNarrowKD/kNarrowKD2): mma.sync bucket 96 at d <= 80 (80 columns) and bucket 256 at
// d <= 224 (224), wgmma bucket 64 at d 32 (32) and 40..48 (48; both off). mma.sync bucket 256's
// padded kernel (232..248) runs every step over the padding instead of testing (FK_MMA_PAD_SKIP_D256).
// The generic kernel computes over all D columns (FMA work on the padding). A few buckets keep
// the binary small: no instantiation per head dim.
template <int N>
constexpr int bucket_of(const int (&dims)[N], int64_t d) {
    for (int i = 0; i < N; ++i)
        if (d <= dims[i]) return dims[i];
    return 0;
}
constexpr int kGenericBuckets[] = {32, 64, 96, 128, 192, 256};
// mma.sync: a bucket at every head dim FlashAttention-2 instantiates below 256 but 224, so that
// the common head dims (32, 64, 96, 128, 160, 192, 256) run unpadded on a tile of their own.
constexpr int kMmaBuckets[] = {32, 64, 96, 128, 160, 192, 256};
// wgmma: bucket 192 (head dims 136..192) takes a smaller Q tile than 256 and so longer K/V tiles;
// FK_WGMMA_BUCKET_192=0 runs those head dims padded in bucket 256 (four kernels fewer).
#ifndef FK_WGMMA_BUCKET_192
#define FK_WGMMA_BUCKET_192 1
#endif
#if FK_WGMMA_BUCKET_192
constexpr int kWgmmaBuckets[] = {64, 128, 192, 256};
#else
constexpr int kWgmmaBuckets[] = {64, 128, 256};
#endif
// The smallest head dim a bucket runs: the bucket below it + 8 (32, the smallest supported, for the first).
template <int N>
constexpr int bucket_floor(const int (&dims)[N], int bucket) {
    int below = 24;
    for (int i = 0; i < N && dims[i] < bucket; ++i) below = dims[i];
    return below + 8;
}

// ---- generic path (the RDNA2 kernel): 128 threads = 8 row groups x 16 lanes ----
// Each thread owns RM query rows x CN key columns of S and RM rows x DN columns of O; a row's
// 16 owners sit in one 16-lane group of a wave32/warp32 (or half of a wave64), so row
// reductions are 4 xor-shuffles. Tiles are stored in the input type with one 4-byte word of
// row padding so that 16 consecutive rows hit 16 different banks. Shared memory stays under
// 48 KiB (static limit on NVIDIA; RDNA2 has 64 KiB of LDS per workgroup). K and V share one
// buffer: the generic path trades overlap for tile size.
template <int D, int ES>
struct GenericTile {
    static constexpr int kThreads = 128;
    static constexpr int BM = ES == 4 ? (D > 128 ? 16 : 32) : (D >= 256 ? 32 : 64);
    static constexpr int BN = ES == 4 ? (D > 128 ? 16 : 32) : (D <= 64 ? 64 : 32);
    static constexpr int RM = BM / 8;
    static constexpr int CN = BN / 16;
    static constexpr int DN = D / 16;
    static constexpr int kPerWord = 4 / ES;           // elements per 32-bit word
    static constexpr int W = D / kPerWord + 1;        // words per smem row (odd: conflict free)
    static constexpr int PW = BN + 1;                 // floats per P row
    static constexpr int kSmemBytes = (BM + BN) * W * 4 + BM * PW * 4;
    static_assert(D % 16 == 0, "head dim must be a multiple of 16");
    static_assert(BM % 8 == 0 && BN % 16 == 0, "tile shape");
    static_assert(kSmemBytes <= 48 * 1024, "generic tile exceeds 48 KiB of shared memory");
};

// ---- mma.sync path (NVIDIA sm_80+): one warp owns MT m16 tiles = 16*MT query rows ----
// BM = 16 * MT * warps; BN keys per K/V tile; Q, K and V tiles each BM|BN x D in shared memory,
// XOR-swizzled in 16-byte chunks. Two m16 tiles per warp reuse each K/V fragment twice (half the
// ldmatrix traffic of one tile). Q fragments stay in registers only when they are few (MT*D <= 128)
// and S is small (BN <= 64: BN 128 at D 64 with Q in registers spills 188 B), else they are re-read
// from shared memory each k-step. Overridable at compile time for tuning (bench/mma_variants.txt).
// Defaults, measured on the H200 (docs/perf.md, "Shifted P V at D 64", bf16 and fp16, 7 video presets):
// D 128 BM 128 x BN 64, 1.06-1.13x SDPA-flash; D 64 BM 128 x BN 64 with the shifted P V below,
// 1.04-1.15x, against 0.85-1.09x for FlashAttention-2's own D 64 tile (BN 128, plain order).
#ifndef FK_MMA_WARPS_D64
#define FK_MMA_WARPS_D64 4
#endif
#ifndef FK_MMA_BN_D64
#define FK_MMA_BN_D64 64
#endif
#ifndef FK_MMA_WARPS_D128
#define FK_MMA_WARPS_D128 4
#endif
#ifndef FK_MMA_BN_D128
#define FK_MMA_BN_D128 64
#endif
// Two m16 tiles per warp: measured 0.88x (D 128) and 0.83x (D 64) of SDPA-flash on the H200
// against 0.62x / 0.76x with one (docs/perf.md, "Two m16 tiles per warp").
#ifndef FK_MMA_MT_D64
#define FK_MMA_MT_D64 2
#endif
#ifndef FK_MMA_MT_D128
#define FK_MMA_MT_D128 2
#endif
#ifndef FK_MMA_Q_IN_REGS
#define FK_MMA_Q_IN_REGS 1   // 0: always re-read Q from shared memory
#endif
#ifndef FK_MMA_Q_REGS_MAX
#define FK_MMA_Q_REGS_MAX 128  // Q stays in registers where MT * D is at most this (and BN <= 64)
#endif
// Buckets that keep Q in registers past FK_MMA_Q_REGS_MAX (1): 96 (MT 2) and 192 (MT 1), 255 / 243
// registers. Measured on the H200 (docs/perf.md "mma.sync head-dim buckets", variant qr): 1.10x /
// 1.15x SDPA-flash at head dims 72 / 80, 0.98x at 96, 1.05x at 192, against 1.04 / 1.09 / 0.96 / 0.97x
// with Q re-read from shared memory. 160 and 256 were not measured this way: they keep it there
// (32, 64 and 128 are decided by FK_MMA_Q_REGS_MAX and BN alone).
#ifndef FK_MMA_Q_REGS_D32
#define FK_MMA_Q_REGS_D32 0
#endif
#ifndef FK_MMA_Q_REGS_D64
#define FK_MMA_Q_REGS_D64 0
#endif
#ifndef FK_MMA_Q_REGS_D96
#define FK_MMA_Q_REGS_D96 1
#endif
#ifndef FK_MMA_Q_REGS_D128
#define FK_MMA_Q_REGS_D128 0
#endif
#ifndef FK_MMA_Q_REGS_D160
#define FK_MMA_Q_REGS_D160 0
#endif
#ifndef FK_MMA_Q_REGS_D192
#define FK_MMA_Q_REGS_D192 1
#endif
#ifndef FK_MMA_Q_REGS_D256
#define FK_MMA_Q_REGS_D256 0
#endif
// Bucket 256 with Q re-read from shared memory: the first FK_MMA_Q_STEPS_D256 k16 steps of Q held in
// registers all the same (4 registers a step), the rest re-read each K/V tile. Measured on the H200
// at head dim 256 (docs/perf.md "Head dim 32 on the wgmma path, head dims 200..248"): 4 steps 0.92x
// SDPA-flash (no spill), 8 steps 0.92x (56 B spill), against 0.99x with none: off.
#ifndef FK_MMA_Q_STEPS_D256
#define FK_MMA_Q_STEPS_D256 0
#endif
// Blocks per SM asked of ptxas (__launch_bounds__' second argument): 0 asks nothing (ptxas uses up
// to 255 registers; two 128-thread blocks fit an SM; CUDA 13.0 spills 12 B at D 64 BN 128 when asked
// for 1); 3 caps the registers at 168 so that three blocks fit.
#ifndef FK_MMA_MIN_BLOCKS_D64
#define FK_MMA_MIN_BLOCKS_D64 0
#endif
#ifndef FK_MMA_MIN_BLOCKS_D128
#define FK_MMA_MIN_BLOCKS_D128 0
#endif
// Shifted P V: step j computes S(j), then P(j-1) V(j-1) together with the softmax of S(j) (one
// basic block: the exponentials issue while the P V MMAs run), V double-buffered (+1 BN x D tile).
// On at D 64 (+4..+23 % over the plain order at BN 128, docs/perf.md); off at D 128, where it needs BN 32 to fit the
// registers (BN 64 spills 116 B) and measured 0.97-1.03x SDPA-flash against 1.06-1.13x.
#ifndef FK_MMA_SHIFT_PV_D64
#define FK_MMA_SHIFT_PV_D64 1
#endif
#ifndef FK_MMA_SHIFT_PV_D128
#define FK_MMA_SHIFT_PV_D128 0
#endif
// Bucket 32: FlashAttention-2's D 32 tile, BM 128 x BN 128, plain order (Q from shared memory at
// BN 128). Measured on the H200 (docs/perf.md "mma.sync head-dim buckets"): 1.19x SDPA-flash,
// against 1.06-1.07x for the D 64 tile (BN 64, shifted P V, Q in registers).
#ifndef FK_MMA_WARPS_D32
#define FK_MMA_WARPS_D32 4
#endif
#ifndef FK_MMA_BN_D32
#define FK_MMA_BN_D32 128
#endif
#ifndef FK_MMA_MT_D32
#define FK_MMA_MT_D32 2
#endif
#ifndef FK_MMA_SHIFT_PV_D32
#define FK_MMA_SHIFT_PV_D32 0
#endif
// Bucket 96 (head dims 72..96): the D 128 tile (BM 128 x BN 64, plain order); 96 fp32 registers of
// O a thread instead of 128. 8 warps of one m16 tile (0.70x) and BN 32 with the shifted P V
// (0.91x) measured slower than this (0.97x) at D 96.
#ifndef FK_MMA_WARPS_D96
#define FK_MMA_WARPS_D96 4
#endif
#ifndef FK_MMA_BN_D96
#define FK_MMA_BN_D96 64
#endif
#ifndef FK_MMA_MT_D96
#define FK_MMA_MT_D96 2
#endif
#ifndef FK_MMA_SHIFT_PV_D96
#define FK_MMA_SHIFT_PV_D96 0
#endif
// Buckets 160 (136..160), 192 (168..192) and 256 (200..256): 4 warps of one m16 tile (BM 64), BN 64
// (40 / 48 / 64 KiB of K and V). Measured against FlashAttention-2's sm_80 shape for 192 and 256,
// 8 warps of one m16 tile (BM 128; BN 64 at 160/192, BN 32 at 256 within 99 KiB): 1.15x against
// 1.05x SDPA-flash at 160, 0.98x against 0.86x at 192, 0.93-0.95x against 0.80x at 256. At 256,
// BN 80 in the sm_90 compilation (112 KiB, still two blocks an SM; 16 B spill) measured 0.91x
// against 0.98x (FK_MMA_SM90_BN_D256=80; docs/perf.md "Head dim 32 on the wgmma path, head dims
// 200..248").
#ifndef FK_MMA_WARPS_D160
#define FK_MMA_WARPS_D160 4
#endif
#ifndef FK_MMA_BN_D160
#define FK_MMA_BN_D160 64
#endif
#ifndef FK_MMA_MT_D160
#define FK_MMA_MT_D160 1
#endif
#ifndef FK_MMA_WARPS_D192
#define FK_MMA_WARPS_D192 4
#endif
#ifndef FK_MMA_BN_D192
#define FK_MMA_BN_D192 64
#endif
#ifndef FK_MMA_MT_D192
#define FK_MMA_MT_D192 1
#endif
#ifndef FK_MMA_WARPS_D256
#define FK_MMA_WARPS_D256 4
#endif
#ifndef FK_MMA_BN_D256
#define FK_MMA_BN_D256 64
#endif
#ifndef FK_MMA_MT_D256
#define FK_MMA_MT_D256 1
#endif
#ifndef FK_MMA_SHIFT_PV_D160
#define FK_MMA_SHIFT_PV_D160 0
#endif
// A head dim below its bucket's D skips the k16 steps of Q K^T and the n8 tile pairs of P V that
// hold only padding (1), at the price of run-time loop bounds in those kernels, or runs them all over
// the zero-filled columns (0). Per bucket: FK_MMA_PAD_SKIP_D<bucket> (default FK_MMA_PAD_SKIP).
// The run-time bounds cost more than the padding saves at every padded head dim measured on the
// H200 (docs/perf.md "Head dim 32 on the wgmma path, head dims 200..248" and the run after it), x
// SDPA-flash, all steps against skipping: 1.30x / 1.07x at 40 and 48, 1.28x / 0.92x at 56, 1.00x /
// 0.77x at 88, 1.11-1.15x / 0.81-0.93x at 104..120, 0.98-1.12x / 0.75-0.88x at 136..152,
// 0.97-1.05x / 0.64-0.70x at 168..184, 1.08x / 0.72x at 240. Off (all steps) at every bucket.
#ifndef FK_MMA_PAD_SKIP
#define FK_MMA_PAD_SKIP 0
#endif
#ifndef FK_MMA_PAD_SKIP_D32
#define FK_MMA_PAD_SKIP_D32 FK_MMA_PAD_SKIP
#endif
#ifndef FK_MMA_PAD_SKIP_D64
#define FK_MMA_PAD_SKIP_D64 FK_MMA_PAD_SKIP
#endif
#ifndef FK_MMA_PAD_SKIP_D96
#define FK_MMA_PAD_SKIP_D96 FK_MMA_PAD_SKIP
#endif
#ifndef FK_MMA_PAD_SKIP_D128
#define FK_MMA_PAD_SKIP_D128 FK_MMA_PAD_SKIP
#endif
#ifndef FK_MMA_PAD_SKIP_D160
#define FK_MMA_PAD_SKIP_D160 FK_MMA_PAD_SKIP
#endif
#ifndef FK_MMA_PAD_SKIP_D192
#define FK_MMA_PAD_SKIP_D192 FK_MMA_PAD_SKIP
#endif
#ifndef FK_MMA_PAD_SKIP_D256
#define FK_MMA_PAD_SKIP_D256 FK_MMA_PAD_SKIP
#endif
// Bucket 96's head dims 72 and 80 run a kernel whose MMAs cover 80 columns, fixed at compile time
// (FK_MMA_NARROW_D96=96: the padded 96 kernel, which skips the padding k16 steps at run time).
// Bucket 256's head dims 200..224 likewise on 224 columns (FK_MMA_NARROW_D256=256: on the padded
// 256 kernel): measured on the H200, 1.20x SDPA-flash at 200 and 1.25-1.26x at 224, against 1.07x
// and 1.11x on the padded kernel running all steps and 0.77x / 0.78x on it skipping them.
#ifndef FK_MMA_NARROW_D96
#define FK_MMA_NARROW_D96 80
#endif
#ifndef FK_MMA_NARROW_D256
#define FK_MMA_NARROW_D256 224
#endif
// Blocks per SM asked of ptxas in the new buckets (0: nothing asked, as at D 64 and 128 above).
#ifndef FK_MMA_MIN_BLOCKS_D32
#define FK_MMA_MIN_BLOCKS_D32 0
#endif
#ifndef FK_MMA_MIN_BLOCKS_D96
#define FK_MMA_MIN_BLOCKS_D96 0
#endif
#ifndef FK_MMA_MIN_BLOCKS_D160
#define FK_MMA_MIN_BLOCKS_D160 0
#endif
#ifndef FK_MMA_MIN_BLOCKS_D192
#define FK_MMA_MIN_BLOCKS_D192 0
#endif
#ifndef FK_MMA_MIN_BLOCKS_D256
#define FK_MMA_MIN_BLOCKS_D256 0
#endif
#ifndef FK_MMA_SHIFT_PV_D192
#define FK_MMA_SHIFT_PV_D192 0
#endif
#ifndef FK_MMA_SHIFT_PV_D256
#define FK_MMA_SHIFT_PV_D256 0
#endif

// cp.async copies with the L2 prefetch-size hint of 128 bytes (1; the CUTLASS copies FlashAttention-2
// uses carry it) or without (0): level at head dim 256 on the H200 (0.99x SDPA-flash both): off.
#ifndef FK_MMA_CP_L2_PREFETCH
#define FK_MMA_CP_L2_PREFETCH 0
#endif
// K/V tiles in shared memory (1 or 2, plain order only): 2 double-buffers K and V, so that tile
// j+1 loads during all of step j (one barrier a step instead of two).
#ifndef FK_MMA_STAGES_D32
#define FK_MMA_STAGES_D32 1
#endif
#ifndef FK_MMA_STAGES_D64
#define FK_MMA_STAGES_D64 1
#endif
#ifndef FK_MMA_STAGES_D96
#define FK_MMA_STAGES_D96 1
#endif
#ifndef FK_MMA_STAGES_D128
#define FK_MMA_STAGES_D128 1
#endif
#ifndef FK_MMA_STAGES_D160
#define FK_MMA_STAGES_D160 1
#endif
#ifndef FK_MMA_STAGES_D192
#define FK_MMA_STAGES_D192 1
#endif
#ifndef FK_MMA_STAGES_D256
#define FK_MMA_STAGES_D256 1
#endif
// One stage, plain order: wait for V(j) and issue K(j+1) before the softmax of S(j) (1, as
// FlashAttention-2 orders it: K(j+1) loads during the softmax and P V) or after it (0). On at
// buckets 96 and 256, measured on the H200 (docs/perf.md "mma.sync buckets 96 and 256"): 1.02-1.03x
// SDPA-flash at head dim 96 (0.97-0.98x after), 1.17x at 72, 1.26x at 80 (1.10x, 1.15x), 0.98x at
// 256 (0.93x). Two stages at 96 (1.03-1.04x, no spill) measured level with it.
#ifndef FK_MMA_EARLY_K_D32
#define FK_MMA_EARLY_K_D32 0
#endif
#ifndef FK_MMA_EARLY_K_D64
#define FK_MMA_EARLY_K_D64 0
#endif
#ifndef FK_MMA_EARLY_K_D96
#define FK_MMA_EARLY_K_D96 1
#endif
#ifndef FK_MMA_EARLY_K_D128
#define FK_MMA_EARLY_K_D128 0
#endif
#ifndef FK_MMA_EARLY_K_D160
#define FK_MMA_EARLY_K_D160 0
#endif
#ifndef FK_MMA_EARLY_K_D192
#define FK_MMA_EARLY_K_D192 0
#endif
#ifndef FK_MMA_EARLY_K_D256
#define FK_MMA_EARLY_K_D256 1
#endif
// Threads that span one row in the cp.async copies of the Q, K and V tiles (fk_mma.h TileCopy), at
// most. 32 (no cap) copies bucket 256's 32-chunk rows with 32 threads, so a thread's rows are 4
// apart and ptxas recomputes the swizzle of its chunk on every row (~130 SASS instructions a K or
// V tile); 16 puts them 8 apart (one swizzle offset per chunk column, an immediate per row: ~55).
// Every other bucket already has rows 8 or more apart.
// Q K^T's ldmatrix addresses from four precomputed bases an operand (Q and K) plus immediates (1),
// or the swizzle XOR recomputed on each of the 16 k16 steps (0: ~5 SASS instructions a step).
// Measured on the H200 (docs/perf.md "mma.sync bucket 256: copy and ldmatrix addressing"), x the
// kernel with 32 and 0, paired call by call, bf16 / fp16: both on 1.04x / 1.05x at head dim 256
// (1.03x SDPA-flash, against 0.98-0.99x), 1.07x at 240, 1.03-1.04x at 200 and 224; 16 alone 1.02x
// at 256, 1.06x at 240, 0.99x at 200; the bases alone 1.01x at 256, 1.02-1.04x at 200..240; 8
// threads a row (rows 16 apart, as FlashAttention-2 copies 256-wide rows) level at 256, 0.97-0.99x
// at 224/240.
#ifndef FK_MMA_COPY_ROW_THREADS_D256
#define FK_MMA_COPY_ROW_THREADS_D256 16
#endif
#ifndef FK_MMA_LDSM_BASES_D256
#define FK_MMA_LDSM_BASES_D256 1
#endif
// Per-architecture tiles. The sm_80 cubin also runs on cc 8.6/8.9, where a block gets at most 99
// KiB of shared memory; the sm_90 cubins run on cc 9.0 only (227 KiB). Buckets 96 and 256 may take
// another tile in the sm_90 compilation (FK_MMA_SM90_<knob>_D<bucket>; default: the sm_80 tile).
// None measured faster on the H200 (docs/perf.md): at 256, 8 warps x BM 128 (128 KiB) 0.91x
// SDPA-flash, with 2 stages (192 KiB) 0.92x, 4 warps with 2 stages (160 KiB, one block an SM)
// 0.79x, against 0.93x for the sm_80 tile; at 96, 8 warps x two m16 tiles, 2 stages, 0.93-0.94x.
// The host reads which cubin a kernel runs on a device (its binary version) and launches with that
// tile's block size and shared memory (fk_gpu.hip).
#ifndef FK_MMA_SM90_WARPS_D96
#define FK_MMA_SM90_WARPS_D96 FK_MMA_WARPS_D96
#endif
#ifndef FK_MMA_SM90_BN_D96
#define FK_MMA_SM90_BN_D96 FK_MMA_BN_D96
#endif
#ifndef FK_MMA_SM90_MT_D96
#define FK_MMA_SM90_MT_D96 FK_MMA_MT_D96
#endif
#ifndef FK_MMA_SM90_STAGES_D96
#define FK_MMA_SM90_STAGES_D96 FK_MMA_STAGES_D96
#endif
#ifndef FK_MMA_SM90_WARPS_D256
#define FK_MMA_SM90_WARPS_D256 FK_MMA_WARPS_D256
#endif
#ifndef FK_MMA_SM90_BN_D256
#define FK_MMA_SM90_BN_D256 FK_MMA_BN_D256
#endif
#ifndef FK_MMA_SM90_MT_D256
#define FK_MMA_SM90_MT_D256 FK_MMA_MT_D256
#endif
#ifndef FK_MMA_SM90_STAGES_D256
#define FK_MMA_SM90_STAGES_D256 FK_MMA_STAGES_D256
#endif
// The architecture whose tiles the code being compiled uses: 90 in the sm_90/sm_90a device passes,
// 80 in the sm_80 pass (and on the host, which asks for both by name).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FK_MMA_ARCH 90
#else
#define FK_MMA_ARCH 80
#endif

// One knob of bucket D (the FK_MMA_<knob>_D<bucket> macros above).
#define FK_MMA_KNOB(K)                                                                                        \
    (D == 32 ? FK_MMA_##K##_D32 : D == 64 ? FK_MMA_##K##_D64 : D == 96 ? FK_MMA_##K##_D96                    \
     : D == 128 ? FK_MMA_##K##_D128 : D == 160 ? FK_MMA_##K##_D160 : D == 192 ? FK_MMA_##K##_D192            \
     : FK_MMA_##K##_D256)
// ... for architecture Arch (80 or 90): the knobs with an sm_90 override
#define FK_MMA_KNOB_ARCH(K)                                                                                   \
    (Arch >= 90 && D == 96 ? FK_MMA_SM90_##K##_D96 : Arch >= 90 && D == 256 ? FK_MMA_SM90_##K##_D256 : FK_MMA_KNOB(K))

// D is the bucket (kMmaBuckets): 32 runs head dim 32, 64 runs 40..64, 96 72..96, 128 104..128,
// 160 136..160, 192 168..192, 256 200..256. Arch: 80 (the sm_80 cubin) or 90 (sm_90, sm_90a).
template <int D, int Arch>
struct MmaTile {
    static constexpr int kWarps = FK_MMA_KNOB_ARCH(WARPS);
    static constexpr int BN = FK_MMA_KNOB_ARCH(BN);
    static constexpr int MT = FK_MMA_KNOB_ARCH(MT);
    static constexpr int kStages = FK_MMA_KNOB_ARCH(STAGES);
    static constexpr bool kEarlyK = FK_MMA_KNOB(EARLY_K) != 0;
    static constexpr int kMinBlocks = FK_MMA_KNOB(MIN_BLOCKS);
    static constexpr int kThreads = 32 * kWarps;
    static constexpr int BM = 16 * MT * kWarps;
    static constexpr bool kQInRegs =
        FK_MMA_Q_IN_REGS && BN <= 64 &&
        (MT * D <= FK_MMA_Q_REGS_MAX || FK_MMA_KNOB(Q_REGS) != 0);
    static constexpr int kQRegSteps = D == 256 ? FK_MMA_Q_STEPS_D256 : 0;  // with !kQInRegs (fk_mma.h)
    static constexpr bool kShiftPV = FK_MMA_KNOB(SHIFT_PV) != 0;
    static constexpr int kCopyRowThreads = D == 256 ? FK_MMA_COPY_ROW_THREADS_D256 : 32;  // TileCopy's TCMAX (fk_mma.h)
    static constexpr bool kLdsmBases = D == 256 && FK_MMA_LDSM_BASES_D256 != 0;  // fk_mma.h, Q K^T
    static constexpr int kMinDim = bucket_floor(kMmaBuckets, D);  // the smallest head dim of the bucket
    static constexpr int kNarrowKD = D == 96 ? FK_MMA_NARROW_D96 : D == 256 ? FK_MMA_NARROW_D256 : D;  // < D: a narrow kernel (fk_mma.h)
    static constexpr bool kPadSkip = FK_MMA_KNOB(PAD_SKIP) != 0;  // run-time bounds in the padded kernel (fk_mma.h)
    static constexpr int kChunks = D / 8;             // 16-byte chunks per row
    static constexpr int kSmemBytes = (BM + (kShiftPV ? 3 : 2 * kStages) * BN) * D * 2;
    static_assert(D == 32 || D == 64 || D == 96 || D == 128 || D == 160 || D == 192 || D == 256,
                  "mma path: buckets 32, 64, 96, 128, 160, 192 and 256");
    static_assert(BN % 16 == 0 && D % 32 == 0 && (MT == 1 || MT == 2), "mma tile shape");
    static_assert(kStages == 1 || (kStages == 2 && !kShiftPV), "mma path: 2 K/V stages in the plain order only");
    // 99 KiB: the most a block gets on cc 8.6/8.9 (the sm_80 cubin runs there too); 227 KiB on cc 9.0
    static_assert(kSmemBytes <= (Arch >= 90 ? 227 : 99) * 1024, "mma tiles exceed the shared memory of a block");
};
#undef FK_MMA_KNOB_ARCH
#undef FK_MMA_KNOB

// ---- wgmma path (NVIDIA sm_90a, fp16/bf16; buckets 64, 128, 192, 256) ----
// One producer warpgroup (TMA loads) and two consumer warpgroups of 64 query rows each (BM 128).
// Tiles sit in shared memory as 64-element column blocks of 128-byte rows (the TMA / wgmma 128B
// swizzle). The K/V ring is kStages deep; 227 KiB of shared memory bounds it (D 128: 32 KiB Q +
// 3 x 64 KiB K/V = 224 KiB).
// Buckets 64 and 128: the consumers take turns to issue their GEMMs (ping-pong), one stage slot
// holds a K and a V tile and is released once both were read.
// The wide buckets (192: head dims 136..192, 256: 200..256, or 136..256 without bucket 192) hold O in
// 96 / 128 fp32 registers a thread and have room for 2 stages only (BN 128 would leave one): 256
// takes K/V tiles of 80 keys (64 KiB Q + 2 x 80 KiB K/V = 224 KiB), 192 of 112 (48 + 2 x 84 = 216
// KiB). With 2 stages a slot that is released only after its V was read leaves no room to load
// ahead, so there K and V are released apart: K(j) as soon as S(j) is done (the producer loads
// K(j+2) while P(j) V(j) still runs), V(j) after P(j) V(j): 707 TFLOP/s at head dim 256 against
// 491 together (H200, bf16, docs/perf.md "Wide head dims"). The rescale of O by the new row maxima
// runs while S(j) is on the tensor cores, before P(j-1) V(j-1) is issued.
#ifndef FK_WGMMA_BN
#define FK_WGMMA_BN 128
#endif
#ifndef FK_WGMMA_STAGES_D128
#define FK_WGMMA_STAGES_D128 3
#endif
#ifndef FK_WGMMA_STAGES_D64
#define FK_WGMMA_STAGES_D64 4
#endif
#ifndef FK_WGMMA_BN_D256
#define FK_WGMMA_BN_D256 80
#endif
#ifndef FK_WGMMA_STAGES_D256
#define FK_WGMMA_STAGES_D256 2
#endif
#ifndef FK_WGMMA_BN_D192
#define FK_WGMMA_BN_D192 112
#endif
#ifndef FK_WGMMA_STAGES_D192
#define FK_WGMMA_STAGES_D192 2
#endif
// Consumers take turns to issue (ping-pong, 1) or issue freely (0). In the wide buckets the choice
// is a tie within a few per cent that moved between two H200 runs (docs/perf.md "Wide head dims"):
// bucket 192 keeps the turns (+0-4 % in the first, -3-0 % in the second), bucket 256 issues freely.
#ifndef FK_WGMMA_PINGPONG_D192
#define FK_WGMMA_PINGPONG_D192 1
#endif
#ifndef FK_WGMMA_PINGPONG_D256
#define FK_WGMMA_PINGPONG_D256 0
#endif
#ifndef FK_WGMMA_WIDE_SPLIT_KV  // wide buckets: K and V slots released apart (1) or together (0)
#define FK_WGMMA_WIDE_SPLIT_KV 1
#endif
#ifndef FK_WGMMA_WIDE_EARLY_RESCALE  // wide buckets: rescale O while S(j) runs (1) or after P(j-1) V(j-1) (0)
#define FK_WGMMA_WIDE_EARLY_RESCALE 1
#endif
// Intra-warpgroup overlap: wait for S(j) alone and compute its exponentials while P(j-1) V(j-1) runs.
// Measured on the H200 (docs/perf.md, "Hopper path"): overlap + 3 stages 585 TFLOP/s at D 128
// against 518 with neither; overlap 431 against 409 at D 64.
#ifndef FK_WGMMA_OVERLAP
#define FK_WGMMA_OVERLAP 1
#endif
// With the overlap: the wait for P(j-1) V(j-1) and the packing of P(j) at the top of the next turn,
// a block of code of its own (1), or right after the exponentials of S(j) (0). ptxas's scheduler
// places a wgmma wait early in its block (in its model the wait costs nothing), so in the second
// form the wait sits before the row maxima and the exponentials run after P V is done; in the first
// they run while it is in flight (SASS read with nvdisasm). Not in the chained bucket-128 kernel,
// where the later packing leaves ptxas short of registers and it serialises the wgmmas (C7512).
// Measured on the H200 (docs/perf.md, "Late P V wait"): 1.02x at long self-attention at D 128,
// 1.01x at D 64, even elsewhere; at D 256 0.96x, so the wide buckets (192, 256) keep the early
// wait (FK_WGMMA_LATE_PV_WAIT_WIDE 0; bucket 192 not measured with it).
#ifndef FK_WGMMA_LATE_PV_WAIT
#define FK_WGMMA_LATE_PV_WAIT 1
#endif
#ifndef FK_WGMMA_LATE_PV_WAIT_WIDE
#define FK_WGMMA_LATE_PV_WAIT_WIDE 0
#endif
// Bucket 256's P V as one wide wgmma per k16 step (n256, or n192 where head dims 136..192 leave
// the fourth 64-column block empty) instead of one n64 wgmma per column block (0): the register A
// operand (P) is sent once instead of four times. Bucket 192 always takes one n192.
#ifndef FK_WGMMA_WIDE_PV_D256
#define FK_WGMMA_WIDE_PV_D256 1
#endif
// Persistent grid: one block per SM (the count queried once per device), each looping over work
// items (a 128-row query tile of one (batch, head)) in a static round-robin: item i on block
// i % blocks. Items are numbered query tile fastest, so the blocks running at one time read the
// same few heads' K and V (from L2). The producer runs ahead across items: the K/V ring keeps
// going, and each consumer's 64-row half of Q is reloaded for the next item as soon as that
// consumer's last S = Q K^T is done, so the next item's Q load and first K/V tiles overlap the
// last P V and the output stores of the current one. 0: one block per work item (the grid holds
// every query tile of every (batch, head)). Measured on the H200 (docs/perf.md, "Persistent wgmma
// grid"): 1.19x / 1.25x the per-item grid at text cross-attention (Nk 512), 1.06x at 2k x 8, level
// at long self-attention and head dim 256: on for every shape.
#ifndef FK_WGMMA_PERSISTENT
#define FK_WGMMA_PERSISTENT 1
#endif
// Clusters of two CTAs along the query tiles at short Nk (buckets 64 and 128, persistent grid, calls
// with Nk <= FK_WGMMA_CLUSTER_KV_MAX_NK and at least two query tiles): each CTA's producer loads half
// of every K/V tile and multicasts it to both, so a pair of adjacent query tiles of one (batch,
// head) reads its K and V from L2 once (text cross-attention re-reads a head's whole K and V per
// 128-row tile). Off (0): measured on the H200 (docs/perf.md, "Short Nk: clusters of two with K/V
// multicast") at 0.86-0.88x the unclustered kernel at Nk 512 and 0.85x at long self-attention;
// correct (GPU tests, memcheck, racecheck) but slower, kept as a switch for other devices.
#ifndef FK_WGMMA_CLUSTER_KV
#define FK_WGMMA_CLUSTER_KV 0
#endif
#ifndef FK_WGMMA_CLUSTER_KV_MAX_NK
#define FK_WGMMA_CLUSTER_KV_MAX_NK 1024
#endif
// 0: the clusters only pair the query tiles (each CTA loads whole K/V tiles itself, nothing shared):
// a control that separates the cluster launch from the multicast.
#ifndef FK_WGMMA_CLUSTER_KV_MULTICAST
#define FK_WGMMA_CLUSTER_KV_MULTICAST 1
#endif
// Bucket 64's head dim 32 runs a kernel whose GEMMs cover 32 columns, fixed at compile time: Q K^T
// in two k16 steps, P V as one n32 wgmma per k16 step (half of the n64 over the padded block), O in
// 16 fp32 registers a thread (FK_WGMMA_NARROW_D64=32; 64: the padded 64 kernel, P V over all 64 columns).
// Head dims 40 and 48 likewise on 48 columns (three k16 steps, n48) with FK_WGMMA_NARROW48_D64=1.
// The narrow kernels wait on no run-time bound, so ptxas adds no warpgroup.arrive fences around
// their wgmmas. They keep Q in shared memory and store O at once (neither of the two changes below).
// Measured on the H200 on top of those changes (docs/perf.md "Narrow kernels and all steps on the
// sources with Q in registers"), bf16, x SDPA-cuDNN: 1.19x at 32 against 1.00x on the padded
// kernel; 0.99x at 40 and 48 against 0.97x / 0.96x (earlier, before those changes: 1.11-1.14x at
// 32, 1.00-1.06x at 40/48).
#ifndef FK_WGMMA_NARROW_D64
#define FK_WGMMA_NARROW_D64 32
#endif
#ifndef FK_WGMMA_NARROW48_D64
#define FK_WGMMA_NARROW48_D64 1
#endif
// Bucket 128's padded head dims likewise: 66..80 on 80 columns (five k16 steps of Q K^T, P V as one
// n80 wgmma a k16 step, O in 40 fp32 registers a thread; FK_WGMMA_NARROW_D128=80) and 81..96 on 96
// (FK_WGMMA_NARROW96_D128=1), where the padded kernel's P V runs all 128 columns; 128 and 0: off.
// Measured on an H100 (docs/perf.md, "What was tried"), bf16, against
// the padded kernel: 1.03x [1.01, 1.05] at head dim 80, level at 72 and 96.
#ifndef FK_WGMMA_NARROW_D128
#define FK_WGMMA_NARROW_D128 80
#endif
#ifndef FK_WGMMA_NARROW96_D128
#define FK_WGMMA_NARROW96_D128 1
#endif
// Short Nk (text cross-attention, Nk 512: 4 K/V tiles per 128-row work item): an item's start and
// end are a large share of its time. Two changes at buckets 64 and 128, on together: measured on
// the H200 (docs/perf.md "Short Nk: Q in registers and late O stores"), bf16, in two runs, 1.04x
// the kernel without them at 1,12,32760,512,128 and 2,40,32760,512,128 (1.02-1.05x / 0.93x
// SDPA-cuDNN, against 0.98-1.01x / 0.89-0.90x) and 1.00-1.03x at 2k x 8, 8k, Flux-class, long
// self-attention and head dim 64. Each alone measured 0.95-0.98x at Nk 512 (ptxas schedules the
// consumer loop differently), so they go together. An L2 prefetch of the next item's Q and Q loads
// from a producer thread of their own measured level (Q's latency is not what costs at Nk 512).
// Q in registers (BN 128): each consumer copies its half of Q from shared memory into wgmma A
// fragments (ldmatrix; 4 registers a k16 step, 32 a thread at D 128) at the item's start and
// releases the buffer at once, so the producer loads the next item's Q as soon as it reaches it
// (after that item's first K/V tile) instead of after this item's last S; S = Q K^T is a
// register-A wgmma.
// (Bucket 64 reads Q from shared memory: its three consumers, below, spill with Q in registers.)
#ifndef FK_WGMMA_Q_REGS_D64
#define FK_WGMMA_Q_REGS_D64 0
#endif
#ifndef FK_WGMMA_Q_REGS_D128
#define FK_WGMMA_Q_REGS_D128 1
#endif
// Late stores: an item's O is packed to 16 bits after its last P V and stored once the next item's
// first S = Q K^T is issued, so the stores run beside that GEMM instead of before it (1); or stored
// before the next item starts (0).
#ifndef FK_WGMMA_LATE_STORE
#define FK_WGMMA_LATE_STORE 1
#endif
// Chained items (buckets 64 and 128 with Q in registers, ping-pong; exact head dims): a kernel whose
// consumers run the block's K/V tiles as one sequence across work items, issuing an item's last
// P V in the same turn as the next item's first S = Q K^T, so an item of n tiles costs n turns,
// not n + 1; the finished item's O is divided and stored in that turn once both GEMMs are done.
// Measured on the H200 (docs/perf.md "Short Nk: chained items with Q in registers"), bf16: 1.02x
// the unchained kernel at Nk 512 (text cross-attention, 4 K/V tiles an item), 0.95-0.99x at Nk
// 2048 and beyond (its inner loop is the unchained kernel's, yet ptxas's code for the kernel runs
// slower there), so the host takes it for calls with Nk up to FK_WGMMA_CHAIN_MAX_NK. The padded
// kernels stay unchained (chained, ptxas spills them). FK_WGMMA_CHAIN=0 builds no chained kernel.
#ifndef FK_WGMMA_CHAIN
#define FK_WGMMA_CHAIN 1
#endif
#ifndef FK_WGMMA_CHAIN_MAX_NK
#define FK_WGMMA_CHAIN_MAX_NK 512
#endif
// Chained kernels: an item's O written to shared memory (the consumer's half of the Q buffer, free
// once Q is in registers) and stored with TMA (1), or stored from registers (0), whose 4-byte
// stores, 16 bytes a row per instruction, cost 15 % of the kernel's time at Nk 512. Measured on the
// H200 (docs/perf.md "Short Nk: O through shared memory with TMA stores"), bf16: 1.14x the register
// stores at 2,40,32760,512,128 and 1,12,32760,512,128.
#ifndef FK_WGMMA_CHAIN_TMA_STORE
#define FK_WGMMA_CHAIN_TMA_STORE 1
#endif
// Unchained exact kernels of buckets 64 and 128 (late stores, Q in registers): the previous
// item's O likewise through the Q buffer with TMA stores, in the next item's first turn, the buffer
// given back once S(0) is done (1), or from registers (0). Measured on the H200 (docs/perf.md
// "O through shared memory at every Nk"), bf16: 1.10x the register stores at 2,40,16380,1024,128,
// 1.07x at 8,16,2048,2048,128, 1.02-1.03x at image and long video self-attention. The padded
// kernels keep the register stores: with TMA stores and the buffer given back inside the loop
// they ran 0.91-0.98x.
#ifndef FK_WGMMA_TMA_STORE
#define FK_WGMMA_TMA_STORE 1
#endif
// Consumer warpgroups at bucket 64: 3 (BM 192, FlashAttention-3's tile at head dim 64; 160
// registers a consumer thread, Q from shared memory; taking turns in rotation), or 2 (BM 128, Q in
// registers with FK_WGMMA_Q_REGS_D64=1). Measured on an H100 (docs/perf.md, "What was tried" and
// "The current defaults' correctness runs"), bf16: three consumers 1.09-1.20x the speed of two at
// head dims 32 and 64 (16k-18k tokens, LTX-Video), level with FlashAttention-4 or ahead where two
// trailed it by 5-12 %.
#ifndef FK_WGMMA_CONSUMERS_D64
#define FK_WGMMA_CONSUMERS_D64 3
#endif
// Consumer warpgroups of bucket 128's narrow kernels (head dims 66..96, KD 80 and 96): 2, or 3
// (BM 192, 160 registers a consumer thread, two K/V stages), where O takes 40 or 48 registers a
// thread instead of 64. Three ran at 0.47-0.61x the speed of two at head dims 72, 80 and 96 on an
// H100 (docs/perf.md, "Ours beside FlashAttention-4, the latest run"). The exact and padded
// bucket-128 kernels keep two.
#ifndef FK_WGMMA_CONSUMERS_NARROW_D128
#define FK_WGMMA_CONSUMERS_NARROW_D128 2
#endif
// KD: the columns a narrow kernel runs (< D), or D (fk_wgmma.h); only the consumer count and what
// follows from it (BM, threads, Q's shared memory, registers) depend on it.
template <int D, int KD = D>
struct WgmmaTile {
    static constexpr int kConsumers = D == 64 ? FK_WGMMA_CONSUMERS_D64
                                      : D == 128 && KD < D ? FK_WGMMA_CONSUMERS_NARROW_D128
                                                           : 2;  // consumer warpgroups
    static constexpr int BM = 64 * kConsumers;           // query rows per block
    static constexpr bool kWide = D > 128;               // buckets 192 and 256
    static constexpr int BN = D == 256 ? FK_WGMMA_BN_D256 : D == 192 ? FK_WGMMA_BN_D192 : FK_WGMMA_BN;  // keys per K/V tile
    // three consumers at bucket 128 (narrow kernels): 48 KiB of Q leave room for two K/V stages
    static constexpr int kStages = D == 64    ? FK_WGMMA_STAGES_D64
                                   : D == 128 ? (kConsumers == 3 ? 2 : FK_WGMMA_STAGES_D128)
                                   : D == 192 ? FK_WGMMA_STAGES_D192
                                              : FK_WGMMA_STAGES_D256;
    static constexpr bool kWidePV = D == 192 || (D == 256 && FK_WGMMA_WIDE_PV_D256);  // one wide P V wgmma
    static constexpr bool kPingPong = D == 192 ? FK_WGMMA_PINGPONG_D192 != 0 : D == 256 ? FK_WGMMA_PINGPONG_D256 != 0 : true;
    static constexpr bool kSplitKV = kWide && FK_WGMMA_WIDE_SPLIT_KV;
    static constexpr bool kEarlyRescale = kWide && FK_WGMMA_WIDE_EARLY_RESCALE;
    static constexpr bool kQRegs = BN == 128 && (D == 64 ? FK_WGMMA_Q_REGS_D64 != 0 : D == 128 ? FK_WGMMA_Q_REGS_D128 != 0 : false);
    static constexpr bool kChain = FK_WGMMA_CHAIN != 0 && kQRegs && kPingPong && !kWide;
    static constexpr bool kLateStore = !kWide && FK_WGMMA_LATE_STORE != 0;  // unchained kernels
    static constexpr int kMinDim = bucket_floor(kWgmmaBuckets, D);  // the smallest head dim of the bucket
    static constexpr int kNarrowKD = D == 64 ? FK_WGMMA_NARROW_D64 : D == 128 ? FK_WGMMA_NARROW_D128 : D;  // < D: a narrow kernel (fk_wgmma.h)
    // a second, for kNarrowKD < d <= 48 (bucket 64) or <= 96 (bucket 128)
    static constexpr int kNarrowKD2 = D == 64 && FK_WGMMA_NARROW48_D64 ? 48 : D == 128 && FK_WGMMA_NARROW96_D128 ? 96 : D;
    static constexpr int kThreads = 128 * (1 + kConsumers);
    static constexpr int kColBlock = 64;                 // elements per 128-byte swizzled row
    static constexpr int kColBlocks = D / kColBlock;
    static constexpr int kQBytes = BM * D * 2;
    static constexpr int kKVBytes = BN * D * 2;          // one K or one V tile
    static constexpr int kQRows = 64;                    // one consumer's half of Q: its own TMA box and barriers
    // Q full/empty per consumer; per stage K/V full, empty (K's alone when split) and, split, V's empty
    static constexpr int kBarrierBytes = 8 * (2 * kConsumers + (kSplitKV ? 4 : 3) * kStages);
    // + 1 KiB: the dynamic shared window is aligned up to the 1 KiB swizzle period in the kernel
    static constexpr int kSmemBytes = 1024 + kQBytes + 2 * kStages * kKVBytes + kBarrierBytes;
    // setmaxnreg: 24*128 + 240*256 <= 64K (two consumers), 24*128 + 160*384 (three)
    static constexpr int kProducerRegs = 24, kConsumerRegs = kConsumers == 2 ? 240 : 160;
    // clusters: the multicast producer spills at 24 (ptxas, CUDA 13.0); 40*128 + 232*256 = 168*384
    static constexpr int kClusterProducerRegs = 40, kClusterConsumerRegs = kConsumers == 2 ? 232 : 152;
    static_assert(kConsumers == 2 || (kConsumers == 3 && (D == 64 || (D == 128 && KD < D))),
                  "wgmma path: three consumers at bucket 64 and bucket 128's narrow kernels only");
    static_assert(D == 64 || D == 128 || D == 192 || D == 256, "wgmma path: buckets 64, 128, 192 and 256");
    static_assert(BN % 16 == 0 && BN >= 64 && (BN <= 128 || (!kWide && (BN == 176 || BN == 192))),
                  "wgmma path: S tiles of n64, n80, n96, n112 or n128 (buckets 64 and 128 also n176, n192)");
    static_assert(kSmemBytes <= 227 * 1024, "wgmma tiles exceed 227 KiB of shared memory");
    static_assert((kNarrowKD == D || (D == 64 && kNarrowKD == 32) || (D == 128 && kNarrowKD == 80)) &&
                      (kNarrowKD2 == D || (D == 64 && kNarrowKD2 == 48) || (D == 128 && kNarrowKD2 == 96)),
                  "wgmma path: narrow kernels are bucket 64's n32 and n48 and bucket 128's n80 and n96");
};

// ---- naive (pre-flash) path ----
struct NaiveTile {
    static constexpr int kThreads = 256;   // 16 x 16 threads, 4 x 4 outputs each
    static constexpr int TM = 64, TN = 64, TK = 16;
    static constexpr int kSoftmaxThreads = 256;
    static constexpr int64_t kWorkspaceBytes = int64_t(4) << 30;  // per chunk of heads/rows
};

// Launch arguments shared by the flash kernels (pointers already typed by the caller).
struct FlashParams {
    const void *q, *k, *v;
    void *o;
    int64_t heads, nq, nk;
    int64_t qs[3], ks[3], vs[3], os[3];
    float scale_log2;   // scale * log2(e): softmax runs in base 2
    int64_t bh0;        // first (batch*heads + head) of this launch
    int32_t d;          // the head dim; the kernel's template D is its bucket (>= d)
    float *lse;         // the log-sum-exp (natural log) per row, or null: one uniform test in the epilogue
    int64_t ls[3];      // its element strides for B, H, N
};

constexpr float kLn2 = 0.6931471805599453f;

// The natural-log log-sum-exp of a row from the online softmax's state: m, the running maximum
// in the base-2 scaled domain, and l, the row's sum of 2^(s * scale * log2 e - m), which is >= 1
// (the maximum's own term): the hardware log2 (relative error ~2^-22) is exact enough.
FK_DEVICE float row_lse(float m, float l) { return (m + __log2f(l)) * kLn2; }

}  // namespace fk

#endif  // FK_TRAITS_H
