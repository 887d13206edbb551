"""SM clock, power and time per call while one GEMM runs back to back for a few seconds: is a
sustained call slower than the short burst `w4 bench` times, and for its clocks?

    PYTHONPATH=. python3 dev/probes/clocks_under_load.py [--cells 8192x57344:128,...]
        [--methods fp16,w4,w4o1,w4o2] [--sets 2] [--seconds 3]

Per cell and method, after a second idle: calls back to back for `seconds`, timed in chunks of 10
by CUDA events, while nvidia-smi samples the SM clock and power every 100 ms. Printed: the time
per call in the first 40 ms (about as long as a `w4 bench` cell runs), in the last half, and the
median clock and power over the last half; the time per call in windows of 10, 20, 40, ... ms;
and, once hot, the first 10 calls after 10 ms to 1 s idle. Methods: fp16 (cuBLAS), w4 (the path
`gemv` picks), w4o1 / w4o2 (the warp-specialised kernel in the permuted / natural k order).
`sets`: copies of the weights the calls rotate through (the decode step reads a different layer's
weights every call). The calls are launched one by one from Python, not from a graph: calls of
less than about 50 us are bound by their launches here.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import torch

from w4cli.bench import cases
from w4cli.gpu import kernels


def methods_for(layer: cases.Layer, m: int, sets: int) -> dict:
    """Per method, a maker of its call (made when the method is run: fp16's weights are large)."""
    x = layer.x(m, 0)
    qw, qz, s = layer.gemv(0)
    w4_sets = [(qw.clone(), qz.clone(), s.clone()) for _ in range(sets)]

    def rotating(weights: list, fn):
        i = [0]

        def call():
            i[0] = (i[0] + 1) % len(weights)
            return fn(*weights[i[0]])
        return call

    def w4(order: int):
        if order == 0:
            return rotating(w4_sets, lambda q, z, sc: kernels.gemv(x, q, z, sc))
        return rotating(w4_sets, lambda q, z, sc: kernels._batch(x, qweight=q, qzeros=z, scales=sc, kernel=3,
                                                                 order=order))

    def fp16():
        w16 = [(torch.randn(layer.n, layer.k, device="cuda", dtype=torch.float16),) for _ in range(sets)]
        return rotating(w16, lambda w: torch.nn.functional.linear(x, w))

    return {"fp16": fp16, "w4": lambda: w4(0), "w4o1": lambda: w4(1), "w4o2": lambda: w4(2)}


def sustained(fn, seconds: float) -> dict:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    time.sleep(1.0)
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                            "--format=csv,noheader,nounits", "-lms", "100"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)  # nvidia-smi's first sample
    chunks = []
    wall0 = time.time()
    while time.time() - wall0 < seconds:
        batch = []
        for _ in range(20):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(10):
                fn()
            b.record()
            batch.append((a, b))
        torch.cuda.synchronize()
        chunks += batch
    smi.terminate()
    rows = [line.split(",") for line in smi.communicate()[0].splitlines() if line.count(",") == 2]
    per_call = [a.elapsed_time(b) * 100 for a, b in chunks]  # us a call (10 calls a chunk)
    ends = [chunks[0][0].elapsed_time(b) for _, b in chunks]  # ms from the first chunk's start
    series = []  # (window end in ms, mean us a call in it): 10, 20, 40, ... ms
    lo, hi = 0.0, 10.0
    while lo < ends[-1]:
        window = [t for t, e in zip(per_call, ends) if lo < e <= hi]
        if window:
            series.append((hi, statistics.mean(window)))
        lo, hi = hi, 2 * hi
    first = [t for t, e in zip(per_call, ends) if e <= 40.0]
    late = [t for t, e in zip(per_call, ends) if e >= ends[-1] / 2]
    half = rows[len(rows) // 2:] or rows
    return {
        "first_us": statistics.mean(first) if first else float("nan"),
        "late_us": statistics.median(late),
        "clock": statistics.median(float(r[0]) for r in half),
        "clock_first": float(rows[3][0]) if len(rows) > 3 else float("nan"),
        "power": statistics.median(float(r[1]) for r in half),
        "temp": max(float(r[2]) for r in rows),
        "series": series,
    }


def recovery(fn, idle_ms: float) -> float:
    """us a call over the first 10 calls after `idle_ms` of idle, the GPU hot from the run before."""
    torch.cuda.synchronize()
    time.sleep(idle_ms / 1000)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(10):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 100


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", default="8192x57344:128,28672x8192:128,8192x28672:4096")
    ap.add_argument("--methods", default="fp16,w4,w4o1")
    ap.add_argument("--sets", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), flush=True)
    for cell in args.cells.split(","):
        shape, m = cell.split(":")
        k, n = (int(v) for v in shape.split("x"))
        layer = cases.Layer(k, n, 128, seed=1)
        made = methods_for(layer, int(m), args.sets)
        for name in args.methods.split(","):
            fn = made[name]()
            r = sustained(fn, args.seconds)
            print(f"{cell} {name:5s} sets={args.sets}: first 40 ms {r['first_us']:8.1f} us a call, last half "
                  f"{r['late_us']:8.1f} us ({r['late_us'] / r['first_us'] - 1:+.1%}); SM clock {r['clock_first']:.0f} "
                  f"-> {r['clock']:.0f} MHz, power {r['power']:.0f} W, max {r['temp']:.0f} C", flush=True)
            print("    by time (ms: us a call): " + ", ".join(f"{e:.0f}: {t:.1f}" for e, t in r["series"]))
            print("    after idle (ms: us a call): " + ", ".join(f"{i}: {recovery(fn, i):.1f}" for i in (10, 50, 200, 1000)),
                  flush=True)
            del fn
        del made, layer
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
