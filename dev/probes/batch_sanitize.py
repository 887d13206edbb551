"""Every batch-kernel variant once on small odd shapes, for compute-sanitizer (out-of-bounds and
misaligned accesses, uninitialised reads) without the test harness around it:

    compute-sanitizer --tool memcheck python3 dev/probes/batch_sanitize.py
    compute-sanitizer --tool initcheck python3 dev/probes/batch_sanitize.py
    compute-sanitizer --tool racecheck python3 dev/probes/batch_sanitize.py
    compute-sanitizer --tool racecheck python3 dev/probes/batch_sanitize.py 1 3 5   (those kernel-3 variants only)
    compute-sanitizer --tool racecheck python3 dev/probes/batch_sanitize.py kernels=2,3 splits=1 m=17,100,300

kernels=, splits=, m=, orders=, shapes= (indices into the list below) narrow the sweep (racecheck
runs each launch hundreds of times slower).

Checks each output against the reference too, so a run that the tool lets through still fails
loudly on a wrong result.
"""

import sys

import torch

from w4cli.gpu import kernels
from w4cli.gpu.checks import gemv_errors
from w4cli.formats import awq_gemm, w4_gemv

gen = torch.Generator().manual_seed(0)
wgmma = kernels.has_wgmma()
only = [int(v) for v in sys.argv[1:] if v.isdigit()]  # kernel-3 variants to run alone (6: the pairs)
narrow = dict(v.split("=") for v in sys.argv[1:] if "=" in v)
kernel_set = [int(v) for v in narrow.get("kernels", "3" if only else "1,2,3").split(",")]
split_set = [int(v) for v in narrow.get("splits", "1,3,6").split(",")]
m_set = [int(v) for v in narrow.get("m", "9,17,33,64,100,128,300").split(",")]
order_set = [int(v) for v in narrow.get("orders", "1,2").split(",")]  # the wgmma kernels' k orders
bad = 0
# the last shape has more than 132 tiles of 128 rows: the warp-specialised kernel's stream-K cuts;
# the one before, few tiles over 33 k-blocks: stream-K over every SM at splits=1 (variants 1-4)
# (1152, 1024, 128): every row block inside N, one scale and zero a row: the bulk-copied constants
shapes = [(200, 56, 200), (4160, 40, 4160), (1152, 2056, 128), (2304, 136, 64), (384, 264, 32),
          (4224, 1032, 128), (256, 17912, 128), (1152, 1024, 128)]
for k, n, g in [shapes[int(i)] for i in narrow["shapes"].split(",")] if "shapes" in narrow else shapes:
    layer = w4_gemv.repack_from_awq(*(t.cuda() for t in awq_gemm.random_layer(k, n, g, gen)))
    weight = w4_gemv.dequantize(**layer, dtype=torch.float16).cpu()
    for m in m_set:
        x = torch.randn(m, k, generator=gen).half().cuda()
        for kernel in kernel_set:
            if (kernel == 1 and m > 64) or (kernel == 2 and m > 128) or (kernel > 1 and not wgmma):
                continue
            for tiles in ((only or range(1, 8)) if kernel == 3 else (1, 2)):
                if (kernel == 2 and m > 64 and tiles == 2) or (kernel == 1 and m <= 16 and tiles == 1):
                    continue  # no such variant (the planner's tables)
                for order in order_set if kernel > 1 else (0,):
                    if order == 2 and g != k and g % 128 != 0:
                        continue  # x as it lies takes one scale a row and 128-k block
                    if tiles == 6 and order != 2:
                        continue  # the pairs (variant 6): x as it lies, no split
                    for splits in (split_set if tiles != 6 else (1,)):
                        out = kernels._batch(x, **layer, splits=splits, tiles=tiles, kernel=kernel, order=order)
                        errors = gemv_errors(out.cpu(), x.cpu(), weight)
                        if not errors.passed:
                            bad += 1
                            print(f"FAIL k={k} n={n} g={g} m={m} kernel={kernel} tiles={tiles} order={order} "
                                  f"splits={splits}: {errors}")
torch.cuda.synchronize()
print("done,", bad, "failures")
raise SystemExit(1 if bad else 0)
