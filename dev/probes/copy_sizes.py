"""Probe (not part of w4): the SM copy kernel's rate at the byte counts of the dequantize shapes.

The copy ceiling in w4cli/gpu/timing.py is measured at 512 MiB. A kernel that moves fewer bytes also pays
a launch ramp and a drain, and so does a copy of that size. This times `torch.bitwise_not` (the
harness's copy kernel) over rotating sets of 42, 148, 169 and 592 MB (read + write), the totals
of the 4096x4096, 4096x14336, 8192x8192 and 8192x28672 dequantizations, against the 512 MiB copy
in the same run (dev/LOG.md, dequantize, item 9).

    PYTHONPATH=. python3 dev/probes/copy_sizes.py      (on a GPU machine, from the repository root)
"""

import torch

from w4cli.gpu.timing import copy_bandwidth, measure


def main() -> None:
    big = copy_bandwidth(method="kernel")
    print(big.row())
    for total_mb in (42.3, 148.0, 169.1, 591.8):
        n = int(total_mb * 1e6 / 2) // 16 * 16  # bytes read (= bytes written), whole 16-byte vectors

        def make(i: int, n: int = n):
            g = torch.Generator(device="cuda").manual_seed(i)
            src = torch.randint(-(2**31), 2**31 - 1, (n // 4,), dtype=torch.int32, device="cuda", generator=g)
            return src, torch.empty_like(src)

        t = measure(lambda s, d: torch.bitwise_not(s, out=d), make, 2 * n,
                    lambda out, a: torch.equal(out, torch.bitwise_not(a[0])), name=f"copy {total_mb} MB",
                    copy=big, min_sets=4)
        print(t.row())


if __name__ == "__main__":
    main()
