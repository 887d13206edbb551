"""One call of each kernel per M on one shape, for Nsight Compute to look at each kernel of the
call (the activation permute and the GEMM) alone:

    ncu --metrics gpu__time_duration.sum python3 dev/probes/batch_once.py [--shape 8192x28672] [--kernels 1,2,3]
        [--tiles T] [--splits S] [--order O] [M ...]

Kernel 0 is the GEMV (M <= 32), 1 the mma.sync batch kernel (M <= 64), 2 the barrier wgmma kernel
(M <= 128), 3 the warp-specialised one (any M); each runs where it exists, with its automatic plan
unless --tiles / --splits / --order fix the batch kernels' (as `kernels._batch` takes them; 0 =
automatic; --order 1 stages x permuted, 2 as it lies).
"""

import argparse

import torch

from w4cli.gpu import kernels
from w4cli.bench import cases

ap = argparse.ArgumentParser()
ap.add_argument("--shape", default="8192x28672")
ap.add_argument("--kernels", default="1,2,3")
ap.add_argument("--tiles", type=int, default=0)
ap.add_argument("--splits", type=int, default=0)
ap.add_argument("--order", type=int, default=0)
ap.add_argument("m", nargs="*", type=int, default=[16, 64, 128])
args = ap.parse_args()
k, n = (int(v) for v in args.shape.split("x"))
layer = cases.Layer(k, n, 128, seed=1)
qw, qz, s = layer.gemv(0)
for m in args.m:
    x = layer.x(m, 0)
    for kernel in (int(v) for v in args.kernels.split(",")):
        if m > {0: 32, 1: 64, 2: 128}.get(kernel, m):
            continue
        if kernel == 0:
            kernels._gemv_splits(x, qweight=qw, qzeros=qz, scales=s, splits=0)
        else:
            kernels._batch(x, qweight=qw, qzeros=qz, scales=s, kernel=kernel, tiles=args.tiles, splits=args.splits,
                           order=args.order if kernel > 1 else 0)
torch.cuda.synchronize()
