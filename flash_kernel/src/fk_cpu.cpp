// fk_cpu.cpp: the CPU target of flash_kernel.h (target "cpu", flash path "cpu").
//
// The same algorithm as the GPU flash path, so every machine can run parity: threads over
// (batch, head, query tile); per query tile the K/V sequence is streamed one tile at a time with
// an online softmax (running max m and running sum l per row, fp32), so the Nq x Nk matrix never
// exists. fk_naive_forward is the oracle: it materialises S = scale * Q K^T for one head at a
// time, softmaxes each row and multiplies by V.
//
// Storage (fp32, fp16, bf16) is converted to fp32 as tiles are loaded and back when O is stored.
// Built without -march flags (baseline x86-64 / SSE2) so the object runs on any x86-64 machine:
// the inner loops are written so that g++ -O3 vectorises them without -ffast-math (the reduction
// dimension is the outer loop, the vectorised one is contiguous, and the flash path keeps a
// 4-row x 8-lane block of accumulators in registers for both Q K^T and P V).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <thread>
#include <vector>

#include "fk_common.h"
#include "flash_kernel.h"

namespace {

constexpr int64_t kMaxD = fk::kMaxHeadDim;  // scratch is sized for it; D itself is a run-time value
constexpr int64_t kBlockQ = 32;  // query rows per work item
constexpr int64_t kBlockK = 64;  // key/value rows per streamed tile

// ---- storage conversion (bit-exact, no F16C needed) -------------------------------------------

inline float bits_to_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline uint32_t float_to_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));  // inf / nan
    if (exp == 0) {
        if (man == 0) return bits_to_float(sign);
        // subnormal: value = man * 2^-24
        float f = static_cast<float>(man) * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
}

// Round to nearest even, overflow to inf, NaN stays NaN.
inline uint16_t float_to_half(float f) {
    uint32_t x = float_to_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  // rounds to >= 65520: inf
    if (ax < 0x38800000u) {                                     // below 2^-14: subnormal half
        // scale so the half subnormal ulp (2^-24) becomes 1, then round to nearest even
        float a = bits_to_float(ax) * 16777216.0f;  // exact: power-of-two scaling
        float r = std::nearbyint(a);                // default rounding mode: nearest even
        return (uint16_t)(sign | (uint32_t)r);
    }
    uint32_t rounded = ax + 0xfffu + ((ax >> 13) & 1u);
    return (uint16_t)(sign | ((rounded - 0x38000000u) >> 13));
}

inline float bf16_to_float(uint16_t b) { return bits_to_float((uint32_t)b << 16); }

inline uint16_t float_to_bf16(float f) {
    uint32_t x = float_to_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);  // quiet NaN
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

struct F32 {
    using T = float;
    static float load(T x) { return x; }
    static T store(float x) { return x; }
};
struct F16 {
    using T = uint16_t;
    static float load(T x) { return half_to_float(x); }
    static T store(float x) { return float_to_half(x); }
};
struct BF16 {
    using T = uint16_t;
    static float load(T x) { return bf16_to_float(x); }
    static T store(float x) { return float_to_bf16(x); }
};

// ---- threads ------------------------------------------------------------------------------------

// Worker count: FK_CPU_THREADS if set (>= 1), else the hardware concurrency, capped by the work.
int64_t worker_count(int64_t items, double flops) {
    int64_t n = 0;
    if (const char *env = std::getenv("FK_CPU_THREADS")) n = std::atoll(env);
    if (n < 1) n = (int64_t)std::thread::hardware_concurrency();
    if (n < 1) n = 1;
    if (flops < 2e6) n = 1;  // thread start-up costs more than the work
    return std::max<int64_t>(1, std::min(n, items));
}

// Runs body(item) for item in [0, items) on `workers` threads (the caller is one of them). If the
// system refuses a thread, the threads already running (or the caller alone) finish the work.
template <typename Body>
void parallel_for(int64_t items, int64_t workers, const Body &body) {
    std::atomic<int64_t> next{0};
    auto run = [&]() {
        for (int64_t i = next.fetch_add(1); i < items; i = next.fetch_add(1)) body(i);
    };
    std::vector<std::thread> pool;
    try {
        pool.reserve((size_t)(workers - 1));
        for (int64_t t = 1; t < workers; ++t) pool.emplace_back(run);
    } catch (...) {
        // fewer threads than asked: correctness does not depend on the count
    }
    run();
    for (auto &t : pool) t.join();
}

// ---- flash forward ------------------------------------------------------------------------------

// Per-thread scratch, sized for the largest head dim: ~ (32 + 64 + 64 + 32) * 256 floats.
struct FlashTile {
    float q[kBlockQ * kMaxD];       // scaled Q rows (row stride DP)
    float kt[kMaxD * kBlockK];      // K tile transposed: kt[d * kBlockK + j]
    float v[kBlockK * kMaxD];       // V tile
    float s[kBlockQ * kBlockK];     // scores of this Q tile against this K tile
    float acc[kBlockQ * kMaxD];     // unnormalised O rows
    float m[kBlockQ], l[kBlockQ];
};

// One work item. D (the head dim) is a run-time bound of every loop over the head dim; DP, the row
// stride of the scratch tiles, is a compile-time bucket (64, 128 or 256 >= D). The vectorised
// loops run over J keys or J head-dim lanes (D is a multiple of 8 = J). With D as the stride too,
// the address arithmetic doubled the time (1 thread, (1,2,1024,1024), D 64 and 128); with DP the
// time equals that of a kernel compiled for one D.
template <typename S, int DP>
void flash_item(const fk_attention_args &a, float scale, int64_t item, FlashTile &t) {
    using T = typename S::T;
    constexpr int R = 4, J = 8;  // register block: R query rows x J keys (or J head-dim lanes)
    const int D = static_cast<int>(a.head_dim);  // validated: a multiple of 8 (J), at most kMaxD
    const int64_t qtiles = (a.nq + kBlockQ - 1) / kBlockQ;
    const int64_t bh = item / qtiles, qt = item % qtiles;
    const int64_t b = bh / a.heads, h = bh % a.heads;
    const int64_t q0 = qt * kBlockQ, rows = std::min(kBlockQ, a.nq - q0);
    const int64_t rows_r = (rows + R - 1) / R * R;  // padded rows are zeros, computed, never stored
    const T *Q = static_cast<const T *>(a.q) + b * a.q_stride[0] + h * a.q_stride[1];
    const T *K = static_cast<const T *>(a.k) + b * a.k_stride[0] + h * a.k_stride[1];
    const T *V = static_cast<const T *>(a.v) + b * a.v_stride[0] + h * a.v_stride[1];
    T *O = static_cast<T *>(a.o) + b * a.o_stride[0] + h * a.o_stride[1];

    for (int64_t i = 0; i < rows_r; ++i) {
        if (i < rows) {
            const T *src = Q + (q0 + i) * a.q_stride[2];
            for (int d = 0; d < D; ++d) t.q[i * DP + d] = S::load(src[d]) * scale;
        } else {
            for (int d = 0; d < D; ++d) t.q[i * DP + d] = 0.0f;
        }
        for (int d = 0; d < D; ++d) t.acc[i * DP + d] = 0.0f;
        t.m[i] = -INFINITY;
        t.l[i] = 0.0f;
    }
    for (int64_t k0 = 0; k0 < a.nk; k0 += kBlockK) {
        const int64_t cols = std::min(kBlockK, a.nk - k0);
        for (int64_t j = 0; j < kBlockK; ++j) {
            if (j < cols) {
                const T *ks = K + (k0 + j) * a.k_stride[2];
                const T *vs = V + (k0 + j) * a.v_stride[2];
                for (int d = 0; d < D; ++d) t.kt[d * kBlockK + j] = S::load(ks[d]);
                for (int d = 0; d < D; ++d) t.v[j * DP + d] = S::load(vs[d]);
            } else {  // ragged last tile: zero keys and values, masked out of the softmax below
                for (int d = 0; d < D; ++d) t.kt[d * kBlockK + j] = 0.0f;
                for (int d = 0; d < D; ++d) t.v[j * DP + d] = 0.0f;
            }
        }
        // S = Q K^T for the tile, R x J accumulators kept in registers across the D loop
        for (int64_t i0 = 0; i0 < rows_r; i0 += R) {
            for (int64_t j0 = 0; j0 < kBlockK; j0 += J) {
                float c[R][J] = {};
                for (int d = 0; d < D; ++d) {
                    const float *kd = t.kt + d * kBlockK + j0;
                    for (int r = 0; r < R; ++r) {
                        const float qd = t.q[(i0 + r) * DP + d];
                        for (int jj = 0; jj < J; ++jj) c[r][jj] += qd * kd[jj];
                    }
                }
                for (int r = 0; r < R; ++r)
                    for (int jj = 0; jj < J; ++jj) t.s[(i0 + r) * kBlockK + j0 + jj] = c[r][jj];
            }
        }
        // online softmax over the valid columns; P overwrites S, masked columns become 0
        for (int64_t i = 0; i < rows_r; ++i) {
            float *srow = t.s + i * kBlockK;
            float mt = t.m[i];
            for (int64_t j = 0; j < cols; ++j) mt = std::max(mt, srow[j]);
            const float alpha = std::exp(t.m[i] - mt);  // exp(-inf) = 0 on the first tile
            float sum = 0.0f;
            for (int64_t j = 0; j < cols; ++j) {
                srow[j] = std::exp(srow[j] - mt);
                sum += srow[j];
            }
            for (int64_t j = cols; j < kBlockK; ++j) srow[j] = 0.0f;
            t.l[i] = t.l[i] * alpha + sum;
            t.m[i] = mt;
            float *arow = t.acc + i * DP;
            for (int d = 0; d < D; ++d) arow[d] *= alpha;
        }
        // O += P V, R rows x J head-dim lanes in registers across the key loop
        for (int64_t i0 = 0; i0 < rows_r; i0 += R) {
            for (int d0 = 0; d0 < D; d0 += J) {
                float c[R][J];
                for (int r = 0; r < R; ++r)
                    for (int jj = 0; jj < J; ++jj) c[r][jj] = t.acc[(i0 + r) * DP + d0 + jj];
                for (int64_t j = 0; j < cols; ++j) {
                    const float *vj = t.v + j * DP + d0;
                    for (int r = 0; r < R; ++r) {
                        const float p = t.s[(i0 + r) * kBlockK + j];
                        for (int jj = 0; jj < J; ++jj) c[r][jj] += p * vj[jj];
                    }
                }
                for (int r = 0; r < R; ++r)
                    for (int jj = 0; jj < J; ++jj) t.acc[(i0 + r) * DP + d0 + jj] = c[r][jj];
            }
        }
    }
    for (int64_t i = 0; i < rows; ++i) {
        T *dst = O + (q0 + i) * a.o_stride[2];
        const float inv = 1.0f / t.l[i];
        for (int d = 0; d < D; ++d) dst[d] = S::store(t.acc[i * DP + d] * inv);
    }
    if (a.lse != nullptr) {  // m is the row's scaled maximum, l its sum of exp(s - m): natural log
        float *L = a.lse + b * a.lse_stride[0] + h * a.lse_stride[1];
        for (int64_t i = 0; i < rows; ++i) L[(q0 + i) * a.lse_stride[2]] = t.m[i] + std::log(t.l[i]);
    }
}

template <typename S>
int32_t flash_run(const fk_attention_args &a, float scale) {
    const int64_t D = a.head_dim;
    const int64_t qtiles = (a.nq + kBlockQ - 1) / kBlockQ;
    int64_t bh = 0, items = 0;
    // zero strides let validated sizes be huge without huge extents: the item count must still fit
    if (!fk::mul_add(a.batch, a.heads, 0, &bh) || !fk::mul_add(bh, qtiles, 0, &items))
        return fk::fail(FK_ERR_SIZE, "batch * heads * query tiles overflows int64");
    const double flops = 4.0 * (double)a.batch * a.heads * a.nq * a.nk * D;
    const int64_t workers = worker_count(items, flops);
    // Scratch is allocated once per worker thread (never per tile); the CPU target is never
    // captured into a CUDA graph.
    std::atomic<bool> oom{false};
    parallel_for(items, workers, [&](int64_t item) {
        // one scratch per thread, freed when the thread ends (the caller's is kept for reuse)
        static thread_local std::unique_ptr<FlashTile> tile;
        if (!tile) tile.reset(new (std::nothrow) FlashTile);
        if (!tile) {
            oom = true;
            return;
        }
        if (D <= 64)
            flash_item<S, 64>(a, scale, item, *tile);
        else if (D <= 128)
            flash_item<S, 128>(a, scale, item, *tile);
        else
            flash_item<S, 256>(a, scale, item, *tile);
    });
    if (oom) return fk::fail(FK_ERR_NO_MEMORY, "could not allocate the per-thread tile scratch");
    return fk::ok();
}

// ---- naive forward (the oracle) -----------------------------------------------------------------

// D is a run-time value here (one instantiation per dtype): the oracle favours a short build over
// the last few percent of speed; the loops still vectorise over the contiguous dimension.
template <typename S>
int32_t naive_run(const fk_attention_args &a, float scale) {
    using T = typename S::T;
    const int64_t D = a.head_dim;
    int64_t s_elems = 0, kv_elems = 0;
    if (!fk::mul_add(a.nq, a.nk, 0, &s_elems) || !fk::mul_add(a.nk, D, 0, &kv_elems) ||
        s_elems > INT64_MAX / 8 || kv_elems > INT64_MAX / 8)
        return fk::fail(FK_ERR_NO_MEMORY, "score workspace of %lld x %lld floats does not fit in memory",
                        (long long)a.nq, (long long)a.nk);
    float *ws = static_cast<float *>(std::malloc((size_t)(s_elems + 2 * kv_elems) * sizeof(float)));
    if (ws == nullptr)
        return fk::fail(FK_ERR_NO_MEMORY, "could not allocate the %lld x %lld fp32 score workspace",
                        (long long)a.nq, (long long)a.nk);
    float *Sm = ws, *Kt = ws + s_elems, *Vf = Kt + kv_elems;
    const int64_t nk = a.nk;
    const double flops = 4.0 * (double)a.nq * a.nk * D;
    const int64_t row_block = 16;
    const int64_t blocks = (a.nq + row_block - 1) / row_block;
    const int64_t workers = worker_count(blocks, flops);
    for (int64_t b = 0; b < a.batch; ++b) {
        for (int64_t h = 0; h < a.heads; ++h) {
            const T *Q = static_cast<const T *>(a.q) + b * a.q_stride[0] + h * a.q_stride[1];
            const T *K = static_cast<const T *>(a.k) + b * a.k_stride[0] + h * a.k_stride[1];
            const T *V = static_cast<const T *>(a.v) + b * a.v_stride[0] + h * a.v_stride[1];
            T *O = static_cast<T *>(a.o) + b * a.o_stride[0] + h * a.o_stride[1];
            float *L = a.lse != nullptr ? a.lse + b * a.lse_stride[0] + h * a.lse_stride[1] : nullptr;
            for (int64_t j = 0; j < nk; ++j)
                for (int64_t d = 0; d < D; ++d) {
                    Kt[d * nk + j] = S::load(K[j * a.k_stride[2] + d]);
                    Vf[j * D + d] = S::load(V[j * a.v_stride[2] + d]);
                }
            // 1) S = scale * Q K^T, all of it
            parallel_for(blocks, workers, [&](int64_t blk) {
                for (int64_t i = blk * row_block; i < std::min(a.nq, (blk + 1) * row_block); ++i) {
                    float *srow = Sm + i * nk;
                    const T *qs = Q + i * a.q_stride[2];
                    for (int64_t j = 0; j < nk; ++j) srow[j] = 0.0f;
                    for (int64_t d = 0; d < D; ++d) {
                        const float qd = S::load(qs[d]);
                        const float *kd = Kt + d * nk;
                        for (int64_t j = 0; j < nk; ++j) srow[j] += qd * kd[j];
                    }
                    for (int64_t j = 0; j < nk; ++j) srow[j] *= scale;
                }
            });
            // 2) row softmax in place, 3) O = P V
            parallel_for(blocks, workers, [&](int64_t blk) {
                float acc[kMaxD];  // D <= kMaxD (validated)
                for (int64_t i = blk * row_block; i < std::min(a.nq, (blk + 1) * row_block); ++i) {
                    float *srow = Sm + i * nk;
                    float mx = -INFINITY, sum = 0.0f;
                    for (int64_t j = 0; j < nk; ++j) mx = std::max(mx, srow[j]);
                    for (int64_t j = 0; j < nk; ++j) {
                        srow[j] = std::exp(srow[j] - mx);
                        sum += srow[j];
                    }
                    const float inv = 1.0f / sum;
                    if (L != nullptr) L[i * a.lse_stride[2]] = mx + std::log(sum);
                    for (int64_t j = 0; j < nk; ++j) srow[j] *= inv;
                    for (int64_t d = 0; d < D; ++d) acc[d] = 0.0f;
                    for (int64_t j = 0; j < nk; ++j) {
                        const float p = srow[j];
                        const float *vj = Vf + j * D;
                        for (int64_t d = 0; d < D; ++d) acc[d] += p * vj[d];
                    }
                    T *dst = O + i * a.o_stride[2];
                    for (int64_t d = 0; d < D; ++d) dst[d] = S::store(acc[d]);
                }
            });
        }
    }
    std::free(ws);
    return fk::ok();
}

// ---- dispatch -----------------------------------------------------------------------------------

template <typename S>
int32_t by_dim(const fk_attention_args &a, float scale, bool naive) {
    return naive ? naive_run<S>(a, scale) : flash_run<S>(a, scale);
}

int32_t forward(const fk_attention_args *args, bool naive) {
    fk::Validated v{};
    int32_t st = fk::validate(args, 0, &v);
    if (st != FK_OK) return st;
    if (args->precision != FK_PRECISION_EXACT)
        return naive ? fk::fail(FK_ERR_PRECISION, "the naive path is exact only: it is the oracle")
                     : fk::no_fp8("on the cpu target (flash_kernel.fp8 holds the CPU reference numerics)");
    try {
        switch (args->dtype) {
            case FK_DTYPE_F32: return by_dim<F32>(*args, v.scale, naive);
            case FK_DTYPE_F16: return by_dim<F16>(*args, v.scale, naive);
            case FK_DTYPE_BF16: return by_dim<BF16>(*args, v.scale, naive);
            default: return fk::fail(FK_ERR_DTYPE, "dtype %d is not supported", (int)args->dtype);
        }
    } catch (const std::bad_alloc &) {
        return fk::fail(FK_ERR_NO_MEMORY, "out of memory");
    } catch (...) {
        // nothing may unwind through the C ABI
        return fk::fail(FK_ERR_LAUNCH, "the CPU worker threads could not be run");
    }
}

}  // namespace

extern "C" {

int32_t fk_abi_version(void) { return FK_ABI_VERSION; }

const char *fk_target(void) { return "cpu"; }

const char *fk_flash_path(void) { return "cpu"; }

int32_t fk_supported_head_dims(int32_t *dims, int32_t capacity) { return fk::supported_head_dims(dims, capacity); }

const char *fk_last_error(void) { return fk::last_error_buffer(); }

const char *fk_last_flash_path(void) { return fk::ran_path(); }

int32_t fk_flash_forward(const fk_attention_args *args) {
    fk::ran_path() = "";
    return fk::ran(forward(args, false), "cpu");
}

int32_t fk_naive_forward(const fk_attention_args *args) { return forward(args, true); }

int32_t fk_workspace_bytes(const fk_attention_args *args, int64_t *bytes) {
    if (bytes == nullptr) return fk::fail(FK_ERR_NULL_POINTER, "bytes is NULL");
    *bytes = 0;
    fk::Validated v{};
    if (int32_t st = fk::validate(args, 0, &v)) return st;
    if (args->precision != FK_PRECISION_EXACT) return fk::no_fp8("on the cpu target");
    return fk::ok();
}

}  // extern "C"
