"""Where a batch call's time goes: each kernel's device time (torch.profiler, CUPTI) next to the
bench's per-call time (w4cli/gpu/timing.py) for the same setting, so that launch seams, the x
kernel and the main kernel's own time can be told apart:

    PYTHONPATH=. python3 dev/probes/kernel_times.py 4096x4096:128:3:1:2 14336x4096:128:3:3:4 ...

Each argument is KxN:M:kernel:tiles:splits (kernel 0 = fp16 cuBLAS; tiles, splits 0 = automatic).
Weights rotate over input sets as in the bench (cold L2).
"""

from __future__ import annotations

import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from w4cli.bench import cases
from w4cli.gpu import kernels, timing


def main() -> int:
    copy = timing.copy_bandwidth()
    print(torch.cuda.get_device_name(), flush=True)
    for spec in sys.argv[1:]:
        shape, m, kernel, tiles, splits = spec.split(":")
        k, n = (int(v) for v in shape.split("x"))
        m, kernel, tiles, splits = int(m), int(kernel), int(tiles), int(splits)
        layer = cases.Layer(k, n, 128, seed=1)
        if kernel == 0:
            t = cases.FP16_CUBLAS.case(layer, m).measure(copy)
            weights = [torch.randn(n, k, device="cuda").half() for _ in range(8)]
            call = lambda x, i: torch.nn.functional.linear(x, weights[i % 8])  # noqa: E731
        else:
            run = lambda x, qw, qz, s, b: kernels._batch(x, qweight=qw, qzeros=qz, scales=s, bias=b,  # noqa: E731
                                                         splits=splits, tiles=tiles, kernel=kernel)
            case = cases.Case(spec, lambda i: (layer.x(m, i), *layer.gemv(i), None), run,
                              lambda out, args: cases.w4_gemv_errors(layer, out, args).require(),
                              cases.W4_GEMV_KERNEL.bytes_moved(k, n, m, layer.group))
            t = case.measure(copy)
            sets = [layer.gemv(i) for i in range(8)]
            call = lambda x, i: run(x, *sets[i % 8], None)  # noqa: E731
        x = layer.x(m, 0)
        for i in range(8):
            call(x, i)
        torch.cuda.synchronize()
        calls = 40
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for i in range(calls):
                call(x, i)
            torch.cuda.synchronize()
        per = defaultdict(float)
        for e in prof.key_averages():
            if getattr(e, "device_type", None) != torch.autograd.DeviceType.CUDA:
                continue
            us = getattr(e, "self_device_time_total", None)
            per[e.key[:60]] += us if us is not None else e.self_cuda_time_total
        parts = ", ".join(f"{name} {us / calls:.2f}" for name, us in sorted(per.items(), key=lambda kv: -kv[1]))
        print(f"{spec}: bench {t.median_us:.2f} us/call | device us/call: {parts}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
