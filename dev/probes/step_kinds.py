"""One layer kind of a decode step, its layers back to back in one CUDA graph (as `w4 bench MODEL`'s
"where the step goes" times it), for two or more kernel trees alternately in one process (lab
only): whether a change that moves the per-shape cell moves the kind inside the step, with and
without PDL.

    PYTHONPATH=.:dev/probes python3 dev/probes/step_kinds.py DIR [DIR ...] --kinds 4096x28672:32
        [--m 256] [--reps 3] [--kernel 3]

--kinds KxN:LAYERS,...: the layer shape and how many copies of it (a model's decoder layers; fewer
where they do not fit). Every tree reads the same weights and the same x; each graph replays its
own eager result bit for bit (w4cli/gpu/timing.py checks).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from w4cli.bench.step import W4_STD_CODE
from w4cli.formats import w4_gemv
from w4cli.gpu import kernels, timing
from ws_ablation import build_tree  # dev/probes, this script's folder

GROUP = 128


def weights(k: int, n: int, count: int, gen: torch.Generator) -> list[dict[str, torch.Tensor]]:
    out = []
    for _ in range(count):
        words = torch.randint(-(2**31), 2**31, (k, n // 8), generator=gen, device="cuda", dtype=torch.int64)
        zeros = torch.randint(-(2**31), 2**31, (k // GROUP, n // 8), generator=gen, device="cuda", dtype=torch.int64)
        scales = torch.full((k // GROUP, n), 1.0 / (W4_STD_CODE * k**0.5), device="cuda").half()
        out.append(w4_gemv.repack_from_awq(words.to(torch.int32), zeros.to(torch.int32), scales))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("others", nargs="+")
    ap.add_argument("--kinds", default="4096x28672:32")
    ap.add_argument("--m", default="256")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--kernel", type=int, default=3)
    args = ap.parse_args()
    mods = {"shipped": build_tree("shipped", kernels.KERNEL_DIR)}
    for d in args.others:
        mods[Path(d).name] = build_tree(Path(d).name, Path(d))
    copy = timing.copy_bandwidth()
    gen = torch.Generator(device="cuda").manual_seed(7)
    for kind in args.kinds.split(","):
        shape, count = kind.split(":")
        k, n = (int(v) for v in shape.split("x"))
        layers = weights(k, n, int(count), gen)
        flat = tuple(w[key] for w in layers for key in ("qweight", "qzeros", "scales"))
        nbytes = sum(t.numel() * t.element_size() for t in flat)
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, k, generator=gen, device="cuda").half()
            for pdl in (True, False):
                row = []
                for _ in range(args.reps):
                    for name, mod in mods.items():
                        def run(x, *_w, mod=mod, pdl=pdl):
                            out = x
                            for w in layers:
                                out = mod.gemm_w4_batch(x, w["qweight"], w["qzeros"], w["scales"], None, 0, 0,
                                                        args.kernel, pdl)
                            return out
                        eager = run(x)
                        t = timing.measure(run, [(x, *flat)], nbytes + int(count) * 2 * m * (k + n),
                                           lambda out, a, eager=eager: torch.equal(out, eager),
                                           name=f"{name} {shape}", copy=copy)
                        row.append(f"{name} {t.median_us / 1000:.3f}")
                print(f"{shape} x{count} M={m} pdl={int(pdl)} (ms): " + " | ".join(row), flush=True)
        del layers, flat
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
