// fma_peak.cu: the fp32 FMA peak the GPU reaches on the day: the denominator of "the forced-generic
// path reaches >= 40% of the GPU's fp32 FMA peak" (docs/perf.md).
//
// Build and run (the device machine):
//   nvcc -O3 -arch=sm_90 -o fma_peak bench/fma_peak.cu && ./fma_peak [iterations] [repeats]
//
// Every thread runs kChains independent FMA chains x = fma(x, b, c) (b, c are kernel arguments,
// so nothing folds), the grid is whole waves of the occupancy-limited block count on every SM,
// and each launch is timed with CUDA events; the best and the median launch are reported. The
// sum of each thread's chains is written out and two threads' sums are recomputed on the host
// with std::fmaf (IEEE fma, same order): equal bits prove every FMA ran and nothing was
// optimised away. Thread 0 of block 0 also reads clock64() and %globaltimer at its start and
// end, giving the SM clock the run actually got. Prints:
//   device <name> sm_<cc> sms <n> clock_mhz <attribute> fp32_lanes_per_sm <n>
//   fma_peak_tflops <best>   (then the median, the measured SM clock, and the datasheet figure)
//   datasheet_tflops <sms x lanes x 2 x boost clock>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK(call)                                                                               \
    do {                                                                                          \
        cudaError_t err_ = (call);                                                                \
        if (err_ != cudaSuccess) {                                                                \
            std::fprintf(stderr, "fma_peak: %s failed: %s (%s:%d)\n", #call, cudaGetErrorString(err_), \
                         __FILE__, __LINE__);                                                     \
            std::exit(1);                                                                         \
        }                                                                                         \
    } while (0)

constexpr int kChains = 8;      // independent FMAs in flight per thread
constexpr int kUnroll = 16;     // inner steps per loop trip
constexpr int kThreads = 256;

__device__ __forceinline__ unsigned long long globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Powers of two: the products are exact, so contracting them into an FMA changes nothing and the
// host reproduces the start values bit for bit.
__host__ __device__ __forceinline__ float chain_start(long long tid, int j) {
    return float(tid % 1021) * 0.0009765625f + float(j) * 0.0078125f;
}

__global__ void __launch_bounds__(kThreads) fma_kernel(float *out, unsigned long long *clk, int trips, float b,
                                                       float c) {
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long c0 = 0, t0 = 0;
    if (tid == 0) {
        c0 = clock64();
        t0 = globaltimer();
    }
    float x[kChains];
#pragma unroll
    for (int j = 0; j < kChains; ++j) x[j] = chain_start(tid, j);
    for (int i = 0; i < trips; ++i) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
            for (int j = 0; j < kChains; ++j) x[j] = __fmaf_rn(x[j], b, c);
        }
    }
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < kChains; ++j) s += x[j];
    out[tid] = s;  // a dependent value: the chains cannot be dropped
    if (tid == 0) {
        clk[0] = clock64() - c0;
        clk[1] = globaltimer() - t0;
    }
}

static float host_sum(long long tid, long long steps, float b, float c) {
    float s = 0.0f;
    for (int j = 0; j < kChains; ++j) {
        float x = chain_start(tid, j);
        for (long long i = 0; i < steps; ++i) x = std::fmaf(x, b, c);
        s += x;
    }
    return s;
}

static int fp32_lanes_per_sm(int major, int minor) {
    // FP32 cores per SM by architecture (CUDA C Programming Guide, "Arithmetic Instructions"
    // throughput table: 32-bit fma results per clock per multiprocessor).
    if (major == 9 || major == 10 || major == 12) return 128;
    if (major == 8) return minor == 0 ? 64 : 128;
    if (major == 7) return 64;
    return 0;
}

int main(int argc, char **argv) {
    const int trips = argc > 1 ? std::atoi(argv[1]) : 4096;
    const int repeats = argc > 2 ? std::atoi(argv[2]) : 20;
    if (trips < 1 || repeats < 1) {
        std::fprintf(stderr, "fma_peak: usage: fma_peak [trips >= 1] [repeats >= 1]\n");
        return 2;
    }
    int dev = 0;
    CHECK(cudaGetDevice(&dev));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, dev));
    int sms = 0, clock_khz = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev));
    const int lanes = fp32_lanes_per_sm(prop.major, prop.minor);

    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fma_kernel, kThreads, 0));
    const int waves = 8;  // whole waves: no SM idles at the tail
    const long long blocks = (long long)sms * per_sm * waves;
    const long long threads = blocks * kThreads;
    const long long steps = (long long)trips * kUnroll;  // FMAs per chain
    const double flops = 2.0 * double(threads) * kChains * double(steps);

    float *out = nullptr;
    unsigned long long *clk = nullptr;
    CHECK(cudaMalloc(&out, threads * sizeof(float)));
    CHECK(cudaMalloc(&clk, 2 * sizeof(unsigned long long)));
    const float b = 0.9999f, c = 1.0e-4f;  // x -> c / (1 - b) = 1: no overflow, no denormals

    fma_kernel<<<(unsigned)blocks, kThreads>>>(out, clk, trips, b, c);  // warm-up (clocks ramp)
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());

    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    std::vector<float> ms(repeats);
    for (int r = 0; r < repeats; ++r) {
        CHECK(cudaEventRecord(e0));
        fma_kernel<<<(unsigned)blocks, kThreads>>>(out, clk, trips, b, c);
        CHECK(cudaGetLastError());
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        CHECK(cudaEventElapsedTime(&ms[r], e0, e1));
    }
    unsigned long long hclk[2] = {0, 0};
    CHECK(cudaMemcpy(hclk, clk, sizeof(hclk), cudaMemcpyDeviceToHost));

    // every FMA ran: two threads' sums, recomputed on the host, bit for bit
    const long long probe[2] = {0, threads - 1};
    for (long long t : probe) {
        float dev_sum = 0.0f;
        CHECK(cudaMemcpy(&dev_sum, out + t, sizeof(float), cudaMemcpyDeviceToHost));
        const float want = host_sum(t, steps, b, c);
        if (std::memcmp(&dev_sum, &want, sizeof(float)) != 0) {
            std::fprintf(stderr, "fma_peak: thread %lld sum %.9g != host %.9g: the kernel did not do its work\n",
                         t, dev_sum, want);
            return 1;
        }
    }

    std::vector<float> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    const double best_tf = flops / (sorted.front() * 1e-3) / 1e12;
    const double median_tf = flops / (sorted[repeats / 2] * 1e-3) / 1e12;
    const double sm_mhz = hclk[1] ? double(hclk[0]) / double(hclk[1]) * 1e3 : 0.0;
    const double sheet_tf = double(sms) * lanes * 2.0 * clock_khz * 1e3 / 1e12;

    std::printf("device %s sm_%d%d sms %d clock_mhz %.0f fp32_lanes_per_sm %d\n", prop.name, prop.major,
                prop.minor, sms, clock_khz / 1e3, lanes);
    std::printf("grid %lld blocks x %d threads (%d per SM, %d waves), %d chains x %lld FMAs, %.3g FLOP per launch\n",
                blocks, kThreads, per_sm, waves, kChains, steps, flops);
    std::printf("fma_peak_tflops %.2f\n", best_tf);
    std::printf("fma_median_tflops %.2f (of %d launches; best %.3f ms, median %.3f ms)\n", median_tf, repeats,
                sorted.front(), sorted[repeats / 2]);
    std::printf("measured_sm_clock_mhz %.0f (clock64 / globaltimer in one thread, last launch)\n", sm_mhz);
    if (lanes)
        std::printf("datasheet_tflops %.2f (%d SMs x %d FP32 lanes x 2 x %.0f MHz); measured = %.1f%% of it\n",
                    sheet_tf, sms, lanes, clock_khz / 1e3, 100.0 * best_tf / sheet_tf);
    else
        std::printf("datasheet_tflops unknown (FP32 lanes per SM not tabled for sm_%d%d)\n", prop.major, prop.minor);
    CHECK(cudaFree(out));
    CHECK(cudaFree(clk));
    return 0;
}
