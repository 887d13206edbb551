"""Where one launch of the warp-specialised kernel spends its time (lab only): the shipped kernel
rebuilt with timestamps, so that a call's fixed cost (launch, first stage, output tile, the last
block's finish) can be told from its k-blocks.

    PYTHONPATH=. python3 dev/probes/ws_timeline.py [--cells 4096x4096:256,8192x28672:64] [--launches 10]
        [--tree DIR] [--patches NAME] [--splits 0] [--variant 0] [--order 0] [--kblocks] [--warm-code]

Thread 0 of each block (the first MMA thread) records the global timer (ns, common to all SMs,
ticking in about 0.25 us on the H100) and its SM's cycle counter (exact) at entry; at each of its
first four tiles' first stage landed, last k-block issued, wgmmas drained and result gone (stored to
y, or the stream-K or split-K partial stored); and at exit. The producer's lane records before and
after its pdl_wait. Each launch runs after a 256 MiB read that evicts L2; the medians over the
launches are printed beside the bench's per-call median (CUDA graph, cold L2) for the same call:
  span        first block's entry to the last block's exit (global timer)
  skew        last block's entry - first block's
  prologue    entry -> first stage landed (per block, cycle counter, median block), with its steps:
              barriers initialised, producer begun, its loop's function entered, first segment
              found, stage 0's constants issued, part A landed; and the MMA warps' own walk: begun,
              set up, first segment found
  kblock      ns per k-block inside the first tile's loop (landed -> last k-block issued)
  drain       last k-block issued -> wgmmas drained
  out         wgmmas drained -> the tile's result gone (for the first tile)
  after       the last tile's result gone -> exit (split-K: first barrier, this thread's sum, second
              barrier)
  finish      last block's exit - median block's exit (global timer)
  stream-K    the slowest block's add of the later pieces' partials (to its last flag, then that
              partial's read) and the slowest store of a piece's partial
The timestamps add a few instructions to the MMA warps; compare the span with the bench's median
to see what they cost.

--patches applies one of compare_builds.py's PATCHES (a change being measured) before the stamps.

--warm-code runs the same call on another layer's data of the same shape between the L2-evicting
read and each traced launch: its code is back in L2 (as in the bench, where every call runs the
same code between reads of less than L2), its data is not. The prologue with and without it shows
what fetching the code from memory costs the traced launch.

--kblocks adds a stamp per k-block of the ring (its first KB_STEPS steps): the producer's lane 0
once it may refill the stage (part A and part B asked for) and thread 0 before its wait for the
stage and once both parts have landed, all on the SM's cycle counter, and prints per step the
median over blocks and launches of the wait, the lead (the MMA warps reaching the stage - part A
asked for: how far ahead the ring is) and part B's time from asked to landed where the step was
waited for: a ring that stays ahead shows leads of kStages - 1 k-blocks and no waits. Split
launches also stamp the producer's steps within a ring step, and the second MMA warpgroup's
arrival at each stage (its skew behind the first).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from w4cli.bench import cases
from w4cli.gpu import kernels, timing
from compare_builds import PATCHES as CHANGES  # dev/probes, this script's folder
from ws_ablation import build_tree

KERNEL = "gemm_w4a16_wgmma.cu"
BLOCKS = 4096  # blocks traced (the first ones by linear index)
SLOTS = 40     # per block: (global timer, cycle counter) pairs

TRACE = """// ---- timeline probe (dev/probes/ws_timeline.py) ----
__device__ unsigned long long w4_trace[%d * %d * 2];
__device__ __forceinline__ void w4_stamp(int slot) {
  const unsigned blk = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (blk >= %d || slot >= %d) return;
  unsigned long long g, c;
  asm volatile("mov.u64 %%0, %%%%globaltimer;" : "=l"(g));
  asm volatile("mov.u64 %%0, %%%%clock64;" : "=l"(c));
  w4_trace[(blk * %d + slot) * 2] = g;
  w4_trace[(blk * %d + slot) * 2 + 1] = c;
}
__device__ __forceinline__ void w4_note(int slot, unsigned long long v0, unsigned long long v1) {
  const unsigned blk = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (blk >= %d) return;
  w4_trace[(blk * %d + slot) * 2] = v0;
  w4_trace[(blk * %d + slot) * 2 + 1] = v1;
}
#define W4_T(slot) do { if (threadIdx.x == 0) w4_stamp(slot); } while (0)
""" % (BLOCKS, SLOTS, BLOCKS, SLOTS, SLOTS, SLOTS, BLOCKS, SLOTS, SLOTS)

def accessor_patches(symbol: str, name: str, elem_bytes: int) -> list[tuple[str, str, str]]:
    """The patches that give a __device__ array `symbol` of the traced kernel file a fetch and a
    clear on the host, bound in the module as `name`_fetch(tensor) and `name`_clear()."""
    host = (f"\nvoid {symbol}_fetch(void* dst, size_t bytes) {{ cudaMemcpyFromSymbol(dst, {symbol}, bytes); }}\n"
            f"void {symbol}_clear() {{\n  void* p = nullptr;\n  cudaGetSymbolAddress(&p, {symbol});\n"
            f"  cudaMemset(p, 0, sizeof({symbol}));\n}}\n}}  // namespace w4\n")
    binding = (f"namespace w4 {{\nvoid {symbol}_fetch(void* dst, size_t bytes);\nvoid {symbol}_clear();\n}}\n"
               "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n"
               f"  m.def(\"{name}_fetch\", [](torch::Tensor t) {{ w4::{symbol}_fetch(t.data_ptr(), t.numel() * {elem_bytes}); }});\n"
               f"  m.def(\"{name}_clear\", []() {{ w4::{symbol}_clear(); }});\n")
    return [(KERNEL, "}  // namespace w4\n", host), ("ops.cpp", "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n", binding)]


# slots: 0 entry, 1 / 2 producer before / after pdl_wait, 4 + 4 j .. 7 + 4 j tile j (landed,
# issued, drained, gone) for its first four tiles, 25 the first stage's part A landed, 32 the
# barriers initialised, 33 / 34 the producer begun / its first segment found (35: its loop's
# function entered), 36 / 37 / 38 the MMA warps' work begun / walk set up / first segment found, 20 / 21
# stream-K's add begun / done (24: its last flag seen), 22 / 23
# stream-K's store begun / done, 26 / 27 split-K's cluster sum begun / this thread's share done, 28
# (tiles, smid), 29 k-blocks of tiles 0-3, 30 exit
PATCHES = [
    (KERNEL, "__host__ __device__ constexpr int ws_threads(int wg)", TRACE + "__host__ __device__ constexpr int ws_threads(int wg)"),
    (KERNEL, "  const WsBarriers b(smem_u32(bars), S::kStages);\n  pdl_launch_dependents();",
     "  const WsBarriers b(smem_u32(bars), S::kStages);\n  W4_T(0);\n  pdl_launch_dependents();"),
    (KERNEL, "  pdl_wait();\n  int i = 0;  // steps into the ring",
     "  if (lane == 0) w4_stamp(1);\n  pdl_wait();\n  if (lane == 0) w4_stamp(2);\n  int i = 0;  // steps into the ring"),
    (KERNEL, "  pdl_wait();\n  for (int i = 0; i < nkb; ++i) {",
     "  if (lane == 0) w4_stamp(1);\n  pdl_wait();\n  if (lane == 0) w4_stamp(2);\n  for (int i = 0; i < nkb; ++i) {"),
    (KERNEL, "  while (work.next(a, seg)) {\n",
     "  int tseg = 0;\n  unsigned long long kbs = 0;\n  while (work.next(a, seg)) {\n"
     "    if (tseg == 0) W4_T(38);\n"
     "    if (tseg < 4) kbs |= (unsigned long long)(seg.kb_hi - seg.kb_lo) << (16 * tseg);\n"),
    (KERNEL, "  WsWork<kPair, kSplit> work(a);\n", "  W4_T(36);\n  WsWork<kPair, kSplit> work(a);\n  W4_T(37);\n"),
    (KERNEL, "  constexpr uint32_t kAtom = S::kTokens * 128;  // bytes of one 64-k atom of the x tile (its place in the stage)\n",
     "  constexpr uint32_t kAtom = S::kTokens * 128;  // bytes of one 64-k atom of the x tile (its place in the stage)\n"
     "  if (lane == 0) w4_stamp(35);\n"),
    (KERNEL, "      mbar_wait(b.full_a + 8 * s, (i / S::kStages) & 1);\n",
     "      mbar_wait(b.full_a + 8 * s, (i / S::kStages) & 1);\n      if (i == 0) W4_T(25);\n"),
    (KERNEL, "      mbar_wait(b.full_b + 8 * s, (i / S::kStages) & 1);\n",
     "      mbar_wait(b.full_b + 8 * s, (i / S::kStages) & 1);\n      if (kb == seg.kb_lo && tseg < 4) W4_T(4 + 4 * tseg);\n"),
    (KERNEL, "    wgmma_wait<0>();\n    const int held",
     "    if (tseg < 4) W4_T(5 + 4 * tseg);\n    wgmma_wait<0>();\n    if (tseg < 4) W4_T(6 + 4 * tseg);\n    const int held"),
    (KERNEL, "      store_split_partial<MT, S::kRows>(acc, reinterpret_cast<float*>(const_cast<uint8_t*>(smem)), row0_local, 64,\n                                        lane);\n",
     "      store_split_partial<MT, S::kRows>(acc, reinterpret_cast<float*>(const_cast<uint8_t*>(smem)), row0_local, 64,\n                                        lane);\n      if (tseg < 4) W4_T(7 + 4 * tseg);\n"),
    (KERNEL, "      release_stage<kPair>(b.empty_b + 8 * held, lane);\n    }\n  }\n}",
     "      release_stage<kPair>(b.empty_b + 8 * held, lane);\n      if (tseg < 4) W4_T(7 + 4 * tseg);\n    }\n    ++tseg;\n  }\n"
     "  if (threadIdx.x == 0) {\n    unsigned smid;\n    asm volatile(\"mov.u32 %0, %%smid;\" : \"=r\"(smid));\n"
     "    w4_note(28, tseg, smid);\n    w4_note(29, kbs, 0);\n  }\n}"),
    (KERNEL, "    if constexpr (kPair) cluster_sync();\n  }\n#endif\n}\n\nstruct WgVariant",
     "    if constexpr (kPair) cluster_sync();\n    W4_T(30);\n  }\n#endif\n}\n\nstruct WgVariant"),
    (KERNEL, "      cluster_sync();\n      reduce_split_cluster_of<MT, S::kRows, S::kMmaThreads>(",
     "      cluster_sync();\n      W4_T(26);\n      reduce_split_cluster_of<MT, S::kRows, S::kMmaThreads>("),
    (KERNEL, "                                                            blockIdx.x * S::kRows);\n",
     "                                                            blockIdx.x * S::kRows);\n      W4_T(27);\n"),
    (KERNEL, "          stream_k_add<kPair, kThreads>(acc, a, (seg.unit + 1) * a.kblocks);\n",
     "          W4_T(20);\n          stream_k_add<kPair, kThreads>(acc, a, (seg.unit + 1) * a.kblocks);\n          W4_T(21);\n"),
    (KERNEL, "      while (ld_acquire_gpu(a.counters + slot) == 0) __nanosleep(64);\n",
     "      while (ld_acquire_gpu(a.counters + slot) == 0) __nanosleep(64);\n    W4_T(24);\n"),
    (KERNEL, "        stream_k_store<kThreads>(acc, a, stream_k_slot<kPair>(blockIdx.x));",
     "        W4_T(22);\n        stream_k_store<kThreads>(acc, a, stream_k_slot<kPair>(blockIdx.x));\n        W4_T(23);"),
    (KERNEL, "    __syncthreads();\n  }\n  // Split-K: the cluster's sum",
     "    __syncthreads();\n  }\n  W4_T(32);\n  // Split-K: the cluster's sum"),
    (KERNEL, "    setmaxnreg_dec<ws_producer_regs(WG, kPair)>();\n    if (warp == kMmaWarps) {\n",
     "    setmaxnreg_dec<ws_producer_regs(WG, kPair)>();\n    if (warp == kMmaWarps) {\n"
     "      if (lane == 0) w4_stamp(33);\n"),
    (KERNEL, "  bool more = work.next(a, seg);\n",
     "  bool more = work.next(a, seg);\n  if (lane == 0) w4_stamp(34);\n"),
] + accessor_patches("w4_trace", "trace", 8)


KB_STEPS = 64  # ring steps traced per block with --kblocks

KB_TRACE = """__device__ unsigned w4_ktrace[%d * %d * 8];
__device__ __forceinline__ void w4_kstamp(int step, int what) {
  const unsigned blk = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (blk >= %d || step >= %d) return;
  w4_ktrace[(blk * %d + step) * 8 + what] = (unsigned)clock64();
}
#define W4_T(slot) do { if (threadIdx.x == 0) w4_stamp(slot); } while (0)
""" % (BLOCKS, KB_STEPS, BLOCKS, KB_STEPS, KB_STEPS)

# after PATCHES: 0 / 1 the producer may refill the stage's part A / part B (both producer loops), 2
# / 3 thread 0 before the stage's wait / past both parts' (the full_b line as PATCHES left it); the
# split producer's lane 0 also once it has issued the stage's constants (4), its first x atom (5)
# and its second (6); thread 128 (the second MMA warpgroup's first) before the stage's wait (7)
KB_PATCHES = [
    (KERNEL, "#define W4_T(slot) do { if (threadIdx.x == 0) w4_stamp(slot); } while (0)\n", KB_TRACE),
    (KERNEL, "if (i >= S::kStages) mbar_wait(b.empty_a + 8 * s, parity);",
     "if (i >= S::kStages) mbar_wait(b.empty_a + 8 * s, parity);\n    if (lane == 0) w4_kstamp(i, 0);"),
    (KERNEL, "if (i >= S::kStages) mbar_wait(b.empty_b + 8 * s, parity);",
     "if (i >= S::kStages) mbar_wait(b.empty_b + 8 * s, parity);\n    if (lane == 0) w4_kstamp(i, 1);"),
    (KERNEL, "      mbar_wait(b.full_a + 8 * s, (i / S::kStages) & 1);\n",
     "      if (threadIdx.x == 0) w4_kstamp(i, 2);\n      if (threadIdx.x == 128) w4_kstamp(i, 7);\n"
     "      mbar_wait(b.full_a + 8 * s, (i / S::kStages) & 1);\n"),
    (KERNEL, "      mbar_wait(b.full_b + 8 * s, (i / S::kStages) & 1);\n",
     "      mbar_wait(b.full_b + 8 * s, (i / S::kStages) & 1);\n      if (threadIdx.x == 0) w4_kstamp(i, 3);\n"),
    (KERNEL, "    if (i > 0) ws_copy_constants<S, kBulk>(a, wmap, smem0, b, i, cb, kb0 + i, atom, wpolicy, lane);\n",
     "    if (i > 0) ws_copy_constants<S, kBulk>(a, wmap, smem0, b, i, cb, kb0 + i, atom, wpolicy, lane);\n"
     "    if (lane == 0) w4_kstamp(i, 4);\n"),
    (KERNEL, "    if (lane == 0) tensor_copy_2d_g2s(st + S::kXOff, x, k0, m0, b.full_a + 8 * s, xpolicy);\n",
     "    if (lane == 0) tensor_copy_2d_g2s(st + S::kXOff, x, k0, m0, b.full_a + 8 * s, xpolicy);\n"
     "    if (lane == 0) w4_kstamp(i, 5);\n"),
    (KERNEL, "      tensor_copy_2d_g2s(st + S::kXOff + kAtom, x, k0 + 64, m0, b.full_b + 8 * s, xpolicy);\n    }\n",
     "      tensor_copy_2d_g2s(st + S::kXOff + kAtom, x, k0 + 64, m0, b.full_b + 8 * s, xpolicy);\n"
     "      w4_kstamp(i, 6);\n    }\n"),
] + accessor_patches("w4_ktrace", "ktrace", 4)


def ring_steps(mod) -> list[list[tuple[int, ...]]]:
    """Per traced block, its ring steps' stamps (cycles, low 32 bits), as far as they were set."""
    t = torch.zeros(BLOCKS * KB_STEPS * 8, dtype=torch.int32)
    mod.ktrace_fetch(t)
    t = (t.view(BLOCKS, KB_STEPS, 8).to(torch.int64) & 0xFFFFFFFF).tolist()
    return [[tuple(step) for step in blk if step[2] and step[3]] for blk in t if blk[0][2]]


def ring_table(steps: list[list[list[tuple[int, ...]]]], ghz: float) -> None:
    """Per ring step, medians over blocks and launches: wait, lead, part B asked -> landed (waited steps)."""
    ns = lambda c: ((c + (1 << 31)) % (1 << 32) - (1 << 31)) / ghz  # noqa: E731  (32-bit wrap)
    n = max((len(b) for launch in steps for b in launch), default=0)
    print("  step: wait ns, lead ns (MMA warps at the stage - part A asked), part B asked -> landed ns "
          "(waited steps only), waited blocks %; the split producer's ns from part A's release to its "
          "constants issued, its first atom issued, part B's release, its second atom issued, and to the "
          "next step's part A release; skew: the second MMA warpgroup reaching the stage after the first",
          flush=True)
    for i in range(n):
        rows = [b[i] for launch in steps for b in launch if len(b) > i]
        waits = [ns(r[3] - r[2]) for r in rows]
        leads = [ns(r[2] - r[0]) for r in rows if r[0]]
        waited = [r for r, w in zip(rows, waits) if w > 100]
        land_b = [ns(r[3] - r[1]) for r in waited if r[1]]
        prod = [[ns(r[k] - r[0]) for r in rows if r[0] and r[k]] for k in (4, 5, 1, 6)]
        nxt = [ns(b[i + 1][0] - b[i][0]) for launch in steps for b in launch if len(b) > i + 1 and b[i][0] and b[i + 1][0]]
        print(f"  {i:3d}: wait {med(waits):7.0f}  lead {med(leads):7.0f}  B landed after {med(land_b):7.0f}  "
              f"waited {100 * len(waited) / max(1, len(rows)):3.0f}%  producer "
              + " ".join(f"{med(v):6.0f}" for v in prod) + f"  next {med(nxt):6.0f}"
              + f"  skew {med([ns(r[7] - r[2]) for r in rows if r[7]]):7.0f}", flush=True)


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def one_launch(mod, call, flush: torch.Tensor, kblocks: list | None = None, warm=None) -> dict:
    """One traced launch after an L2-evicting read; the per-launch statistics in ns. With `kblocks`
    (a build with KB_PATCHES), its ring steps are appended there. `warm`, when given, runs between
    the read and the launch (the same call on other data: the code back in L2, the data not)."""
    flush.sum()
    if warm is not None:
        warm()
    mod.trace_clear()
    if kblocks is not None:
        mod.ktrace_clear()
    torch.cuda.synchronize()
    call()
    torch.cuda.synchronize()
    if kblocks is not None:
        kblocks.append(ring_steps(mod))
    t = torch.zeros(BLOCKS * SLOTS * 2, dtype=torch.int64)
    mod.trace_fetch(t)
    t = t.view(BLOCKS, SLOTS, 2).tolist()
    blocks = [b for b in t if b[0][0] != 0]
    g = lambda b, s: b[s][0]  # noqa: E731
    c = lambda b, s: b[s][1]  # noqa: E731
    # cycles -> ns per block from its own span (entry -> exit on both clocks)
    rates = [(c(b, 30) - c(b, 0)) / (g(b, 30) - g(b, 0)) for b in blocks if g(b, 30) > g(b, 0)]
    ghz = med(rates)
    ns = lambda b, s0, s1: (c(b, s1) - c(b, s0)) / ghz  # noqa: E731
    entries = [g(b, 0) for b in blocks]
    exits = [g(b, 30) for b in blocks]
    first = [b for b in blocks if b[28][0] >= 1 and b[5][1] and b[4][1]]
    kb0 = [b[29][0] & 0xFFFF for b in first]
    last_gone = lambda b: 7 + 4 * (min(b[28][0], 4) - 1)  # noqa: E731
    return {
        "blocks": len(blocks), "ghz": ghz,
        "span": max(exits) - min(entries), "skew": max(entries) - min(entries),
        "prologue": med([ns(b, 0, 4) for b in first]),
        "part_a": med([ns(b, 0, 25) for b in first if b[25][1]]),
        "issued": med([ns(b, 0, 1) for b in blocks if b[1][1]]),
        "init": med([ns(b, 0, 32) for b in blocks if b[32][1]]),
        "role": med([ns(b, 0, 33) for b in blocks if b[33][1]]),
        "walk": med([ns(b, 0, 34) for b in blocks if b[34][1]]),
        "entered": med([ns(b, 0, 35) for b in blocks if b[35][1]]),
        "c_begun": med([ns(b, 0, 36) for b in blocks if b[36][1]]),
        "c_work": med([ns(b, 0, 37) for b in blocks if b[37][1]]),
        "c_first": med([ns(b, 0, 38) for b in blocks if b[38][1]]),
        "pdl": med([ns(b, 1, 2) for b in blocks if b[1][1] and b[2][1]]),
        "kblock": med([ns(b, 4, 5) / max(1, kb - 1) for b, kb in zip(first, kb0) if kb > 1]),
        "drain": med([ns(b, 5, 6) for b in first]),
        "out": med([ns(b, 6, 7) for b in first if b[7][1]]),
        "after": med([ns(b, last_gone(b), 30) for b in blocks if b[28][0] >= 1 and b[last_gone(b)][1]]),
        "finish": max(exits) - med(exits),
        # split-K in clusters: the first cluster barrier (the partial stored -> every block's stored),
        # this thread's share of the sum, and the second barrier (-> exit)
        "wait1": med([ns(b, 7, 26) for b in first if b[26][1] and b[7][1]]),
        "reduce": med([ns(b, 26, 27) for b in blocks if b[26][1] and b[27][1]]),
        "wait2": med([ns(b, 27, 30) for b in blocks if b[27][1]]),
        # stream-K: a cut tile's first block adding the later pieces' partials (flag waits included),
        # and a later block storing its piece's partial; the slowest block of each
        "skadd": max([ns(b, 20, 21) for b in blocks if b[20][1] and b[21][1]], default=float("nan")),
        "skwait": max([ns(b, 20, 24) for b in blocks if b[20][1] and b[24][1]], default=float("nan")),
        "skread": max([ns(b, 24, 21) for b in blocks if b[24][1] and b[21][1]], default=float("nan")),
        "skstore": max([ns(b, 22, 23) for b in blocks if b[22][1] and b[23][1]], default=float("nan")),
        "tiles": med([b[28][0] for b in blocks]), "kb": med(kb0),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", default="4096x4096:128,4096x4096:256,4096x4096:1024,4096x6144:256,8192x28672:64,8192x28672:256")
    ap.add_argument("--launches", type=int, default=10)
    ap.add_argument("--tree", default=str(kernels.KERNEL_DIR))
    ap.add_argument("--splits", type=int, default=0)
    ap.add_argument("--variant", type=int, default=0)
    ap.add_argument("--order", type=int, default=0)
    ap.add_argument("--patches", default="", help="one of compare_builds.py's PATCHES, applied first")
    ap.add_argument("--kblocks", action="store_true", help="stamp each ring step too (KB_PATCHES)")
    ap.add_argument("--warm-code", action="store_true",
                    help="before each traced launch, the same call on another layer's data (code in L2, data not)")
    args = ap.parse_args()
    name = ("timeline_kb_" if args.kblocks else "timeline_") + Path(args.tree).name + (f"_{args.patches}" if args.patches else "")
    mod = build_tree(name, Path(args.tree),
                     (CHANGES[args.patches] if args.patches else []) + PATCHES + (KB_PATCHES if args.kblocks else []))
    copy = timing.copy_bandwidth()
    flush = torch.empty(64 << 20, dtype=torch.float32, device="cuda").uniform_()
    print(torch.cuda.get_device_name(), flush=True)
    for cell in args.cells.split(","):
        shape, m = cell.split(":")
        k, n = (int(v) for v in shape.split("x"))
        m = int(m)
        layer = cases.Layer(k, n, 128, seed=1)

        def run(x, qw, qz, s, b):
            return mod.gemm_w4_batch(x, qw, qz, s, b, args.splits, args.variant, 3, False, args.order)
        case = cases.Case(cell, lambda i: (layer.x(m, i), *layer.gemv(i), None), run,
                          lambda out, a: cases.w4_gemv_errors(layer, out, a).require(),
                          cases.W4_GEMV_KERNEL.bytes_moved(k, n, m, layer.group))
        bench = case.measure(copy).median_us
        x, (qw, qz, s) = layer.x(m, 0), layer.gemv(0)
        steps = [] if args.kblocks else None
        warm = None
        if args.warm_code:
            other = cases.Layer(k, n, 128, seed=2)
            xo, (qwo, qzo, so) = other.x(m, 0), other.gemv(0)
            warm = lambda: run(xo, qwo, qzo, so, None)  # noqa: E731
        runs = [one_launch(mod, lambda: run(x, qw, qz, s, None), flush, steps, warm) for _ in range(args.launches)]
        col = {key: med([r[key] for r in runs]) for key in runs[0]}
        print(f"{cell}: bench {bench:.2f} us | blocks {col['blocks']:.0f} tiles/block {col['tiles']:.0f} "
              f"kb/tile0 {col['kb']:.0f} @ {col['ghz']:.2f} GHz | span {col['span'] / 1e3:.2f} us, skew "
              f"{col['skew'] / 1e3:.2f}, prologue {col['prologue'] / 1e3:.2f} (barriers {col['init'] / 1e3:.2f}, producer {col['role'] / 1e3:.2f}, its loop {col['entered'] / 1e3:.2f}, first segment "
              f"{col['walk'] / 1e3:.2f}, stage 0's constants issued {col['issued'] / 1e3:.2f}, part A {col['part_a'] / 1e3:.2f}, pdl wait "
              f"{col['pdl'] / 1e3:.2f}; MMA warps: begun {col['c_begun'] / 1e3:.2f}, walk set up {col['c_work'] / 1e3:.2f}, "
              f"first segment {col['c_first'] / 1e3:.2f}), "
              f"kblock {col['kblock'] / 1e3:.3f}, drain {col['drain'] / 1e3:.2f}, out {col['out'] / 1e3:.2f}, "
              f"after {col['after'] / 1e3:.2f} (wait {col['wait1'] / 1e3:.2f}, sum {col['reduce'] / 1e3:.2f}, wait "
              f"{col['wait2'] / 1e3:.2f}), finish {col['finish'] / 1e3:.2f}, stream-K add {col['skadd'] / 1e3:.2f} "
              f"(to the last flag {col['skwait'] / 1e3:.2f}, its partial {col['skread'] / 1e3:.2f}) store "
              f"{col['skstore'] / 1e3:.2f} (slowest)", flush=True)
        if steps is not None:
            ring_table(steps, col["ghz"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
