// batch_tiles.cu: a standalone probe (not built into w4): how far does the GEMV's mma.sync design
// carry past M = 8 if one read of the weight serves every row? Answers dev/LOG.md, "Batch sizes
// M > 8", first measurement.
//
// The shipped kernel takes M <= 8 (one mma n8 tile of activation columns) and w4 calls it once per
// 8 rows, so M = 16 reads the weight twice. Here each converted weight fragment feeds NT n8 tiles
// (M = 8 NT rows): the same lane layout, the same weight load, conversion and per-weight scaling
// as the shipped lean kernel's checked path (its building blocks, included from
// kernels/gemv_w4a16.cu), with lane (g, t) loading x rows g, g + 8, ... g + 8 (NT - 1) straight
// from global memory (16 bytes per row and word; they stay in L1/L2). One block of S warps per
// 16-row tile, split-K across the warps, partials summed in warp order through shared memory.
//
// Checked against the shipped kernel (ceil(M / 8) launches) in the same run: normwise relative
// difference (the shipped kernel scales after the mma on these shapes, so they are not bit-equal).
// Timed as the harness does in miniature (probe.cuh): CUDA graph over 3 rotating weight sets
// (> 4x L2 for the 8192x28672 shape), median.
// Build and run on a GPU machine (from the repository root):
//   mkdir -p build && nvcc -O3 -std=c++17 -arch=sm_90 -I kernels dev/probes/batch_tiles.cu -o build/batch_tiles
//   build/batch_tiles
#include <cuda_fp16.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "gemv_w4a16.cu"  // kernels/, through -I kernels
#include "probe.cuh"

using namespace w4;

// The shipped lean kernel's per-weight step for one k-block (its compute_one), each converted
// weight fragment feeding NT n8 tiles of activations instead of one.
template <int NT>
__device__ __forceinline__ void convert_and_mma(const Block& b, const uint4 (&xv)[NT][4], float (&acc0)[NT][4],
                                                float (&acc1)[NT][4]) {
  const ZeroF16x8 zlo = row_zero(b.z & 0xF), zhi = row_zero(b.z >> 4);
  const uint32_t slo = (b.s & 0xFFFFu) * 0x10001u, shi = (b.s >> 16) * 0x10001u;
  const uint32_t wl[4] = {b.lo.x, b.lo.y, b.lo.z, b.lo.w};
  const uint32_t wh[4] = {b.hi.x, b.hi.y, b.hi.z, b.hi.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    uint32_t dl[4], dh[4];
    u4x8_minus_zero_f16x8(wl[w], zlo, dl);
    u4x8_minus_zero_f16x8(wh[w], zhi, dh);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      dl[i] = mul_f16x2(dl[i], slo);
      dh[i] = mul_f16x2(dh[i], shi);
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      mma_16816(acc0[j], dl[0], dh[0], dl[1], dh[1], xv[j][w].x, xv[j][w].y);
      mma_16816(acc1[j], dl[2], dh[2], dl[3], dh[3], xv[j][w].z, xv[j][w].w);
    }
  }
}

template <int NT>
__global__ void __launch_bounds__(512) gemv_tiles(const Args a) {
  extern __shared__ __align__(16) float part[];  // [S][NT][4][32]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, S = blockDim.x >> 5;
  const Lane<1> l = make_lane<1>(a, lane, warp);
  float acc0[NT][4] = {}, acc1[NT][4] = {};
  const uint4* x16 = reinterpret_cast<const uint4*>(a.x);
  for (int kb = warp * a.kb_per_warp; kb < l.kb_end; ++kb) {
    Block b[1];
    load_blocks<1>(b, kb, a, l);
    uint4 xv[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int row = l.g + 8 * j;
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const int k0 = 128 * kb + 32 * l.t + 8 * w;
        xv[j][w] = (row < a.M && k0 < a.K) ? __ldg(x16 + ((size_t)row * a.K + k0) / 8) : make_uint4(0, 0, 0, 0);
      }
    }
    convert_and_mma<NT>(b[0], xv, acc0, acc1);
  }
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) part[((warp * NT + j) * 4 + i) * 32 + lane] = acc0[j][i] + acc1[j][i];
  __syncthreads();
  for (int o = threadIdx.x; o < NT * 128; o += blockDim.x) {
    const int j = o >> 7, i = (o >> 5) & 3, ln = o & 31;
    const int n = l.tile * 16 + (ln >> 2) + 8 * (i >> 1);
    const int m = 8 * j + 2 * (ln & 3) + (i & 1);
    if (m >= a.M || n >= a.N) continue;
    float sum = 0.f;
    for (int w = 0; w < S; ++w) sum += part[((w * NT + j) * 4 + i) * 32 + ln];
    a.y[(size_t)m * a.N + n] = __float2half_rn(sum);
  }
}

// The same work with the activations staged in shared memory: a block of W x S warps covers W
// 16-row tiles (warp tw of split s: tile blockIdx.x * W + tw, k-blocks s * P ..), and each step
// the block copies the M x 128 activation slice of each split's current k-block into shared
// memory once, for all W tiles: W times less activation traffic than one tile per block.
// Rows are padded by 16 bytes so the lanes' 16-byte reads spread over the banks.
constexpr int kRowHalves = 128 + 8;

template <int NT>
__global__ void __launch_bounds__(512) gemv_tiles_shared(const Args a, int W) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, S = (blockDim.x >> 5) / W;
  const int tw = warp % W, s = warp / W;
  __half* xs = reinterpret_cast<__half*>(smem);  // [S][8 NT][kRowHalves]
  float* part = reinterpret_cast<float*>(smem + (size_t)S * 8 * NT * kRowHalves * 2);  // [S][W][NT][4][32]
  const int tile = blockIdx.x * W + tw;
  const bool live = tile * 16 < a.N;
  // make_lane reads the tile from blockIdx.x: build the lane for this warp's tile by hand
  Lane<1> l;
  l.g = lane >> 2;
  l.t = lane & 3;
  l.tile = live ? tile : 0;
  l.row_lo = l.tile * 16 + l.g;
  l.has_hi = l.tile * 16 + 8 < a.N;
  l.words_n = a.N >> 3;
  l.zshift = 4 * ((l.g >> 1) + 4 * (l.g & 1));
  l.has_x[0] = true;
  l.wlo = a.qweight + (size_t)(2 * l.tile) * a.kblocks * 32 + lane;
  l.whi = l.wlo + (size_t)a.kblocks * 32;
  l.xrow[0] = nullptr;
  l.policy = evict_first_policy();
  const int kb0 = s * a.kb_per_warp;
  l.kb_end = min(kb0 + a.kb_per_warp, a.kblocks);
  float acc0[NT][4] = {}, acc1[NT][4] = {};
  const uint4* x16 = reinterpret_cast<const uint4*>(a.x);
  const int threads_per_split = 32 * W;
  const int tid_in_split = threadIdx.x - s * threads_per_split;
  for (int step = 0; step < a.kb_per_warp; ++step) {
    const int kb = kb0 + step;
    Block b[1];
    load_blocks<1>(b, kb, a, l);
    __half* mine = xs + (size_t)s * 8 * NT * kRowHalves;
    // the split's slice: 8 NT rows x 16 uint4, copied by its W warps
    for (int v = tid_in_split; v < 8 * NT * 16; v += threads_per_split) {
      const int row = v >> 4, col = v & 15, k0 = 128 * kb + 8 * col;
      const uint4 val = (row < a.M && kb < l.kb_end && k0 < a.K) ? __ldg(x16 + ((size_t)row * a.K + k0) / 8) : make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(mine + row * kRowHalves + 8 * col) = val;
    }
    __syncthreads();
    if (kb < l.kb_end) {
      uint4 xv[NT][4];
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int w = 0; w < 4; ++w)
          xv[j][w] = *reinterpret_cast<const uint4*>(mine + (l.g + 8 * j) * kRowHalves + 32 * l.t + 8 * w);
      convert_and_mma<NT>(b[0], xv, acc0, acc1);
    }
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) part[(((s * W + tw) * NT + j) * 4 + i) * 32 + lane] = acc0[j][i] + acc1[j][i];
  __syncthreads();
  for (int o = threadIdx.x; o < W * NT * 128; o += blockDim.x) {
    const int t2 = o / (NT * 128), j = (o >> 7) % NT, i = (o >> 5) & 3, ln = o & 31;
    const int n = (blockIdx.x * W + t2) * 16 + (ln >> 2) + 8 * (i >> 1);
    const int m = 8 * j + 2 * (ln & 3) + (i & 1);
    if (m >= a.M || n >= a.N) continue;
    float sum = 0.f;
    for (int sp = 0; sp < S; ++sp) sum += part[(((sp * W + t2) * NT + j) * 4 + i) * 32 + ln];
    a.y[(size_t)m * a.N + n] = __float2half_rn(sum);
  }
}

struct Layer {
  int K, N;
  std::vector<uint4*> qweight;  // rotating sets
  int32_t* qzeros;
  __half* scales;
};

static Args args_for(const Layer& L, const __half* x, __half* y, int M, int S, int set) {
  const int G = 128;
  Args a{};
  a.x = x;
  a.qweight = L.qweight[set];
  a.qzeros = reinterpret_cast<const uint32_t*>(L.qzeros);
  a.scales = L.scales;
  a.bias = nullptr;
  a.y = y;
  a.M = M, a.K = L.K, a.N = L.N, a.groups = L.K / G, a.runs_per_group = G / 32;
  a.group_magic = (uint32_t)((uint64_t{1} << 32) / a.runs_per_group + 1);
  a.kblocks = (L.K + 127) / 128;
  a.kb_per_warp = (a.kblocks + S - 1) / S;
  a.kb_per_group = G / 128;
  a.order_mask = 0;
  return a;
}

template <int NT>
static double time_tiles(const Layer& L, const __half* x, __half* y, int M, int S, cudaStream_t st) {
  const int tiles = (L.N + 15) / 16;
  const size_t smem = (size_t)S * NT * 4 * 32 * sizeof(float);
  return graph_time_us(st, 6, 3, [&](int i) {
    gemv_tiles<NT><<<tiles, 32 * S, smem, st>>>(args_for(L, x, y, M, S, i % (int)L.qweight.size()));
  });
}

template <int NT>
static size_t shared_bytes(int W, int S) {
  return (size_t)S * 8 * NT * kRowHalves * 2 + (size_t)S * W * NT * 4 * 32 * sizeof(float);
}

template <int NT>
static void launch_shared(const Args& a, int W, int S, cudaStream_t st) {
  const int tiles = (a.N + 15) / 16;
  const size_t smem = shared_bytes<NT>(W, S);
  CK(cudaFuncSetAttribute(gemv_tiles_shared<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  gemv_tiles_shared<NT><<<(tiles + W - 1) / W, 32 * W * S, smem, st>>>(a, W);
}

template <int NT>
static double time_shared(const Layer& L, const __half* x, __half* y, int M, int W, int S, cudaStream_t st) {
  return graph_time_us(st, 6, 3, [&](int i) { launch_shared<NT>(args_for(L, x, y, M, S, i % (int)L.qweight.size()), W, S, st); });
}

static double time_shipped(const Layer& L, const __half* x, __half* y, int M, cudaStream_t st) {
  return graph_time_us(st, 6, 3, [&](int i) {
    const int set = i % (int)L.qweight.size();
    for (int m0 = 0; m0 < M; m0 += 8) {
      const int rows = std::min(8, M - m0);
      CK(launch_gemv_w4a16(x + (size_t)m0 * L.K, reinterpret_cast<const int32_t*>(L.qweight[set]), L.qzeros,
                           L.scales, nullptr, y + (size_t)m0 * L.N, rows, L.K, L.N, 128, 0, false, st));
    }
  });
}

static double rel_diff(const std::vector<__half>& a, const std::vector<__half>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double u = __half2float(a[i]), v = __half2float(b[i]);
    num += (u - v) * (u - v);
    den += v * v;
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

int main() {
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  std::mt19937 rng(0);
  const int shapes[][2] = {{8192, 28672}, {8192, 8192}, {4096, 14336}};
  printf("| K x N | M | shipped (ceil(M/8) launches) us | one read, NT = M/8 tiles: best S | us | rel. diff | x in shared memory: best W x S | us | rel. diff |\n");
  printf("|---|---|---|---|---|---|---|---|---|\n");
  for (auto& sh : shapes) {
    Layer L;
    L.K = sh[0], L.N = sh[1];
    const size_t words = (size_t)L.N / 8 * ((L.K + 127) / 128) * 128;  // int32 words of qweight
    const int sets = std::max(2, (int)(200e6 / (words * 4.0)) + 1);
    std::vector<uint32_t> host(words);
    for (int s = 0; s < sets; ++s) {
      for (auto& w : host) w = rng();
      uint4* d;
      CK(cudaMalloc(&d, words * 4));
      CK(cudaMemcpy(d, host.data(), words * 4, cudaMemcpyHostToDevice));
      L.qweight.push_back(d);
    }
    const size_t zwords = (size_t)(L.K / 128) * (L.N / 8);
    std::vector<uint32_t> hz(zwords);
    for (auto& w : hz) w = rng();
    CK(cudaMalloc(&L.qzeros, zwords * 4));
    CK(cudaMemcpy(L.qzeros, hz.data(), zwords * 4, cudaMemcpyHostToDevice));
    std::vector<__half> hs((size_t)(L.K / 128) * L.N);
    std::uniform_real_distribution<float> su(1e-3f, 1e-2f), xu(-1.f, 1.f);
    for (auto& v : hs) v = __float2half(su(rng));
    CK(cudaMalloc(&L.scales, hs.size() * 2));
    CK(cudaMemcpy(L.scales, hs.data(), hs.size() * 2, cudaMemcpyHostToDevice));
    const int MMAX = 32;
    std::vector<__half> hx((size_t)MMAX * L.K);
    for (auto& v : hx) v = __float2half(xu(rng));
    __half *x, *y0, *y1;
    CK(cudaMalloc(&x, hx.size() * 2));
    CK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&y0, (size_t)MMAX * L.N * 2));
    CK(cudaMalloc(&y1, (size_t)MMAX * L.N * 2));
    for (int M : {8, 16, 32}) {
      const double shipped = time_shipped(L, x, y0, M, st);
      double best = 1e30;
      int best_s = 0;
      for (int S : {2, 4, 8, 16}) {
        const double t = M == 8 ? time_tiles<1>(L, x, y1, M, S, st)
                       : M == 16 ? time_tiles<2>(L, x, y1, M, S, st)
                                 : time_tiles<4>(L, x, y1, M, S, st);
        if (t < best) best = t, best_s = S;
      }
      // outputs of the same weight set (set 0) for the check
      for (int m0 = 0; m0 < M; m0 += 8)
        CK(launch_gemv_w4a16(x + (size_t)m0 * L.K, reinterpret_cast<const int32_t*>(L.qweight[0]), L.qzeros, L.scales,
                             nullptr, y0 + (size_t)m0 * L.N, std::min(8, M - m0), L.K, L.N, 128, 0, false, st));
      const int tiles = (L.N + 15) / 16, S = best_s, NT = M / 8;
      const size_t smem = (size_t)S * NT * 4 * 32 * sizeof(float);
      const Args a = args_for(L, x, y1, M, S, 0);
      if (NT == 1) gemv_tiles<1><<<tiles, 32 * S, smem, st>>>(a);
      if (NT == 2) gemv_tiles<2><<<tiles, 32 * S, smem, st>>>(a);
      if (NT == 4) gemv_tiles<4><<<tiles, 32 * S, smem, st>>>(a);
      CK(cudaGetLastError());
      CK(cudaStreamSynchronize(st));
      std::vector<__half> r0((size_t)M * L.N), r1((size_t)M * L.N);
      CK(cudaMemcpy(r0.data(), y0, r0.size() * 2, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(r1.data(), y1, r1.size() * 2, cudaMemcpyDeviceToHost));
      const double diff_tiles = rel_diff(r1, r0);
      double best_sh = 1e30;
      int bw = 0, bs = 0;
      for (int W : {4, 8, 16}) {
        for (int S2 : {1, 2, 4}) {
          if (W * S2 > 16) continue;
          const double t = M == 8 ? time_shared<1>(L, x, y1, M, W, S2, st)
                         : M == 16 ? time_shared<2>(L, x, y1, M, W, S2, st)
                                   : time_shared<4>(L, x, y1, M, W, S2, st);
          if (t < best_sh) best_sh = t, bw = W, bs = S2;
        }
      }
      const Args a2 = args_for(L, x, y1, M, bs, 0);
      if (NT == 1) launch_shared<1>(a2, bw, bs, st);
      if (NT == 2) launch_shared<2>(a2, bw, bs, st);
      if (NT == 4) launch_shared<4>(a2, bw, bs, st);
      CK(cudaGetLastError());
      CK(cudaStreamSynchronize(st));
      CK(cudaMemcpy(r1.data(), y1, r1.size() * 2, cudaMemcpyDeviceToHost));
      printf("| %dx%d | %d | %.2f | S = %d | %.2f | %.1e | %d x %d | %.2f | %.1e |\n", L.K, L.N, M, shipped, best_s, best,
             diff_tiles, bw, bs, best_sh, rel_diff(r1, r0));
    }
    for (auto* d : L.qweight) CK(cudaFree(d));
    CK(cudaFree(L.qzeros));
    CK(cudaFree(L.scales));
    CK(cudaFree(x));
    CK(cudaFree(y0));
    CK(cudaFree(y1));
  }
  return 0;
}
