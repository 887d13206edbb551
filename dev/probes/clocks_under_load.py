"""SM clock and power while one GEMM runs back to back for a few seconds: the warp-specialised
kernel against fp16 cuBLAS at the same shape (is a sustained int4 GEMM slower for its clocks?).

    PYTHONPATH=. python3 dev/probes/clocks_under_load.py [M] [K] [N]

Samples nvidia-smi every 100 ms in the background and prints the median clock and power of each
phase, with the time per call measured by CUDA events over the same window.
"""

import statistics
import subprocess
import sys
import time

import torch

from w4cli.bench import cases
from w4cli.gpu import kernels

m, k, n = (int(v) for v in (sys.argv[1:4] if len(sys.argv) >= 4 else (4096, 8192, 28672)))
layer = cases.Layer(k, n, 128, seed=1)
qw, qz, s = layer.gemv(0)
x = layer.x(m, 0)
w16 = torch.randn(n, k, device="cuda", dtype=torch.float16)
runs = {
    "w4 ws": lambda: kernels._batch(x, qweight=qw, qzeros=qz, scales=s, kernel=3),
    "fp16 cuBLAS": lambda: torch.nn.functional.linear(x, w16),
}
for name, fn in runs.items():
    fn()
    torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "100"], stdout=subprocess.PIPE, text=True)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    calls, t0 = 0, time.time()
    start.record()
    while time.time() - t0 < 4.0:
        for _ in range(20):
            fn()
        calls += 20
        torch.cuda.synchronize()
    end.record()
    torch.cuda.synchronize()
    smi.terminate()
    rows = [line.split(",") for line in smi.communicate()[0].splitlines() if line.count(",") == 1]
    clocks = [float(c) for c, _ in rows[5:]]  # after the first half second
    power = [float(p) for _, p in rows[5:]]
    print(f"{name}: {start.elapsed_time(end) * 1000 / calls:.1f} us a call, SM clock median "
          f"{statistics.median(clocks):.0f} MHz (min {min(clocks):.0f}), power median {statistics.median(power):.0f} W",
          flush=True)
