"""The batch path of two kernel trees side by side in one process (lab only): the shipped kernels/
and another copy (e.g. an older commit's, `git archive <rev> kernels | tar -x -C DIR`), each timed on
the bench's harness at the same shapes and M, alternating, outputs checked against the reference.

    PYTHONPATH=. python3 dev/probes/compare_builds.py [DIR ...] [--patches NAME,...] [--shapes 8192x28672]
        [--m 64,1024] [--kernel 3] [--tiles T] [--splits S] [--reps 2] [--orders 1,2]

--patches adds the shipped tree rebuilt with one of PATCHES (below) each, as more columns.

--kernel 0 times the GEMV (M <= 32, its automatic warps per tile) instead of a batch kernel.

--orders times the shipped tree once per k order of the wgmma kernels (1 permuted, 2 as x lies; 0
the planner's), each as its own column.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from w4cli.bench import cases
from w4cli.gpu import kernels, timing
from ws_ablation import LOOP, build_tree  # dev/probes, this script's folder


def time_alternately(mods: dict, shapes: str, ms: str, call, checked: bool = True, label: str = "",
                     reps: int = 2, pad_x: int = 0) -> None:
    """Per shape and M, every tree's `call(mod, x, qweight, qzeros, scales, bias)` timed `reps` times,
    alternating, on the bench's harness; each output checked against the reference unless
    `checked` is False (a build whose results are wrong on purpose). pad_x > 0: x is the first M
    rows of an allocation of M rounded up to pad_x rows (for a build that reads past row M)."""
    copy = timing.copy_bandwidth()
    for shape in shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        layer = cases.Layer(k, n, 128, seed=1)
        for m in (int(v) for v in ms.split(",")):
            row = []
            for _ in range(reps):
                for name, mod in mods.items():
                    def run(x, qw, qz, s, b, mod=mod):
                        return call(mod, x, qw, qz, s, b)
                    def check(out, a, layer=layer):
                        return cases.w4_gemv_errors(layer, out, a).require() if checked else True
                    rows = -(-m // pad_x) * pad_x if pad_x else m
                    case = cases.Case(name, lambda i, m=m, rows=rows, layer=layer: (layer.x(rows, i)[:m], *layer.gemv(i),
                                                                                   None), run,
                                      check, cases.W4_GEMV_KERNEL.bytes_moved(k, n, m, layer.group))
                    t = case.measure(copy)
                    row.append(f"{name} {t.median_us:.2f} ({t.pct_of_copy:.0f}%)")
            print(f"{shape} M={m}{label}: " + " | ".join(row), flush=True)


# Named variants of the shipped tree: (file, text, replacement) each, every occurrence replaced.
# What each measured is in dev/LOG.md: none won (batch_ring8, wg_ring8, wg_one_an_sm on the H100,
# tmap_prefetch, wg_queue3, late_b_wait on the H200, 2026-11-27; warp_release's outcome is in the
# sixteenth session's steps, w_prefetch's in the seventeenth's, wg_lockstep, wg_lockstep2, wg_skew2,
# two_producers and two_producers_split's in the eighteenth's, none of which won either; x_padded
# (timing only) showed what a box past M costs, eighteenth session).
PATCHES = {
    # the mma.sync kernel's cp.async ring 8 deep at M <= 16 (184 KB at 256 rows): more bytes in flight
    # a block, where one block of 8 warps an SM keeps DRAM half busy (14336x4096 at M = 16)
    "batch_ring8": [("gemm_w4a16_batch.cu", "static constexpr int kStages = 4;",
                     "static constexpr int kStages = NB <= 2 ? 8 : 4;")],
    # the barrier wgmma kernel's ring up to 8 deep where 8 stages fit in 220 KB (M <= 32)
    "wg_ring8": [("gemm_w4a16_wgmma.cu",
                  "static constexpr int kStages = (220 * 1024) / L::kStageBytes >= 4 ? 4 : (220 * 1024) / L::kStageBytes;",
                  "static constexpr int kStages = (220 * 1024) / L::kStageBytes >= 8 ? 8 : (220 * 1024) / L::kStageBytes;")],
}
# the barrier wgmma kernel's launches of no more blocks than SMs with shared memory for one block an
# SM: where two fit, clusters may be placed two blocks an SM while other SMs idle (28672x8192 at
# M = 32, two tiles: Nsight Compute counts 0 to 2 blocks an SM at 128, 192 and 224 blocks)
PATCHES["wg_one_an_sm"] = [("gemm_w4a16_wgmma.cu", """  return launch_kernel(v.fn[natural][plan.splits > 1], dim3(plan.row_blocks, plan.splits), dim3(kBatchThreads), v.smem,
                       stream, pdl, plan.splits, a, wmap, xmap);""", """  int sms = 132, device = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const int smem = (int64_t)plan.row_blocks * plan.splits <= sms && v.smem < 116 * 1024 ? 116 * 1024 : v.smem;
  if (smem != v.smem) cudaFuncSetAttribute(v.fn[natural][plan.splits > 1], cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  return launch_kernel(v.fn[natural][plan.splits > 1], dim3(plan.row_blocks, plan.splits), dim3(kBatchThreads), smem,
                       stream, pdl, plan.splits, a, wmap, xmap);""")]

# the permute kernel asking for the same shared-memory carveout as the wgmma kernels it precedes, so
# that their blocks may share an SM at once under PDL: in the bench's graph 3.2-3.5 us pass between
# one barrier-kernel launch's last block out and the next's first in, the permute kernel and two
# launches (H100, barrier_timeline.py, twenty-fourth session)
PATCHES["permute_carveout"] = [("gemm_w4a16_wgmma.cu", """  const int kblocks = static_cast<int>((K + 127) / 128);
  const int64_t chunks = M * kblocks * 16;
  *staged = scratch;""", """  static const bool carveout = cudaFuncSetAttribute(permute_x_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                                    cudaSharedmemCarveoutMaxShared) == cudaSuccess || (cudaGetLastError(), false);
  (void)carveout;
  const int kblocks = static_cast<int>((K + 127) / 128);
  const int64_t chunks = M * kblocks * 16;
  *staged = scratch;""")]

# The clustered barrier-kernel launches that run in two modes in the bench (14336x4096 and 28672x8192
# at M = 32, 32 clusters of 7 at two blocks an SM) need every cluster the GPU can hold at once: on
# the H100 read by barrier_timeline.py the clusters of 7 went 2, 4, 4, 4, 4, 4, 5, 5 to its groups of
# 8, 16, 16, 16, 16, 16, 18 and 18 SMs in every launch, no room to spare, and a cluster that does
# not find room waits for the first ones to end. Two ways to leave room, each alone:
# the GEMM after its own permute kernel launched without PDL (the permute kernel's blocks gone
# before the clusters are placed) ...
PATCHES["permute_no_pdl"] = [("gemm_w4a16_wgmma.cu", "  *pdl = true;\n  return err;\n}", "  return err;\n}")]
# ... or the planner's split counts whose clusters fit with one to spare
PATCHES["cluster_slack"] = [("gemm_w4a16_wgmma.cu",
                             "    const int64_t clusters = max_active_clusters(fn, threads, smem, splits);\n",
                             "    const int64_t clusters = max_active_clusters(fn, threads, smem, splits) - 1;\n")]

# both: the permute kernel's blocks out of the GEMM's way on every count (carveout) and gone before
# the GEMM's blocks are placed (no PDL)
PATCHES["carveout_no_pdl"] = PATCHES["permute_carveout"] + PATCHES["permute_no_pdl"]

# the permute kernel with the default carveout again, as before 77b5fe1
PATCHES["no_carveout"] = [("gemm_w4a16_wgmma.cu", """  cudaError_t err = cudaFuncSetAttribute(permute_x_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                         cudaSharedmemCarveoutMaxShared);
  if (err != cudaSuccess) return err;
  err = launch_kernel(""", "  const cudaError_t err = launch_kernel(")]

# The barrier kernel under PDL after its permute kernel everywhere again, as before the planner's
# permute_pdl (28672x8192's two tiles at M = 25-32)
PATCHES["permute_pdl_everywhere"] = [("gemm_w4a16_wgmma.cu", "  if (!natural && !plan.permute_pdl) pdl = false;\n", "")]

# The barrier kernel's scale after the wgmma on two m64 tiles of 32 tokens too, at one block an SM
# there (its second set of sums spills at two): where a layer's two-tile blocks are about one an SM
# anyway (8192x8192 at M = 17-32: 32 row blocks in clusters of 4) the 7-10% fewer instructions of
# one tile's post-scale, at the cost of the second block an SM elsewhere (8192x28672: 112 row blocks)
PATCHES["post_two_tiles"] = [
    ("gemm_w4a16_wgmma.cu", "__global__ void __launch_bounds__(kBatchThreads, MT <= 32 ? 2 : 1)\n    gemm_w4a16_wgmma_kernel(",
     "__global__ void __launch_bounds__(kBatchThreads, MT <= 32 && !(kPost && NT == 2 && MT == 32) ? 2 : 1)\n"
     "    gemm_w4a16_wgmma_kernel("),
    ("gemm_w4a16_wgmma.cu", "K >= 4096 && (M <= 16 || (M <= 32 && tiles == 1));", "K >= 4096 && M <= 32;"),
    ("gemm_w4a16_wgmma.cu", "  if (post && (mt > 32 || (mt == 32 && tiles != 1))) return false;", "  if (post && mt > 32) return false;"),
    ("gemm_w4a16_wgmma.cu", "    case 322: *v = wg_variant<32, 2>(); return true;",
     "    case 322: *v = post ? wg_variant<32, 2, true>() : wg_variant<32, 2>(); return true;"),
]

# the pairs past M = 256 at any count where the driver says how many clusters fit, within one wave
# too: WsSpread over the clusters, so that one wave of pairs filling 48-73% of them (4096x6144,
# 4096x4096, 14336x4096 at M = 512) is cut by stream-K over every cluster instead of leaving the rest
# idle (variant 5's stream-K over every SM lost 4% to one wave of pairs on 4096x6144 at M = 512)
PATCHES["pairs_sk_one_wave"] = [
    ("gemm_w4a16_wgmma.cu", "    if (pairs > clusters && pair_clusters_known(pair)) return 6;",
     "    if ((M > 256 || pairs > clusters) && pair_clusters_known(pair)) return 6;"),
    ("gemm_w4a16_wgmma.cu", "    const bool sk = pairs > clusters && pair_spread.sk_tiles > 0 && pair_clusters_known(v);",
     "    const bool sk = pair_spread.sk_tiles > 0 && pair_clusters_known(v);"),
    ("gemm_w4a16_wgmma.cu", "    plan->ctas = 2 * static_cast<int>(pairs < clusters ? pairs : clusters);",
     "    plan->ctas = 2 * static_cast<int>(sk ? pair_spread.ctas : pairs < clusters ? pairs : clusters);"),
]

# the warp-specialised kernel's two tensor maps prefetched at entry by its first thread, so that the
# producer's first copies do not wait for the descriptors (the timeline's prologue: stage 0 issued
# 0.7 us after the producer began, landed 1.1 us after that, H200)
PATCHES["tmap_prefetch"] = [("gemm_w4a16_wgmma.cu", """  const WsBarriers b(smem_u32(bars), S::kStages);
  pdl_launch_dependents();  // a kernel launched after this one with PDL waits (pdl_wait) before its reads""",
                             """  const WsBarriers b(smem_u32(bars), S::kStages);
  if (threadIdx.x == 0) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(&wmap) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(&xmap) : "memory");
  }
  pdl_launch_dependents();  // a kernel launched after this one with PDL waits (pdl_wait) before its reads""")]

# three words' wgmmas in flight a warpgroup instead of two (wait for all but two groups): the
# releases move one word later (the previous stage's part B once this stage's word 1 is issued, part
# A once word 3 is), so that at 64-token tiles, where a group is 64-128 tensor cycles, the wgmmas'
# latency is covered (the ninth session tried it at 256 tokens only)
PATCHES["wg_queue3"] = [("gemm_w4a16_wgmma.cu", """    wgmma_wait<1>();  // word c - 1's wgmmas are done: their A fragments' registers are free again
    if (!kDrain && c == 0 && release != 0) release_stage<kPairRelease>(release, lane);
    if (!kDrain && c == 2 && release_a != 0) release_stage<kPairRelease>(release_a, lane);""",
                         """    wgmma_wait<2>();  // word c - 2's wgmmas are done
    if (!kDrain && c == 1 && release != 0) release_stage<kPairRelease>(release, lane);
    if (!kDrain && c == 3 && release_a != 0) release_stage<kPairRelease>(release_a, lane);""")]

# the warp-specialised kernel's wait for a stage's second x atom moved from the k-block's start to
# word 2, which is the first to read it: one mbarrier round trip fewer on each k-block's way to its
# first wgmma (64- and 128-token k-blocks are 0.76-1.5 us; try_wait's branch held 8% of the MMA warps'
# samples at 4096x14336, M = 64)
PATCHES["late_b_wait"] = [
    ("gemm_w4a16_wgmma.cu", """                                            uint32_t release_a = 0) {""",
     """                                            uint32_t release_a = 0, uint32_t wait_b = 0, uint32_t parity_b = 0) {"""),
    ("gemm_w4a16_wgmma.cu", """    if (kNatural && c < 3) load_chunks(c + 1);
    wgmma_fence();""", """    if (kNatural && c < 3) load_chunks(c + 1);
    if (c == 2 && wait_b != 0) mbar_wait(wait_b, parity_b);
    wgmma_fence();"""),
    ("gemm_w4a16_wgmma.cu", """      mbar_wait(b.full_b + 8 * s, (i / S::kStages) & 1);
""", ""),
    ("gemm_w4a16_wgmma.cu", """kSplit || kb + 1 < seg.kb_hi ? b.empty_a + 8 * s : 0u);""",
     """kSplit || kb + 1 < seg.kb_hi ? b.empty_a + 8 * s : 0u, b.full_b + 8 * s,
                                          (i / S::kStages) & 1);"""),
]

# each warp's release of a stage one arrival by lane 0 after __syncwarp (the warp's reads ordered
# before it by the warp barrier) instead of 32, the empty barriers counting warps: 16 shared-memory
# arrivals a stage part in place of 256 (the ring microbenchmark's hand-off alone held 64-token
# whole-word k-blocks to 68% against 84% without it, H200, sixteenth session)
PATCHES["warp_release"] = [
    ("gemm_w4a16_wgmma.cu", """  mbar_arrive(bar);
  if constexpr (kPair) {
    __syncwarp();
    if (lane == 0) mbar_arrive_remote(bar, cluster_rank() ^ 1);
    __syncwarp();""", """  __syncwarp();
  if (lane == 0) mbar_arrive(bar);
  if constexpr (kPair) {
    if (lane == 0) mbar_arrive_remote(bar, cluster_rank() ^ 1);
    __syncwarp();"""),
    ("gemm_w4a16_wgmma.cu", "S::kMmaThreads + (kPair ? kMmaWarps : 0)", "kMmaWarps + (kPair ? kMmaWarps : 0)"),
    ("gemm_w4a16_wgmma.cu", "      mbar_arrive(b.empty_b + 8 * held);", "      release_stage<false>(b.empty_b + 8 * held, lane);"),
]

# the weights asked of L2 a ring ahead: the producer's lane 0, with each stage it fills, prefetches
# (cp.async.bulk.prefetch.tensor, no shared memory, no barrier) the weight box of the k-block kStages
# further on in the same split or tile, so that its copy, when the stage comes round, reads L2
# instead of DRAM (a byte of weights held a 64-128-token stage about twice as long as a byte of
# activations from L2, sixteenth session step 4)
PATCHES["w_prefetch"] = [
    ("tensor_core.cuh", """__device__ __forceinline__ uint64_t evict_normal_policy() {""",
     """__device__ __forceinline__ void tensor_prefetch_4d_l2(const void* map, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%0, {%1, %2, %3, %4}];\\n" ::"l"(map), "r"(c0),
               "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
__device__ __forceinline__ uint64_t evict_normal_policy() {"""),
    ("gemm_w4a16_wgmma.cu", """    if (i > 0) ws_copy_constants<S, kBulk>(a, wmap, smem0, b, i, cb, kb0 + i, atom, wpolicy, lane);
    if (lane == 0) tensor_copy_2d_g2s(st + S::kXOff, x, k0, m0, b.full_a + 8 * s, xpolicy);""",
     """    if (i > 0) ws_copy_constants<S, kBulk>(a, wmap, smem0, b, i, cb, kb0 + i, atom, wpolicy, lane);
    if (lane == 0 && i + S::kStages < nkb) tensor_prefetch_4d_l2(&wmap, 0, 0, kb0 + i + S::kStages, cb * (S::kRows / 8));
    if (lane == 0) tensor_copy_2d_g2s(st + S::kXOff, x, k0, m0, b.full_a + 8 * s, xpolicy);"""),
    ("gemm_w4a16_wgmma.cu", """      if (i > 0) ws_copy_constants<S, kBulk>(a, wmap, smem0, b, i, seg.cb, kb, atom, wpolicy, lane);
      if (lane == 0) copy_x(st + S::kXOff, x, kb * 128, m0, b.full_a + 8 * s);""",
     """      if (i > 0) ws_copy_constants<S, kBulk>(a, wmap, smem0, b, i, seg.cb, kb, atom, wpolicy, lane);
      if (lane == 0 && kb + S::kStages < seg.kb_hi)
        tensor_prefetch_4d_l2(&wmap, 0, 0, kb + S::kStages, seg.cb * (S::kRows / 8));
      if (lane == 0) copy_x(st + S::kXOff, x, kb * 128, m0, b.full_a + 8 * s);"""),
]

# The two MMA warpgroups held within a k-block (every k-block), or two, of each other: both pass the
# MMA threads' named barrier before waiting for a stage. A stage is freed once all 256 MMA threads
# released it, so a second warpgroup running k-blocks behind the first leaves the first a ring of
# fewer stages ahead of the copies (dev/LOG.md, seventeenth session, steps 7-8).
_STAGE_WAIT = """      const int s = i % S::kStages;
      mbar_wait(b.full_a + 8 * s, (i / S::kStages) & 1);"""
PATCHES["wg_lockstep"] = [("gemm_w4a16_wgmma.cu", _STAGE_WAIT, _STAGE_WAIT.replace(
    "      mbar_wait(b.full_a", "      mma_threads_sync<S::kMmaThreads>();\n      mbar_wait(b.full_a"))]
PATCHES["wg_lockstep2"] = [("gemm_w4a16_wgmma.cu", _STAGE_WAIT, _STAGE_WAIT.replace(
    "      mbar_wait(b.full_a", "      if ((i & 1) == 0) mma_threads_sync<S::kMmaThreads>();\n      mbar_wait(b.full_a"))]
# Softer: before a stage, a thread waits until both warpgroups have released part A of the stage two
# steps back (the empty barrier the producer waits on; its phase cannot have moved on again, since
# that needs this thread past the stage's next use), so neither runs more than about a step and a
# half ahead, with no barrier between the warpgroups otherwise. Not for the pairs, whose empty
# barriers count the other block's warps too.
PATCHES["wg_skew2"] = [("gemm_w4a16_wgmma.cu", _STAGE_WAIT, _STAGE_WAIT.replace(
    "      mbar_wait(b.full_a",
    "      if (!kPair && i >= 2) mbar_wait(b.empty_a + 8 * ((i - 2) % S::kStages), ((i - 2) / S::kStages) & 1);\n"
    "      mbar_wait(b.full_a"))]


# The producer's two parts in two warps of its warpgroup: warp 8 waits for part A's release and
# issues the stage's constants and first x atom, warp 9 waits for part B's and issues the second
# atom, each on its own loop over the same steps. Per ring step the one producer warp spent about a
# k-block (constants 330 ns, atoms 150-180 ns each, its waits 200-240 ns; 8192x8192, M = 128, H200),
# and passed each empty barrier 3.7-6 us after the MMA warps had released it (eighteenth session,
# step 1): if its own instruction stream is the pace, split in two it is about halved.
_SPLIT_RING = """  if (nkb > 0) ws_copy_constants<S, kBulk>(a, wmap, smem0, b, 0, cb, kb0, atom, wpolicy, lane);
  pdl_wait();
  for (int i = 0; i < nkb; ++i) {
    const int s = i % S::kStages;
    const uint32_t parity = ((i / S::kStages) + 1) & 1;
    const uint32_t st = smem0 + s * S::kStageBytes;
    const int k0 = (kb0 + i) * 128;
    if (i >= S::kStages) mbar_wait(b.empty_a + 8 * s, parity);
    if (i > 0) ws_copy_constants<S, kBulk>(a, wmap, smem0, b, i, cb, kb0 + i, atom, wpolicy, lane);
    if (lane == 0) tensor_copy_2d_g2s(st + S::kXOff, x, k0, m0, b.full_a + 8 * s, xpolicy);
    if (i >= S::kStages) mbar_wait(b.empty_b + 8 * s, parity);
    if (lane == 0) {
      mbar_arrive_expect_tx(b.full_b + 8 * s, atom);
      tensor_copy_2d_g2s(st + S::kXOff + kAtom, x, k0 + 64, m0, b.full_b + 8 * s, xpolicy);
    }
  }"""  # the split producer's ring, as shipped
_SPLIT_LOOP = _SPLIT_RING + """
  // Leave only once the MMA warps have consumed every stage: no copy outlives its issuer.
  for (int i = nkb > S::kStages ? nkb - S::kStages : 0; i < nkb; ++i) {
    mbar_wait(b.empty_a + 8 * (i % S::kStages), (i / S::kStages) & 1);
    mbar_wait(b.empty_b + 8 * (i % S::kStages), (i / S::kStages) & 1);
  }"""
_SPLIT_LOOP2 = """  if (nkb > 0 && part == 0) ws_copy_constants<S, kBulk>(a, wmap, smem0, b, 0, cb, kb0, atom, wpolicy, lane);
  pdl_wait();
  const uint32_t empty = part == 0 ? b.empty_a : b.empty_b;
  for (int i = 0; i < nkb; ++i) {
    const int s = i % S::kStages;
    const uint32_t parity = ((i / S::kStages) + 1) & 1;
    const uint32_t st = smem0 + s * S::kStageBytes;
    const int k0 = (kb0 + i) * 128;
    if (i >= S::kStages) mbar_wait(empty + 8 * s, parity);
    if (part == 0) {
      if (i > 0) ws_copy_constants<S, kBulk>(a, wmap, smem0, b, i, cb, kb0 + i, atom, wpolicy, lane);
      if (lane == 0) tensor_copy_2d_g2s(st + S::kXOff, x, k0, m0, b.full_a + 8 * s, xpolicy);
    } else if (lane == 0) {
      mbar_arrive_expect_tx(b.full_b + 8 * s, atom);
      tensor_copy_2d_g2s(st + S::kXOff + kAtom, x, k0 + 64, m0, b.full_b + 8 * s, xpolicy);
    }
  }
  for (int i = nkb > S::kStages ? nkb - S::kStages : 0; i < nkb; ++i)
    mbar_wait(empty + 8 * (i % S::kStages), (i / S::kStages) & 1);"""
_PERSIST_LOOP = LOOP  # the persistent producer's ring step (ws_ablation's)
_PERSIST_LOOP2 = """      if (i >= S::kStages) mbar_wait((part == 0 ? b.empty_a : b.empty_b) + 8 * s, parity);
      if (part == 0) {
        if (i > 0) ws_copy_constants<S, kBulk>(a, wmap, smem0, b, i, seg.cb, kb, atom, wpolicy, lane);
        if (lane == 0) copy_x(st + S::kXOff, x, kb * 128, m0, b.full_a + 8 * s);
      } else if (lane == 0) {
        mbar_arrive_expect_tx(b.full_b + 8 * s, atom);
        copy_x(st + S::kXOff + kAtom, x, kb * 128 + 64, m0, b.full_b + 8 * s);
      }"""
_PERSIST_TAIL = """  for (int j = i > S::kStages ? i - S::kStages : 0; j < i; ++j) {
    mbar_wait(b.empty_a + 8 * (j % S::kStages), (j / S::kStages) & 1);
    mbar_wait(b.empty_b + 8 * (j % S::kStages), (j / S::kStages) & 1);
  }"""
_PERSIST_TAIL2 = """  for (int j = i > S::kStages ? i - S::kStages : 0; j < i; ++j)
    mbar_wait((part == 0 ? b.empty_a : b.empty_b) + 8 * (j % S::kStages), (j / S::kStages) & 1);"""
PATCHES["two_producers"] = [
    ("gemm_w4a16_wgmma.cu", _SPLIT_LOOP, _SPLIT_LOOP2),
    ("gemm_w4a16_wgmma.cu", "int mt, int kb0, int nkb, int lane) {", "int mt, int kb0, int nkb, int lane, int part) {"),
    ("gemm_w4a16_wgmma.cu", _PERSIST_LOOP, _PERSIST_LOOP2),
    ("gemm_w4a16_wgmma.cu", _PERSIST_TAIL, _PERSIST_TAIL2),
    ("gemm_w4a16_wgmma.cu", "uint32_t smem0, const WsBarriers& b, int lane) {",
     "uint32_t smem0, const WsBarriers& b, int lane, int part) {"),
    ("gemm_w4a16_wgmma.cu", "  if (more) ws_copy_constants<S, kBulk>(", "  if (more && part == 0) ws_copy_constants<S, kBulk>("),
    ("gemm_w4a16_wgmma.cu", "    if (warp == kMmaWarps) {", "    if (warp == kMmaWarps || warp == kMmaWarps + 1) {"),
    ("gemm_w4a16_wgmma.cu", "blockIdx.z, kb0, nkb, lane);", "blockIdx.z, kb0, nkb, lane, warp - kMmaWarps);"),
    ("gemm_w4a16_wgmma.cu", "(a, wmap, xmap, xtail, smem0, b, lane);", "(a, wmap, xmap, xtail, smem0, b, lane, warp - kMmaWarps);"),
]
# the split launches' producer only (the persistent one, at 40 registers, spills 20-60 bytes split in two)
PATCHES["two_producers_split"] = PATCHES["two_producers"][:2] + [
    ("gemm_w4a16_wgmma.cu", "    if (warp == kMmaWarps) {", "    if (warp == kMmaWarps || (kSplit && warp == kMmaWarps + 1)) {"),
    ("gemm_w4a16_wgmma.cu", "blockIdx.z, kb0, nkb, lane);", "blockIdx.z, kb0, nkb, lane, warp - kMmaWarps);"),
]


# The x tensor map over M rounded up to the tile's tokens, so that no box reaches past the map's
# rows (timing only, with --pad-x: reads the allocation's rows past M). A token tile partly past M
# ran up to twice as long as a full one (4096x14336, variant 5: M = 160 115 us, 192 88 us, 256
# 58 us, the same 112 tiles; H100, eighteenth session, step 5): if the tensor copy engine's fill
# of the rows past the map is what costs, this build runs those cells as fast as M = 256.
PATCHES["x_padded"] = [("gemm_w4a16_wgmma.cu",
                        "x_tensor_map(staged, M, cols, v.pair != nullptr ? v.tokens / 2 : v.tokens, &xmap);",
                        "x_tensor_map(staged, (M + v.tokens - 1) / v.tokens * v.tokens, cols,\n"
                        "                                            v.pair != nullptr ? v.tokens / 2 : v.tokens, &xmap);")]


# The x atoms through cp.async by the producer warpgroup's three idle warps (96 threads, 16-byte
# chunks into the same 128-byte swizzle, tokens past M and k past the row as zeros), the tensor
# copy engine left with the weights alone; each thread arrives on full_a / full_b once its chunks of
# the part land (96 more arrivals a phase), and each MMA thread fences the async proxy after its
# waits (cp.async writes through the generic proxy). Not the pairs, which keep their multicast. If
# the copy engine's rate in box rows an SM paces the ring (eighteenth session, step 8: a producer
# late by several k-blocks still issues one step a k-block, a second producer warp does not help,
# and rows it only zero-fills cost it as much as rows it reads), split and persistent launches at
# M = 64-256 run faster, most where x has the most rows a stage (128-256 tokens).
_X_WARPS = """
// (lab) the x atoms by cp.async: thread t of the producer warpgroup's warps 1-3
template <typename S>
__device__ __forceinline__ void lab_copy_x_part(const BatchArgs& a, uint32_t st, int m0, int k0, int atom, int t) {
  for (int idx = t; idx < S::kTokens * 8; idx += 96) {
    const int r = idx >> 3, c = idx & 7;
    const int m = m0 + r, k = k0 + 64 * atom + 8 * c;
    const bool ok = m < a.M && k < a.x_cols;
    cp_async16(st + S::x_dst(r, 8 * atom + c), a.x + (ok ? (size_t)m * a.x_stride + k : 0), ok);
  }
}
template <typename S>
__device__ __forceinline__ void lab_copy_x_step(const BatchArgs& a, const WsBarriers& b, uint32_t smem0, int i, int m0,
                                                int kb, int t) {
  const int s = i % S::kStages;
  const uint32_t parity = ((i / S::kStages) + 1) & 1;
  const uint32_t st = smem0 + s * S::kStageBytes;
  if (i >= S::kStages) mbar_wait(b.empty_a + 8 * s, parity);
  lab_copy_x_part<S>(a, st, m0, kb * 128, 0, t);
  mbar_arrive_cp_async(b.full_a + 8 * s);
  if (i >= S::kStages) mbar_wait(b.empty_b + 8 * s, parity);
  lab_copy_x_part<S>(a, st, m0, kb * 128, 1, t);
  mbar_arrive_cp_async(b.full_b + 8 * s);
}
template <typename S, bool kSplit>
__device__ __forceinline__ void lab_copy_x(const BatchArgs& a, const WsBarriers& b, uint32_t smem0, int t) {
  pdl_wait();
  int i = 0;
  if constexpr (kSplit) {
    const int kb0 = blockIdx.y * a.kb_per_split, nkb = min(a.kblocks, kb0 + a.kb_per_split) - kb0;
    for (; i < nkb; ++i) lab_copy_x_step<S>(a, b, smem0, i, (int)blockIdx.z * S::kTokens, kb0 + i, t);
  } else {
    WsWork<false> work(a, false);
    WsSegment seg;
    while (work.next(a, seg))
      for (int kb = seg.kb_lo; kb < seg.kb_hi; ++kb, ++i) lab_copy_x_step<S>(a, b, smem0, i, (int)seg.mt * S::kTokens, kb, t);
  }
  for (int j = i > S::kStages ? i - S::kStages : 0; j < i; ++j) {
    mbar_wait(b.empty_a + 8 * (j % S::kStages), (j / S::kStages) & 1);
    mbar_wait(b.empty_b + 8 * (j % S::kStages), (j / S::kStages) & 1);
  }
}

// ---- stream-K: a tile cut between the blocks of a persistent launch ----"""
PATCHES["x_cp_async"] = [
    ("gemm_w4a16_wgmma.cu", "\n// ---- stream-K: a tile cut between the blocks of a persistent launch ----", _X_WARPS),
    # the split producer: weights, scales and zeros only
    ("gemm_w4a16_wgmma.cu", "kb0, atom, wpolicy, lane);", "kb0, 0u, wpolicy, lane);"),
    ("gemm_w4a16_wgmma.cu", "kb0 + i, atom, wpolicy, lane);", "kb0 + i, 0u, wpolicy, lane);"),
    ("gemm_w4a16_wgmma.cu", """    if (lane == 0) tensor_copy_2d_g2s(st + S::kXOff, x, k0, m0, b.full_a + 8 * s, xpolicy);
    if (i >= S::kStages) mbar_wait(b.empty_b + 8 * s, parity);
    if (lane == 0) {
      mbar_arrive_expect_tx(b.full_b + 8 * s, atom);
      tensor_copy_2d_g2s(st + S::kXOff + kAtom, x, k0 + 64, m0, b.full_b + 8 * s, xpolicy);
    }""", """    (void)x, (void)k0, (void)st, (void)xpolicy;"""),
    ("gemm_w4a16_wgmma.cu", """  for (int i = nkb > S::kStages ? nkb - S::kStages : 0; i < nkb; ++i) {
    mbar_wait(b.empty_a + 8 * (i % S::kStages), (i / S::kStages) & 1);
    mbar_wait(b.empty_b + 8 * (i % S::kStages), (i / S::kStages) & 1);
  }""", """  for (int i = nkb > S::kStages ? nkb - S::kStages : 0; i < nkb; ++i)
    mbar_wait(b.empty_a + 8 * (i % S::kStages), (i / S::kStages) & 1);"""),
    # the persistent producer: the same but for the pairs
    ("gemm_w4a16_wgmma.cu", "tail(seg) ? (a.M - (int)seg.mt * S::kTokens) * 128u : kAtom; };",
     "!kPair ? 0u : tail(seg) ? (a.M - (int)seg.mt * S::kTokens) * 128u : kAtom; };"),
    ("gemm_w4a16_wgmma.cu", """      if (lane == 0) copy_x(st + S::kXOff, x, kb * 128, m0, b.full_a + 8 * s);
      if (i >= S::kStages) mbar_wait(b.empty_b + 8 * s, parity);
      if (lane == 0) {""", """      if (kPair && lane == 0) copy_x(st + S::kXOff, x, kb * 128, m0, b.full_a + 8 * s);
      if (kPair && i >= S::kStages) mbar_wait(b.empty_b + 8 * s, parity);
      if (kPair && lane == 0) {"""),
    # barriers: the x threads' arrivals
    ("gemm_w4a16_wgmma.cu", """      mbar_init(b.full_a + 8 * s, 1 + 32);  // the producer's expect_tx, its 32 lanes' cp.async
      mbar_init(b.full_b + 8 * s, 1);       // its expect_tx""",
     """      mbar_init(b.full_a + 8 * s, 1 + 32 + (kPair ? 0 : 96));
      mbar_init(b.full_b + 8 * s, kPair ? 1 : 96);"""),
    # the consumer: cp.async's writes to the tensor cores
    ("gemm_w4a16_wgmma.cu", """      mbar_wait(b.full_b + 8 * s, (i / S::kStages) & 1);
      const int off = s * S::kStageBytes;""", """      mbar_wait(b.full_b + 8 * s, (i / S::kStages) & 1);
      fence_proxy_async_shared();
      const int off = s * S::kStageBytes;"""),
    # the roles
    ("gemm_w4a16_wgmma.cu", """        ws_produce<S, kPair, false>(a, wmap, xmap, xtail, smem0, b, lane);
      }
    }""", """        ws_produce<S, kPair, false>(a, wmap, xmap, xtail, smem0, b, lane);
      }
    } else if constexpr (!kPair) {
      lab_copy_x<S, kSplit>(a, b, smem0, threadIdx.x - kBatchThreads - 32);
    }"""),
]



# Both 64-k atoms of a full token tile's x as one box of a 3-D map over x ([atoms][tokens][64 k]
# with the 128-byte swizzle, the stage's own layout: dims 64 k, M rows, K / 64 atoms, strides of a
# row and of 128 bytes), on part A's barrier, part B's completed by a plain arrival once both parts
# are free; the last token tile where M leaves it part empty, and the pairs, as before. One copy
# fewer a stage for the producer (and part A no longer refilled before part B is released). If the
# producer's own issue paces the split launches at M = 64-128 (dev/LOG.md, nineteenth session, step
# 8), they run faster by about the share of a stage's issues it saves (a fifth); else within 2% or
# slower (part A waits half a k-block longer for its refill). Lab only: needs K a multiple of 64 in
# the natural order (true of every layer compare_builds times).
_ONE_BOX_HOST = """cudaError_t x_tensor_map(const void* x, int64_t M, int64_t cols, int tokens, CUtensorMap* map) {"""
_ONE_BOX_HOST_NEW = """cudaError_t lab_x_one_box_map(const void* x, int64_t M, int64_t cols, int tokens, CUtensorMap* map) {
  const cuuint64_t dims[3] = {64, static_cast<cuuint64_t>(M), static_cast<cuuint64_t>(cols / 64)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(cols) * 2, 128};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(tokens), 2};
  return encode_tensor_map(CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, x, dims, strides, box, true, map);
}
""" + _ONE_BOX_HOST
_ONE_BOX_COPY = """__device__ __forceinline__ void tensor_copy_4d_g2s("""
_ONE_BOX_COPY_NEW = """__device__ __forceinline__ void tensor_copy_3d_g2s(uint32_t dst, const void* map, int c0, int c1, int c2, uint32_t bar,
                                                   uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3, %4}], [%5], %6;\\n" ::"r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "l"(policy)
      : "memory");
}
""" + _ONE_BOX_COPY
_ONE_BOX_SPLIT = _SPLIT_RING
_ONE_BOX_SPLIT_NEW = """  const bool whole = atom == kAtom;  // (xtail is then xmap, one box of both atoms)
  const uint32_t part_a = whole ? 2 * atom : atom;
  if (nkb > 0) ws_copy_constants<S, kBulk>(a, wmap, smem0, b, 0, cb, kb0, part_a, wpolicy, lane);
  pdl_wait();
  for (int i = 0; i < nkb; ++i) {
    const int s = i % S::kStages;
    const uint32_t parity = ((i / S::kStages) + 1) & 1;
    const uint32_t st = smem0 + s * S::kStageBytes;
    const int k0 = (kb0 + i) * 128;
    if (i >= S::kStages) mbar_wait(b.empty_a + 8 * s, parity);
    if (whole && i >= S::kStages) mbar_wait(b.empty_b + 8 * s, parity);
    if (i > 0) ws_copy_constants<S, kBulk>(a, wmap, smem0, b, i, cb, kb0 + i, part_a, wpolicy, lane);
    if (whole) {
      if (lane == 0) {
        tensor_copy_3d_g2s(st + S::kXOff, x, 0, m0, k0 / 64, b.full_a + 8 * s, xpolicy);
        mbar_arrive(b.full_b + 8 * s);
      }
      continue;
    }
    if (lane == 0) tensor_copy_2d_g2s(st + S::kXOff, x, k0, m0, b.full_a + 8 * s, xpolicy);
    if (i >= S::kStages) mbar_wait(b.empty_b + 8 * s, parity);
    if (lane == 0) {
      mbar_arrive_expect_tx(b.full_b + 8 * s, atom);
      tensor_copy_2d_g2s(st + S::kXOff + kAtom, x, k0 + 64, m0, b.full_b + 8 * s, xpolicy);
    }
  }"""
_ONE_BOX_PERSIST_FIRST = """  if (more) ws_copy_constants<S, kBulk>(a, wmap, smem0, b, 0, seg.cb, seg.kb_lo, atom_of(seg), wpolicy, lane);"""
_ONE_BOX_PERSIST_FIRST_NEW = """  auto one = [&](const WsSegment& seg) { return !kPair && atom_of(seg) == kAtom; };  // (xtail is then xmap)
  if (more)
    ws_copy_constants<S, kBulk>(a, wmap, smem0, b, 0, seg.cb, seg.kb_lo, (one(seg) ? 2 : 1) * atom_of(seg), wpolicy,
                                lane);"""
_ONE_BOX_PERSIST = """      if (i >= S::kStages) mbar_wait(b.empty_a + 8 * s, parity);
      if (i > 0) ws_copy_constants<S, kBulk>(a, wmap, smem0, b, i, seg.cb, kb, atom, wpolicy, lane);
      if (lane == 0) copy_x(st + S::kXOff, x, kb * 128, m0, b.full_a + 8 * s);"""
_ONE_BOX_PERSIST_NEW = """      const bool whole = one(seg);
      if (i >= S::kStages) mbar_wait(b.empty_a + 8 * s, parity);
      if (whole && i >= S::kStages) mbar_wait(b.empty_b + 8 * s, parity);
      if (i > 0) ws_copy_constants<S, kBulk>(a, wmap, smem0, b, i, seg.cb, kb, (whole ? 2 : 1) * atom, wpolicy, lane);
      if (whole) {
        if (lane == 0) {
          tensor_copy_3d_g2s(st + S::kXOff, x, 0, m0, 2 * kb, b.full_a + 8 * s, xpolicy);
          mbar_arrive(b.full_b + 8 * s);
        }
        continue;
      }
      if (lane == 0) copy_x(st + S::kXOff, x, kb * 128, m0, b.full_a + 8 * s);"""
_ONE_BOX_MAP = """  if (err == cudaSuccess) err = x_tensor_map(staged, M, cols, v.pair != nullptr ? v.tokens / 2 : v.tokens, &xmap);"""
_ONE_BOX_MAP_NEW = """  if (err == cudaSuccess)
    err = v.pair != nullptr ? x_tensor_map(staged, M, cols, v.tokens / 2, &xmap) : lab_x_one_box_map(staged, M, cols, v.tokens, &xmap);"""
PATCHES["x_one_box"] = [
    ("tensor_core.cuh", _ONE_BOX_COPY, _ONE_BOX_COPY_NEW),
    ("gemm_w4a16_wgmma.cu", _ONE_BOX_HOST, _ONE_BOX_HOST_NEW),
    ("gemm_w4a16_wgmma.cu", _ONE_BOX_SPLIT, _ONE_BOX_SPLIT_NEW),
    ("gemm_w4a16_wgmma.cu", _ONE_BOX_PERSIST_FIRST, _ONE_BOX_PERSIST_FIRST_NEW),
    ("gemm_w4a16_wgmma.cu", _ONE_BOX_PERSIST, _ONE_BOX_PERSIST_NEW),
    ("gemm_w4a16_wgmma.cu", _ONE_BOX_MAP, _ONE_BOX_MAP_NEW),
]

# one more kernel in front of every warp-specialised launch: an empty zero_flags_kernel (no flags),
# PDL-chained as the stream-K launches' own flags kernel is, the GEMM then under PDL. What it adds
# to a call is about what the flags kernel costs the stream-K launches, which a GEMM that left its
# flags zeroed behind it (no kernel of its own) would save.
PATCHES["chain_extra"] = [("gemm_w4a16_wgmma.cu", "  if (v.pair != nullptr)  // (plan_gemm_w4a16_ws: natural order, no split)\n",
                           "  err = launch_kernel(zero_flags_kernel, dim3(1), dim3(256), 0, stream, pdl, 1, flags, 0);\n"
                           "  if (err != cudaSuccess) return err;\n  pdl = true;\n"
                           "  if (v.pair != nullptr)  // (plan_gemm_w4a16_ws: natural order, no split)\n")]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("others", nargs="*")
    ap.add_argument("--patches", default="", help=f"names of PATCHES: {', '.join(PATCHES)}")
    ap.add_argument("--shapes", default="8192x28672")
    ap.add_argument("--m", default="64,1024")
    ap.add_argument("--kernel", type=int, default=3)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--orders", default="0")
    ap.add_argument("--tiles", type=int, default=0, help="the batch kernels' tiling (0: the planner's)")
    ap.add_argument("--splits", type=int, default=0, help="their split-K count (0: the planner's)")
    ap.add_argument("--pad-x", type=int, default=0, help="x allocated with M rounded up to this many rows")
    args = ap.parse_args()
    shipped = build_tree("shipped", kernels.KERNEL_DIR)
    mods = {f"o{o}" if args.orders != "0" else "shipped": (shipped, int(o)) for o in args.orders.split(",")}
    for d in args.others:
        mods[Path(d).name] = (build_tree(Path(d).name, Path(d)), None)
    for name in (v for v in args.patches.split(",") if v):
        mods[name] = (build_tree(name, kernels.KERNEL_DIR, PATCHES[name]), None)
    def call(entry, x, qw, qz, s, b):
        mod, order = entry
        if args.kernel == 0:
            return mod.gemv_w4(x, qw, qz, s, b, 0, False)
        if order is None:  # another tree: its own binding, which may not know `order`
            return mod.gemm_w4_batch(x, qw, qz, s, b, args.splits, args.tiles, args.kernel)
        return mod.gemm_w4_batch(x, qw, qz, s, b, args.splits, args.tiles, args.kernel, False, order)
    time_alternately(mods, args.shapes, args.m, call, label=f" kernel {args.kernel}", reps=args.reps,
                     pad_x=args.pad_x)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
