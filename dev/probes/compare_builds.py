"""The batch path of two kernel trees side by side in one process (lab only): the shipped kernels/
and another copy (e.g. an older commit's, `git archive <rev> kernels | tar -x -C DIR`), each timed on
the bench's harness at the same shapes and M, alternating, outputs checked against the reference.

    PYTHONPATH=. python3 dev/probes/compare_builds.py DIR [DIR ...] [--shapes 8192x28672] [--m 64,1024] [--kernel 3]
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

from w4cli.bench import cases
from w4cli.gpu import kernels, timing


def build(name: str, src: Path):
    from torch.utils import cpp_extension

    root = Path("/tmp/w4_compare") / name
    tree = root / "kernels"
    if tree.exists():
        shutil.rmtree(tree)
    shutil.copytree(src, tree)
    return cpp_extension.load(
        name=f"w4_compare_{name}",
        sources=[str(p) for p in kernels.build_sources(tree)],
        build_directory=str(root),
        extra_cflags=["-O3"],
        extra_cuda_cflags=["-O3", "-gencode=arch=compute_90a,code=sm_90a"],
        extra_include_paths=[str(tree)],
        verbose=False,
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("others", nargs="+")
    ap.add_argument("--shapes", default="8192x28672")
    ap.add_argument("--m", default="64,1024")
    ap.add_argument("--kernel", type=int, default=3)
    args = ap.parse_args()
    mods = {"shipped": build("shipped", kernels.KERNEL_DIR)}
    for d in args.others:
        mods[Path(d).name] = build(Path(d).name, Path(d))
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
