// cluster_fit.cu: how many thread block clusters of S one-block-an-SM blocks run at once (lab only).
// Every warp-specialised variant takes more than half an SM's shared memory, so its blocks run one
// an SM and the clusters that fit depend on the cluster size alone (the GPCs' SM counts), not on
// the variant: this asks the driver (cudaOccupancyMaxActiveClusters) for S = 1..8 with one
// 200 KB block of 384 threads an SM, with the launch attribute and config the kernels' own
// fit_cluster_splits uses (launch.cuh), and prints the SMs those clusters leave idle, for the
// variant model's offline replays.
//
//     nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I kernels dev/probes/cluster_fit.cu -o build/cluster_fit
//     build/cluster_fit
#include <cuda_runtime.h>

#include <cstdio>

#include "launch.cuh"

__global__ void __launch_bounds__(384, 1) one_block_an_sm() {
  extern __shared__ char smem[];
  if (threadIdx.x == 1024) smem[0] = 0;  // never: the kernel only has to exist
}

int main() {
  constexpr int kSmem = 200 * 1024;
  if (cudaFuncSetAttribute(one_block_an_sm, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem) != cudaSuccess ||
      cudaFuncSetAttribute(one_block_an_sm, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
    std::printf("cudaFuncSetAttribute failed\n");
    return 1;
  }
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, device);
  std::printf("%s, %d SMs, one %d KB block of 384 threads an SM\n", prop.name, sms, kSmem / 1024);
  std::printf("S  clusters at once  blocks  SMs idle\n");
  for (int s = 1; s <= 8; ++s) {
    cudaLaunchAttribute attribute = w4::cluster_attribute(s);
    const cudaLaunchConfig_t config = w4::launch_config(dim3(1, s * 64, 1), dim3(384), kSmem, nullptr, &attribute, 1);
    int clusters = 0;
    const cudaError_t err = cudaOccupancyMaxActiveClusters(&clusters, one_block_an_sm, &config);
    if (err != cudaSuccess) {
      std::printf("%d  %s\n", s, cudaGetErrorString(err));
      cudaGetLastError();
      continue;
    }
    std::printf("%d  %16d  %6d  %8d\n", s, clusters, clusters * s, sms - clusters * s);
  }
  return 0;
}
