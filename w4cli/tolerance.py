"""How close a GEMV output must be to its reference, and why. One definition, used by `w4 gemv`,
`w4 bench`, `w4 verify` and the tests.

The reference is y_ref = x @ W^T in float32 (float64 where cheap) from the *same* fp16-rounded
weight the kernel dequantizes, so quantization error is not part of the comparison: only the
kernel's arithmetic is. The kernel accumulates K products in float32 (each product of two fp16
values is exact in fp32) in some order, then rounds once to fp16:
  - the final rounding to fp16 costs at most half an ulp: 2^-11 |y| (we allow 2^-10 |y|);
  - each of the K float32 additions is off by at most 2 ulp (2 * 2^-24 relative) of a partial
    sum no larger than sum |x_k w_k| (tensor cores align the products and truncate rather than
    round, hence 2 ulp rather than 1/2); we allow 4 K 2^-24 sum |x_k w_k|, which also covers the
    bias add and the split-K partial sums combined at the end;
  - plus one fp16 subnormal step (2^-24) so an exact 0 reference does not demand an exact 0.
This is a worst-case bound, so on random data it is loose: it catches wrong weights, wrong
nibble order, wrong groups or a missing bias by orders of magnitude, but not fp16 accumulation.
That is the exact test's job (activations in {-1, 0, 1}, power-of-two scales: every fp32
partial sum is exact, so the output must equal the reference rounded once, bit for bit).
"""

from __future__ import annotations

import torch


BOUND_TEXT = "|err| <= 2^-10 |ref| + 4 K 2^-24 (|x| @ |W|^T + |bias|) + 2^-24"


# x [M, K]; weight [N, K] (the fp16-rounded dequantized weight); ref [M, N] float32 or float64;
# bias [N] | None -> bound [M, N] float64
def gemv_bound(x: torch.Tensor, weight: torch.Tensor, ref: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    k = x.shape[-1]
    magnitude = x.abs().to(torch.float64) @ weight.abs().to(torch.float64).t()
    if bias is not None:
        magnitude = magnitude + bias.abs().to(torch.float64)
    return 2.0**-10 * ref.abs().to(torch.float64) + 4 * k * 2.0**-24 * magnitude + 2.0**-24


def gemv_errors(
    out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, ref: torch.Tensor, bias: torch.Tensor | None = None
) -> dict[str, float]:
    """max abs error, normwise relative error ||out - ref|| / ||ref|| (elementwise relative errors
    explode on outputs near zero and say nothing), worst err/bound, and whether every output is
    finite and inside the bound."""
    err = (out.to(torch.float64) - ref.to(torch.float64)).abs()
    bound = gemv_bound(x, weight, ref, bias)
    finite = bool(torch.isfinite(out).all())
    ratio = float((err / bound).max()) if err.numel() else 0.0
    ref_norm = float(ref.to(torch.float64).norm())
    return {
        "max_abs_err": float(err.max()) if err.numel() else 0.0,
        "rel_err": float(err.norm()) / ref_norm if ref_norm > 0 else float(err.norm()),
        "worst_err_over_bound": ratio,
        "passed": finite and ratio <= 1.0,
    }
