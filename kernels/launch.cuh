// launch.cuh: one kernel launch, with or without programmatic dependent launch (PDL: the kernel may
// start while the previous kernel in the stream still runs; tensor_core.cuh's pdl_wait orders its
// reads of activations and its writes after that kernel) and thread block clusters. Host code; the
// launchers' one way to launch.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace w4 {

// cluster_y > 1: clusters of (1, cluster_y, 1) blocks (sm_90; the grid's y a multiple of it).
template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*fn)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                          int cluster_y, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attributes[2];
  unsigned n = 0;
  if (pdl) {
    attributes[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_y > 1) {
    attributes[n].id = cudaLaunchAttributeClusterDimension;
    attributes[n].val.clusterDim.x = 1;
    attributes[n].val.clusterDim.y = static_cast<unsigned>(cluster_y);
    attributes[n++].val.clusterDim.z = 1;
  }
  config.attrs = attributes;
  config.numAttrs = n;
  return cudaLaunchKernelEx(&config, fn, std::forward<Args>(args)...);
}

}  // namespace w4
