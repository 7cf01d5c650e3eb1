// fk_wgmma.h: the Hopper flash kernel (sm_90a, fp16/bf16; head-dim buckets 64, 128, 192, 256).
//
// Warp-specialised, in the manner FlashAttention-3 describes (no code of it is used here):
//  - warpgroup 0 is the producer: it gives back registers (setmaxnreg.dec) and one thread issues
//    TMA bulk tensor copies (cp.async.bulk.tensor) of Q (one 64-row half per consumer) and of K/V
//    tiles into a kStages-deep ring, each copy completing on an mbarrier ("full"); it refills a
//    slot once both consumers have released it ("empty"; in the wide buckets 192 and 256 K and V
//    have one each, so that K(j+2) loads as soon as S(j) is done).
//  - persistent grid (FK_WGMMA_PERSISTENT): one block per SM loops over work items (a query tile
//    of one (batch, head)); the ring runs on across items and a consumer's half of Q is reloaded
//    once it is in registers (buckets 64, 128) or its last S of the item is done, so the next
//    item's loads overlap this one.
//  - warpgroups 1 and 2 (and 3 at bucket 64: FK_WGMMA_CONSUMERS_D64) are consumers of 64
//    query rows each (setmaxnreg.inc): S = Q K^T with wgmma
//    (bucket 128: Q copied into registers at the item's start and its buffer released at
//    once; 64, 192 and 256: Q from shared memory), the online softmax in registers (base 2, log2 e
//    folded into the scale), then O += P V with P straight from the S accumulators as the register
//    A operand of wgmma. Bucket 128 (and 64 with Q in registers) chains a block's items at short Nk (exact head dims): an item's last
//    P V is issued in the same turn as the next item's first S, and after both its O is written into
//    the consumer's half of the Q buffer (the next Q is in registers by then) and stored with TMA;
//    padded head dims there store an item's O from registers once the next item's first S is issued.
//  - ping-pong (buckets 64, 128, 192): the two consumers take turns to issue their GEMMs (two named
//    barriers), so one warpgroup's softmax runs while the other's GEMMs keep the tensor cores busy.
//    Each step issues P(j-1) V(j-1) together with S(j) = Q K(j)^T, so one S register set suffices.
//    At bucket 256, whose GEMMs are long next to the softmax, the consumers issue freely.
// Tensor maps are encoded on the host through the driver entry point that the CUDA runtime hands
// out (cudaGetDriverEntryPointByVersion): no libcuda link, nothing beyond the base runtime.
// Ragged tiles: TMA zero-fills rows past N; scores of keys past nk are set to -inf; rows past nq
// are not stored. Head dims below the bucket D: the tensor maps' dimension 0 is the real head dim d,
// so TMA zero-fills columns d..D-1 of a column block it loads; column blocks wholly past d are
// neither loaded nor read; Q K^T stops after the k16 steps that hold data, P V (wide buckets: one
// n192 or n256 wgmma) after the column blocks that do; columns past d are not stored. Head dim 32
// in bucket 64 can run a narrow kernel (FK_WGMMA_NARROW_D64, off): two k16 steps of Q K^T and an
// n32 P V, fixed at compile time (head dims 40 and 48 another: three k16 steps and an n48 P V).
#ifndef FK_WGMMA_H
#define FK_WGMMA_H

#include "gpu/fk_mma.h"
#include "gpu/fk_traits.h"

#if defined(FK_HAVE_MMA) && defined(FK_WGMMA)
#include <cuda.h>  // CUtensorMap and the encoder's types only: the driver is reached at run time
#include <cudaTypedefs.h>
#define FK_HAVE_WGMMA 1

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FK_WGMMA_DEVICE_OK 1
#include "gpu/fk_wgmma_ops.h"
#endif

namespace fk {
namespace wgmma {

// Where N, H and B sit among a tensor map's dimensions 1..3 (dimension 0 is D): the host orders
// them by stride, so each map is a plain increasing-stride tensor whatever the layout.
struct MapDims {
    int8_t n, h, b;
};
struct MapsDims {
    MapDims q, k, v, o;
};

#if defined(FK_WGMMA_DEVICE_OK)
FK_DEVICE uint32_t smem_u32(const void *p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

FK_DEVICE void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
FK_DEVICE void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
FK_DEVICE void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
FK_DEVICE void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done = 0;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}
FK_DEVICE void tma_load_4d(uint32_t dst, const CUtensorMap *map, uint32_t bar, int c0, int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
        ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar) : "memory");
}
// Clusters of two along the query tiles (FK_WGMMA_CLUSTER_KV): each CTA's producer loads half of
// every K/V tile and multicasts it into both CTAs' shared memory (the same offset, completing on
// the same barrier offset in each), so the pair reads K and V from L2 once.
FK_DEVICE void tma_load_4d_mc(uint32_t dst, const CUtensorMap *map, uint32_t bar, int c0, int c1, int c2, int c3,
                              uint16_t mask) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n"
        ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar), "h"(mask) : "memory");
}
// Every thread of both CTAs: after the barriers' init (before any remote arrive or multicast) and
// before exit (the peer may still arrive on this CTA's barriers).
FK_DEVICE void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// Arrive on the barrier at the same shared offset in CTA `peer` of the cluster.
FK_DEVICE void mbar_arrive_peer(uint32_t bar, uint32_t peer) {
    asm volatile("{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\nmbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra];\n}\n"
                 ::"r"(bar), "r"(peer) : "memory");
}
// O's rows from shared memory to global memory (rows past the map's extent are not written); the
// copy joins this thread's bulk group
FK_DEVICE void tma_store_4d(const CUtensorMap *map, uint32_t src, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n"
                 ::"l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src) : "memory");
}
FK_DEVICE void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
FK_DEVICE void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
FK_DEVICE void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
FK_DEVICE void named_sync(int id, int threads) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory"); }
FK_DEVICE void named_arrive(int id, int threads) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory"); }
FK_DEVICE void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
FK_DEVICE void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> FK_DEVICE void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// Keeps the compiler from moving accumulator reads/writes across an asynchronous wgmma.
template <int R> FK_DEVICE void fence_regs(float (&r)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// An m64 accumulator's rows times their factors: n8 tile t holds rows r (a0) and r + 8 (a1).
template <int R> FK_DEVICE void scale_rows(float (&o)[R], float a0, float a1) {
#pragma unroll
    for (int t = 0; t < R / 4; ++t) {
        o[4 * t] *= a0;
        o[4 * t + 1] *= a0;
        o[4 * t + 2] *= a1;
        o[4 * t + 3] *= a1;
    }
}

// Shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride byte
// offsets (>> 4 each, 14 bits), layout type 1 in bits 62-63. Tiles start on 1 KiB boundaries
// (the swizzle period), so the base offset field stays 0.
FK_DEVICE uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t((lbo & 0x3FFFF) >> 4) << 16) |
           (uint64_t((sbo & 0x3FFFF) >> 4) << 32) | (uint64_t(1) << 62);
}

FK_DEVICE int pick(const MapDims &m, int dim, int n, int h, int b) {
    return m.n == dim ? n : (m.h == dim ? h : b);
}
#endif  // FK_WGMMA_DEVICE_OK

// D: the head-dim bucket. kPad: the head dim p.d is below it (run-time tests skip the padding);
// without it the kernel is compiled for p.d == D alone, with no such test (ptxas injects
// warpgroup.arrive fences around the tested wgmmas; the untested kernel keeps none).
// kPersist: the grid is one block per SM and each block loops over work items i = blockIdx.x,
// blockIdx.x + gridDim.x, ... of `items` (FK_WGMMA_PERSISTENT, fk_traits.h); otherwise the grid is
// (query tiles, (batch, head) pairs from p.bh0) and each block runs the one item it names.
// Item i is query tile i % qtiles of (batch * heads + head) i / qtiles.
// kCl 2 (persistent only): the grid is clusters of two CTAs; an item is a pair of adjacent query
// tiles of one (batch, head), tile 2 (i % pairs) + rank on the CTA of that rank (a last odd tile's
// partner computes on no rows and stores nothing), and K/V tiles are multicast (tma_load_4d_mc):
// a slot is refilled once the consumers of both CTAs have released it.
// KD < D (padded only; bucket 64's KD 32 and 48, bucket 128's 80 and 96, WgmmaTile::kNarrowKD and
// kNarrowKD2): head dims up to KD; Q K^T runs KD / 16 k16 steps and P V one nKD wgmma per k16 step, and O holds KD columns,
// all fixed at compile time. These kernels read Q from shared memory and store O at once (no
// T::kQRegs, no T::kLateStore): the form measured.
// kChain (exact head dims of buckets 64 and 128, WgmmaTile::kChain; the host takes it up to
// FK_WGMMA_CHAIN_MAX_NK keys): the block's items chained, an item's last P V in the same turn as
// the next item's first S.
template <class E, int D, bool kPad, bool kPersist, int kCl, int KD = D, bool kChain = false>
__global__ void __launch_bounds__(WgmmaTile<D, KD>::kThreads, 1)
    flash_wgmma_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                       const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap to, FlashParams p,
                       MapsDims md, int64_t items) {
#if defined(FK_WGMMA_DEVICE_OK)
    using T = WgmmaTile<D, KD>;
    constexpr int BM = T::BM, BN = T::BN, S = T::kStages, CB = T::kColBlocks, QR = T::kQRows;
    constexpr int kRowBytes = 128;  // one swizzled row of a column block
    static_assert(kCl == 1 || (kCl == 2 && kPersist && BN % 2 == 0), "clusters of two: persistent grid");
    constexpr bool kNarrow = KD < D;
    static_assert(!kNarrow || (kPad && ((D == 64 && (KD == 32 || KD == 48)) || (D == 128 && (KD == 80 || KD == 96)))),
                  "wgmma path: narrow kernels are bucket 64's n32 and n48 and bucket 128's n80 and n96");
    static_assert(!kChain || (T::kChain && !kPad && kCl == 1), "wgmma path: chained items are exact-head-dim kernels of buckets 64, 128");
    constexpr bool kQRegs = T::kQRegs && !kNarrow, kLateStore = T::kLateStore && !kNarrow && !kChain;
    // chained: an item's O leaves through the consumer's half of the Q buffer (Q is in registers by
    // then) with TMA stores, the buffer given back to the producer a turn later
    constexpr bool kTmaStore = kChain && FK_WGMMA_CHAIN_TMA_STORE;
    // unchained exact kernels (late stores, Q in registers): the previous item's O likewise, in the
    // next item's first turn, instead of from registers
    constexpr bool kTmaLate = kLateStore && kQRegs && kCl == 1 && !kPad && FK_WGMMA_TMA_STORE;
    constexpr bool kOSmem = kTmaStore || kTmaLate;  // O leaves through the Q buffer
    constexpr int kMc = kCl > 1 && FK_WGMMA_CLUSTER_KV_MULTICAST ? kCl : 1;  // CTAs sharing each K/V tile
    // the late P V wait (fk_traits.h): buckets 64 and 128 and, by their own switch, the wide ones;
    // not in the chained bucket-128 kernel, where ptxas then runs short of registers and
    // serialises its wgmmas (C7512)
    constexpr bool kLateWait = FK_WGMMA_OVERLAP && (D <= 128 ? FK_WGMMA_LATE_PV_WAIT : FK_WGMMA_LATE_PV_WAIT_WIDE) &&
                               !(kChain && D == 128);
    extern __shared__ unsigned char smem_raw[];
    const uint32_t sq = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const uint32_t sk = sq + T::kQBytes;            // stage s: sk + s * kKVBytes
    const uint32_t sv = sk + S * T::kKVBytes;
    const uint32_t q_full = sv + S * T::kKVBytes;   // 8-byte mbarriers; consumer c's Q half: + 8c
    const uint32_t q_empty = q_full + 8 * T::kConsumers;
    const uint32_t k_full = q_empty + 8 * T::kConsumers, v_full = k_full + 8 * S, empty = v_full + 8 * S;
    const uint32_t v_empty = T::kSplitKV ? empty + 8 * S : empty;  // split: V's own; else the slot's

    const int wg = threadIdx.x / 128, lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
    const int qtiles = static_cast<int>((p.nq + BM - 1) / BM);
    const int ptiles = (qtiles + kCl - 1) / kCl;  // items per (batch, head)
    // the CTA's rank in its cluster: clusters are kCl consecutive blocks along x (ctaid, unlike
    // %cluster_ctarank, is rematerialised rather than held in a register)
    const uint32_t rank = kCl > 1 ? blockIdx.x % kCl : 0;
    // this block's first item, the item past its last, and its step (clusters: the cluster's)
    const int64_t first = kPersist ? int64_t(blockIdx.x / kCl) : (p.bh0 + blockIdx.y) * qtiles + blockIdx.x;
    const int64_t last = kPersist ? items : first + 1;
    const int64_t step = kPersist ? int64_t(gridDim.x / kCl) : 1;
    const int nk = static_cast<int>(p.nk);
    const int ntiles = (nk + BN - 1) / BN;
    const int dh = kPad ? p.d : D;           // the head dim (<= D)
    const int cbn = (dh + 63) / 64;          // column blocks holding data (TMA zero-fills the rest of the last)
    const int ksteps = (dh + 15) / 16;       // k16 steps of Q K^T holding data

    if (threadIdx.x == 0) {
        for (int c = 0; c < T::kConsumers; ++c) {
            mbar_init(q_full + 8 * c, 1);
            mbar_init(q_empty + 8 * c, 4);  // lane 0 of each of the consumer's warps
        }
        for (int s = 0; s < S; ++s) {
            mbar_init(k_full + 8 * s, 1);
            mbar_init(v_full + 8 * s, 1);
            mbar_init(empty + 8 * s, 4 * T::kConsumers * kMc);  // lane 0 of every consumer warp (of both CTAs)
            if (T::kSplitKV) mbar_init(v_empty + 8 * s, 4 * T::kConsumers * kMc);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    if constexpr (kCl > 1) cluster_sync();
    else __syncthreads();

    if (wg == 0) {  // ---------------- producer ----------------
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kCl > 1 ? T::kClusterProducerRegs : T::kProducerRegs));
        // Item `item`'s Q (the it-th of this block), each consumer's half once that consumer has
        // released its previous one. A half wholly past nq is not loaded (its rows are computed on
        // stale data and never stored): a plain arrive.
        auto load_q = [&](int it, int64_t item) {
            const int64_t bh = item / ptiles;
            const int b = static_cast<int>(bh / p.heads), h = static_cast<int>(bh % p.heads);
            const int q0 = (static_cast<int>(item % ptiles) * kCl + int(rank)) * BM;
            for (int c = 0; c < T::kConsumers; ++c) {
                if (it > 0) mbar_wait(q_empty + 8 * c, (it - 1) & 1);
                const int r0 = q0 + c * QR;
                if (r0 >= p.nq) {
                    mbar_arrive(q_full + 8 * c);
                    continue;
                }
                mbar_expect_tx(q_full + 8 * c, cbn * QR * kRowBytes);
#pragma unroll
                for (int cb = 0; cb < CB; ++cb)
                    if (cb < cbn)
                        tma_load_4d(sq + cb * BM * kRowBytes + c * QR * kRowBytes, &tq, q_full + 8 * c, cb * 64,
                                    pick(md.q, 1, r0, h, b), pick(md.q, 2, r0, h, b), pick(md.q, 3, r0, h, b));
            }
        };
        if (warp == 0 && lane == 0) {
            int g = 0;  // K/V tiles issued so far: the ring runs on across items
            int it = 0;
            for (int64_t item = first; item < last; item += step, ++it) {
                const int64_t bh = item / ptiles;
                const int b = static_cast<int>(bh / p.heads), h = static_cast<int>(bh % p.heads);
                for (int j = 0; j < ntiles; ++j, ++g) {
                    const int st = g % S;
                    if (g >= S) mbar_wait(empty + 8 * st, ((g / S) - 1) & 1);
                    const int n0 = j * BN;
                    mbar_expect_tx(k_full + 8 * st, cbn * BN * kRowBytes);  // (split: this waited for K's slot alone)
                    // clusters: this CTA's half of the tile's rows (the peer's half arrives on the same
                    // barrier); TMA zero-fills rows past nk, a half wholly past them included
                    constexpr int kHalf = BN / kMc;
                    const int hr = kMc > 1 ? int(rank) * kHalf : 0, nh = n0 + hr;
                    // one K or V tile (this CTA's rows of it, under clusters) into stage st, column block by block
                    auto load_tile = [&](uint32_t base, const CUtensorMap *map, uint32_t full, const MapDims &dims) {
#pragma unroll
                        for (int cb = 0; cb < CB; ++cb)
                            if (cb < cbn) {
                                const uint32_t dst = base + st * T::kKVBytes + cb * BN * kRowBytes + hr * kRowBytes;
                                if constexpr (kMc > 1)
                                    tma_load_4d_mc(dst, map, full, cb * 64, pick(dims, 1, nh, h, b),
                                                   pick(dims, 2, nh, h, b), pick(dims, 3, nh, h, b), 0x3);
                                else
                                    tma_load_4d(dst, map, full, cb * 64, pick(dims, 1, nh, h, b),
                                                pick(dims, 2, nh, h, b), pick(dims, 3, nh, h, b));
                            }
                    };
                    load_tile(sk, &tk, k_full + 8 * st, md.k);
                    if (T::kSplitKV && g >= S) mbar_wait(v_empty + 8 * st, ((g / S) - 1) & 1);
                    mbar_expect_tx(v_full + 8 * st, cbn * BN * kRowBytes);
                    load_tile(sv, &tv, v_full + 8 * st, md.v);
                    // Q after the item's first K/V tile, which may go ahead while a consumer still
                    // reads its half of the previous item's Q
                    if (j == 0) load_q(it, item);
                }
            }
        }
        if constexpr (kCl > 1) cluster_sync();
        return;
    }

    // ---------------- consumers ----------------
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kCl > 1 ? T::kClusterConsumerRegs : T::kConsumerRegs));
    const int c = wg - 1;                     // consumer index: rows 64c .. 64c + 63 of the block
    // named barrier 1 + c (0 is __syncthreads): consumer c's turn, given by the one before it
    const int my_bar = 1 + c, other_bar = T::kConsumers == 2 ? 2 - c : 1 + (c + 1) % T::kConsumers;
    constexpr int kPair = 256;                // the waiting and the giving consumer take part in each
    auto my_turn = [&] { if constexpr (T::kPingPong) named_sync(my_bar, kPair); };
    auto their_turn = [&] { if constexpr (T::kPingPong) named_arrive(other_bar, kPair); };
    const uint32_t sq_wg = sq + c * 64 * kRowBytes;
    const float sl2 = p.scale_log2;

    // k16 steps of Q K^T and n64 column blocks of P V every head dim of this bucket fills: only
    // later ones test the head dim.
    constexpr int kMinSteps = (T::kMinDim + 15) / 16, kMinBlocks = (T::kMinDim + 63) / 64;
    float s[BN / 2];          // S accumulators: n8 tile t holds rows r, r+8 x cols 8t + 2(lane%4) + {0,1}
    float o[KD / 2];          // O accumulators, same layout over the head dim (the narrow kernel: KD columns)
    uint32_t pf[BN / 16][4];  // P as wgmma's register A operand, one k16 step per pair of n8 tiles
    float m0, m1, l0, l1;     // running row maxima (base 2, scaled) and partial sums of rows r, r+8
    // Q in registers (kQRegs): this warp's 16 rows of the consumer's half as wgmma A fragments,
    // one k16 step each (the layout of pf)
    uint32_t qf[kQRegs ? D / 16 : 1][4];
    // Late stores (kLateStore): the finished item's O as 16-bit pairs (rows r, r+8 of n8 tile t:
    // ob[2t], ob[2t + 1]), where they go, and whether they are still to be stored
    uint32_t ob[kLateStore ? KD / 4 : 1];
    uint16_t *ob_p0 = nullptr, *ob_p1 = nullptr;
    bool ob_r0 = false, ob_r1 = false, ob_pending = false;
    int64_t ob_item = 0;  // kTmaLate: the work item the packed O belongs to
    auto issue_s = [&](int st) {  // S = Q K(st)^T over KD / 16 k-steps; both operands K-major
        const uint32_t kb = sk + st * T::kKVBytes;
#pragma unroll
        for (int ks = 0; ks < KD / 16; ++ks) {
            // past the head dim Q and K hold zeros (or, in blocks never loaded, nothing): stop
            if (!kNarrow && ks >= kMinSteps && ks >= ksteps) break;
            const uint32_t off = (ks % 4) * 32;  // k16 step inside a 128-byte row
            const uint64_t da = smem_desc(sq_wg + (ks / 4) * BM * kRowBytes + off, 16, 1024);
            const uint64_t db = smem_desc(kb + (ks / 4) * BN * kRowBytes + off, 16, 1024);
            if constexpr (kQRegs) Ops<E>::rsk_n128(s, qf[ks], db, ks > 0);
            else if constexpr (BN == 192) Ops<E>::ss_n192(s, da, db, ks > 0);
            else if constexpr (BN == 176) Ops<E>::ss_n176(s, da, db, ks > 0);
            else if constexpr (BN == 128) Ops<E>::ss_n128(s, da, db, ks > 0);
            else if constexpr (BN == 112) Ops<E>::ss_n112(s, da, db, ks > 0);
            else if constexpr (BN == 96) Ops<E>::ss_n96(s, da, db, ks > 0);
            else if constexpr (BN == 80) Ops<E>::ss_n80(s, da, db, ks > 0);
            else Ops<E>::ss_n64(s, da, db, ks > 0);
        }
    };
    auto issue_pv = [&](int st) {  // O += P V(st): V row-major = N-major B; LBO = next 64 columns, SBO = next 8 keys
        const uint32_t vb = sv + st * T::kKVBytes;
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            const uint64_t db = smem_desc(vb + kk * 16 * kRowBytes, BN * kRowBytes, 8 * kRowBytes);
            if constexpr (kNarrow) {  // columns 0..KD-1: the start of each 128-byte row (bucket 128: and of the next block's, LBO)
                if constexpr (KD == 32) Ops<E>::rs_n32(o, pf[kk], db);
                else if constexpr (KD == 48) Ops<E>::rs_n48(o, pf[kk], db);
                else if constexpr (KD == 80) Ops<E>::rs_n80(o, pf[kk], db);
                else Ops<E>::rs_n96(o, pf[kk], db);
            } else if constexpr (D == 128) {
                Ops<E>::rs_n128(o, pf[kk], db);
            } else if constexpr (D == 64) {
                Ops<E>::rs_n64(o, pf[kk], db);
            } else if constexpr (T::kWidePV) {
                // one wide wgmma over the column blocks of O that hold data: its accumulator is the
                // n64 ones side by side, so o[] keeps its layout
                if (D == 192 || (kMinBlocks < 4 && cbn < 4))
                    Ops<E>::rs_n192(*reinterpret_cast<float(*)[96]>(&o[0]), pf[kk], db);
                else
                    Ops<E>::rs_n256(*reinterpret_cast<float(*)[128]>(&o[0]), pf[kk], db);
            } else {  // one n64 wgmma per column block of O that holds data
#pragma unroll
                for (int cb = 0; cb < CB; ++cb) {
                    if (cb >= kMinBlocks && cb >= cbn) break;
                    const uint64_t dbc = smem_desc(vb + cb * BN * kRowBytes + kk * 16 * kRowBytes, BN * kRowBytes,
                                                   8 * kRowBytes);
                    Ops<E>::rs_n64(*reinterpret_cast<float(*)[32]>(&o[32 * cb]), pf[kk], dbc);
                }
            }
        }
    };
    // Softmax in two halves, so that the first can run while this warpgroup's P V is in flight:
    // probs() turns S(j) into unnormalised probabilities in place (fp32) and returns the rescale
    // factors; finish() packs them as P and rescales O (which needs the previous P V done).
    auto probs = [&](int j, float &a0, float &a1) {
        const int n0 = j * BN;
        if (n0 + BN > nk) {  // ragged last tile: keys past nk get no weight
            const int t2 = 2 * (lane % 4);
#pragma unroll
            for (int t = 0; t < BN / 8; ++t) {
                const int col = n0 + t * 8 + t2;
                if (col >= nk) s[4 * t] = s[4 * t + 2] = -INFINITY;
                if (col + 1 >= nk) s[4 * t + 1] = s[4 * t + 3] = -INFINITY;
            }
        }
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int t = 0; t < BN / 8; ++t) {
            mx0 = fmaxf(mx0, fmaxf(s[4 * t], s[4 * t + 1]));
            mx1 = fmaxf(mx1, fmaxf(s[4 * t + 2], s[4 * t + 3]));
        }
        mx0 = fmaxf(mx0, fk_shfl_xor(mx0, 1));
        mx0 = fmaxf(mx0, fk_shfl_xor(mx0, 2));
        mx1 = fmaxf(mx1, fk_shfl_xor(mx1, 1));
        mx1 = fmaxf(mx1, fk_shfl_xor(mx1, 2));
        const float mn0 = fmaxf(m0, mx0 * sl2), mn1 = fmaxf(m1, mx1 * sl2);  // finite: >= 1 valid key per tile
        a0 = mma::ex2(m0 - mn0);
        a1 = mma::ex2(m1 - mn1);
        m0 = mn0;
        m1 = mn1;
        float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
        for (int t = 0; t < BN / 8; ++t) {
            s[4 * t] = mma::ex2(fmaf(s[4 * t], sl2, -mn0));
            s[4 * t + 1] = mma::ex2(fmaf(s[4 * t + 1], sl2, -mn0));
            s[4 * t + 2] = mma::ex2(fmaf(s[4 * t + 2], sl2, -mn1));
            s[4 * t + 3] = mma::ex2(fmaf(s[4 * t + 3], sl2, -mn1));
            sum0 += s[4 * t] + s[4 * t + 1];
            sum1 += s[4 * t + 2] + s[4 * t + 3];
        }
        l0 = l0 * a0 + sum0;  // per-thread partial; the quad's four are summed at the end
        l1 = l1 * a1 + sum1;
    };
    auto rescale = [&](float a0, float a1) { scale_rows(o, a0, a1); };
    // Early rescale (wide buckets): O is multiplied by P(j-1)'s factors after S(j) is issued (the
    // registers of O are not S's), then fenced again before P(j-1) V(j-1) reads them.
    float ra0 = 1.0f, ra1 = 1.0f;
    auto finish = [&](float a0, float a1) {
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            pf[kk][0] = mma::Ptx<E>::pack(s[8 * kk], s[8 * kk + 1]);      // row r,   keys 16kk + 2(lane%4) + {0,1}
            pf[kk][1] = mma::Ptx<E>::pack(s[8 * kk + 2], s[8 * kk + 3]);  // row r+8, same keys
            pf[kk][2] = mma::Ptx<E>::pack(s[8 * kk + 4], s[8 * kk + 5]);  // row r,   keys + 8
            pf[kk][3] = mma::Ptx<E>::pack(s[8 * kk + 6], s[8 * kk + 7]);  // row r+8, keys + 8
        }
        if constexpr (T::kEarlyRescale) {
            ra0 = a0;
            ra1 = a1;
        } else {
            rescale(a0, a1);
        }
    };
    auto early_rescale = [&] {  // between S(j)'s issue and P(j-1) V(j-1)'s
        if constexpr (T::kEarlyRescale) {
            fence_regs(o);
            rescale(ra0, ra1);
            wg_fence();
        }
    };
    auto arrive = [&](uint32_t bar) {  // this warp has finished reading a slot (clusters: tell both CTAs)
        __syncwarp();
        if (lane == 0) mbar_arrive(bar);
        if constexpr (kMc > 1)
            if (lane == 1) mbar_arrive_peer(bar, (blockIdx.x % kCl) ^ 1u);
    };
    auto release_k = [&](int st) { if constexpr (T::kSplitKV) arrive(empty + 8 * st); };  // after S(j)
    auto release_v = [&](int st) { arrive(v_empty + 8 * st); };  // after P V; unsplit: K and V together
    auto release_q = [&] {  // this warp's last S of the item is done: its half of Q may be reloaded
        __syncwarp();
        if (lane == 0) mbar_arrive(q_empty + 8 * c);
    };
    // Q in registers: lane l gives the address of row l % 8 of 8 x 8 matrix l / 8 (rows + 8 for
    // matrices 1 and 3, columns + 8 for 2 and 3), so ldmatrix.x4 returns the A fragment; the
    // 128-byte swizzle moves 16-byte chunk k of row r to k ^ (r % 8).
    auto load_q_regs = [&](bool give_back = true) {
        if constexpr (kQRegs) {
            const int row = 16 * warp + lane % 8 + ((lane / 8) & 1) * 8;
#pragma unroll
            for (int ks = 0; ks < D / 16; ++ks) {
                if (ks >= kMinSteps && ks >= ksteps) break;
                const int chunk = (ks % 4) * 2 + lane / 16;
                const uint32_t addr = sq_wg + (ks / 4) * BM * kRowBytes + row * kRowBytes + ((chunk ^ (row % 8)) * 16);
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                             : "=r"(qf[ks][0]), "=r"(qf[ks][1]), "=r"(qf[ks][2]), "=r"(qf[ks][3])
                             : "r"(addr) : "memory");
            }
            // the copy engine overwrites the buffer next (async proxy after these generic reads)
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            if (give_back) release_q();
        }
    };
    auto release_q_last = [&] { if constexpr (!kQRegs) release_q(); };  // after the item's last S
    // Late wait (kLateWait): a turn ends with the exponentials of S(j); the wait for P(j-1) V(j-1),
    // the release of its V and the packing of P(j) (pa0, pa1: its rescale factors) open the next
    // block of code (the top of the loop, or the code after it), where ptxas's scheduler, which
    // keeps the wait within its block, cannot move it above the exponentials. `prev`: the V slot
    // of a P V still to be released, or -1.
    float pa0 = 1.0f, pa1 = 1.0f;
    auto settle = [&](int prev) {
        if constexpr (kLateWait) {
            wg_wait<0>();
            fence_regs(o);
            if (prev >= 0) release_v(prev);
            finish(pa0, pa1);
        }
    };
    auto done = [&](float a0, float a1) {  // S(j)'s exponentials are in s: pack now, or keep for settle()
        if constexpr (kLateWait) {
            pa0 = a0;
            pa1 = a1;
        } else {
            finish(a0, a1);
        }
    };
    // kOSmem: O written into this consumer's half of the Q buffer (the 128-byte swizzle TMA reads:
    // rows ra, ra + 8 of a store share a swizzle phase, and the eight rows of a warp's store fall in
    // eight different 16-byte chunks), then stored by one thread with TMA; release_o() gives the
    // buffer back once the copy engine has read it.
    bool o_held = false;
    auto put_o = [&](int t, uint32_t va, uint32_t vb) {  // n8 tile t of rows ra, ra + 8
        const int ra = 16 * warp + lane / 4;
        const uint32_t at = sq_wg + ra * kRowBytes + (lane % 4) * 4 + (t / 8) * BM * kRowBytes + (((t % 8) ^ (ra % 8)) * 16);
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(at), "r"(va) : "memory");
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(at + 8 * kRowBytes), "r"(vb) : "memory");
    };
    auto send_o = [&](int64_t item) {
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the copy engine reads next
        named_sync(3 + c, 128);                                          // this consumer's four warps
        if (warp == 0 && lane == 0) {
            const int64_t bh = item / ptiles;
            const int b = static_cast<int>(bh / p.heads), h = static_cast<int>(bh % p.heads);
            const int r0 = static_cast<int>(item % ptiles) * BM + 64 * c;
            if (r0 < p.nq) {  // rows past nq (and columns past the head dim) are clipped by the map
#pragma unroll
                for (int cb = 0; cb < CB; ++cb)
                    if (cb < cbn)
                        tma_store_4d(&to, sq_wg + cb * BM * kRowBytes, cb * 64, pick(md.o, 1, r0, h, b),
                                     pick(md.o, 2, r0, h, b), pick(md.o, 3, r0, h, b));
            }
            bulk_commit();
        }
        o_held = true;
    };
    auto release_o = [&] {  // the buffer read by the copy engine: the producer may load the next Q
        if constexpr (kOSmem) {
            if (warp == 0 && lane == 0) bulk_wait_read();
            release_q();
            o_held = false;
        }
    };
    auto store_o = [&] {  // the late stores of the previous item's O
        if constexpr (kTmaLate) {
#pragma unroll
            for (int t = 0; t < KD / 8; ++t) put_o(t, ob[2 * t], ob[2 * t + 1]);
            send_o(ob_item);
            ob_pending = false;
        } else if constexpr (kLateStore) {
            const int col = 2 * (lane % 4);
#pragma unroll
            for (int t = 0; t < KD / 8; ++t) {
                if (t * 8 >= dh) break;  // padding columns
                if (ob_r0) *reinterpret_cast<uint32_t *>(ob_p0 + t * 8 + col) = ob[2 * t];
                if (ob_r1) *reinterpret_cast<uint32_t *>(ob_p1 + t * 8 + col) = ob[2 * t + 1];
            }
            ob_pending = false;
        }
    };

    // 1 / the row sums of rows r, r + 8, from this thread's partials sl0, sl1 (a quad holds a row);
    // sl0, sl1 become the rows' sums
    auto inverse_sums = [&](float &sl0, float &sl1, float &i0, float &i1) {
        sl0 += fk_shfl_xor(sl0, 1);
        sl0 += fk_shfl_xor(sl0, 2);
        sl1 += fk_shfl_xor(sl1, 1);
        sl1 += fk_shfl_xor(sl1, 2);
        i0 = 1.0f / sl0;
        i1 = 1.0f / sl1;
    };
    // The log-sum-exp of rows r0, r0 + 8 of (b, h) from their maxima and sums, where it is asked
    // for (one uniform test: the default call skips it)
    auto put_lse = [&](int b, int h, int64_t r0, float sm0, float sm1, float sl0, float sl1) {
        if (p.lse != nullptr && lane % 4 == 0) {
            float *lse = p.lse + int64_t(b) * p.ls[0] + int64_t(h) * p.ls[1];
            if (r0 < p.nq) lse[r0 * p.ls[2]] = row_lse(sm0, sl0);
            if (r0 + 8 < p.nq) lse[(r0 + 8) * p.ls[2]] = row_lse(sm1, sl1);
        }
    };
    // n8 tile t of the finished O, rows r and r + 8 divided by their sums, as 16-bit pairs (the
    // direct stores below pack inside their row tests, the code as measured)
    auto packed_o = [&](int t, float i0, float i1, uint32_t &va, uint32_t &vb) {
        va = mma::Ptx<E>::pack(o[4 * t] * i0, o[4 * t + 1] * i0);
        vb = mma::Ptx<E>::pack(o[4 * t + 2] * i1, o[4 * t + 3] * i1);
    };

    // The item's O (all its P V done) divided by the row sums sl0, sl1 (this thread's partials) and
    // stored, or, with late stores, packed for store_o() beside the next GEMM.
    auto end_item = [&](int64_t item, float sl0, float sl1, float sm0, float sm1) {
        float i0, i1;
        inverse_sums(sl0, sl1, i0, i1);
        const int64_t bh = item / ptiles;
        const int b = static_cast<int>(bh / p.heads), h = static_cast<int>(bh % p.heads);
        const int q0 = (static_cast<int>(item % ptiles) * kCl + int(rank)) * BM;
        uint16_t *out = static_cast<uint16_t *>(p.o) + int64_t(b) * p.os[0] + int64_t(h) * p.os[1];
        const int64_t r0 = int64_t(q0) + 64 * c + 16 * warp + lane / 4, r1 = r0 + 8;
        put_lse(b, h, r0, sm0, sm1, sl0, sl1);
        if constexpr (kLateStore) {
#pragma unroll
            for (int t = 0; t < KD / 8; ++t) packed_o(t, i0, i1, ob[2 * t], ob[2 * t + 1]);
            if constexpr (kTmaLate) {
                ob_item = item;
            } else {
                ob_p0 = out + r0 * p.os[2];
                ob_p1 = out + r1 * p.os[2];
                ob_r0 = r0 < p.nq;
                ob_r1 = r1 < p.nq;
            }
            ob_pending = true;
        } else {
            const int col = 2 * (lane % 4);
#pragma unroll
            for (int t = 0; t < KD / 8; ++t) {
                if (t * 8 >= dh) break;  // padding columns
                if (r0 < p.nq)
                    *reinterpret_cast<uint32_t *>(out + r0 * p.os[2] + t * 8 + col) = mma::Ptx<E>::pack(o[4 * t] * i0, o[4 * t + 1] * i0);
                if (r1 < p.nq)
                    *reinterpret_cast<uint32_t *>(out + r1 * p.os[2] + t * 8 + col) = mma::Ptx<E>::pack(o[4 * t + 2] * i1, o[4 * t + 3] * i1);
            }
        }
    };

    // kTmaStore (chained): the item's O divided, packed and sent through the Q buffer (put_o, send_o)
    auto end_item_tma = [&](int64_t item, float sl0, float sl1, float sm0, float sm1) {
        if constexpr (kTmaStore) {
            float i0, i1;
            inverse_sums(sl0, sl1, i0, i1);
            if (p.lse != nullptr) {
                const int64_t bh = item / ptiles;
                put_lse(static_cast<int>(bh / p.heads), static_cast<int>(bh % p.heads),
                        int64_t(item % ptiles) * BM + 64 * c + 16 * warp + lane / 4, sm0, sm1, sl0, sl1);
            }
#pragma unroll
            for (int t = 0; t < KD / 8; ++t) {
                uint32_t va, vb;
                packed_o(t, i0, i1, va, vb);
                put_o(t, va, vb);
            }
            send_o(item);
        }
    };

    // With ping-pong the consumers take turns (named barriers my_bar / other_bar) without a break
    // between items: both run the same number of turns per item (ntiles + 1; chained, ntiles and
    // one more at the block's end), so the alternation carries over.
    if (T::kPingPong && c == T::kConsumers - 1) named_arrive(1, kPair);  // consumer 0 takes the first turn
    if constexpr (kChain) {
        // Chained items: the block's K/V tiles are one sequence across its items. The block's first
        // turn issues S(0) alone; inside an item each turn issues S(j) with P(j-1) V(j-1) (the loop
        // of the unchained kernel); between items one turn issues the next item's S(0) with this
        // item's last P V, and the finished O is divided and stored once both are done, while the
        // other consumer's GEMMs run; the block's last item ends with its last P V alone. Every
        // wait is unconditional (a wait chosen at run time makes ptxas serialise every wgmma:
        // C7514), and the inner loop stays as compact as the unchained kernel's.
        if (first < last) {
#pragma unroll
            for (int i = 0; i < KD / 2; ++i) o[i] = 0.0f;
            m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
            mbar_wait(q_full + 8 * c, 0);
            load_q_regs();
            {
                mbar_wait(k_full, 0);
                my_turn();
                fence_regs(s);
                wg_fence();
                issue_s(0);
                wg_commit();
                their_turn();
                wg_wait<0>();
                fence_regs(s);
                release_k(0);
                float a0, a1;
                probs(0, a0, a1);
                done(a0, a1);
            }
            int g0 = 0;  // ring position of the item's first K/V tile
            int it = 0;
            for (int64_t item = first;; ++it) {
                for (int j = 1; j < ntiles; ++j) {
                    const int g = g0 + j;
                    const int st = g % S, pst = (g - 1) % S;
                    settle(j > 1 ? (g - 2) % S : -1);
                    mbar_wait(k_full + 8 * st, (g / S) & 1);
                    mbar_wait(v_full + 8 * pst, ((g - 1) / S) & 1);
                    my_turn();
                    fence_regs(s);
                    fence_regs(o);
                    wg_fence();
                    issue_s(st);
                    wg_commit();
                    issue_pv(pst);
                    wg_commit();
                    their_turn();
                    if constexpr (kTmaStore)
                        if (j == 1 && o_held) release_o();  // the previous item's O has been read
                    wg_wait<1>();
                    fence_regs(s);
                    release_k(st);
                    float a0, a1;
                    probs(j, a0, a1);
                    if constexpr (!kLateWait) {
                        wg_wait<0>();
                        fence_regs(o);
                        release_v(pst);
                    }
                    done(a0, a1);
                }
                settle(ntiles > 1 ? (g0 + ntiles - 2) % S : -1);
                const int pst = (g0 + ntiles - 1) % S, pph = ((g0 + ntiles - 1) / S) & 1;  // the last tile
                if (item + step >= last) {  // the block's last item: its last P V alone
                    mbar_wait(v_full + 8 * pst, pph);
                    my_turn();
                    fence_regs(o);
                    wg_fence();
                    issue_pv(pst);
                    wg_commit();
                    their_turn();
                    wg_wait<0>();
                    fence_regs(o);
                    release_v(pst);
                    end_item(item, l0, l1, m0, m1);
                    break;
                }
                // the next item's S(0) with this one's last P V (its last S is done: Q's registers are free)
                g0 += ntiles;
                const int st = g0 % S;
                mbar_wait(q_full + 8 * c, (it + 1) & 1);
                load_q_regs(!kTmaStore);  // kTmaStore: the buffer holds this item's O next
                mbar_wait(k_full + 8 * st, (g0 / S) & 1);
                mbar_wait(v_full + 8 * pst, pph);
                my_turn();
                fence_regs(s);
                fence_regs(o);
                wg_fence();
                issue_s(st);
                wg_commit();
                issue_pv(pst);
                wg_commit();
                their_turn();
                const float sl0 = l0, sl1 = l1, sm0 = m0, sm1 = m1;
                m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
                wg_wait<1>();
                fence_regs(s);
                release_k(st);
                float a0, a1;
                probs(0, a0, a1);
                wg_wait<0>();
                fence_regs(o);
                release_v(pst);
                if constexpr (kTmaStore) {
                    end_item_tma(item, sl0, sl1, sm0, sm1);
                    if (ntiles == 1) release_o();  // no later turn in this item to do it
                } else {
                    end_item(item, sl0, sl1, sm0, sm1);
                }
#pragma unroll
                for (int i = 0; i < KD / 2; ++i) o[i] = 0.0f;
                done(a0, a1);
                item += step;
            }
        }
    } else {
        int g0 = 0;  // ring position of the item's first K/V tile
        int it = 0;
        for (int64_t item = first; item < last; item += step, ++it, g0 += ntiles) {
#pragma unroll
            for (int i = 0; i < KD / 2; ++i) o[i] = 0.0f;
            m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
            mbar_wait(q_full + 8 * c, it & 1);
            load_q_regs(!(kTmaLate && ob_pending));  // kTmaLate: the buffer holds the previous O next

            // Tile 0: S(0) alone.
            {
                const int st = g0 % S;
                mbar_wait(k_full + 8 * st, (g0 / S) & 1);
                my_turn();
                fence_regs(s);
                wg_fence();
                issue_s(st);
                wg_commit();
                their_turn();
                if constexpr (kLateStore)
                    if (ob_pending) store_o();  // the previous item's O, beside this S
                wg_wait<0>();
                fence_regs(s);
                release_k(st);
                if (ntiles == 1) release_q_last();
                float a0, a1;
                probs(0, a0, a1);
                done(a0, a1);
                if constexpr (kTmaLate)
                    if (o_held) release_o();  // the previous item's O has been read (S(0) took longer)
            }

            for (int j = 1; j < ntiles; ++j) {
                const int g = g0 + j;
                const int st = g % S, pst = (g - 1) % S;
                settle(j > 1 ? (g - 2) % S : -1);
                mbar_wait(k_full + 8 * st, (g / S) & 1);
                if (!T::kSplitKV) mbar_wait(v_full + 8 * pst, ((g - 1) / S) & 1);
                my_turn();
                fence_regs(s);
                fence_regs(o);
                wg_fence();
                issue_s(st);
                float a0, a1;
#if FK_WGMMA_OVERLAP
                // S(j) and P(j-1) V(j-1) in two groups: the exponentials of S(j) run while P V is in flight.
                wg_commit();
                if (T::kSplitKV) mbar_wait(v_full + 8 * pst, ((g - 1) / S) & 1);
                early_rescale();
                issue_pv(pst);
                wg_commit();
                their_turn();
                wg_wait<1>();
                fence_regs(s);
                release_k(st);
                if (j == ntiles - 1) release_q_last();
                probs(j, a0, a1);
                if constexpr (kLateWait) {
                    done(a0, a1);
                    continue;
                }
                wg_wait<0>();
                fence_regs(o);
#else
                if (T::kSplitKV) mbar_wait(v_full + 8 * pst, ((g - 1) / S) & 1);
                early_rescale();
                issue_pv(pst);
                wg_commit();
                their_turn();
                wg_wait<0>();
                fence_regs(s);
                fence_regs(o);
                release_k(st);
                if (j == ntiles - 1) release_q_last();
                probs(j, a0, a1);
#endif
                release_v(pst);
                finish(a0, a1);
            }

            // Last P V.
            {
                settle(ntiles > 1 ? (g0 + ntiles - 2) % S : -1);
                const int g = g0 + ntiles - 1;
                const int pst = g % S;
                mbar_wait(v_full + 8 * pst, (g / S) & 1);
                my_turn();
                fence_regs(o);
                if constexpr (T::kEarlyRescale) rescale(ra0, ra1);
                wg_fence();
                issue_pv(pst);
                wg_commit();
                their_turn();
                wg_wait<0>();
                fence_regs(o);
                release_v(pst);
            }

            end_item(item, l0, l1, m0, m1);
        }
    }
    if constexpr (kLateStore)
        if (ob_pending) store_o();  // the block's last item
    if constexpr (kOSmem)
        if (warp == 0 && lane == 0) bulk_wait();  // every O stored before the block ends
    if (T::kPingPong && c == 0) named_sync(my_bar, kPair);  // the last consumer's last arrive: leave no barrier half-used
    if constexpr (kCl > 1) cluster_sync();
#else
    __trap();  // the sm_80 pass of an sm_90a build: never launched (the host checks the cubin)
#endif
}

// ---------------- host side ----------------

// The driver's tensor-map encoder, looked up once through the runtime (null if the driver lacks it).
inline PFN_cuTensorMapEncodeTiled_v12000 encoder() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void *f = nullptr;
        cudaDriverEntryPointQueryResult q{};
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            f = nullptr;
        (void)cudaGetLastError();
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
    }();
    return fn;
}

// A 4-D map (D, then N/H/B ordered by stride) over one tensor, box = 64 columns x `rows` rows of one
// (b, h). Returns false where TMA cannot address the tensor (the caller then takes the mma path).
inline bool encode(CUtensorMap *map, MapDims *dims, int32_t dtype, const void *ptr, int64_t batch, int64_t heads,
                   int64_t n, int64_t d, const int64_t (&strides)[3], int rows) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = encoder();
    if (enc == nullptr) return false;
    const int64_t size[3] = {batch, heads, n};  // B, H, N
    int64_t bytes[3];
    int64_t extent = d * 2;
    for (int i = 0; i < 3; ++i) {
        bytes[i] = strides[i] * 2;
        if (size[i] > 1 && bytes[i] * size[i] > extent) extent = bytes[i] * size[i];
    }
    for (int i = 0; i < 3; ++i)  // a dimension of size 1 is never stepped: give it the outermost stride
        if (size[i] == 1) bytes[i] = (extent + 15) / 16 * 16;
    int order[3] = {2, 1, 0};    // N, H, B: sort by stride (stable)
    for (int i = 1; i < 3; ++i)
        for (int k = i; k > 0 && bytes[order[k]] < bytes[order[k - 1]]; --k) {
            const int t = order[k];
            order[k] = order[k - 1];
            order[k - 1] = t;
        }
    cuuint64_t gdim[4] = {cuuint64_t(d), 0, 0, 0};
    cuuint64_t gstride[3];
    for (int i = 0; i < 3; ++i) {
        const int which = order[i];
        gdim[i + 1] = cuuint64_t(size[which]);
        gstride[i] = cuuint64_t(bytes[which]);
        if (bytes[which] % 16 != 0 || bytes[which] >= (int64_t(1) << 40) || size[which] > INT32_MAX) return false;
        if (which == 2) dims->n = int8_t(i + 1);
        if (which == 1) dims->h = int8_t(i + 1);
        if (which == 0) dims->b = int8_t(i + 1);
    }
    cuuint32_t box[4] = {64, 1, 1, 1};  // N's dimension carries the rows: shared memory gets them in order
    box[dims->n] = cuuint32_t(rows);
    const cuuint32_t estride[4] = {1, 1, 1, 1};
    const CUresult r = enc(map, dtype == FK_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                           4, const_cast<void *>(ptr), gdim, gstride, box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE,
                           CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS;
}

// encode() through a small per-thread cache of the last maps encoded. A map is a function of
// encode()'s arguments alone, so a call on the tensors of a recent call (a loop over the same
// buffers, or a caching allocator handing the same blocks back) copies 128 bytes instead of
// asking the driver: the encoder costs host time on every call that a short kernel does not hide.
struct MapKey {
    const void *ptr;
    int64_t batch, heads, n, d, strides[3];
    int32_t dtype, rows, dev;

    bool operator==(const MapKey &o) const {
        return ptr == o.ptr && batch == o.batch && heads == o.heads && n == o.n && d == o.d && strides[0] == o.strides[0] &&
               strides[1] == o.strides[1] && strides[2] == o.strides[2] && dtype == o.dtype && rows == o.rows && dev == o.dev;
    }
};

struct CachedMap {
    CUtensorMap map;
    MapKey key;
    MapDims dims;
    bool used;
};

constexpr int kMapCacheSize = 12;  // q, k, v and o of a self- and a cross-attention call, and spare

inline bool encode_cached(CUtensorMap *map, MapDims *dims, int dev, int32_t dtype, const void *ptr, int64_t batch,
                          int64_t heads, int64_t n, int64_t d, const int64_t (&strides)[3], int rows) {
    static thread_local CachedMap cache[kMapCacheSize];
    static thread_local unsigned next = 0;
    const MapKey key{ptr, batch, heads, n, d, {strides[0], strides[1], strides[2]}, dtype, rows, dev};
    for (const CachedMap &c : cache)
        if (c.used && c.key == key) {
            *map = c.map;
            *dims = c.dims;
            return true;
        }
    if (!encode(map, dims, dtype, ptr, batch, heads, n, d, strides, rows)) return false;  // not cached: rare
    CachedMap &slot = cache[next++ % kMapCacheSize];
    slot.map = *map;
    slot.key = key;
    slot.dims = *dims;
    slot.used = true;
    return true;
}

}  // namespace wgmma
}  // namespace fk

#endif  // FK_HAVE_MMA && FK_WGMMA
#endif  // FK_WGMMA_H
