"""Exact comparison on raw bits, and the GEMV check with the bound of w4cli/tolerance.py.

Bits, never allclose: `allclose(atol=0, rtol=0)` calls +0.0 and -0.0 equal and NaN unequal to
itself, and a kernel that is meant to be exact must agree on both.
"""

from __future__ import annotations

import torch

from w4cli.tolerance import BOUND_TEXT, gemv_bound
from w4cli.verify.report import Mismatch

_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# any tensor -> the same shape as signed integers of its element size (bool/uint8 -> int8, ...)
def raw_bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous()
    return t if t.dtype == _INT_OF_SIZE[t.element_size()] else t.view(_INT_OF_SIZE[t.element_size()])


def _value(t: torch.Tensor, index: tuple[int, ...]) -> str:
    v = t[index]
    word = int(raw_bits(v.reshape(1))[0]) & ((1 << (8 * t.element_size())) - 1)
    hexed = f"0x{word:0{2 * t.element_size()}x}"
    if t.is_floating_point():
        return f"{v.item()!r} ({hexed})"
    return f"{v.item()} ({hexed})" if t.dtype != torch.bool else str(bool(v.item()))


def first_difference(got: torch.Tensor, want: torch.Tensor, got_label: str = "got", want_label: str = "expected") -> str | None:
    """None when dtype, shape and every bit agree; else one line: what differs, how many, and the
    first differing element with its index and both values (and their bits)."""
    if got.dtype != want.dtype:
        return f"dtype {str(got.dtype).removeprefix('torch.')}, {want_label} {str(want.dtype).removeprefix('torch.')}"
    if tuple(got.shape) != tuple(want.shape):
        return f"shape {list(got.shape)}, {want_label} {list(want.shape)}"
    a, b = raw_bits(got.cpu()), raw_bits(want.cpu())
    if torch.equal(a, b):
        return None
    bad = (a != b).nonzero()
    index = tuple(int(i) for i in bad[0])
    return (f"{bad.shape[0]} of {a.numel()} elements differ; first at {list(index)}: "
            f"{got_label} {_value(got.cpu(), index)} vs {want_label} {_value(want.cpu(), index)}")


def require_identical(got: torch.Tensor, want: torch.Tensor, what: str, got_label: str = "got", want_label: str = "expected") -> None:
    diff = first_difference(got, want, got_label, want_label)
    if diff is not None:
        raise Mismatch(f"{what}: {diff}")


# out [M, N] fp16 kernel result; x [M, K] fp16; w16 [N, K] the fp16 dequantized weight the kernel
# uses; bias [N] | None -> (worst err/bound, max |err|, mean relative error, SQNR dB)
def gemv_error(out: torch.Tensor, x: torch.Tensor, w16: torch.Tensor, bias: torch.Tensor | None = None) -> tuple[float, float, float, float]:
    """Checks the GEMV result against a float64 reference built from the same fp16 weights, with
    the bound of w4cli/tolerance.py (its docstring says why that bound). Also returns the upstream
    metrics (Marlin's mean relative error, torchao's SQNR) for comparison.
    Raises Mismatch naming the first output outside the bound.
    """
    w = w16.to(torch.float64)
    xd = x.to(torch.float64)
    ref = xd @ w.t()
    if bias is not None:
        ref = ref + bias.to(torch.float64)
    bound = gemv_bound(x, w16, ref, bias)
    o = out.to(torch.float64)
    err = (o - ref).abs()
    bad = (err > bound) | ~torch.isfinite(o)
    ratio = float((err / bound).max()) if torch.isfinite(o).all() else float("inf")
    if bool(bad.any()):
        index = tuple(int(i) for i in bad.nonzero()[0])
        raise Mismatch(f"{int(bad.sum())} of {o.numel()} outputs outside {BOUND_TEXT}; "
                       f"first at {list(index)}: kernel {o[index].item()!r} vs reference {ref[index].item()!r} "
                       f"(bound {bound[index].item():.3g})")
    max_abs = float(err.max())
    mean_rel = float(err.mean() / ref.abs().mean().clamp_min(1e-300))
    noise = float(err.pow(2).sum().sqrt())
    sqnr = float("inf") if noise == 0 else 20 * torch.log10(ref.pow(2).sum().sqrt() / noise).item()
    return ratio, max_abs, mean_rel, sqnr
