"""Does a measurement depend on what ran just before it? fp16 cuBLAS and w4's path timed in the
sequence w4, fp16, w4, w4, fp16, w4 on the bench's harness, per shape and M (lab only):

    PYTHONPATH=. python3 dev/probes/order_effect.py [--shapes 4096x4096,8192x28672] [--m 128,256,1024]
"""

from __future__ import annotations

import argparse

import torch

from w4cli.bench import cases
from w4cli.gpu import timing


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x4096,4096x6144,8192x28672")
    ap.add_argument("--m", default="128,256,1024")
    args = ap.parse_args()
    copy = timing.copy_bandwidth()
    print(torch.cuda.get_device_name(), flush=True)
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        layer = cases.Layer(k, n, 128, seed=1)
        for m in (int(v) for v in args.m.split(",")):
            row = []
            for key in ("w4", "fp16", "w4", "w4", "fp16", "w4"):
                method = cases.W4_GEMV_KERNEL if key == "w4" else cases.FP16_CUBLAS
                row.append(f"{key} {method.case(layer, m).measure(copy).median_us:.2f}")
            print(f"{shape} M={m}: " + " | ".join(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
