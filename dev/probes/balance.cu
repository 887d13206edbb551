// balance.cu: a standalone probe (not built into w4): would handing out the GEMV's work at run
// time, grid-wide, let its read pattern reach more of the copy rate on the 29-34 MB shapes?
// Answers dev/LOG.md, GEMV, steps 43 and 44.
//
// Step 41 found that the default kernel ends with its slowest warps, 2.6-2.8 us after the median
// warp issued its last load, and that warps of one SM leave their rings 1.3-2.3 us apart. Before
// building a grid-wide work queue into the kernel, this probe measures what such a queue buys on
// the weight reads alone, with and without work per k-block, and what its fix-up costs.
//
// Every kernel here walks units of C k-blocks (unit u: 16-row tile u / (KB/C), k-blocks
// (u % (KB/C)) * C ..) of the w4-gemv layout [N/8][KB][8][16] int32, each warp reading the two
// 512-byte tiles of rows 0-7 and 8-15 per k-block with 16-byte `ld.global.nc.L1::no_allocate`
// loads and an L2 evict-first policy, through the default kernel's two-slot register ring (the
// next k-block's loads are issued before the current one is consumed; the ring runs on across
// units). "Consuming" a k-block XORs its words and, with WORK > 0, runs a chain of WORK dependent
// fp32 FMAs seeded by them (a stand-in for the conversion and mma; WORK is calibrated below
// against the default kernel's own time). A warp takes its first F units statically (warp w:
// units [wF, (w+1)F)) and, with `dynamic`, then takes units from one global counter (one atomic
// per unit, asked for a unit ahead so the answer is back before it is needed). With `fixup`,
// each unit ends as the real kernel would have to: its 16 fp32 sums (M = 1) are stored to a
// per-unit slot, a fence, an atomic on the tile's counter, and the tile's last unit reads the
// tile's slots in unit order and stores 16 fp16 outputs (deterministic whichever warp took which
// unit). Counters reset themselves (the warp that takes the last ticket; the tile's last unit).
// Launch shapes:
//   static    the default kernel's: one block of S warps per tile, warp w of the tile reads
//             k-blocks [wP, (w+1)P) (C = P, F = 1), S and the 16 warps per SM as the kernel picks
//             them (dynamic shared memory holds the blocks per SM to the kernel's 128-register
//             occupancy)
//   queue     one 16-warp block per SM (2112 warps), F static units each, the rest from the queue
// Timing: CUDA graph over rotating sets (> 4x the 50 MiB L2 per round), 40 replays, median; % of
// a 512 MiB copy by an SM kernel timed the same way (the bytes counted are the weights alone).
// `balance rotate` times only the static split, plain and with each unit's k-blocks walked from
// a rotated start ((j + u R) mod P, R = 1, 3, 5), so that warps running in step read different
// offsets of their tiles (step 44).
// Build and run on a GPU machine (from the repository root):
//   mkdir -p build && nvcc -O3 -std=c++17 -arch=sm_90 -I kernels dev/probes/balance.cu -o build/balance
//   build/balance [rotate]
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "gemv_w4a16.cu"  // kernels/, through -I kernels
#include "probe.cuh"

struct Geo {
  int kblocks, units_per_tile, C, units, F;
  bool dynamic, fixup;
  int rot = 0;  // unit u walks its k-blocks starting at (u * rot) % C, wrapping (step 44)
};

// One k-block of a unit: the two 512-byte tiles of rows 0-7 and 8-15.
struct Slot {
  uint4 lo, hi;
};

__device__ __forceinline__ void load_slot(Slot& s, const uint4* a, const Geo& g, int unit, int j,
                                          int lane, uint64_t pol) {
  const int tile = unit / g.units_per_tile;
  const int kb = (unit % g.units_per_tile) * g.C + (g.rot ? (j + unit * g.rot) % g.C : j);
  const size_t lo = ((size_t)(2 * tile) * g.kblocks + kb) * 32 + lane;
  s.lo = ldw(a + lo, pol);
  s.hi = ldw(a + lo + (size_t)g.kblocks * 32, pol);
}

template <int WORK>
__device__ __forceinline__ void consume(const Slot& s, float& f, uint32_t& acc) {
  acc ^= s.lo.x ^ s.lo.y ^ s.lo.z ^ s.lo.w ^ s.hi.x ^ s.hi.y ^ s.hi.z ^ s.hi.w;
  if (WORK > 0) {
    float v = __uint_as_float((acc & 0x007fffffu) | 0x3f800000u) + f;
#pragma unroll
    for (int i = 0; i < WORK; ++i) v = fmaf(v, 0.999f, 1e-3f);
    f = v;
  }
}

// The fix-up the real kernel would need per unit (M = 1: lanes with t = 0 hold rows g and g+8).
__device__ __forceinline__ void finish_unit(const Geo& g, int unit, float f, int lane,
                                            float2* partials, unsigned* tile_count, __half* y) {
  const int tile = unit / g.units_per_tile;
  if ((lane & 3) == 0) partials[(size_t)unit * 8 + (lane >> 2)] = make_float2(f, -f);
  __threadfence();
  unsigned old = 0;
  if (lane == 0) old = atomicAdd(&tile_count[tile], 1u);
  old = __shfl_sync(0xffffffffu, old, 0);
  if (old == (unsigned)g.units_per_tile - 1) {
    __threadfence();
    if ((lane & 3) == 0) {
      float2 sum = make_float2(0.f, 0.f);
      for (int u = 0; u < g.units_per_tile; ++u) {
        const float2 p = __ldcg(&partials[((size_t)tile * g.units_per_tile + u) * 8 + (lane >> 2)]);
        sum.x += p.x;
        sum.y += p.y;
      }
      y[tile * 16 + (lane >> 2)] = __float2half(sum.x);
      y[tile * 16 + 8 + (lane >> 2)] = __float2half(sum.y);
    }
    if (lane == 0) tile_count[tile] = 0;
  }
}

// The copy ceiling the way w4's harness measures it: an SM kernel (not the copy engine, which
// reaches about 20% less on an H100), read + write counted.
__global__ void copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

template <int WORK>
__global__ void walk(const uint4* __restrict__ a, Geo g, unsigned* queue, unsigned* tile_count,
                     float2* partials, __half* y, uint32_t* out) {
  const int lane = threadIdx.x & 31;
  const int nwarps = gridDim.x * (blockDim.x >> 5);
  const int w = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const uint64_t pol = pol_ef();
  const int dyn_units = g.units - nwarps * g.F;
  // the i-th unit of this warp: static ones first, then tickets
  auto ticket = [&]() -> unsigned {
    unsigned t = 0;
    if (lane == 0) t = atomicAdd(queue, 1u);
    return t;
  };
  auto resolve = [&](unsigned t) -> int {
    t = __shfl_sync(0xffffffffu, t, 0);
    if (t == (unsigned)(dyn_units > 0 ? dyn_units : 0) + nwarps - 1 && lane == 0) *queue = 0;
    return (int)t < dyn_units ? nwarps * g.F + (int)t : -1;
  };
  int i = 0;
  int unit = g.F > 0 ? w * g.F : (g.dynamic ? resolve(ticket()) : -1);
  if (unit >= g.units) unit = -1;
  uint32_t acc = 0;
  float f = 0.f;
  Slot A, B;
  if (unit >= 0) load_slot(A, a, g, unit, 0, lane, pol);
  while (unit >= 0) {
    // ask for the unit after this one now, so the atomic is back before its loads are due
    const bool next_static = i + 1 < g.F;
    unsigned pending = 0;
    if (!next_static && g.dynamic) pending = ticket();
    int next = -1;
    for (int j = 0; j < g.C; j += 2) {
      load_slot(B, a, g, unit, j + 1, lane, pol);
      consume<WORK>(A, f, acc);
      if (j + 2 < g.C) {
        load_slot(A, a, g, unit, j + 2, lane, pol);
      } else {
        next = next_static ? unit + 1 : (g.dynamic ? resolve(pending) : -1);
        if (next >= 0) load_slot(A, a, g, next, 0, lane, pol);
      }
      consume<WORK>(B, f, acc);
    }
    if (g.fixup) finish_unit(g, unit, f, lane, partials, tile_count, y);
    f = 0.f;
    unit = next;
    ++i;
  }
  if (acc == 0x12345678u) out[0] = acc;
}

int main(int argc, char** argv) {
  // `balance rotate`: only the static split, with its k-ranges walked from rotated starts
  const bool rotate_only = argc > 1 && std::string(argv[1]) == "rotate";
  const int shapes[][2] = {{4096, 14336}, {14336, 4096}, {8192, 8192}, {8192, 28672}, {28672, 8192}};
  int sms = 0;
  int smem_sm = 0, smem_reserved = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0));
  CK(cudaDeviceGetAttribute(&smem_reserved, cudaDevAttrReservedSharedMemoryPerBlock, 0));
  const int warps_per_sm = 16;  // the default kernel's 128 registers
  const size_t pool_bytes = size_t{512} << 20;
  char *pool = nullptr, *pool2 = nullptr;
  CK(cudaMalloc(&pool, pool_bytes));
  CK(cudaMalloc(&pool2, pool_bytes));
  CK(cudaMemset(pool, 0x5a, pool_bytes));
  unsigned *queue = nullptr, *tile_count = nullptr;
  float2* partials = nullptr;
  __half* y = nullptr;
  uint32_t* out = nullptr;
  CK(cudaMalloc(&queue, 4));
  CK(cudaMemset(queue, 0, 4));
  CK(cudaMalloc(&tile_count, 4 << 20));
  CK(cudaMemset(tile_count, 0, 4 << 20));
  CK(cudaMalloc(&partials, 64 << 20));
  CK(cudaMalloc(&y, 1 << 20));
  CK(cudaMalloc(&out, 4));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  for (auto fn : {walk<0>, walk<48>, walk<96>}) {
    CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10));
  }
  // graph of `rounds` launches over rotating sets, 40 replays, median us per launch
  auto time_us = [&](int rounds, auto launch) { return graph_time_us(st, rounds, 2 * rounds, launch); };
  const double copy_us = time_us(4, [&](int) {
    copy_kernel<<<sms * 8, 256, 0, st>>>(reinterpret_cast<const uint4*>(pool), reinterpret_cast<uint4*>(pool2),
                                         pool_bytes / 16);
  });
  const double copy_gbs = 2.0 * pool_bytes / (copy_us * 1e3);
  printf("copy 512 MiB: %.1f us, %.0f GB/s (read + write)\n", copy_us, copy_gbs);
  printf("%-11s %-44s %9s %9s %9s\n", "K x N", "launch", "WORK=0", "WORK=48", "WORK=96");
  for (const auto& sh : shapes) {
    const int K = sh[0], N = sh[1], kblocks = K / 128, tiles = N / 16;
    const size_t bytes = (size_t)K * N / 2;
    const int sets = (int)std::min<size_t>(pool_bytes / bytes, 4 * (size_t{50} << 20) / bytes + 1);
    auto run = [&](const char* name, int grid, int block_warps, size_t smem, Geo g) {
      printf("%5dx%-5d %-44s", K, N, name);
      for (auto fn : {walk<0>, walk<48>, walk<96>}) {
        const double us = time_us(sets, [&](int i) {
          fn<<<grid, block_warps * 32, smem, st>>>(reinterpret_cast<const uint4*>(pool + (size_t)(i % sets) * bytes), g,
                                                   queue, tile_count, partials, y, out);
        });
        printf(" %5.2f %2.0f%%", us, 100.0 * bytes / (us * 1e3) / copy_gbs);
      }
      printf("\n");
    };
    // the default kernel's split: largest power of two S with tiles * S <= 16 warps per SM
    int S = 1;
    while (S < 16 && tiles * S * 2 <= sms * warps_per_sm) S *= 2;
    const int P = kblocks / S;
    // dynamic shared memory so that at most 16 / S blocks (16 warps) fit per SM
    const size_t smem_static = (size_t)smem_sm / (warps_per_sm / S) - smem_reserved;
    char name[96];
    snprintf(name, sizeof name, "static: %d blocks x %d warps, P = %d", tiles, S, P);
    run(name, tiles, S, smem_static, Geo{kblocks, S, P, tiles * S, 1, false, false});
    for (int rot : {1, 3, 5}) {
      snprintf(name, sizeof name, "static, start rotated by unit * %d", rot);
      Geo g{kblocks, S, P, tiles * S, 1, false, false};
      g.rot = rot;
      run(name, tiles, S, smem_static, g);
    }
    if (rotate_only) continue;
    snprintf(name, sizeof name, "static + fix-up (C = %d)", P);
    run(name, tiles, S, smem_static, Geo{kblocks, S, P, tiles * S, 1, false, true});
    const int nwarps = sms * warps_per_sm;
    for (int C : {2, 4, 8}) {
      if (kblocks % C) continue;
      const int units = tiles * (kblocks / C);
      const int fair = units / nwarps;
      std::vector<int> fs = {0, fair * 3 / 4, fair};
      fs.erase(std::unique(fs.begin(), fs.end()), fs.end());
      for (int F : fs) {
        for (bool fix : {false, true}) {
          snprintf(name, sizeof name, "queue C = %d, F = %d of %.1f%s", C, F, units / (double)nwarps, fix ? " + fix-up" : "");
          run(name, sms, warps_per_sm, 120 << 10, Geo{kblocks, kblocks / C, C, units, F, true, fix});
        }
      }
    }
  }
  return 0;
}
