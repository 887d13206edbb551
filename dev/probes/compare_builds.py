"""The batch path of two kernel trees side by side in one process (lab only): the shipped kernels/
and another copy (e.g. an older commit's, `git archive <rev> kernels | tar -x -C DIR`), each timed on
the bench's harness at the same shapes and M, alternating, outputs checked against the reference.

    PYTHONPATH=. python3 dev/probes/compare_builds.py DIR [DIR ...] [--shapes 8192x28672] [--m 64,1024] [--kernel 3]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from w4cli.bench import cases
from w4cli.gpu import kernels, timing
from ws_ablation import build_tree  # dev/probes, this script's folder


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("others", nargs="+")
    ap.add_argument("--shapes", default="8192x28672")
    ap.add_argument("--m", default="64,1024")
    ap.add_argument("--kernel", type=int, default=3)
    args = ap.parse_args()
    mods = {"shipped": build_tree("shipped", kernels.KERNEL_DIR)}
    for d in args.others:
        mods[Path(d).name] = build_tree(Path(d).name, Path(d))
    copy = timing.copy_bandwidth()
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        layer = cases.Layer(k, n, 128, seed=1)
        for m in (int(v) for v in args.m.split(",")):
            row = []
            for _ in range(2):
                for name, mod in mods.items():
                    def run(x, qw, qz, s, b, mod=mod):
                        return mod.gemm_w4_batch(x, qw, qz, s, b, 0, 0, args.kernel)
                    case = cases.Case(name, lambda i: (layer.x(m, i), *layer.gemv(i), None), run,
                                      lambda out, a: cases.w4_gemv_errors(layer, out, a).require(),
                                      cases.W4_GEMV_KERNEL.bytes_moved(k, n, m, layer.group))
                    row.append(f"{name} {case.measure(copy).median_us:.1f}")
            print(f"{shape} M={m} kernel {args.kernel}: " + " | ".join(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
