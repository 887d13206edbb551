// gemv_trace.cu: a standalone probe (not built into w4): where the GEMV's time goes in one launch.
// Answers dev/LOG.md, GEMV, steps 41 and 44.
//
// Builds kernels/gemv_w4a16.cu with W4_GEMV_TRACE defined, so the default (pipelined) kernel
// records per warp the global timer (ns, common to all SMs, coarse) and its SM's cycle counter
// (exact, per SM) at entry, after the ring's last trip (its last loads issued, two k-blocks
// left), after its last k-block, and after the block's reduction and store. For each shape (M = 1,
// G = 128, random codes over the full 32-bit range, random scales) it runs the launcher as w4
// does, each launch after a read of 256 MiB (evicts L2 without leaving dirty lines), and prints
// the medians over 15 launches of:
//   per warp, from its cycle counter (us at the clock the counters show): entry -> end of ring
//   ("ring"), the drain (the last loads' wait and two k-blocks), the reduction and store; the
//   median warp and the slowest
//   over the grid, from the global timer: the entry skew (last warp's entry - first) and the span
//   (first entry -> last store), the spread of the SMs' finishing times, and how far apart the
//   warps leave their rings within one SM and across SMs
//   whether the same warps are slow every launch (step 44): the correlation of the warps' ring
//   times between consecutive launches, the spread of each warp's mean over the launches against
//   the spread within one, and the mean ring time by k-range position in the tile
// Build and run on a GPU machine (from the repository root):
//   mkdir -p build && nvcc -O3 -std=c++17 -arch=sm_90 -I kernels dev/probes/gemv_trace.cu -o build/gemv_trace
//   build/gemv_trace
#define W4_GEMV_TRACE 8192
#include "gemv_w4a16.cu"  // kernels/, through -I kernels

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "probe.cuh"

__global__ void read_flush(const uint4* p, size_t n, uint32_t* out) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) *out = acc;
}

static void* trace_ptr() {
  void* p = nullptr;
  CK(cudaGetSymbolAddress(&p, w4::g_gemv_trace));
  return p;
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main() {
  const int shapes[][2] = {{4096, 14336}, {14336, 4096}, {8192, 8192}, {8192, 28672}, {28672, 8192}};
  const int G = 128, M = 1, launches = 15;
  const int slots = sizeof(w4::g_gemv_trace[0]) / sizeof(w4::g_gemv_trace[0][0]);  // stamps per warp
  const size_t flush_bytes = size_t{256} << 20;
  uint4* flush = nullptr;
  uint32_t* sink = nullptr;
  CK(cudaMalloc(&flush, flush_bytes));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(flush, 1, flush_bytes));
  std::mt19937 rng(7);
  printf("%-12s %5s %6s | %8s %8s %8s %8s | %8s %8s %8s %8s | %7s %7s | %s\n", "K x N", "warps", "/SM",
         "ring", "drain", "reduce", "GHz", "ring max", "drain mx", "red max", "warp mx", "skew", "span",
         "SM finish - first SM's (p10/p50/max), us");
  for (const auto& sh : shapes) {
    const int K = sh[0], N = sh[1];
    const int kblocks = K / 128, groups = K / G;
    std::vector<uint32_t> hq((size_t)N / 8 * kblocks * 128), hz((size_t)groups * N / 8);
    for (auto& v : hq) v = rng();
    for (auto& v : hz) v = rng();
    std::vector<__half> hs((size_t)groups * N), hx((size_t)M * K);
    std::uniform_real_distribution<float> us(0.002f, 0.012f), ux(-1.f, 1.f);
    for (auto& v : hs) v = __float2half(us(rng));
    for (auto& v : hx) v = __float2half(ux(rng));
    int32_t *q, *z;
    __half *s, *x, *y;
    CK(cudaMalloc(&q, hq.size() * 4));
    CK(cudaMalloc(&z, hz.size() * 4));
    CK(cudaMalloc(&s, hs.size() * 2));
    CK(cudaMalloc(&x, hx.size() * 2));
    CK(cudaMalloc(&y, (size_t)M * N * 2));
    CK(cudaMemcpy(q, hq.data(), hq.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(z, hz.data(), hz.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(s, hs.data(), hs.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    std::vector<double> within, across;
    std::vector<std::vector<double>> ring_of;  // per timed launch: each warp's ring time (cycles), by warp id
    std::vector<std::vector<int>> sm_of;       // ... and its SM
    std::vector<double> ring, drain, reduce, ghz, ring_mx, drain_mx, red_mx, warp_mx, skew, span, f10, f50, fmax;
    int warps = 0, sms = 0;
    for (int it = 0; it < launches + 2; ++it) {
      CK(cudaMemset(trace_ptr(), 0, sizeof(unsigned long long) * W4_GEMV_TRACE * slots));
      read_flush<<<1056, 256>>>(flush, flush_bytes / 16, sink);
      CK(w4::launch_gemv_w4a16(x, q, z, s, nullptr, y, M, K, N, G, 0, false, nullptr));
      CK(cudaDeviceSynchronize());
      std::vector<unsigned long long> t((size_t)W4_GEMV_TRACE * slots);
      CK(cudaMemcpy(t.data(), trace_ptr(), t.size() * 8, cudaMemcpyDeviceToHost));
      unsigned long long e0 = ~0ull, e1 = 0, r1 = 0;
      std::vector<unsigned long long> sm_end(1024, 0);
      std::vector<std::vector<double>> sm_ring(1024);  // per SM: the warps' ring-end times (ns)
      std::vector<double> c_ring, c_drain, c_red, c_all, clk;
      warps = 0;
      for (int w = 0; w < W4_GEMV_TRACE; ++w) {
        const unsigned long long* r = &t[(size_t)w * slots];
        if (r[0] == 0) continue;
        ++warps;
        e0 = std::min(e0, r[0]);
        e1 = std::max(e1, r[0]);
        r1 = std::max(r1, r[3]);
        sm_end[r[8]] = std::max(sm_end[r[8]], r[3]);
        sm_ring[r[8]].push_back((double)(r[1] ? r[1] : r[2]));
        const double c0 = (double)r[4], c1 = (double)(r[5] ? r[5] : r[6]), c2 = (double)r[6], c3 = (double)r[7];
        c_ring.push_back(c1 - c0);
        c_drain.push_back(c2 - c1);
        c_red.push_back(c3 - c2);
        c_all.push_back(c3 - c0);
        if (r[3] > r[0] + 2000) clk.push_back((c3 - c0) / (double)(r[3] - r[0]));  // cycles per ns
      }
      if (it < 2) continue;  // warm-up launches
      ring_of.emplace_back(W4_GEMV_TRACE, -1.0);
      sm_of.emplace_back(W4_GEMV_TRACE, -1);
      for (int w = 0; w < W4_GEMV_TRACE; ++w) {
        const unsigned long long* r = &t[(size_t)w * slots];
        if (r[0]) ring_of.back()[w] = (double)(r[5] ? r[5] : r[6]) - (double)r[4], sm_of.back()[w] = (int)r[8];
      }
      std::vector<double> in_sm, sm_med;
      for (auto& v : sm_ring) {
        if (v.empty()) continue;
        std::sort(v.begin(), v.end());
        in_sm.push_back((v.back() - v.front()) / 1000.0);
        sm_med.push_back(v[v.size() / 2] / 1000.0);
      }
      std::sort(sm_med.begin(), sm_med.end());
      within.push_back(median(in_sm));
      across.push_back(sm_med.back() - sm_med.front());
      const double g = median(clk);  // GHz
      std::vector<double> ends;
      for (auto v : sm_end)
        if (v) ends.push_back((double)(v - e0) / 1000.0);
      std::sort(ends.begin(), ends.end());
      sms = (int)ends.size();
      ring.push_back(median(c_ring) / g / 1000.0);
      drain.push_back(median(c_drain) / g / 1000.0);
      reduce.push_back(median(c_red) / g / 1000.0);
      ghz.push_back(g);
      ring_mx.push_back(*std::max_element(c_ring.begin(), c_ring.end()) / g / 1000.0);
      drain_mx.push_back(*std::max_element(c_drain.begin(), c_drain.end()) / g / 1000.0);
      red_mx.push_back(*std::max_element(c_red.begin(), c_red.end()) / g / 1000.0);
      warp_mx.push_back(*std::max_element(c_all.begin(), c_all.end()) / g / 1000.0);
      skew.push_back((e1 - e0) / 1000.0);
      span.push_back((r1 - e0) / 1000.0);
      f10.push_back(ends[ends.size() / 10] - ends[0]);
      f50.push_back(ends[ends.size() / 2] - ends[0]);
      fmax.push_back(ends.back() - ends[0]);
    }
    printf("%5dx%-6d %5d %6.1f | %8.2f %8.2f %8.2f %8.2f | %8.2f %8.2f %8.2f %8.2f | %7.2f %7.2f | %.2f / %.2f / %.2f\n",
           K, N, warps, warps / (double)sms, median(ring), median(drain), median(reduce), median(ghz),
           median(ring_mx), median(drain_mx), median(red_mx), median(warp_mx), median(skew), median(span),
           median(f10), median(f50), median(fmax));
    printf("%12s ring end within an SM (max - min, median SM): %.2f us; across SMs (slowest SM's median warp - fastest's): %.2f us\n",
           "", median(within), median(across));
    // Is a warp slow because of what it reads (the same warps slow every launch) or by chance?
    // r: Pearson correlation of the warps' ring times between consecutive launches; the spread of
    // each warp's mean over the launches against the spread within one launch; and the mean ring
    // time of each k-range position in the tile (warp id % S), relative to the overall mean.
    {
      const int S = warps / ((N + 15) / 16);
      auto pearson = [](const std::vector<double>& a, const std::vector<double>& b) {
        double ma = 0, mb = 0;
        int n = 0;
        for (size_t i = 0; i < a.size(); ++i)
          if (a[i] >= 0 && b[i] >= 0) ma += a[i], mb += b[i], ++n;
        ma /= n, mb /= n;
        double sab = 0, saa = 0, sbb = 0;
        for (size_t i = 0; i < a.size(); ++i)
          if (a[i] >= 0 && b[i] >= 0) sab += (a[i] - ma) * (b[i] - mb), saa += (a[i] - ma) * (a[i] - ma), sbb += (b[i] - mb) * (b[i] - mb);
        return sab / std::sqrt(saa * sbb);
      };
      std::vector<double> rs, sd_launch;
      for (size_t i = 0; i + 1 < ring_of.size(); ++i) rs.push_back(pearson(ring_of[i], ring_of[i + 1]));
      std::vector<double> mean_w(W4_GEMV_TRACE, 0.0);
      std::vector<double> pos_sum(S, 0.0);
      std::vector<int> pos_n(S, 0);
      double all = 0;
      int all_n = 0;
      for (const auto& v : ring_of) {
        double m = 0, q = 0;
        int n = 0;
        for (int w = 0; w < W4_GEMV_TRACE; ++w)
          if (v[w] >= 0) {
            m += v[w], q += v[w] * v[w], ++n;
            mean_w[w] += v[w] / ring_of.size();
            pos_sum[w % S] += v[w], ++pos_n[w % S];
            all += v[w], ++all_n;
          }
        m /= n;
        sd_launch.push_back(std::sqrt(q / n - m * m));
      }
      double m = 0, q = 0;
      int n = 0;
      for (int w = 0; w < W4_GEMV_TRACE; ++w)
        if (ring_of[0][w] >= 0) m += mean_w[w], q += mean_w[w] * mean_w[w], ++n;
      m /= n;
      const double g = median(ghz) * 1000.0;  // cycles per us
      printf("%12s warps' ring times, launch to launch: r = %.2f; sd of a warp's mean %.2f us vs sd within a launch %.2f us; k-range position (of %d) vs mean:",
             "", median(rs), std::sqrt(q / n - m * m) / g, median(sd_launch) / g, S);
      for (int p = 0; p < S; ++p) printf(" %+.2f", (pos_sum[p] / pos_n[p] - all / all_n) / g);
      printf(" us\n");
      // the share of a launch's ring-time variance that lies between SMs, and how many warps run
      // on the same SM as in the launch before
      std::vector<double> share, same;
      for (size_t i = 0; i < ring_of.size(); ++i) {
        std::vector<double> sum(1024, 0.0);
        std::vector<int> cnt(1024, 0);
        double mu = 0, tot = 0;
        int k = 0, kept = 0;
        for (int w = 0; w < W4_GEMV_TRACE; ++w)
          if (ring_of[i][w] >= 0) {
            sum[sm_of[i][w]] += ring_of[i][w], ++cnt[sm_of[i][w]], mu += ring_of[i][w], ++k;
            if (i > 0 && sm_of[i][w] == sm_of[i - 1][w]) ++kept;
          }
        mu /= k;
        double between = 0;
        for (int w = 0; w < W4_GEMV_TRACE; ++w)
          if (ring_of[i][w] >= 0) tot += (ring_of[i][w] - mu) * (ring_of[i][w] - mu);
        for (int c = 0; c < 1024; ++c)
          if (cnt[c]) between += cnt[c] * (sum[c] / cnt[c] - mu) * (sum[c] / cnt[c] - mu);
        share.push_back(between / tot);
        if (i > 0) same.push_back((double)kept / k);
      }
      printf("%12s between-SM share of the ring-time variance %.0f%%; warps on the same SM as the launch before %.0f%%\n", "",
             100 * median(share), 100 * median(same));
    }
    CK(cudaFree(q));
    CK(cudaFree(z));
    CK(cudaFree(s));
    CK(cudaFree(x));
    CK(cudaFree(y));
  }
  return 0;
}
