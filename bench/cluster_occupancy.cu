// How many clusters of 1, 2 and 4 CTAs of the Hopper kernel's shape (384 threads, the bucket-128
// tile's dynamic shared memory, one CTA an SM) the device runs at once: a cluster launch can leave
// SMs idle where a GPC's free SMs do not divide into whole clusters.
//   nvcc -O2 -std=c++17 -arch=sm_90a -DFK_WGMMA -I flash_kernel/include -I flash_kernel/src \
//       bench/cluster_occupancy.cu -o /tmp/cluster_occupancy && /tmp/cluster_occupancy
#include <cstdio>
#include <cuda_runtime.h>
#include "gpu/fk_traits.h"

__global__ void __launch_bounds__(384, 1) probe() {
    extern __shared__ unsigned char smem[];
    if (threadIdx.x == 0) smem[0] = 0;
}

int main() {
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    const int bytes = fk::WgmmaTile<128>::kSmemBytes;
    if (cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess) return 1;
    std::printf("SMs %d, %d bytes of shared memory a CTA\n", sms, bytes);
    for (int size : {1, 2, 4}) {
        cudaLaunchConfig_t cfg{};
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = size;
        at[0].val.clusterDim.y = 1;
        at[0].val.clusterDim.z = 1;
        cfg.gridDim = dim3(size, 1, 1);
        cfg.blockDim = dim3(384, 1, 1);
        cfg.dynamicSmemBytes = bytes;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        int n = 0;
        const cudaError_t e = cudaOccupancyMaxActiveClusters(&n, probe, &cfg);
        std::printf("cluster size %d: %d clusters at once (%d SMs busy)%s%s\n", size, n, n * size,
                    e == cudaSuccess ? "" : " error: ", e == cudaSuccess ? "" : cudaGetErrorString(e));
    }
    return 0;
}
