// launch.cuh: one kernel launch, with or without programmatic dependent launch (PDL: the kernel may
// start while the previous kernel in the stream still runs; tensor_core.cuh's pdl_wait orders its
// reads of activations and its writes after that kernel) and thread block clusters. Host code; the
// launchers' one way to launch.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace w4 {

// Clusters of (1, cluster_y, 1) blocks, as a launch attribute (sm_90; the grid's y a multiple of it).
inline cudaLaunchAttribute cluster_attribute(int cluster_y) {
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = 1;
  attribute.val.clusterDim.y = static_cast<unsigned>(cluster_y);
  attribute.val.clusterDim.z = 1;
  return attribute;
}

// A launch's shape with `n` attributes (the array outlives the config's use).
inline cudaLaunchConfig_t launch_config(dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                        cudaLaunchAttribute* attributes, unsigned n) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = n;
  return config;
}

// cluster_y > 1: clusters of (1, cluster_y, 1) blocks.
template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*fn)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                          int cluster_y, Args&&... args) {
  cudaLaunchAttribute attributes[2];
  unsigned n = 0;
  if (pdl) {
    attributes[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_y > 1) attributes[n++] = cluster_attribute(cluster_y);
  const cudaLaunchConfig_t config = launch_config(grid, block, smem, stream, attributes, n);
  return cudaLaunchKernelEx(&config, fn, std::forward<Args>(args)...);
}

}  // namespace w4
