"""Is a batch-kernel launch slower back to back than alone? (lab only)

Stamped alone after an L2-evicting read, the barrier wgmma kernel's launches that run in two modes
in the bench (14336x4096 and 28672x8192 at M = 32 in clusters of 7) took a steady 17 and 53 us from
first block in to last block out, where the bench's graph of back-to-back launches gives 20-24 and
69-89 (`barrier_timeline.py`, dev/LOG.md). One cell (K x N : M : kernel : tiles, 0 = the planner's)
timed five ways, in this order:
  sustained  the bench's method (timing.py: a graph over input sets beyond 4x L2, 400 ms warm-up)
  brief      the same graph with one warm-up replay and five timed: clocks not yet settled under
             the power limit
  alone      one launch after an L2-evicting read, events around it (launch included), median
  same       a graph of 16 launches on one input set (the weights still beyond L2 on the large
             layers), sustained
  gapped     the sustained graph with a ~5 us spin kernel between launches
If only sustained is slow, the clocks under load; if brief and same are slow too but gapped is not,
launches starting while the previous one's blocks leave.

    PYTHONPATH=. python3 dev/probes/launch_context.py [--cells 14336x4096:32:2:0,28672x8192:32:2:2]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from w4cli.bench import cases
from w4cli.gpu import kernels, timing

SPIN_CYCLES = 9000  # torch.cuda._sleep: about 5 us at 1.8-2 GHz


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", default="14336x4096:32:2:0,28672x8192:32:2:2,8192x28672:32:2:0,28672x8192:32:1:2")
    ap.add_argument("--alone", type=int, default=100)
    args = ap.parse_args()
    kernels.load()
    flush = torch.empty(64 << 20, dtype=torch.float32, device="cuda").uniform_()
    print(torch.cuda.get_device_name(), flush=True)
    spin = timing.measure(lambda x: torch.cuda._sleep(SPIN_CYCLES), lambda i: (torch.empty(16 << 20, device="cuda"),),
                          0, lambda out, a: True, name="spin")
    print(f"spin kernel alone: {spin.median_us:.2f} us", flush=True)
    for cell in args.cells.split(","):
        shape, m, kernel, tiles = cell.split(":")
        k, n = (int(v) for v in shape.split("x"))
        m, kernel, tiles = int(m), int(kernel), int(tiles)
        layer = cases.Layer(k, n, 128, seed=1)

        def run(x, qw, qz, s):
            return kernels._batch(x, qweight=qw, qzeros=qz, scales=s, kernel=kernel, tiles=tiles, splits=0)

        def gapped(x, qw, qz, s):
            torch.cuda._sleep(SPIN_CYCLES)
            return run(x, qw, qz, s)

        make = lambda i: (layer.x(m, i), *layer.gemv(i))  # noqa: E731
        check = lambda out, a: cases.w4_gemv_errors(layer, out, (*a, None)).require()  # noqa: E731
        sustained = timing.measure(run, make, 0, check, name=cell)
        brief = timing.measure(run, make, 0, check, name=cell, warmup=1, warmup_ms=0, replays=5, timed_ms=0)
        one = make(0)
        same = timing.measure(run, [one] * 16, 0, check, name=cell, l2_multiple=0)
        gap = timing.measure(gapped, make, 0, check, name=cell)
        times = []
        for _ in range(args.alone):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            flush.sum()
            torch.cuda._sleep(200_000)  # the GPU busy while the launch is queued: its events time it alone
            begin.record()
            run(*one)
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end) * 1000)
        print(f"{cell}: sustained {sustained.median_us:.2f} (p10 {sustained.p10_us:.2f}, p90 {sustained.p90_us:.2f}) | "
              f"brief {brief.median_us:.2f} | alone {statistics.median(times):.2f} (min {min(times):.2f}) | "
              f"same set {same.median_us:.2f} (p10 {same.p10_us:.2f}, p90 {same.p90_us:.2f}) | gapped "
              f"{gap.median_us:.2f} - spin {spin.median_us:.2f} = {gap.median_us - spin.median_us:.2f} "
              f"(p10 {gap.p10_us - spin.median_us:.2f}, p90 {gap.p90_us - spin.median_us:.2f}) us", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
