"""Sweep the batch kernels' settings (kernel, row tiles, split-K count) against fp16 cuBLAS,
the GEMV at M = 8 and the automatic choice, in one run, with w4cli/gpu/timing.py (the bench's method).

    PYTHONPATH=. python3 dev/bench_batch.py [--m 16,32,64] [--shapes 8192x28672,...] [--splits 1,2,4,8] [--kernels 1,2]

Prints one line per measurement and, per (shape, M), the best setting against the automatic one.
"""

from __future__ import annotations

import argparse
import time

import torch

from w4cli.gpu import kernels, timing
from w4cli.bench import cases

SHAPES = "8192x8192,8192x28672,28672x8192,4096x14336,14336x4096"


def run_case(name, layer, m, run, copy):
    case = cases.Case(name, lambda i: (layer.x(m, i), *layer.gemv(i), None), run,
                      lambda out, args: cases.w4_gemv_errors(layer, out, args).require(),
                      cases.W4_GEMV_KERNEL.bytes_moved(layer.k, layer.n, m, layer.group))
    try:
        return case.measure(copy)
    except Exception as exc:  # noqa: BLE001 - one failed setting must not end the sweep
        print(f"{name}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", default="16,32,64")
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--splits", default="1,2,3,4,6,8")
    ap.add_argument("--tiles", default="1,2,4")
    ap.add_argument("--kernels", default="1,2", help="0 = the GEMV in one launch (M <= 32; --splits are its warps), "
                    "1 = mma.sync (M <= 64), 2 = wgmma (sm_90a, M <= 128), "
                    "3 = warp-specialised wgmma (sm_90a, any M; --tiles are its variants 1..7)")
    args = ap.parse_args()
    kernels.load()
    copy = timing.copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d %H:%M')}, copy {copy.gbps:.0f} GB/s", flush=True)
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        layer = cases.Layer(k, n, 128, seed=1)
        fp16 = {}
        for m in [8] + [int(v) for v in args.m.split(",")]:
            fp = cases.FP16_CUBLAS.case(layer, m).measure(copy)
            fp16[m] = fp.median_us
            auto = run_case(f"{shape} M={m} auto", layer, m, lambda x, qw, qz, s, b: kernels.gemv(x, qw, qz, s, bias=b), copy)
            if auto is None:
                continue
            line = f"{shape} M={m}: fp16 {fp.median_us:.2f}  auto[{kernels.gemv_path(m, k, n)}] {auto.median_us:.2f} ({fp.median_us / auto.median_us:.2f}x, {auto.pct_of_copy:.0f}% copy)"
            print(line, flush=True)
            if m <= 8:
                continue
            dq = run_case(f"{shape} M={m} dequant+cuBLAS", layer, m, lambda x, qw, qz, s, b: torch.nn.functional.linear(
                x, kernels.dequantize_w4_gemv(qw, qz, s, x.shape[1]), b), copy)
            if dq is not None:
                print(f"  {shape} M={m}: dequant+cuBLAS {dq.median_us:.2f} ({fp.median_us / dq.median_us:.2f}x)", flush=True)
            best = None
            for kernel in (int(v) for v in args.kernels.split(",")):
                if (kernel == 0 and m > 32) or (kernel == 1 and m > 64) or (kernel == 2 and m > 128):
                    continue
                for tiles in [0] if kernel == 0 else (int(v) for v in args.tiles.split(",")):
                    for splits in [0] + [int(v) for v in args.splits.split(",") if v]:
                        if kernel == 0:
                            run = lambda x, qw, qz, s, b, splits=splits: kernels._gemv_splits(  # noqa: E731
                                x, qweight=qw, qzeros=qz, scales=s, bias=b, splits=splits)
                        else:
                            run = lambda x, qw, qz, s, b, tiles=tiles, splits=splits, kernel=kernel: kernels._batch(  # noqa: E731
                                x, qweight=qw, qzeros=qz, scales=s, bias=b, splits=splits, tiles=tiles, kernel=kernel)
                        t = run_case(f"{shape} M={m} kernel={kernel} tiles={tiles} splits={splits}", layer, m, run, copy)
                        if t is None:
                            continue
                        print(f"    kernel={kernel} tiles={tiles} splits={splits}: {t.median_us:.2f} us ({fp.median_us / t.median_us:.2f}x, {t.pct_of_copy:.0f}% copy)", flush=True)
                        if best is None or t.median_us < best[0]:
                            best = (t.median_us, kernel, tiles, splits)
            if best:
                print(f"  best {shape} M={m}: kernel={best[1]} tiles={best[2]} splits={best[3]} {best[0]:.2f} us ({fp.median_us / best[0]:.2f}x) vs auto {auto.median_us:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
