// fk_gpu.hip: the C ABI of flash_kernel.h for GPU targets (HIP dialect; nvcc compiles it through
// gpu/fk_hip_compat.h). One translation unit: host dispatch here, kernels in gpu/*.h.
//
// Paths: fp8 (precision FK_PRECISION_FP8: sm_90a builds on a cc 9.0 device, head dims up to 128,
// gpu/fk_fp8.h), wgmma (sm_90a builds (-DFK_WGMMA) on a cc 9.0 device, fp16/bf16), mma_sync (NVIDIA
// sm_80+, fp16/bf16), generic (fp32, and every case on AMD or under -DFK_FORCE_GENERIC), naive
// (fk_naive_forward). Every path runs every head dim 32..256 in steps of 8, each on the kernel of
// its head-dim bucket (fk_traits.h).
#include "gpu/fk_hip_compat.h"

#include "fk_common.h"
#include "gpu/fk_generic.h"
#include "gpu/fk_mma.h"
#include "gpu/fk_naive.h"
#include "gpu/fk_traits.h"
#include "gpu/fk_wgmma.h"
#include "gpu/fk_fp8.h"

#include <algorithm>
#include <atomic>
#include <cstdio>

namespace {

constexpr int64_t kMaxGridY = 65535;  // grid.y/z limit on both vendors

#define FK_STR2(x) #x
#define FK_STR(x) FK_STR2(x)

// Every launch is followed by this: the runtime's own message goes into fk_last_error.
int32_t check_launch(const char *what) {
    hipError_t e = hipGetLastError();
    if (e != hipSuccess) return fk::fail(FK_ERR_LAUNCH, "%s launch failed: %s", what, hipGetErrorString(e));
    return FK_OK;
}

fk::FlashParams flash_params(const fk_attention_args *a, const fk::Validated &v) {
    fk::FlashParams p{};
    p.q = a->q;
    p.k = a->k;
    p.v = a->v;
    p.o = a->o;
    p.heads = a->heads;
    p.nq = a->nq;
    p.nk = a->nk;
    for (int i = 0; i < 3; ++i) {
        p.qs[i] = a->q_stride[i];
        p.ks[i] = a->k_stride[i];
        p.vs[i] = a->v_stride[i];
        p.os[i] = a->o_stride[i];
    }
    p.scale_log2 = v.scale * fk::kLog2e;
    p.d = static_cast<int32_t>(a->head_dim);
    p.lse = a->lse;
    for (int i = 0; i < 3; ++i) p.ls[i] = a->lse_stride[i];
    return p;
}

// Launches `kernel` over (query tiles, heads) in slices of at most 65535 (b, h) pairs.
template <class Kernel>
int32_t launch_flash(Kernel kernel, fk::FlashParams p, int64_t bm, int threads, size_t smem, hipStream_t s,
                     int64_t bh_total, const char *what) {
    const int64_t qtiles = (p.nq + bm - 1) / bm;
    if (qtiles > INT32_MAX) return fk::fail(FK_ERR_SIZE, "nq %lld needs more than 2^31-1 blocks", (long long)p.nq);
    for (int64_t bh0 = 0; bh0 < bh_total; bh0 += kMaxGridY) {
        p.bh0 = bh0;
        const int64_t n = bh_total - bh0 < kMaxGridY ? bh_total - bh0 : kMaxGridY;
        dim3 grid(static_cast<unsigned>(qtiles), static_cast<unsigned>(n), 1);
        kernel<<<grid, threads, smem, s>>>(p);
        if (int32_t st = check_launch(what)) return st;
    }
    return FK_OK;
}

#if defined(FK_HAVE_MMA)
// The device this thread launches on (-1 if the runtime cannot say).
int current_device() {
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return dev;
}

// Dynamic shared memory past 48 KiB must be opted into per device and kernel. The setting stays
// with the kernel in the device's context, so it is made once: a driver call on every launch costs
// host time that a short kernel does not hide. `opted` holds one bit per device (devices past 63, or
// unknown, opt in on every call); forget_opt_in clears it after a failed launch, so a context that
// was reset gets the opt-in again.
inline uint64_t device_bit(int dev) { return dev >= 0 && dev < 64 ? uint64_t(1) << dev : 0; }

template <class Kernel>
int32_t opt_in_smem(Kernel kernel, int bytes, int dev, std::atomic<uint64_t> &opted, const char *what) {
    const uint64_t bit = device_bit(dev);
    if (bit != 0 && (opted.load(std::memory_order_acquire) & bit) != 0) return FK_OK;
    hipError_t e = hipFuncSetAttribute(reinterpret_cast<const void *>(kernel), hipFuncAttributeMaxDynamicSharedMemorySize,
                                       bytes);
    if (e != hipSuccess) return fk::fail(FK_ERR_LAUNCH, "%s shared memory opt-in failed: %s", what, hipGetErrorString(e));
    opted.fetch_or(bit, std::memory_order_release);
    return FK_OK;
}

inline int32_t forget_opt_in(int32_t status, int dev, std::atomic<uint64_t> &opted) {
    if (status != FK_OK) opted.fetch_and(~device_bit(dev), std::memory_order_relaxed);
    return status;
}
#endif

template <class E, int D>
int32_t run_generic(const fk::FlashParams &p, hipStream_t s, int64_t bh) {
    using Tile = fk::GenericTile<D, E::kBytes>;
    return fk::ran(launch_flash(fk::generic::flash_generic_kernel<E, D>, p, Tile::BM, Tile::kThreads, 0, s, bh,
                                "flash (generic)"),
                   "generic");
}

template <class E>
int32_t dispatch_generic(const fk::FlashParams &p, int64_t d, hipStream_t s, int64_t bh) {
    switch (fk::bucket_of(fk::kGenericBuckets, d)) {
        case 32: return run_generic<E, 32>(p, s, bh);
        case 64: return run_generic<E, 64>(p, s, bh);
        case 96: return run_generic<E, 96>(p, s, bh);
        case 128: return run_generic<E, 128>(p, s, bh);
        case 192: return run_generic<E, 192>(p, s, bh);
        case 256: return run_generic<E, 256>(p, s, bh);
        default: return fk::fail(FK_ERR_HEAD_DIM, "head_dim %lld has no generic kernel", (long long)d);
    }
}

#if defined(FK_HAVE_MMA)
// The binary version (80, 90) of the cubin `kernel` runs on device `dev`: its tile is MmaTile<D, that>
// (fk_traits.h: the sm_90 compilation may take larger tiles). Asked once per device and kernel in
// `known` (devices past 63, or unknown, ask on every call); 0 if the runtime cannot say.
template <class Kernel>
int cubin_arch(Kernel kernel, int dev, std::atomic<int> (&known)[64]) {
    if (dev >= 0 && dev < 64) {
        if (const int a = known[dev].load(std::memory_order_relaxed)) return a;
    }
    cudaFuncAttributes fa{};
    if (cudaFuncGetAttributes(&fa, kernel) != cudaSuccess || fa.binaryVersion <= 0) {
        (void)cudaGetLastError();
        return 0;
    }
    if (dev >= 0 && dev < 64) known[dev].store(fa.binaryVersion, std::memory_order_relaxed);
    return fa.binaryVersion;
}

template <class Tile, class Kernel>
int32_t launch_mma_tile(Kernel kernel, const fk::FlashParams &p, hipStream_t s, int64_t bh, int dev,
                        std::atomic<uint64_t> &opted) {
    if (int32_t st = opt_in_smem(kernel, Tile::kSmemBytes, dev, opted, "flash (mma_sync)")) return st;
    const int32_t st = launch_flash(kernel, p, Tile::BM, Tile::kThreads, Tile::kSmemBytes, s, bh, "flash (mma_sync)");
    return fk::ran(forget_opt_in(st, dev, opted), "mma_sync");
}

template <class E, int D, bool kPad, int KD>
int32_t launch_mma(const fk::FlashParams &p, hipStream_t s, int64_t bh, int dev) {
    auto kernel = fk::mma::flash_mma_kernel<E, D, kPad, KD>;
    static std::atomic<uint64_t> opted;  // devices opted in for this kernel
    static std::atomic<int> arch[64];    // per device: the binary version of its cubin (0 unknown)
    const int a = cubin_arch(kernel, dev, arch);
    if (a == 0) return fk::fail(FK_ERR_LAUNCH, "flash (mma_sync): this device runs no cubin of the kernel");
    return a >= 90 ? launch_mma_tile<fk::MmaTile<D, 90>>(kernel, p, s, bh, dev, opted)
                   : launch_mma_tile<fk::MmaTile<D, 80>>(kernel, p, s, bh, dev, opted);
}

// The kernel of bucket D for head dim p.d: exact (d == D), narrow (d <= the bucket's kNarrowKD:
// the MMAs run over that many columns), or padded. A bucket whose smallest head dim is D itself
// (32) has no padded kernel.
template <class E, int D>
int32_t run_mma(const fk::FlashParams &p, hipStream_t s, int64_t bh, int dev) {
    using Tile = fk::MmaTile<D, 80>;  // kMinDim and kNarrowKD: the same on every architecture
    if constexpr (Tile::kMinDim < D) {
        if constexpr (Tile::kNarrowKD < D)
            if (p.d <= Tile::kNarrowKD) return launch_mma<E, D, true, Tile::kNarrowKD>(p, s, bh, dev);
        if (p.d != D) return launch_mma<E, D, true, D>(p, s, bh, dev);
    }
    return launch_mma<E, D, false, D>(p, s, bh, dev);
}
#endif

#if defined(FK_HAVE_WGMMA)
constexpr bool kPersist = FK_WGMMA_PERSISTENT != 0;  // fk_traits.h: one block per SM looping over work items

// The number of SMs of device `dev`, asked once per device (0 if the runtime cannot say).
int sm_count(int dev) {
    static std::atomic<int> known[64];  // per device: 0 unknown
    if (dev >= 0 && dev < 64) {
        if (const int n = known[dev].load(std::memory_order_relaxed)) return n;
    }
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n < 1) {
        (void)cudaGetLastError();
        return 0;
    }
    if (dev >= 0 && dev < 64) known[dev].store(n, std::memory_order_relaxed);
    return n;
}

// Whether device `dev` (the current one) runs this library's sm_90a cubin: a cc 9.0 device, the
// kernel's binary built for it (not the sm_80 fallback cubin), and a driver that encodes tensor maps.
bool wgmma_usable(int dev) {
    static std::atomic<int8_t> known[64];  // per device: 0 unknown, 1 yes, 2 no
    if (dev < 0) return false;             // the runtime cannot say which device: mma_sync
    if (dev < 64 && known[dev].load() != 0) return known[dev].load() == 1;
    int major = 0, minor = 0;
    cudaFuncAttributes fa{};
    const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess && major == 9 &&
                    minor == 0 &&
                    cudaFuncGetAttributes(&fa, fk::wgmma::flash_wgmma_kernel<fk::BF16, 128, false, kPersist, 1>) == cudaSuccess &&
                    fa.binaryVersion == 90 && fk::wgmma::encoder() != nullptr;
    (void)cudaGetLastError();
    if (dev < 64) known[dev].store(ok ? 1 : 2);
    return ok;
}

constexpr int32_t kNotTaken = -1;  // the wgmma path cannot address these tensors: take mma_sync

// Clusters of two with K/V multicast (fk_traits.h FK_WGMMA_CLUSTER_KV): buckets 64 and 128 on the
// persistent grid, short Nk, at least two query tiles.
template <int D>
constexpr bool kClusterKV = kPersist && FK_WGMMA_CLUSTER_KV != 0 && (D == 64 || D == 128);

// How many clusters of two of `kernel` run at once on device `dev` (asked once per device and
// kernel; 0 if the runtime cannot say).
template <class Kernel>
int active_pairs(Kernel kernel, int smem, int dev, std::atomic<int> (&known)[64]) {
    if (dev >= 0 && dev < 64) {
        if (const int n = known[dev].load(std::memory_order_relaxed)) return n;
    }
    cudaLaunchConfig_t cfg{};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = 2;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.gridDim = dim3(2, 1, 1);
    cfg.blockDim = dim3(static_cast<unsigned>(128 * 3), 1, 1);
    cfg.dynamicSmemBytes = static_cast<size_t>(smem);
    cfg.attrs = at;
    cfg.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess || n < 1) {
        (void)cudaGetLastError();
        return 0;
    }
    if (dev >= 0 && dev < 64) known[dev].store(n, std::memory_order_relaxed);
    return n;
}

template <class E, int D>
int32_t run_wgmma(const fk::FlashParams &p, int32_t dtype, int64_t batch, hipStream_t s, int64_t bh_total, int dev) {
    using Tile = fk::WgmmaTile<D>;
    // the narrow kernels' tiles (their consumer count, so BM, threads and shared memory, may differ)
    using TileN = fk::WgmmaTile<D, Tile::kNarrowKD>;
    using TileN2 = fk::WgmmaTile<D, Tile::kNarrowKD2>;
    constexpr int kMaxBM = std::max({Tile::BM, TileN::BM, TileN2::BM});
    if (p.nq > INT32_MAX - kMaxBM || p.nk > INT32_MAX - Tile::BN) return kNotTaken;
    const int sms = kPersist ? sm_count(dev) : 0;
    if (kPersist && sms == 0) return kNotTaken;  // the runtime cannot say how many SMs: mma_sync
    const int64_t qtiles = (p.nq + Tile::BM - 1) / Tile::BM;
    const bool cl = kClusterKV<D> && p.nk <= FK_WGMMA_CLUSTER_KV_MAX_NK && qtiles >= 2;
    CUtensorMap tq, tk, tv, to;
    fk::wgmma::MapsDims md{};
    // dimension 0 of each map is the real head dim: TMA zero-fills the bucket's padding columns;
    // Q is loaded in halves, one per consumer warpgroup; clusters load K and V in halves too
    const int kv_rows = cl && FK_WGMMA_CLUSTER_KV_MULTICAST ? Tile::BN / 2 : Tile::BN;
    if (!fk::wgmma::encode_cached(&tq, &md.q, dev, dtype, p.q, batch, p.heads, p.nq, p.d, p.qs, Tile::kQRows) ||
        !fk::wgmma::encode_cached(&tk, &md.k, dev, dtype, p.k, batch, p.heads, p.nk, p.d, p.ks, kv_rows) ||
        !fk::wgmma::encode_cached(&tv, &md.v, dev, dtype, p.v, batch, p.heads, p.nk, p.d, p.vs, kv_rows))
        return kNotTaken;
    const bool padded = p.d != D;
    fk::FlashParams q = p;
    if constexpr (kClusterKV<D>) {
        if (cl) {
            auto kernel = padded ? fk::wgmma::flash_wgmma_kernel<E, D, true, true, 2>
                                 : fk::wgmma::flash_wgmma_kernel<E, D, false, true, 2>;
            static std::atomic<uint64_t> opted[2];
            static std::atomic<int> pairs_known[2][64];
            if (int32_t st = opt_in_smem(kernel, Tile::kSmemBytes, dev, opted[padded], "flash (wgmma)")) return st;
            int pairs = active_pairs(kernel, Tile::kSmemBytes, dev, pairs_known[padded]);
            if (pairs == 0) pairs = sms / 2;
            const int64_t items = (qtiles + 1) / 2 * bh_total;  // pairs of query tiles
            q.bh0 = 0;
            const unsigned clusters = static_cast<unsigned>(items < pairs ? items : pairs);
            cudaLaunchConfig_t cfg{};
            cudaLaunchAttribute at[1];
            at[0].id = cudaLaunchAttributeClusterDimension;
            at[0].val.clusterDim.x = 2;
            at[0].val.clusterDim.y = 1;
            at[0].val.clusterDim.z = 1;
            cfg.gridDim = dim3(2 * clusters, 1, 1);
            cfg.blockDim = dim3(Tile::kThreads, 1, 1);
            cfg.dynamicSmemBytes = Tile::kSmemBytes;
            cfg.stream = s;
            cfg.attrs = at;
            cfg.numAttrs = 1;
            const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, tq, tk, tv, tq, q, md, items);
            if (e != cudaSuccess) (void)cudaGetLastError();
            int32_t st = e == cudaSuccess ? check_launch("flash (wgmma)")
                                          : fk::fail(FK_ERR_LAUNCH, "flash (wgmma) launch failed: %s", cudaGetErrorString(e));
            if (st) return forget_opt_in(st, dev, opted[padded]);
            return fk::ran(FK_OK, "wgmma");
        }
    }
    // a narrow kernel (bucket 64 at head dims 32 and 40..48, bucket 128 at 66..80 and 81..96 where on:
    // GEMMs over 32, 48, 80 or 96 columns), the padded
    // one, the exact one with its items chained (buckets 64 and 128 at short Nk), or the exact one
    const bool narrow = Tile::kNarrowKD < D && p.d <= Tile::kNarrowKD;
    const bool narrow2 = !narrow && Tile::kNarrowKD2 < D && p.d <= Tile::kNarrowKD2;
    bool chain = Tile::kChain && !padded && p.nk <= FK_WGMMA_CHAIN_MAX_NK;
    // O's map, read by the kernels that store O with TMA: the chained ones and, with
    // FK_WGMMA_TMA_STORE, the unchained exact ones of buckets 64 and 128
    const bool o_tma_unchained = FK_WGMMA_TMA_STORE && Tile::kQRegs && !Tile::kWide && !padded;
    to = tq;
    if ((chain && FK_WGMMA_CHAIN_TMA_STORE) || o_tma_unchained) {
        if (!fk::wgmma::encode_cached(&to, &md.o, dev, dtype, p.o, batch, p.heads, p.nq, p.d, p.os, Tile::kQRows)) {
            if (o_tma_unchained) return kNotTaken;  // TMA cannot address O: the mma.sync path
            chain = false;  // the unchained kernel stores O from registers
        }
    }
    const int which = narrow ? 2 : narrow2 ? 3 : padded ? 1 : chain ? 4 : 0;
    auto kernel = narrow    ? fk::wgmma::flash_wgmma_kernel<E, D, true, kPersist, 1, Tile::kNarrowKD>
                  : narrow2 ? fk::wgmma::flash_wgmma_kernel<E, D, true, kPersist, 1, Tile::kNarrowKD2>
                  : padded  ? fk::wgmma::flash_wgmma_kernel<E, D, true, kPersist, 1>
                  : chain   ? fk::wgmma::flash_wgmma_kernel<E, D, false, kPersist, 1, D, Tile::kChain>
                            : fk::wgmma::flash_wgmma_kernel<E, D, false, kPersist, 1>;
    const int bm = narrow ? TileN::BM : narrow2 ? TileN2::BM : Tile::BM;
    const int threads = narrow ? TileN::kThreads : narrow2 ? TileN2::kThreads : Tile::kThreads;
    const int smem = narrow ? TileN::kSmemBytes : narrow2 ? TileN2::kSmemBytes : Tile::kSmemBytes;
    const int64_t tiles = (p.nq + bm - 1) / bm;  // query tiles of the chosen kernel (it computes the same)
    static std::atomic<uint64_t> opted[5];  // per kernel (exact, padded, narrow, narrow2, chained): devices opted in
    if (int32_t st = opt_in_smem(kernel, smem, dev, opted[which], "flash (wgmma)")) return st;
    if constexpr (kPersist) {  // one block per SM (fewer if there are fewer items), each looping over items
        const int64_t items = tiles * bh_total;
        q.bh0 = 0;
        const unsigned blocks = static_cast<unsigned>(items < sms ? items : sms);
        kernel<<<blocks, threads, smem, s>>>(tq, tk, tv, to, q, md, items);
        if (int32_t st = check_launch("flash (wgmma)")) return forget_opt_in(st, dev, opted[which]);
    } else {
        for (int64_t bh0 = 0; bh0 < bh_total; bh0 += kMaxGridY) {
            q.bh0 = bh0;
            const int64_t n = bh_total - bh0 < kMaxGridY ? bh_total - bh0 : kMaxGridY;
            dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(n), 1);
            kernel<<<grid, threads, smem, s>>>(tq, tk, tv, to, q, md, 0);
            if (int32_t st = check_launch("flash (wgmma)")) return forget_opt_in(st, dev, opted[which]);
        }
    }
    return fk::ran(FK_OK, "wgmma");
}

// The wgmma path where it applies; kNotTaken otherwise.
int32_t dispatch_wgmma(const fk::FlashParams &p, int32_t dtype, int64_t d, int64_t batch, hipStream_t s, int64_t bh,
                       int dev) {
    if (!wgmma_usable(dev) || dtype == FK_DTYPE_F32) return kNotTaken;
    const bool h = dtype == FK_DTYPE_F16;
    switch (fk::bucket_of(fk::kWgmmaBuckets, d)) {
        case 64: return h ? run_wgmma<fk::F16, 64>(p, dtype, batch, s, bh, dev) : run_wgmma<fk::BF16, 64>(p, dtype, batch, s, bh, dev);
        case 128: return h ? run_wgmma<fk::F16, 128>(p, dtype, batch, s, bh, dev) : run_wgmma<fk::BF16, 128>(p, dtype, batch, s, bh, dev);
#if FK_WGMMA_BUCKET_192
        case 192: return h ? run_wgmma<fk::F16, 192>(p, dtype, batch, s, bh, dev) : run_wgmma<fk::BF16, 192>(p, dtype, batch, s, bh, dev);
#endif
        case 256: return h ? run_wgmma<fk::F16, 256>(p, dtype, batch, s, bh, dev) : run_wgmma<fk::BF16, 256>(p, dtype, batch, s, bh, dev);
        default: return kNotTaken;
    }
}
#endif

#if defined(FK_HAVE_FP8)
// The FP8 kernel's head-dim bucket, and its workspace for these arguments (false: sizes overflow).
inline int fp8_bucket(int64_t d) { return d <= 64 ? 64 : 128; }
inline bool fp8_layout(const fk_attention_args *a, fk::fp8::Layout *l) {
    return fk::fp8::layout_for(a->batch, a->heads, a->nq, a->nk, fp8_bucket(a->head_dim), l);
}

// Refuses what the FP8 kernel cannot run, whatever the device: head dims past 128, sizes past int32.
int32_t fp8_shape_ok(const fk_attention_args *a, fk::fp8::Layout *l) {
    if (a->head_dim > fk::fp8::kMaxDim)
        return fk::fail(FK_ERR_HEAD_DIM, "head_dim %lld has no fp8 kernel (precision fp8 takes head dims 32..%d)",
                        (long long)a->head_dim, fk::fp8::kMaxDim);
    if (a->nq > INT32_MAX - fk::fp8::kMaxConsumers * fk::fp8::kQBlock || a->nk > INT32_MAX - fk::fp8::BN)
        return fk::fail(FK_ERR_SIZE, "precision fp8 takes nq below 2^31 - 192 and nk below 2^31 - 128");
    if (!fp8_layout(a, l)) return fk::fail(FK_ERR_SIZE, "the fp8 workspace for these sizes overflows a 64-bit size");
    return FK_OK;
}

template <class E, int D>
int32_t run_fp8(const fk_attention_args *a, const fk::Validated &v, const fk::fp8::Layout &lay, hipStream_t s, int dev) {
    namespace f8 = fk::fp8;
    using Tile = f8::Fp8Tile<D>;
    f8::Fp8Params p{};
    p.q = a->q;
    p.k = a->k;
    p.v = a->v;
    p.o = a->o;
    p.heads = a->heads;
    p.nq = a->nq;
    p.nk = a->nk;
    for (int i = 0; i < 3; ++i) {
        p.qs[i] = a->q_stride[i];
        p.ks[i] = a->k_stride[i];
        p.vs[i] = a->v_stride[i];
        p.os[i] = a->o_stride[i];
        p.ls[i] = a->lse_stride[i];
    }
    p.d = static_cast<int32_t>(a->head_dim);
    p.scale = v.scale;
    p.scale_log2 = v.scale * fk::kLog2e;
    p.lse = a->lse;
    p.qblocks = static_cast<int32_t>(lay.qblocks);
    p.ntiles = static_cast<int32_t>(lay.ntiles);
    p.chunks = static_cast<int32_t>(lay.chunks);
    p.ws = static_cast<unsigned char *>(a->workspace);
    p.lay = lay;
    auto kernel = f8::attention_kernel<E, D>;
    static std::atomic<uint64_t> opted;
    if (int32_t st = opt_in_smem(kernel, Tile::kSmemBytes, dev, opted, "flash (fp8)")) return st;
    const unsigned qtiles = static_cast<unsigned>((a->nq + Tile::BM - 1) / Tile::BM);
    const int64_t bh_total = a->batch * a->heads;
    for (int64_t bh0 = 0; bh0 < bh_total; bh0 += kMaxGridY) {
        p.bh0 = bh0;
        const unsigned n = static_cast<unsigned>(bh_total - bh0 < kMaxGridY ? bh_total - bh0 : kMaxGridY);
        f8::stats_kernel<E><<<dim3(static_cast<unsigned>(p.chunks), n), 256, 0, s>>>(p);
        if (int32_t st = check_launch("fp8 statistics")) return st;
        f8::stats_finish_kernel<<<n, f8::kMaxDim, 0, s>>>(p);
        if (int32_t st = check_launch("fp8 statistics")) return st;
        f8::quant_qk_kernel<E, false, D><<<dim3(static_cast<unsigned>(p.qblocks), n), 256, 0, s>>>(p);
        if (int32_t st = check_launch("fp8 quantization of Q")) return st;
        f8::quant_qk_kernel<E, true, D><<<dim3(static_cast<unsigned>(p.ntiles), n), 256, 0, s>>>(p);
        if (int32_t st = check_launch("fp8 quantization of K")) return st;
        f8::quant_v_kernel<E, D><<<dim3(static_cast<unsigned>(p.ntiles), n), 256, 0, s>>>(p);
        if (int32_t st = check_launch("fp8 quantization of V")) return st;
        kernel<<<dim3(qtiles, n), Tile::kThreads, Tile::kSmemBytes, s>>>(p);
        if (int32_t st = check_launch("flash (fp8)")) return forget_opt_in(st, dev, opted);
    }
    return fk::ran(FK_OK, "fp8");
}
#endif

// precision fp8: the FP8 kernel where this build and device have it, else FK_ERR_PRECISION.
int32_t dispatch_fp8(const fk_attention_args *a, const fk::Validated &v) {
#if defined(FK_HAVE_FP8)
    fk::fp8::Layout lay{};
    if (int32_t st = fp8_shape_ok(a, &lay)) return st;
    const int dev = current_device();
    if (!wgmma_usable(dev)) return fk::no_fp8("on this device");
    if (a->workspace == nullptr || a->workspace_bytes < lay.total || reinterpret_cast<uintptr_t>(a->workspace) % 16 != 0)
        return fk::fail(FK_ERR_WORKSPACE, "precision fp8 needs a 16-byte aligned workspace of %lld bytes (fk_workspace_bytes); "
                        "given %lld bytes at %p", (long long)lay.total, (long long)a->workspace_bytes, a->workspace);
    hipStream_t s = static_cast<hipStream_t>(a->stream);
    const bool d64 = fp8_bucket(a->head_dim) == 64;
    switch (a->dtype) {
        case FK_DTYPE_F16: return d64 ? run_fp8<fk::F16, 64>(a, v, lay, s, dev) : run_fp8<fk::F16, 128>(a, v, lay, s, dev);
        case FK_DTYPE_BF16: return d64 ? run_fp8<fk::BF16, 64>(a, v, lay, s, dev) : run_fp8<fk::BF16, 128>(a, v, lay, s, dev);
        default: return d64 ? run_fp8<fk::F32, 64>(a, v, lay, s, dev) : run_fp8<fk::F32, 128>(a, v, lay, s, dev);
    }
#else
    (void)a;
    (void)v;
    return fk::no_fp8("in this build (no sm_90a kernels)");
#endif
}

int32_t dispatch_flash(const fk::FlashParams &p, int32_t dtype, int64_t d, int64_t batch, hipStream_t s, int64_t bh) {
#if defined(FK_HAVE_MMA)
    const int dev = current_device();
#endif
#if defined(FK_HAVE_WGMMA)
    const int32_t w = dispatch_wgmma(p, dtype, d, batch, s, bh, dev);
    if (w != kNotTaken) return w;
#endif
#if defined(FK_HAVE_MMA)
    // fp16/bf16: mma.sync at every head dim, so this build holds no fp16/bf16 generic kernel
    if (dtype != FK_DTYPE_F32) {
        const bool h = dtype == FK_DTYPE_F16;
        switch (fk::bucket_of(fk::kMmaBuckets, d)) {
            case 32: return h ? run_mma<fk::F16, 32>(p, s, bh, dev) : run_mma<fk::BF16, 32>(p, s, bh, dev);
            case 64: return h ? run_mma<fk::F16, 64>(p, s, bh, dev) : run_mma<fk::BF16, 64>(p, s, bh, dev);
            case 96: return h ? run_mma<fk::F16, 96>(p, s, bh, dev) : run_mma<fk::BF16, 96>(p, s, bh, dev);
            case 128: return h ? run_mma<fk::F16, 128>(p, s, bh, dev) : run_mma<fk::BF16, 128>(p, s, bh, dev);
            case 160: return h ? run_mma<fk::F16, 160>(p, s, bh, dev) : run_mma<fk::BF16, 160>(p, s, bh, dev);
            case 192: return h ? run_mma<fk::F16, 192>(p, s, bh, dev) : run_mma<fk::BF16, 192>(p, s, bh, dev);
            case 256: return h ? run_mma<fk::F16, 256>(p, s, bh, dev) : run_mma<fk::BF16, 256>(p, s, bh, dev);
            default: return fk::fail(FK_ERR_HEAD_DIM, "head_dim %lld has no mma_sync kernel", (long long)d);
        }
    }
    return dispatch_generic<fk::F32>(p, d, s, bh);
#else
    switch (dtype) {
        case FK_DTYPE_F32: return dispatch_generic<fk::F32>(p, d, s, bh);
        case FK_DTYPE_F16: return dispatch_generic<fk::F16>(p, d, s, bh);
        default: return dispatch_generic<fk::BF16>(p, d, s, bh);
    }
#endif
}

template <class E>
int32_t run_naive(const fk_attention_args *a, const fk::Validated &v, hipStream_t s) {
    using fk::NaiveTile;
    fk::naive::NaiveParams p{};
    p.q = a->q;
    p.k = a->k;
    p.v = a->v;
    p.o = a->o;
    p.heads = a->heads;
    p.nq = a->nq;
    p.nk = a->nk;
    p.d = a->head_dim;
    for (int i = 0; i < 3; ++i) {
        p.qs[i] = a->q_stride[i];
        p.ks[i] = a->k_stride[i];
        p.vs[i] = a->v_stride[i];
        p.os[i] = a->o_stride[i];
    }
    p.scale = v.scale;
    p.lse = a->lse;
    for (int i = 0; i < 3; ++i) p.ls[i] = a->lse_stride[i];
    const int64_t bh_total = a->batch * a->heads;
    const int64_t row_bytes = a->nk * 4;
    // Chunk: as many whole heads as fit the workspace limit, else as many query rows of one head.
    // (nq * nk * 4 may overflow int64: compare by division first.)
    int64_t rows = a->nq, group = 0;
    if (row_bytes <= NaiveTile::kWorkspaceBytes / a->nq) group = NaiveTile::kWorkspaceBytes / (row_bytes * a->nq);
    if (group < 1) {
        group = 1;
        rows = NaiveTile::kWorkspaceBytes / row_bytes;
        if (rows < 1) rows = 1;
        if (rows > a->nq) rows = a->nq;
    }
    if (group > bh_total) group = bh_total;
    if (group > kMaxGridY) group = kMaxGridY;
    const int64_t max_rows = kMaxGridY * NaiveTile::TM;
    if (rows > max_rows) rows = max_rows;
    if ((a->nk + NaiveTile::TN - 1) / NaiveTile::TN > INT32_MAX || group * rows > INT32_MAX)
        return fk::fail(FK_ERR_SIZE, "nk %lld is too large for the naive kernels", (long long)a->nk);

    float *ws = nullptr;
    const size_t ws_bytes = static_cast<size_t>(group * rows * row_bytes);
    hipError_t e = hipMalloc(reinterpret_cast<void **>(&ws), ws_bytes);
    if (e != hipSuccess) {
        (void)hipGetLastError();  // clear it: the failure is reported here, not at the next launch
        return fk::fail(FK_ERR_NO_MEMORY, "naive workspace of %zu bytes: %s", ws_bytes, hipGetErrorString(e));
    }
    p.ws = ws;
    int32_t st = FK_OK;
    for (int64_t bh0 = 0; bh0 < bh_total && st == FK_OK; bh0 += group) {
        const int64_t g = bh_total - bh0 < group ? bh_total - bh0 : group;
        for (int64_t r0 = 0; r0 < a->nq && st == FK_OK; r0 += rows) {
            p.bh0 = bh0;
            p.row0 = r0;
            p.rows = a->nq - r0 < rows ? a->nq - r0 : rows;
            dim3 gs(static_cast<unsigned>((a->nk + NaiveTile::TN - 1) / NaiveTile::TN),
                    static_cast<unsigned>((p.rows + NaiveTile::TM - 1) / NaiveTile::TM), static_cast<unsigned>(g));
            fk::naive::scores_kernel<E><<<gs, NaiveTile::kThreads, 0, s>>>(p);
            if ((st = check_launch("naive scores"))) break;
            fk::naive::softmax_kernel<<<static_cast<unsigned>(g * p.rows), NaiveTile::kSoftmaxThreads, 0, s>>>(p);
            if ((st = check_launch("naive softmax"))) break;
            dim3 go(static_cast<unsigned>((a->head_dim + NaiveTile::TN - 1) / NaiveTile::TN),
                    static_cast<unsigned>((p.rows + NaiveTile::TM - 1) / NaiveTile::TM), static_cast<unsigned>(g));
            fk::naive::pv_kernel<E><<<go, NaiveTile::kThreads, 0, s>>>(p);
            if ((st = check_launch("naive P V"))) break;
        }
    }
    // The workspace is reused by every chunk on one stream; free it only once the work is done.
    hipError_t se = hipStreamSynchronize(s);
    (void)hipFree(ws);
    if (st != FK_OK) return st;
    if (se != hipSuccess) return fk::fail(FK_ERR_LAUNCH, "naive forward failed: %s", hipGetErrorString(se));
    return FK_OK;
}

}  // namespace

extern "C" {

int32_t fk_abi_version(void) { return FK_ABI_VERSION; }

const char *fk_target(void) {
#if defined(FK_TARGET)
    return FK_TARGET;  // the build passes -DFK_TARGET="gfx1030" etc.
#elif defined(__CUDA_ARCH_LIST__)
    static const int archs[] = {__CUDA_ARCH_LIST__};
    static char name[16] = "";
    if (name[0] == '\0') std::snprintf(name, sizeof name, "sm_%d", archs[0] / 10);
    return name;
#elif defined(FK_PLATFORM_AMD)
    return "amdgcn";
#else
    return "unknown";
#endif
}

const char *fk_flash_path(void) {
#if defined(FK_HAVE_WGMMA)
    return wgmma_usable(current_device()) ? "wgmma" : "mma_sync";  // the path fp16/bf16 take on this device
#elif defined(FK_HAVE_MMA)
    return "mma_sync";
#else
    return "generic";
#endif
}

int32_t fk_supported_head_dims(int32_t *dims, int32_t capacity) { return fk::supported_head_dims(dims, capacity); }

const char *fk_last_error(void) { return fk::last_error_buffer(); }

const char *fk_last_flash_path(void) { return fk::ran_path(); }

int32_t fk_flash_forward(const fk_attention_args *args) {
    fk::ran_path() = "";
    fk::Validated v{};
    // Both flash paths load 16 bytes at a time: pointers and row strides must allow it.
    if (int32_t st = fk::validate(args, fk::kVectorBytes, &v)) return st;
    if (args->precision == FK_PRECISION_FP8) {
        if (int32_t st = dispatch_fp8(args, v)) return st;
        return fk::ok();
    }
    const fk::FlashParams p = flash_params(args, v);
    if (int32_t st = dispatch_flash(p, args->dtype, args->head_dim, args->batch, static_cast<hipStream_t>(args->stream),
                                    args->batch * args->heads))
        return st;
    return fk::ok();
}

int32_t fk_workspace_bytes(const fk_attention_args *args, int64_t *bytes) {
    if (bytes == nullptr) return fk::fail(FK_ERR_NULL_POINTER, "bytes is NULL");
    *bytes = 0;
    fk::Validated v{};
    if (int32_t st = fk::validate(args, 0, &v)) return st;
    if (args->precision == FK_PRECISION_EXACT) return fk::ok();
#if defined(FK_HAVE_FP8)
    fk::fp8::Layout lay{};
    if (int32_t st = fp8_shape_ok(args, &lay)) return st;
    *bytes = lay.total;
    return fk::ok();
#else
    return fk::no_fp8("in this build");
#endif
}

int32_t fk_naive_forward(const fk_attention_args *args) {
    fk::Validated v{};
    if (int32_t st = fk::validate(args, 0, &v)) return st;
    if (args->precision != FK_PRECISION_EXACT) return fk::fail(FK_ERR_PRECISION, "the naive path is exact only: it is the oracle");
    hipStream_t s = static_cast<hipStream_t>(args->stream);
    int32_t st = FK_OK;
    switch (args->dtype) {
        case FK_DTYPE_F32: st = run_naive<fk::F32>(args, v, s); break;
        case FK_DTYPE_F16: st = run_naive<fk::F16>(args, v, s); break;
        default: st = run_naive<fk::BF16>(args, v, s); break;
    }
    return st != FK_OK ? st : fk::ok();
}

}  // extern "C"
