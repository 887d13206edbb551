"""Time the AWQ dequantize kernel against the device-to-device copy ceiling (w4cli/timing.py).

Usage: PYTHONPATH=. python3 dev/bench_dequant.py [--out DIR] [--quick]
Bytes per call (explicit): K*N/2 qweight + (K/G)*N*2 scales + (K/G)*N/2 packed zeros read,
K*N*out_bytes written. Every timing is preceded by a bit-exact check against the reference.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from pathlib import Path

import torch

from w4cli import kernels
from w4cli.checks import require_identical
from w4cli.formats import awq_gemm
from w4cli.timing import copy_bandwidth, measure

SHAPES = [(8192, 8192), (8192, 28672), (28672, 8192), (4096, 4096), (4096, 14336)]  # K x N
G = 128


def make_factory(K: int, N: int, scale_dtype=torch.float16):
    def make(i: int):
        gen = torch.Generator(device="cuda").manual_seed(1000 + i)
        qw = torch.randint(-(2**31), 2**31 - 1, (K, N // 8), generator=gen, device="cuda", dtype=torch.int32)
        qz = torch.randint(-(2**31), 2**31 - 1, (K // G, N // 8), generator=gen, device="cuda", dtype=torch.int32)
        s = (torch.randn(K // G, N, generator=gen, device="cuda") * 0.02 + 0.001).to(scale_dtype)
        return qw, qz, s

    return make


def bytes_moved(K: int, N: int, out_bytes: int) -> int:
    return K * N // 2 + (K // G) * N * 2 + (K // G) * N // 2 + K * N * out_bytes


def exact_check(dtype, transpose):
    def check(out, args):
        require_identical(out, awq_gemm.dequantize(*args, dtype=dtype, transpose=transpose), "dequantize", "kernel", "reference")

    return check


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
    rows = [copy]
    shapes = SHAPES[:1] if a.quick else SHAPES
    for K, N in shapes:
        make = make_factory(K, N)
        cases = [("NK fp16", True, torch.float16), ("KN fp16", False, torch.float16)]
        if (K, N) == (8192, 8192):
            cases += [("NK bf16", True, torch.bfloat16), ("NK fp32", True, torch.float32),
                      ("KN bf16", False, torch.bfloat16)]
        if (K, N) == (8192, 28672):
            cases += [("NK bf16", True, torch.bfloat16)]
        for label, transpose, dtype in cases:
            fn = lambda qw, qz, s, t=transpose, d=dtype: kernels.dequantize_awq(qw, qz, s, dtype=d, transpose=t)  # noqa: E731
            nbytes = bytes_moved(K, N, torch.empty(0, dtype=dtype).element_size())
            t = measure(fn, make, nbytes, exact_check(dtype, transpose), name=f"{K}x{N} {label}", copy=copy,
                        min_sets=a.min_sets)
            rows.append(t)
            print(t.row(), flush=True)
        torch.cuda.empty_cache()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_dequant.json").write_text(json.dumps([r.__dict__ for r in rows], indent=1))
    print("\n| K x N | layout | median us | p10-p90 us | GB/s | % of copy |")
    print("|---|---|---|---|---|---|")
    for r in rows[1:]:
        shape, label = r.name.split(" ", 1)
        print(f"| {shape} | {label} | {r.median_us:.2f} | {r.p10_us:.2f}-{r.p90_us:.2f} | {r.gbps:.0f} | {r.pct_of_copy:.1f}% |")
    print(f"copy: {copy.gbps:.0f} GB/s ({copy.name}), device {dev}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
