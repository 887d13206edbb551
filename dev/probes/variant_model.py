"""The warp-specialised kernel's variant model (kernels/gemm_w4a16_wgmma.cu, default_ws_variant)
replayed offline against a sweep of every variant (dev/bench_batch.py --kernels 3 --tiles 1,2,3,4,5
--splits 0), to see which variant it picks per cell and to fit its per-variant costs (lab only).

    python3 dev/probes/variant_model.py SWEEP.txt [--costs 210,130,130,100,100] [--fit]
    python3 dev/probes/variant_model.py --costs 210,140,130,100,100 --where-7 4096x6144,14336x4096

Prints, per (shape, M) of the sweep, the measured time of every variant, the model's pick and how far
it is from the best; with --fit, the cost vectors (v5 fixed at 100) whose picks lose least over the
sweep (geometric mean). The cluster counts are the H100's (dev/probes/cluster_fit.cu). Only the
cost model's pick among variants 1-5 is replayed, not the fill rule after it that turns variant 5
into its pairs (variant 6). --where-7 prints, per shape, the M (1-1024) at which the rule after
those picks variant 7 (192-row tiles on three MMA warpgroups), the pairs' rules replayed before it
(past one wave of pairs; one wave of them, which variant 7 takes where its tiles fit one wave).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import math
import re

SMS = 132
CLUSTERS = {2: 66, 3: 39, 4: 30, 5: 22, 6: 17, 7: 15, 8: 15}  # clusters of S one-block-an-SM blocks at once (H100)
TOKENS = {1: 64, 2: 64, 3: 128, 4: 128, 5: 256, 7: 128}
ROWS = {1: 128, 2: 256, 3: 128, 4: 256, 5: 128, 7: 192}
COST_7 = 110
SPLIT_MIN_KBLOCKS, MAX_SPLITS, SPLIT_BASE_COST = 8, 8, 2
STREAM_K_COST, STREAM_K_CUT_KBLOCKS = 250, 3


def auto_splits(blocks: int, kblocks: int) -> int:
    want = SMS // blocks if blocks < SMS else 1
    cap = min(kblocks // SPLIT_MIN_KBLOCKS, MAX_SPLITS)
    return max(1, min(want, cap))


def fit_splits(tiles: int, splits: int) -> int:
    while splits > 1:
        clusters = CLUSTERS[splits]
        if -(-tiles // clusters) <= -(-(tiles * splits) // SMS):
            break
        splits -= 1
    return splits


def spread_waves(tiles: int, kblocks: int) -> int:
    rest, whole = tiles % SMS, tiles // SMS
    steps = rest * kblocks
    if whole == 0 and 2 * rest <= SMS:
        blocks = min(steps, SMS)
        cost = steps * 1000 // blocks + STREAM_K_CUT_KBLOCKS * 1000 * blocks // tiles
        return cost // kblocks if cost * 10 < 9 * 1000 * kblocks else 1000
    share = min(2 * rest, SMS)
    blocks = min(steps, share)
    sk = rest > 0 and rest * 1000 // blocks + STREAM_K_COST < 1000
    return whole * 1000 + (rest * 1000 // blocks + STREAM_K_COST if sk else 1000 if rest > 0 else 0)


def cost_of(v: int, m: int, k: int, n: int, costs: dict) -> int:
    kblocks = -(-k // 128)
    blocks = -(-n // ROWS[v]) * -(-m // TOKENS[v])
    splits = fit_splits(blocks, auto_splits(blocks, kblocks))
    per_block = -(-kblocks // splits) + (splits + SPLIT_BASE_COST if splits > 1 else 0)
    waves = -(-(blocks * splits) // SMS) * 1000 if splits > 1 else spread_waves(blocks, kblocks)
    return waves * TOKENS[v] * ROWS[v] * costs[v] * per_block


def pick(m: int, k: int, n: int, costs: dict) -> int:
    best, best_cost = 5, None
    for v in (5, 4, 3, 2, 1):  # ties go to the larger tile
        cost = cost_of(v, m, k, n, costs)
        if best_cost is None or cost < best_cost:
            best, best_cost = v, cost
    return best


def picks_7(m: int, k: int, n: int, costs: dict) -> bool:
    best = pick(m, k, n, costs)
    pairs, clusters = -(-m // 256) * ((-(-n // 128) + 1) // 2), CLUSTERS[2]
    if best == 5 and m >= 256 and pairs > clusters:
        return False  # the pairs, past one wave of them
    if best == 5 and m > 256 and (pairs * 100 >= 95 * -(-pairs // clusters) * clusters or pairs * 100 >= 70 * clusters):
        # one wave of pairs, or of variant 7's tiles in its place
        return n % 192 == 0 and -(-n // 192) * -(-m // 128) <= SMS
    if m > 256 or (m > 128 and n % 192 != 0):
        return False
    return cost_of(7, m, k, n, {**costs, 7: COST_7}) < cost_of(best, m, k, n, costs)


def ranges(ms: list[int]) -> str:
    """1, 2, 3, 7, 8 -> '1-3, 7-8'."""
    out, start = [], None
    for i, m in enumerate(ms):
        if start is None:
            start = m
        if i + 1 == len(ms) or ms[i + 1] != m + 1:
            out.append(f"{start}-{m}" if m != start else f"{m}")
            start = None
    return ", ".join(out) or "none"


def read_sweep(path: str) -> dict:
    """{(K, N, M): {variant: mean us}} from bench_batch.py's output."""
    cells, cur = collections.defaultdict(lambda: collections.defaultdict(list)), None
    for line in open(path):
        head = re.match(r"(\d+)x(\d+) M=(\d+): fp16", line)
        if head:
            cur = tuple(int(g) for g in head.groups())
            continue
        row = re.match(r"\s+kernel=3 tiles=(\d) splits=0: ([\d.]+) us", line)
        if row and cur:
            cells[cur][int(row.group(1))].append(float(row.group(2)))
    return {c: {v: sum(t) / len(t) for v, t in vs.items()} for c, vs in cells.items() if len(vs) == 5}


def loss(cells: dict, costs: dict) -> tuple[float, int]:
    """Geometric-mean slowdown of the picks against each cell's best, and the cells within 3%."""
    logs, good = [], 0
    for (k, n, m), times in cells.items():
        ratio = times[pick(m, k, n, costs)] / min(times.values())
        logs.append(math.log(ratio))
        good += ratio <= 1.03
    return math.exp(sum(logs) / len(logs)) - 1, good


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("sweep", nargs="?")
    ap.add_argument("--costs", default="210,130,130,100,100")
    ap.add_argument("--fit", action="store_true")
    ap.add_argument("--where-7", help="KxN,... : the M at which variant 7 is picked")
    args = ap.parse_args()
    costs = dict(zip(range(1, 6), (int(c) for c in args.costs.split(","))))
    if args.where_7:
        for shape in args.where_7.split(","):
            k, n = (int(v) for v in shape.split("x"))
            print(f"{shape}: variant 7 at M = {ranges([m for m in range(1, 1025) if picks_7(m, k, n, costs)])}")
        return
    cells = read_sweep(args.sweep)
    for (k, n, m), times in sorted(cells.items()):
        v = pick(m, k, n, costs)
        best = min(times, key=times.get)
        print(f"{k}x{n} M={m}: " + " ".join(f"v{t} {times[t]:.1f}" for t in sorted(times))
              + f"  pick v{v} ({times[v] / times[best] - 1:+.1%} against v{best})")
    lost, good = loss(cells, costs)
    print(f"costs {args.costs}: {lost:+.2%} geometric mean against the best, {good} of {len(cells)} cells within 3%")
    if args.fit:
        grid = range(80, 260, 10)
        found = sorted((loss(cells, {1: a, 2: b, 3: c, 4: d, 5: 100}), (a, b, c, d))
                       for a, b, c, d in itertools.product(grid, grid, grid, grid) if a >= b and c >= d)
        for (lost, good), vec in found[:10]:
            print(f"  {','.join(map(str, vec))},100: {lost:+.2%}, {good} within 3%")


if __name__ == "__main__":
    main()
