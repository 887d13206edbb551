"""Time the w4 GEMV kernel against fp16 cuBLAS (F.linear) and torch's int4 kernel
(torch._weight_int4pack_mm, bf16), in one run: the cases of w4cli/bench/cases.py (their inputs,
checks and byte counts), measured with w4cli/gpu/timing.py (check, then time; CUDA graph over rotating
input sets > 4x L2; median of 30 replays).

    PYTHONPATH=. python3 dev/bench_gemv.py [--out DIR] [--m 1,2,4,8] [--quick] [--splits]

--splits also sweeps the warps per 16-row tile (split-K) at M = 1, through the private
w4cli.gpu.kernels._gemv_splits: the same case, run another way.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

from w4cli.gpu import kernels, timing
from w4cli.bench import cases

SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096), (8192, 8192), (8192, 28672), (28672, 8192)]
G = 128
PEERS = (cases.FP16, cases.TORCH_INT4, cases.W4_GEMV)  # the table's columns, in order


def measure(case: cases.Case, copy: timing.Timing) -> timing.Timing | None:
    try:
        return case.measure(copy)
    except Exception as exc:  # noqa: BLE001 - one failed kernel must not end the sweep
        print(f"{case.name}: {type(exc).__name__}: {exc}", flush=True)
        return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--m", default="1,2,4,8")
    ap.add_argument("--quick", action="store_true", help="first three shapes only")
    ap.add_argument("--splits", action="store_true", help="also sweep the split-K setting at M=1")
    ap.add_argument("--no-peers", action="store_true", help="skip the table (fp16 cuBLAS, torch int4, w4); with --splits")
    args = ap.parse_args()
    ms = [int(v) for v in args.m.split(",")]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    kernels.load()
    props = torch.cuda.get_device_properties(0)
    copy = timing.copy_bandwidth()
    head = (f"{props.name}, {props.multi_processor_count} SMs, L2 {props.L2_cache_size >> 20} MiB, "
            f"torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}; copy {copy.gbps:.0f} GB/s")
    print(head, flush=True)
    rows, records = [], []
    for k, n in SHAPES[:3] if args.quick else SHAPES:
        layer = cases.Layer(k, n, G, seed=1)
        for m in [] if args.no_peers else ms:
            times = {}
            for key in PEERS:
                method = cases.METHODS[key]
                why = method.refusal(k, n, G)
                if why is not None:
                    print(f"{method.label} {k}x{n}: {why}", flush=True)
                    continue
                t = measure(method.case(layer, m), copy)
                if t is not None:
                    times[key] = t
                    records.append({"shape": [k, n], "m": m, "method": key, **t.__dict__})
            us = [times[key].median_us if key in times else float("nan") for key in PEERS]
            w4 = times.get(cases.W4_GEMV)
            rows.append((k, n, m, *us, w4.gbps if w4 else float("nan"), w4.pct_of_copy if w4 else float("nan")))
            print(f"{k}x{n} M={m}: fp16 {us[0]:.2f} int4 {us[1]:.2f} w4 {us[2]:.2f} us ({rows[-1][-1]:.1f}% copy)", flush=True)
        if args.splits and 1 in ms:
            gemv = cases.W4_GEMV_KERNEL.case(layer, 1)
            for sp in (1, 2, 4, 8, 16):
                def run(x, qweight, qzeros, scales, bias, sp=sp):
                    return kernels._gemv_splits(x, qweight=qweight, qzeros=qzeros, scales=scales, bias=bias, splits=sp)

                t = measure(dataclasses.replace(gemv, name=f"{gemv.name} splits={sp}", run=run), copy)
                if t is not None:
                    print("  " + t.row(), flush=True)
                    records.append({"shape": [k, n], "m": 1, "method": cases.W4_GEMV, "splits": sp, **t.__dict__})
        del layer
        torch.cuda.empty_cache()

    lines = [head, "",
             "| K x N | M | fp16 cuBLAS us | torch int4 us | w4 us | w4 GB/s | % of copy | vs fp16 | vs int4 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for k, n, m, f, i, w, gb, pct in rows:
        lines.append(f"| {k}x{n} | {m} | {f:.2f} | {i:.2f} | {w:.2f} | {gb:.0f} | {pct:.1f}% | {f / w:.2f}x | {i / w:.2f}x |")
    table = "\n".join(lines)
    print("\n" + table)
    (out_dir / "gemv_table.md").write_text(table + "\n")
    (out_dir / "gemv_bench.json").write_text(json.dumps({"copy_gbps": copy.gbps, "records": records}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
