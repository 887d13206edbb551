"""Where the blocks of one barrier wgmma launch ran, and when (lab only): the shipped kernel rebuilt
with a stamp per block, for the cells whose time comes in two modes from one launch to the next
(224 blocks of two an SM on 132 SMs: 14336x4096 at M = 32 in clusters of 7, 8192x28672 at M = 32
on one m64 tile, 28672x8192 at M = 32 on two; dev/LOG.md).

    PYTHONPATH=.:dev/probes python3 dev/probes/barrier_timeline.py [--cells 14336x4096:32:0,8192x28672:32:1]
        [--launches 200] [--out DIR]

A cell is K x N : M : tiles (0 = the planner's). Thread 0 of each block records the global timer
(ns, common to all SMs) and its SM's cycle counter at entry, once its k-block loop is done and at
exit, with its SM (%smid) and its cluster (%clusterid, %cluster_ctarank), in a ring of the last
LAUNCHES launches. First the bench times the cell (its graph of back-to-back launches over input
sets beyond 4x L2): its last launches' spans by input set and the idle time between launches are
printed. Then each launch runs alone after a 256 MiB read that evicts L2. Per cell the launches' spans (first entry to last exit) are
printed with the fastest and slowest fifth compared: per-block time entry -> loop done, the most
blocks on one SM and on one GPC, and how late the last block entered. SMs are grouped into GPCs
by the clusters they shared (a cluster's blocks share a GPC), so a launch in clusters names the
GPCs; one without them names none. With --out, every stamp goes to DIR/<cell>.safetensors
(int64 [launches, blocks, 8]: entry, loop done, exit as (timer, clock) pairs, SM, cluster) for
reading on another machine.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from w4cli.bench import cases
from w4cli.gpu import kernels, timing
from ws_ablation import build_tree  # dev/probes, this script's folder
from ws_timeline import accessor_patches

KERNEL = "gemm_w4a16_wgmma.cu"
BLOCKS = 512  # blocks traced a launch (the first ones by linear index)
LAUNCHES = 64  # launches kept, a ring indexed by the launch count

# Each launch reads the launch count at entry (the previous launch has completed: stream order, no
# PDL) and writes its blocks' stamps to that slot of the ring; its last block to leave advances the
# count. The count and the blocks that have left are the ring's last two words.
TRACE = """// ---- block timeline probe (dev/probes/barrier_timeline.py) ----
__device__ unsigned long long w4_btrace[LAUNCHES * BLOCKS * 8 + 2];
__device__ __forceinline__ unsigned w4_block() { return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z); }
__device__ __forceinline__ unsigned long long w4_launch() {
  return *reinterpret_cast<volatile unsigned long long*>(w4_btrace + LAUNCHES * BLOCKS * 8);
}
__device__ __forceinline__ void w4_bstamp(unsigned long long launch, int slot) {
  if (threadIdx.x != 0 || w4_block() >= BLOCKS) return;
  unsigned long long g, c;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g));
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c));
  unsigned long long* t = w4_btrace + ((launch % LAUNCHES) * BLOCKS + w4_block()) * 8;
  t[2 * slot] = g;
  t[2 * slot + 1] = c;
}
__device__ __forceinline__ void w4_bleave(unsigned long long launch) {
  if (threadIdx.x != 0) return;
  if (w4_block() < BLOCKS) {
    unsigned smid, rank, cx, cy;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(cx));
    asm volatile("mov.u32 %0, %%clusterid.y;" : "=r"(cy));
    unsigned long long* t = w4_btrace + ((launch % LAUNCHES) * BLOCKS + w4_block()) * 8;
    t[6] = smid;
    t[7] = cx | (cy << 16) | ((unsigned long long)rank << 32);
  }
  __threadfence();
  const unsigned long long total = (unsigned long long)gridDim.x * gridDim.y * gridDim.z;
  if (atomicAdd(w4_btrace + LAUNCHES * BLOCKS * 8 + 1, 1ull) + 1 == total) {
    w4_btrace[LAUNCHES * BLOCKS * 8 + 1] = 0;
    __threadfence();
    atomicAdd(w4_btrace + LAUNCHES * BLOCKS * 8, 1ull);
  }
}
""".replace("LAUNCHES", str(LAUNCHES)).replace("BLOCKS", str(BLOCKS))

KERNEL_HEAD = "template <int MT, int NT, bool kSplit, bool kNatural, bool kPost>\n__global__ void __launch_bounds__(kBatchThreads, MT <= 32 ? 2 : 1)\n"
PATCHES = [
    (KERNEL, KERNEL_HEAD, TRACE + KERNEL_HEAD),
    (KERNEL, "  pdl_launch_dependents();  // a kernel launched after this one with PDL waits (pdl_wait) before its reads\n  if (copier) {\n",
     "  const unsigned long long w4_at = w4_launch();\n  w4_bstamp(w4_at, 0);\n"
     "  pdl_launch_dependents();  // a kernel launched after this one with PDL waits (pdl_wait) before its reads\n  if (copier) {\n"),
    (KERNEL, "  cp_async_wait<0>();\n  const int row0 = cb * S::kRows + (warp >> 2) * NT * 64 + (warp & 3) * 16;\n",
     "  cp_async_wait<0>();\n  w4_bstamp(w4_at, 1);\n  const int row0 = cb * S::kRows + (warp >> 2) * NT * 64 + (warp & 3) * 16;\n"),
    (KERNEL, "    cluster_sync_reads_done();\n  }\n#endif\n}\n",
     "    cluster_sync_reads_done();\n  }\n  w4_bstamp(w4_at, 2);\n  w4_bleave(w4_at);\n#endif\n}\n"),
] + accessor_patches("w4_btrace", "btrace", 8)


def fetch(mod) -> tuple[int, list[torch.Tensor]]:
    """The launch count and the ring's launches, oldest first: int64 [blocks, 8] of the blocks that ran."""
    t = torch.zeros(LAUNCHES * BLOCKS * 8 + 2, dtype=torch.int64)
    mod.btrace_fetch(t)
    count = int(t[-2])
    ring = t[:-2].view(LAUNCHES, BLOCKS, 8)
    launches = [ring[e % LAUNCHES] for e in range(max(0, count - LAUNCHES), count)]
    return count, [b[b[:, 0] != 0] for b in launches]


def one_launch(mod, call, flush: torch.Tensor) -> torch.Tensor:
    """One stamped launch after an L2-evicting read: int64 [blocks, 8] of the blocks that ran."""
    flush.sum()
    torch.cuda.synchronize()
    call()
    torch.cuda.synchronize()
    return fetch(mod)[1][-1]


def gpc_groups(launches: list[torch.Tensor]) -> dict[int, int]:
    """SM -> GPC label, from the SMs that held blocks of one cluster (union-find); empty without clusters."""
    parent: dict[int, int] = {}

    def find(a: int) -> int:
        while parent.setdefault(a, a) != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a
    clustered = False
    for t in launches:
        members: dict[int, list[int]] = {}
        for sm, where in zip(t[:, 6].tolist(), t[:, 7].tolist()):
            members.setdefault(where & 0xFFFFFFFF, []).append(sm)
            clustered |= (where >> 32) > 0
        for sms in members.values():
            for sm in sms[1:]:
                parent[find(sm)] = find(sms[0])
    if not clustered:
        return {}
    roots = sorted({find(sm) for sm in parent})
    return {sm: roots.index(find(sm)) for sm in parent}


def launch_stats(t: torch.Tensor, gpc: dict[int, int]) -> dict:
    entry, done, leave = t[:, 0], t[:, 2], t[:, 4]
    per_sm = torch.bincount(t[:, 6])
    stats = {
        "span": (leave.max() - entry.min()).item() / 1e3,
        "late": (entry.max() - entry.min()).item() / 1e3,
        "block": statistics.median(((done - entry).float() / 1e3).tolist()),
        "kcycles": statistics.median(((t[:, 3] - t[:, 1]).float() / 1e3).tolist()),
        "slowest": ((done - entry).max()).item() / 1e3,
        "sm_max": per_sm.max().item(),
        "sms": (per_sm > 0).sum().item(),
        "two": (per_sm == 2).sum().item(),
    }
    if gpc:
        per_gpc = torch.bincount(torch.tensor([gpc.get(sm, -1) + 1 for sm in t[:, 6].tolist()]))[1:]
        stats["gpc_max"], stats["gpc_min"] = per_gpc.max().item(), per_gpc.min().item()
    return stats


def graph_stats(cell: str, fetched: tuple[int, list[torch.Tensor]], bench: timing.Timing) -> None:
    """The bench's own last launches (its timed graph, back to back over its input sets): their
    spans by input set, and the idle time between one launch's last block out and the next's first
    in. Launch e ran input set (e - 1) % sets: one checked launch, then one eager launch a set,
    then the graph's replays."""
    count, launches = fetched
    first = count - len(launches)
    sets = bench.input_sets
    spans: dict[int, list[float]] = {}
    gaps = []
    for i, t in enumerate(launches):
        spans.setdefault((first + i - 1) % sets, []).append((t[:, 4].max() - t[:, 0].min()).item() / 1e3)
        if i:
            gaps.append((t[:, 0].min() - launches[i - 1][:, 4].max()).item() / 1e3)
    by_set = ", ".join(f"set {j}: median {statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f}, {len(v)})"
                       for j, v in sorted(spans.items()))
    # a block's k-block loop on both clocks: more ns for the same cycles is the SM clock; more
    # cycles, the block waited. Then when the blocks came in and how long the last loop and the
    # split-K sum took: a late cluster shows as a late last entry.
    loops = sorted(((t[:, 4].max() - t[:, 0].min()).item() / 1e3,
                    statistics.median(((t[:, 2] - t[:, 0]).float() / 1e3).tolist()),
                    statistics.median(((t[:, 3] - t[:, 1]).float() / 1e3).tolist()),
                    (t[:, 0].max() - t[:, 0].min()).item() / 1e3,
                    ((t[:, 2] - t[:, 0]).max()).item() / 1e3,
                    statistics.median(((t[:, 4] - t[:, 2]).float() / 1e3).tolist())) for t in launches)
    quarter = max(1, len(loops) // 4)
    for name, part in (("fastest quarter", loops[:quarter]), ("slowest quarter", loops[-quarter:])):
        span, ns, kcycles, late, slowest, tail = (statistics.median(v[j] for v in part) for j in range(6))
        print(f"  {name} of those: span {span:.2f} us, a block's loop {ns:.2f} us = {kcycles:.1f} k cycles "
              f"({kcycles / ns:.2f} GHz), slowest loop {slowest:.2f}, last entry {late:.2f} after the first, "
              f"loop done -> exit {tail:.2f}", flush=True)
    print(f"{cell}: the bench's last {len(launches)} launches of {count} ({sets} input sets), span by set: {by_set}; "
          f"gap between launches median {statistics.median(gaps) if gaps else float('nan'):.2f} us "
          f"({min(gaps, default=float('nan')):.2f}-{max(gaps, default=float('nan')):.2f})", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", default="14336x4096:32:0,8192x28672:32:1,8192x28672:32:0,28672x8192:32:2")
    ap.add_argument("--launches", type=int, default=200)
    ap.add_argument("--tree", default=str(kernels.KERNEL_DIR))
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    mod = build_tree("block_timeline_" + Path(args.tree).name, Path(args.tree), PATCHES)
    copy = timing.copy_bandwidth()
    flush = torch.empty(64 << 20, dtype=torch.float32, device="cuda").uniform_()
    print(torch.cuda.get_device_name(), flush=True)
    for cell in args.cells.split(","):
        shape, m, tiles = cell.split(":")
        k, n = (int(v) for v in shape.split("x"))
        m, tiles = int(m), int(tiles)
        layer = cases.Layer(k, n, 128, seed=1)

        def run(x, qw, qz, s, b):
            return mod.gemm_w4_batch(x, qw, qz, s, b, 0, tiles, 2, False, 0)
        case = cases.Case(cell, lambda i: (layer.x(m, i), *layer.gemv(i), None), run,
                          lambda out, a: cases.w4_gemv_errors(layer, out, a).require(),
                          cases.W4_GEMV_KERNEL.bytes_moved(k, n, m, layer.group))
        mod.btrace_clear()
        bench = case.measure(copy)
        graph_stats(cell, fetch(mod), bench)
        x, (qw, qz, s) = layer.x(m, 0), layer.gemv(0)
        launches = [one_launch(mod, lambda: run(x, qw, qz, s, None), flush) for _ in range(args.launches)]
        gpc = gpc_groups(launches)
        stats = [launch_stats(t, gpc) for t in launches]
        spans = sorted(st["span"] for st in stats)
        q = lambda p: spans[min(len(spans) - 1, int(p * len(spans)))]  # noqa: E731
        print(f"{cell}: bench {bench.median_us:.2f} us (p10 {bench.p10_us:.2f}, p90 {bench.p90_us:.2f}) | "
              f"{len(launches[0])} blocks on {stats[0]['sms']} SMs, {len(set(gpc.values())) if gpc else 'no'} GPCs seen | "
              f"span p10 {q(0.1):.2f} median {q(0.5):.2f} p90 {q(0.9):.2f} max {spans[-1]:.2f} us", flush=True)
        order = sorted(range(len(stats)), key=lambda i: stats[i]["span"])
        fifth = max(1, len(order) // 5)
        for name, picked in (("fastest fifth", order[:fifth]), ("slowest fifth", order[-fifth:])):
            col = {key: statistics.median(stats[i][key] for i in picked) for key in stats[picked[0]]}
            print(f"  {name}: span {col['span']:.2f} us, last entry {col['late']:.2f} after the first, block entry -> "
                  f"loop done median {col['block']:.2f} ({col['kcycles']:.1f} k cycles) slowest {col['slowest']:.2f}, SMs used {col['sms']:.0f} "
                  f"({col['two']:.0f} with two blocks, at most {col['sm_max']:.0f})"
                  + (f", blocks a GPC {col['gpc_min']:.0f}-{col['gpc_max']:.0f}" if gpc else ""), flush=True)
        if args.out:
            from safetensors.torch import save_file

            rows = max(len(t) for t in launches)
            stacked = torch.zeros(len(launches), rows, 8, dtype=torch.int64)
            for i, t in enumerate(launches):
                stacked[i, : len(t)] = t
            Path(args.out).mkdir(parents=True, exist_ok=True)
            save_file({"stamps": stacked}, str(Path(args.out) / f"{cell.replace(':', '_')}.safetensors"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
