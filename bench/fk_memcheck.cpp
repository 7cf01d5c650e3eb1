// Calls the C ABI over the GPU test shapes with exact-size buffers; returns non-zero on any failure.
// Every other (dtype, layout) asks for the log-sum-exp too, into an exact-size fp32 buffer, so both the
// epilogue that writes it and the one that does not run under the sanitizers. FK_DRIVER_FP8: the
// calls ask for precision fp8 instead (head dims up to 128, the flash path alone), each with a
// workspace of exactly fk_workspace_bytes.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <array>
#include <vector>
#include "flash_kernel.h"
typedef int32_t (*fwd_t)(const fk_attention_args *);
static uint16_t f2h(float f) {  // fp32 -> fp16, values here are small normals
    uint32_t u; std::memcpy(&u, &f, 4);
    uint32_t s = (u >> 16) & 0x8000u; int e = int((u >> 23) & 0xff) - 127 + 15; uint32_t m = (u >> 13) & 0x3ffu;
    if (e <= 0) return uint16_t(s); return uint16_t(s | (uint32_t(e) << 10) | m);
}
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { std::printf("dlopen: %s\n", dlerror()); return 2; }
    fwd_t flash = (fwd_t)dlsym(h, "fk_flash_forward"), naive = (fwd_t)dlsym(h, "fk_naive_forward");
    const char *(*err)() = (const char *(*)())dlsym(h, "fk_last_error");
    int32_t (*ws_bytes)(const fk_attention_args *, int64_t *) =
        (int32_t (*)(const fk_attention_args *, int64_t *))dlsym(h, "fk_workspace_bytes");
    std::vector<std::array<long, 4>> shapes = {{2,3,1,1},{2,3,77,77},{2,2,1000,1000},{1,2,4097,4097},{2,2,77,1000},{1,3,1000,77},{2,1,1,4097},{1,2,4097,1}};
    if (const char *m = std::getenv("FK_DRIVER_MANY"); m && *m) {
        // the persistent grid's shapes instead: more work items than SMs (blocks loop over several,
        // the K/V ring and the Q buffers run on across items), ragged query and key tiles
        int sms = 0;
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
        shapes = {{1, sms + 7L, 300, 1000}, {2, sms + 3L, 129, 100}, {1, 2L * sms + 1, 128, 128}, {1, sms + 1L, 256, 512}};
    }
    std::vector<int> dims = {32, 40, 64, 72, 96, 128, 160, 192, 256};  // exact buckets and padded head dims
    const char *only = std::getenv("FK_DRIVER_DIMS");
    if (only) {  // e.g. "40,72,160": these alone (FK_DRIVER_SMALL keeps them all)
        dims.clear();
        for (const char *p = only; *p;) { dims.push_back(std::atoi(p)); while (*p && *p != ',') ++p; if (*p) ++p; }
    }
    int calls = 0, bad = 0;
    auto on = [](const char *name) { const char *v = std::getenv(name); return v && *v; };
    const bool small = on("FK_DRIVER_SMALL");            // racecheck: fewer, smaller calls
    const bool flash_only = on("FK_DRIVER_FLASH_ONLY");  // ... and not the naive path
    const long small_n = on("FK_DRIVER_MAX_N") ? std::atol(std::getenv("FK_DRIVER_MAX_N")) : 1000;  // racecheck: the largest N
    const bool fp8 = on("FK_DRIVER_FP8");
    for (auto &s : shapes) for (int d : dims) for (int dt = 0; dt < 3; ++dt) for (int lay = 0; lay < 2; ++lay) {
        if (small && (s[2] > small_n || s[3] > small_n || dt == 0 || (!only && d != 64 && d != 128 && d != 72 && d != 192))) continue;
        if (d != 64 && d != 128 && (s[2] > 1000 || s[3] > 1000)) continue;  // keep it short
        if (fp8 && d > 128) continue;  // the FP8 kernel's head dims
        long B = s[0], H = s[1], nq = s[2], nk = s[3]; size_t es = dt == 0 ? 4 : 2;
        size_t nqe = B * H * nq * d, nke = B * H * nk * d;
        std::vector<unsigned char> host(nke > nqe ? nke * es : nqe * es);
        for (size_t i = 0; i < host.size() / es; ++i) {
            float f = float(std::rand() % 2001 - 1000) / 1000.0f;
            if (dt == 0) std::memcpy(&host[i * 4], &f, 4);
            else { uint32_t u; std::memcpy(&u, &f, 4); uint16_t x = dt == 1 ? f2h(f) : uint16_t(u >> 16); std::memcpy(&host[i * 2], &x, 2); }
        }
        void *q, *k, *v, *o; float *lse = nullptr;
        cudaMalloc(&q, nqe * es); cudaMalloc(&k, nke * es); cudaMalloc(&v, nke * es); cudaMalloc(&o, nqe * es);
        const bool with_lse = (dt + lay) % 2 == 1;
        if (with_lse) cudaMalloc(&lse, size_t(B * H * nq) * sizeof(float));
        cudaMemcpy(q, host.data(), nqe * es, cudaMemcpyHostToDevice);
        cudaMemcpy(k, host.data(), nke * es, cudaMemcpyHostToDevice);
        cudaMemcpy(v, host.data(), nke * es, cudaMemcpyHostToDevice);
        fk_attention_args a{}; a.abi_version = FK_ABI_VERSION; a.dtype = dt; a.q = q; a.k = k; a.v = v; a.o = o;
        a.batch = B; a.heads = H; a.nq = nq; a.nk = nk; a.head_dim = d;
        auto st = [&](int64_t *x, long n) { if (lay == 0) { x[0] = H * n * d; x[1] = n * d; x[2] = d; } else { x[0] = n * H * d; x[1] = d; x[2] = H * d; } };
        st(a.q_stride, nq); st(a.o_stride, nq); st(a.k_stride, nk); st(a.v_stride, nk);
        if (with_lse) {  // (B, H, Nq) contiguous in one layout, (B, Nq, H) in the other
            a.lse = lse; a.lse_stride[0] = H * nq;
            if (lay == 0) { a.lse_stride[1] = nq; a.lse_stride[2] = 1; } else { a.lse_stride[1] = 1; a.lse_stride[2] = H; }
        }
        void *ws = nullptr;
        if (fp8) {
            a.precision = FK_PRECISION_FP8;
            int64_t need = 0;
            if (ws_bytes(&a, &need) != 0 || need <= 0) { ++bad; std::printf("FAIL fk_workspace_bytes: %s\n", err()); }
            cudaMalloc(&ws, size_t(need)); a.workspace = ws; a.workspace_bytes = need;
        }
        for (int which = 0; which < (flash_only || fp8 ? 1 : 2); ++which) {
            int32_t rc = (which ? naive : flash)(&a); cudaError_t e = cudaDeviceSynchronize(); ++calls;
            if (rc != 0 || e != cudaSuccess) { ++bad; std::printf("FAIL %s B%ld H%ld nq%ld nk%ld d%d dt%d lay%d lse%d rc %d (%s) cuda %s\n", which ? "naive" : "flash", B, H, nq, nk, d, dt, lay, int(with_lse), rc, err(), cudaGetErrorString(e)); }
        }
        // misaligned pointer: refused before any launch
        a.q = (char *)q + 2; int32_t rc = flash(&a); ++calls;
        if (rc != FK_ERR_ALIGNMENT) { ++bad; std::printf("FAIL misaligned q accepted (rc %d)\n", rc); }
        cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(o); if (lse) cudaFree(lse); if (ws) cudaFree(ws);
    }
    std::printf("memcheck driver: %d calls, %d failures\n", calls, bad);
    return bad ? 1 : 0;
}
