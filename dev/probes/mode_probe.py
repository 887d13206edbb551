"""Is a bimodal cell's slow mode where its weights lie in memory, or the GPU's state? (lab only)

28672x8192 at M = 17-32 with two m64 tiles runs 61 or 73 us (M = 17), 70 or 84-89 (M = 32) from one
measurement to the next, in every build and plan tried at once (dev/LOG.md, fourteenth session):
one cell timed R times on the bench's harness, and before the rounds that --fresh names the
weights are copied to new memory (the old freed first, so the allocator places them elsewhere).
Meanwhile nvidia-smi logs the SM clock, power and temperature every 100 ms. Per round: the median
and spread, whether the weights moved (and where they start), and the clock and power over the
round. A mode that changes only where the weights moved is their placement; one that changes while
they stay is the GPU's state or the launches' scheduling.

    PYTHONPATH=. python3 dev/probes/mode_probe.py [--shape 28672x8192] [--m 32] [--kernel 2] [--tiles 2]
        [--splits 0] [--rounds 12] [--fresh 4,6,8,10]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time

import torch

from w4cli.bench import cases
from w4cli.gpu import kernels, timing


def smi_log(path: str) -> subprocess.Popen:
    return subprocess.Popen(
        ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu", "--format=csv,noheader,nounits",
         "-lms", "100"], stdout=open(path, "w"), stderr=subprocess.DEVNULL)


def smi_between(path: str, begin: float, end: float) -> str:
    """Median SM clock (MHz), power (W) and temperature (C) of the log's lines in [begin, end] (epoch s)."""
    clocks, powers, temps = [], [], []
    for line in open(path):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5:
            continue
        try:
            stamp = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S"))
            if begin - 1 <= stamp <= end + 1:
                clocks.append(float(parts[1])), powers.append(float(parts[3])), temps.append(float(parts[4]))
        except ValueError:
            continue
    if not clocks:
        return "no nvidia-smi lines"
    return f"SM {statistics.median(clocks):.0f} MHz, {statistics.median(powers):.0f} W, {statistics.median(temps):.0f} C"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="28672x8192")
    ap.add_argument("--m", type=int, default=32)
    ap.add_argument("--kernel", type=int, default=2)
    ap.add_argument("--tiles", type=int, default=2)
    ap.add_argument("--splits", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--fresh", default="4,6,8,10", help="rounds before which the weights move")
    args = ap.parse_args()
    fresh = {int(v) for v in args.fresh.split(",") if v}
    k, n = (int(v) for v in args.shape.split("x"))
    kernels.load()
    copy = timing.copy_bandwidth()
    layer = cases.Layer(k, n, 128, seed=1)

    def run(x, qw, qz, s, b):
        return kernels._batch(x, qweight=qw, qzeros=qz, scales=s, bias=b, splits=args.splits, tiles=args.tiles,
                              kernel=args.kernel)

    case = cases.Case(f"{args.shape} M={args.m}", lambda i: (layer.x(args.m, i), *layer.gemv(i), None), run,
                      lambda out, a: cases.w4_gemv_errors(layer, out, a).require(),
                      cases.W4_GEMV_KERNEL.bytes_moved(k, n, args.m, layer.group))
    log = tempfile.NamedTemporaryFile(suffix=".csv", delete=False).name
    smi = smi_log(log)
    print(f"{torch.cuda.get_device_name()}, copy {copy.gbps:.0f} GB/s, {args.shape} M={args.m} kernel {args.kernel} "
          f"tiles {args.tiles} splits {args.splits}", flush=True)
    try:
        for r in range(args.rounds):
            moved = r in fresh and "gemv" in layer._sets
            if moved:  # the same values in new memory: free the old first, so that the new lands elsewhere
                old = layer._sets.pop("gemv")
                host = [tuple(t.cpu() for t in s) for s in old]
                del old
                torch.cuda.empty_cache()
                layer._sets["gemv"] = [tuple(t.cuda() for t in s) for s in host]
            begin = time.time()
            t = case.measure(copy)
            end = time.time()
            where = " ".join(f"{s[0].data_ptr() % (1 << 30) >> 20} MiB" for s in layer._sets["gemv"])
            print(f"round {r:2d}{' moved' if moved else '      '}: {t.median_us:8.2f} us (spread {100 * t.spread:4.1f}%, "
                  f"{t.input_sets} sets, qweight at {where} mod 1 GiB), {smi_between(log, begin, end)}", flush=True)
    finally:
        smi.terminate()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
