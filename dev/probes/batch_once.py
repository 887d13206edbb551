"""One batch-kernel call per (M, kernel) on 8192x28672, for Nsight Compute to look at each kernel
of the call (the activation permute and the GEMM) alone:

    ncu --metrics gpu__time_duration.sum python3 dev/probes/batch_once.py [M ...]

Kernel 3 (the warp-specialised one) runs at every M; kernels 1 and 2 where they exist.
"""

import sys

import torch

from w4cli.gpu import kernels
from w4cli.bench import cases

layer = cases.Layer(8192, 28672, 128, seed=1)
qw, qz, s = layer.gemv(0)
for m in [int(v) for v in sys.argv[1:]] or (16, 64, 128):
    x = layer.x(m, 0)
    for kernel in (1, 2, 3):
        if (kernel == 1 and m > 64) or (kernel == 2 and m > 128):
            continue
        kernels._batch(x, qweight=qw, qzeros=qz, scales=s, kernel=kernel)
torch.cuda.synchronize()
