"""Time the AWQ dequantize kernel against the device-to-device copy ceiling: the dequantize cases of
w4cli/bench/cases.py (one per output dtype and layout; bit-exact check before each timing; bytes
K*N/2 qweight + (K/G)*N*2 scales + (K/G)*N/2 packed zeros read, K*N*out_bytes written), measured with
w4cli/gpu/timing.py.

Usage: PYTHONPATH=. python3 dev/bench_dequant.py [--out DIR] [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from pathlib import Path

import torch

from w4cli.gpu import kernels
from w4cli.bench import cases
from w4cli.gpu.timing import copy_bandwidth

SHAPES = [(8192, 8192), (8192, 28672), (28672, 8192), (4096, 4096), (4096, 14336)]  # K x N
G = 128
FP16_NK, FP16_KN = (torch.float16, True), (torch.float16, False)
BF16_NK, BF16_KN, FP32_NK = (torch.bfloat16, True), (torch.bfloat16, False), (torch.float32, True)
# (dtype, transpose) per shape: both fp16 layouts everywhere, the other outputs on two shapes
OUTPUTS = {(8192, 8192): [FP16_NK, FP16_KN, BF16_NK, FP32_NK, BF16_KN], (8192, 28672): [FP16_NK, FP16_KN, BF16_NK]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true", help="first shape only")
    ap.add_argument("--min-sets", type=int, default=4, help="input sets per graph replay (at least; 4x L2 rule)")
    a = ap.parse_args()
    kernels.load()
    dev = torch.cuda.get_device_name()
    print(f"# {dev}, torch {torch.__version__}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    copies = [copy_bandwidth(method="memcpy"), copy_bandwidth(method="kernel")]
    for c in copies:
        print(c.row(), flush=True)
    copy = max(copies, key=lambda c: c.gbps)  # the ceiling: the faster of the two
    rows = []
    for k, n in SHAPES[:1] if a.quick else SHAPES:
        layer = cases.Layer(k, n, G, seed=1)
        for dtype, transpose in OUTPUTS.get((k, n), [FP16_NK, FP16_KN]):
            method = cases.dequantize_method(dtype, transpose)
            t = method.case(layer, None).measure(copy, min_sets=a.min_sets)
            rows.append((f"{k}x{n}", f"{str(dtype).removeprefix('torch.')} {'[N,K]' if transpose else '[K,N]'}", t))
            print(t.row(), flush=True)
        del layer
        torch.cuda.empty_cache()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_dequant.json").write_text(json.dumps([copy.__dict__] + [t.__dict__ for _, _, t in rows], indent=1))
    print("\n| K x N | output | median us | p10-p90 us | GB/s | % of copy |")
    print("|---|---|---|---|---|---|")
    for shape, output, t in rows:
        print(f"| {shape} | {output} | {t.median_us:.2f} | {t.p10_us:.2f}-{t.p90_us:.2f} | {t.gbps:.0f} | {t.pct_of_copy:.1f}% |")
    print(f"copy: {copy.gbps:.0f} GB/s ({copy.name}), device {dev}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
