"""What a weight layout in the mma fragment's own k order would cost the GEMV (lab only). In such a
layout (dev/LOG.md, fourth session on issue 23) lane t's word j of a 128-k block holds
k = 32 j + {2t, 2t + 1, 2t + 8, 2t + 9} and the same + 16, so the GEMV reads each word's
activations as four 4-byte pairs instead of one 16-byte vector. This builds the GEMV with only
that change, in all three of its loops (the lean kernel's, the pipelined kernel's, the checked
tail's); the weights stay as they are, so its results are wrong and not checked. It times that
build beside the shipped one, alternately, on the bench's harness.

    PYTHONPATH=. python3 dev/probes/gemv_x_pairs.py [--shapes 4096x4096,...] [--m 1,4,8,16]
"""

from __future__ import annotations

import argparse

import torch

from compare_builds import time_alternately  # dev/probes, this script's folder
from w4cli.gpu import kernels
from ws_ablation import build_tree

FILE = "gemv_w4a16.cu"
LOOP = """      for (int j = 0; j < 4; ++j) xv[b][j] = __ldg(px[b] + j);"""
LOOP_PAIRS = """      for (int j = 0; j < 4; ++j) {
        const uint32_t* xq = reinterpret_cast<const uint32_t*>(px[b] - 4 * l.t) + 16 * j + l.t;
        xv[b][j] = make_uint4(__ldg(xq), __ldg(xq + 4), __ldg(xq + 8), __ldg(xq + 12));
      }"""
PIPE = """        const uint4 xv = __ldg(px + x_tile[b] + j);"""
PIPE_PAIRS = """        const uint32_t* xq = reinterpret_cast<const uint32_t*>(px + x_tile[b] - 4 * l.t) + 16 * j + l.t;
        const uint4 xv = make_uint4(__ldg(xq), __ldg(xq + 4), __ldg(xq + 8), __ldg(xq + 12));"""
RING = """        xv[u][b][j] = (kb0 + u < l.kb_end && l.has_x[b] && k0 < a.K) ? __ldg(l.xrow[b] + (k0 >> 3))
                                                                      : make_uint4(0, 0, 0, 0);"""
RING_PAIRS = """        const uint32_t* xq = reinterpret_cast<const uint32_t*>(l.xrow[b]) + 64 * (kb0 + u) + 16 * j + l.t;
        xv[u][b][j] = (kb0 + u < l.kb_end && l.has_x[b] && k0 < a.K)
                          ? make_uint4(__ldg(xq), __ldg(xq + 4), __ldg(xq + 8), __ldg(xq + 12))
                          : make_uint4(0, 0, 0, 0);"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x4096,4096x6144,4096x14336,14336x4096,8192x8192,8192x28672,28672x8192")
    ap.add_argument("--m", default="1,4,8,16")
    args = ap.parse_args()
    mods = {"shipped": build_tree("gemv_shipped", kernels.KERNEL_DIR),
            "pairs": build_tree("gemv_pairs", kernels.KERNEL_DIR, [(FILE, LOOP, LOOP_PAIRS), (FILE, PIPE, PIPE_PAIRS),
                                                                       (FILE, RING, RING_PAIRS)])}
    print(torch.cuda.get_device_name(), flush=True)
    time_alternately(mods, args.shapes, args.m, lambda mod, x, qw, qz, s, b: mod.gemv_w4(x, qw, qz, s, b, 0, False),
                     checked=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
