"""Time the w4 GEMV kernel against fp16 cuBLAS (F.linear) and torch's int4 kernel
(torch._weight_int4pack_mm, bf16), in one run, with w4cli/timing.py (check, then time; CUDA graph
over rotating input sets > 4x L2; median of 30 replays). Every kernel's output is checked against
a float64 reference before it is timed.

    PYTHONPATH=. python3 dev/bench_gemv.py [--out DIR] [--m 1,2,4,8] [--quick] [--splits]

Bytes per call (what the table's GB/s and % of copy use):
    w4:   K*N/2 (int4) + (K/G)*N*2 (scales) + (K/G)*N/2 (zeros) + M*K*2 (x) + M*N*2 (y)
    fp16: K*N*2 + M*K*2 + M*N*2
    int4: K*N/2 + (K/G)*N*2*2 (bf16 scale and zero) + M*K*2 + M*N*2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from w4cli import kernels, timing
from w4cli.formats import w4_gemv
from w4cli.checks import gemv_errors, require_normwise

SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096), (8192, 8192), (8192, 28672), (28672, 8192)]
G = 128
DEV = "cuda"


def w4_inputs(m: int, k: int, n: int):
    groups = k // G

    def make(i: int):
        gen = torch.Generator(device=DEV).manual_seed(1000 + i)
        qweight = torch.randint(-(2**31), 2**31, (n // 8, k // 128, 8, 16), generator=gen, device=DEV,
                                dtype=torch.int64).to(torch.int32)
        qzeros = torch.randint(-(2**31), 2**31, (groups, n // 8), generator=gen, device=DEV,
                               dtype=torch.int64).to(torch.int32)
        scales = (torch.rand(groups, n, generator=gen, device=DEV) * 0.01 + 0.002).half()
        x = torch.randn(m, k, generator=gen, device=DEV).half()
        return x, qweight, qzeros, scales

    return make


def w4_check(k: int, n: int):
    def check(out, args):
        x, qweight, qzeros, scales = args
        meta = torch.tensor([1, k, n, G], dtype=torch.int32)
        gemv_errors(out, x, w4_gemv.dequantize(qweight, qzeros, scales, meta, torch.float16)).require()

    return check


def fp16_inputs(m: int, k: int, n: int):
    def make(i: int):
        gen = torch.Generator(device=DEV).manual_seed(2000 + i)
        w = (torch.randn(n, k, generator=gen, device=DEV) * 0.02).half()
        x = torch.randn(m, k, generator=gen, device=DEV).half()
        return x, w

    return make


def fp16_check(out, args):
    x, w = args
    require_normwise(out, x.double() @ w.double().t(), 1e-2)


def int4_inputs(m: int, k: int, n: int):
    groups = k // G

    def make(i: int):
        gen = torch.Generator(device=DEV).manual_seed(3000 + i)
        q = torch.randint(0, 16, (n, k), generator=gen, device=DEV, dtype=torch.int32)
        packed = ((q[:, ::2] << 4) | q[:, 1::2]).to(torch.uint8)
        wpack = torch._convert_weight_to_int4pack(packed, 8)
        scale = (torch.rand(groups, n, generator=gen, device=DEV) * 0.01 + 0.002)
        zero = (torch.rand(groups, n, generator=gen, device=DEV) - 0.5) * 0.01
        sz = torch.stack([scale, zero], dim=-1).to(torch.bfloat16).contiguous()
        x = torch.randn(m, k, generator=gen, device=DEV).to(torch.bfloat16)
        return x, wpack, sz, q.to(torch.uint8)

    return make


def int4_fn(x, wpack, sz, _q):
    return torch._weight_int4pack_mm(x, wpack, G, sz)


def int4_check(out, args):
    # tinygemm's convention: w = (q - 8) * scale + zero
    x, _, sz, q = args
    s = sz[..., 0].double().repeat_interleave(G, 0).t()  # [N, K]
    z = sz[..., 1].double().repeat_interleave(G, 0).t()
    w = (q.double() - 8) * s + z
    require_normwise(out, x.double() @ w.t(), 2e-2)


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
    shapes = SHAPES[:3] if args.quick else SHAPES
    for k, n in shapes:
        groups = k // G
        for m in ([] if args.no_peers else ms):
            act = m * k * 2 + m * n * 2
            b_w4 = k * n // 2 + groups * n * 2 + groups * n // 2 + act
            b_16 = k * n * 2 + act
            b_i4 = k * n // 2 + groups * n * 4 + act
            res = {}
            try:
                res["w4"] = timing.measure(lambda x, q, z, s: kernels.gemv(x, q, z, s), w4_inputs(m, k, n), b_w4,
                                           w4_check(k, n), name=f"w4 {k}x{n} M={m}", copy=copy)
            except Exception as exc:  # noqa: BLE001
                print(f"w4 {k}x{n} M={m}: {type(exc).__name__}: {exc}", flush=True)
            res["fp16"] = timing.measure(lambda x, w: F.linear(x, w), fp16_inputs(m, k, n), b_16, fp16_check,
                                         name=f"fp16 {k}x{n} M={m}", copy=copy)
            try:
                res["int4"] = timing.measure(int4_fn, int4_inputs(m, k, n), b_i4, int4_check,
                                             name=f"int4 {k}x{n} M={m}", copy=copy)
            except Exception as exc:  # noqa: BLE001
                print(f"torch int4 {k}x{n} M={m}: {type(exc).__name__}: {exc}", flush=True)
            for t in res.values():
                records.append({"shape": [k, n], "m": m, **t.__dict__})
            w4, f16, i4 = res.get("w4"), res["fp16"], res.get("int4")
            rows.append((k, n, m, f16.median_us, i4.median_us if i4 else float("nan"),
                         w4.median_us if w4 else float("nan"), w4.gbps if w4 else float("nan"),
                         w4.pct_of_copy if w4 else float("nan")))
            r = rows[-1]
            print(f"{k}x{n} M={m}: fp16 {r[3]:.2f} int4 {r[4]:.2f} w4 {r[5]:.2f} us ({r[7]:.1f}% copy)", flush=True)
        if args.splits and 1 in ms:
            for sp in (1, 2, 4, 8, 16):
                try:
                    t = timing.measure(lambda x, q, z, s, sp=sp: kernels._gemv_splits(x, q, z, s, splits=sp),
                                       w4_inputs(1, k, n), k * n // 2 + groups * n * 5 // 2 + 2 * k + 2 * n,
                                       w4_check(k, n), name=f"w4 {k}x{n} M=1 splits={sp}", copy=copy)
                    print("  " + t.row(), flush=True)
                    records.append({"shape": [k, n], "m": 1, "splits": sp, **t.__dict__})
                except Exception as exc:  # noqa: BLE001
                    print(f"  splits={sp}: {type(exc).__name__}: {exc}", flush=True)

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
