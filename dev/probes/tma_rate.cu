// tma_rate.cu: how fast the tensor copy engine fills a ring of stages shaped as the warp-specialised
// kernel's, with nothing consuming them (lab only). At M = 64-128 the kernel's MMA warps wait on
// stages that its producer asked for only about one k-block earlier, and the producer, late,
// still issues one stage a k-block (dev/LOG.md, eighteenth session): this measures what the copy
// engine and the memory behind it deliver to one SM, and to all of them at once, when the ring is
// refilled the moment a stage lands (an infinitely fast consumer), against the kernel's own rate.
//
// One block of one warp per SM (or fewer blocks); lane 0 walks `steps` ring steps: wait for the
// slot's previous copies to land, expect the stage's bytes, then start the stage's copies as the
// kernel does: the weights as one box of R / 8 512-byte tiles (the w4-gemv layout, the permuted
// order's whole 512-byte rows, from a 553 MB buffer so that they come from DRAM: block b reads row
// block b over consecutive k-blocks, none twice in a launch), and x as two 64-k atoms of T tokens
// (128-byte swizzle, from a 4 MB fp16 [256, 8192] buffer that stays in L2; every block reads the
// same tokens, as the row blocks of one token tile do). With `map_rows` < T the x map holds fewer
// rows than the box (the rows past it arrive as zeros, as a part-empty token tile's did before the
// tail box). Results: dev/LOG.md, nineteenth session, step 4.
// Per configuration, over 8 launches after one warm-up: the median block's bytes a nanosecond
// (global timer, first issue to last landing), the sum over blocks against the launch's span, and
// the mean clock cycles one copy's issue takes (lane 0's clock around each cp.async.bulk.tensor).
//
//     nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I kernels dev/probes/tma_rate.cu -o build/tma_rate
//     build/tma_rate
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "probe.cuh"

constexpr int kXRows = 256, kXCols = 8192;             // x: 4 MB, in L2
constexpr int kWRows = 132 * 256, kWKblocks = 256;     // weights: 33792 x 32768 int4, 553 MB
constexpr int kMaxBlocks = 132;

struct Cfg {
  int blocks, tokens, map_rows, rows, stages, steps;
};
struct Params {
  int tokens, tiles8, stages, steps, stage_bytes;
};
struct Result {
  unsigned long long t0, t1, issue_cycles, issues;
};

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void __launch_bounds__(32, 1) tma_ring(const __grid_constant__ CUtensorMap xmap,
                                                   const __grid_constant__ CUtensorMap wmap, Params p, Result* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t bars[8];
  if (threadIdx.x != 0) return;
  const uint32_t smem0 = (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) + 1023) & ~1023u;
  const uint32_t bar0 = static_cast<uint32_t>(__cvta_generic_to_shared(bars));
  for (int s = 0; s < p.stages; ++s) w4::mbar_init(bar0 + 8 * s, 1);
  w4::fence_mbar_init();
  const uint64_t policy = w4::evict_normal_policy();
  const uint32_t x_bytes = p.tokens > 0 ? 2u * p.tokens * 128 : 0, w_bytes = p.tiles8 * 512u;
  unsigned long long cycles = 0, issues = 0;
  const unsigned long long t0 = now_ns();
  for (int i = 0; i < p.steps; ++i) {
    const int s = i % p.stages;
    const uint32_t bar = bar0 + 8 * s, st = smem0 + s * p.stage_bytes;
    if (i >= p.stages) w4::mbar_wait(bar, ((i / p.stages) - 1) & 1);
    w4::mbar_arrive_expect_tx(bar, x_bytes + w_bytes);
    const long long c0 = clock64();
    if (p.tiles8 > 0)
      w4::tensor_copy_4d_g2s(st + x_bytes, &wmap, 0, 0, i % kWKblocks, blockIdx.x * p.tiles8, bar, policy);
    if (p.tokens > 0) {
      const int k0 = (i % (kXCols / 128)) * 128;
      w4::tensor_copy_2d_g2s(st, &xmap, k0, 0, bar, policy);
      w4::tensor_copy_2d_g2s(st + p.tokens * 128, &xmap, k0 + 64, 0, bar, policy);
    }
    cycles += clock64() - c0;
    issues += (p.tiles8 > 0) + 2 * (p.tokens > 0);
  }
  for (int i = p.steps > p.stages ? p.steps - p.stages : 0; i < p.steps; ++i)
    w4::mbar_wait(bar0 + 8 * (i % p.stages), (i / p.stages) & 1);
  out[blockIdx.x] = {t0, now_ns(), cycles, issues};
#endif
}

static PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found;
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess) {
    printf("no cuTensorMapEncodeTiled\n");
    exit(1);
  }
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
}

static CUtensorMap encode(CUtensorMapDataType type, int rank, void* base, const cuuint64_t* dims,
                          const cuuint64_t* strides, const cuuint32_t* box, bool swizzled) {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = encoder();
  CUtensorMap map;
  const cuuint32_t steps[4] = {1, 1, 1, 1};
  if (fn(&map, type, rank, base, dims, strides, box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE,
         swizzled ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    printf("tensor map encode failed\n");
    exit(1);
  }
  return map;
}

static void run(const Cfg& c, void* x, void* w, Result* d_out, int clock_khz) {
  const int tiles8 = c.rows / 8;
  const cuuint64_t xdims[2] = {kXCols, (cuuint64_t)(c.map_rows > 0 ? c.map_rows : kXRows)};
  const cuuint64_t xstrides[1] = {kXCols * 2};
  const cuuint32_t xbox[2] = {64, (cuuint32_t)(c.tokens > 0 ? c.tokens : 64)};
  const CUtensorMap xmap = encode(CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, x, xdims, xstrides, xbox, true);
  const cuuint64_t wdims[4] = {128, 1, kWKblocks, kWRows / 8};
  const cuuint64_t wstrides[3] = {512, 512, (cuuint64_t)kWKblocks * 512};
  const cuuint32_t wbox[4] = {128, 1, 1, (cuuint32_t)(tiles8 > 0 ? tiles8 : 1)};
  const CUtensorMap wmap = encode(CU_TENSOR_MAP_DATA_TYPE_INT32, 4, w, wdims, wstrides, wbox, false);
  const int stage_bytes = (2 * c.tokens * 128 + tiles8 * 512 + 1023) / 1024 * 1024;
  const Params p{c.tokens, tiles8, c.stages, c.steps, stage_bytes};
  const int smem = c.stages * stage_bytes + 1024;
  if (smem > 227 * 1024) {
    printf("skip: %d stages of %d B do not fit\n", c.stages, stage_bytes);
    return;
  }
  CK(cudaFuncSetAttribute(tma_ring, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  std::vector<double> per_block, aggregate, issue;
  std::vector<Result> h(c.blocks);
  for (int rep = 0; rep < 9; ++rep) {
    tma_ring<<<c.blocks, 32, smem>>>(xmap, wmap, p, d_out);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    if (rep == 0) continue;
    CK(cudaMemcpy(h.data(), d_out, c.blocks * sizeof(Result), cudaMemcpyDeviceToHost));
    const double bytes = (double)c.steps * (2.0 * c.tokens * 128 + tiles8 * 512);
    unsigned long long lo = ~0ull, hi = 0, cyc = 0, n = 0;
    for (const Result& r : h) {
      per_block.push_back(bytes / (double)(r.t1 - r.t0));
      lo = std::min(lo, r.t0), hi = std::max(hi, r.t1), cyc += r.issue_cycles, n += r.issues;
    }
    aggregate.push_back(bytes * c.blocks / (double)(hi - lo));
    issue.push_back(n ? (double)cyc / n : 0);
  }
  std::sort(per_block.begin(), per_block.end());
  std::sort(aggregate.begin(), aggregate.end());
  std::sort(issue.begin(), issue.end());
  const double issue_cyc = issue[issue.size() / 2];
  printf("blocks %3d  x %3d tokens (map %3d rows)  w %3d rows  %d stages of %3d KB: per block %6.1f B/ns "
         "(slowest %6.1f), all %7.0f GB/s, issue %6.0f cycles (%5.0f ns) a copy\n",
         c.blocks, c.tokens, c.map_rows > 0 ? c.map_rows : kXRows, c.rows, c.stages, stage_bytes / 1024,
         per_block[per_block.size() / 2], per_block.front(), aggregate[aggregate.size() / 2], issue_cyc,
         issue_cyc * 1e6 / clock_khz);
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  int clock_khz = 0;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  printf("%s, %d SMs, %d MHz\n", prop.name, prop.multiProcessorCount, clock_khz / 1000);
  const int sms = std::min(prop.multiProcessorCount, kMaxBlocks);
  void *x, *w;
  Result* d_out;
  CK(cudaMalloc(&x, (size_t)kXRows * kXCols * 2));
  CK(cudaMalloc(&w, (size_t)kWRows * kWKblocks * 64));
  CK(cudaMemset(x, 0x3c, (size_t)kXRows * kXCols * 2));
  CK(cudaMemset(w, 0x5a, (size_t)kWRows * kWKblocks * 64));
  CK(cudaMalloc(&d_out, kMaxBlocks * sizeof(Result)));
  const int steps = 256;
  // (blocks, tokens, map rows, weight rows, stages, steps): the kernel's variants' stages first
  const Cfg cfgs[] = {
      {sms, 64, 0, 128, 8, steps},  {sms, 64, 0, 256, 6, steps},   {sms, 128, 0, 128, 5, steps},
      {sms, 128, 0, 256, 4, steps}, {sms, 256, 0, 128, 3, steps},
      // the weights alone (DRAM), and x alone (L2), all SMs and one
      {sms, 0, 0, 128, 8, steps},   {sms, 0, 0, 256, 8, steps},    {1, 0, 0, 256, 8, steps},
      {sms, 64, 0, 0, 8, steps},    {sms, 128, 0, 0, 5, steps},    {sms, 256, 0, 0, 3, steps},
      {1, 128, 0, 0, 5, steps},     {1, 256, 0, 0, 3, steps},
      // half the SMs: does the sum hold (a shared limit) or the per-block rate (the SM's own)?
      {sms / 2, 128, 0, 128, 5, steps}, {sms / 2, 128, 0, 0, 5, steps},
      // rows past the map: zero-filled, no memory read
      {sms, 128, 64, 0, 5, steps},  {sms, 128, 1, 0, 5, steps},    {1, 128, 1, 0, 5, steps},
      {sms, 256, 160, 128, 3, steps},
      // deeper rings of the same stages (smaller x tiles): is it bytes in flight?
      {sms, 64, 0, 128, 4, steps},  {sms, 64, 0, 128, 2, steps},   {sms, 128, 0, 128, 2, steps},
  };
  for (const Cfg& c : cfgs) run(c, x, w, d_out, clock_khz);
  return 0;
}
