"""How w4 decides that a kernel's output is right: the one set of checks used by `w4 gemv`,
`w4 bench`, `w4 verify`, the tests and dev/.

Bit for bit, where the arithmetic is exact (dequantize, repack, the GEMV on exact data): raw bits,
never allclose. `allclose(atol=0, rtol=0)` calls +0.0 and -0.0 equal and NaN unequal to itself, and
a kernel that is meant to be exact must agree on both. A difference is named by its first element,
with both values and their bits.

Within a bound, where the kernel sums in its own order (the GEMV). The reference is
y_ref = x @ W^T (+ bias) in float64 from the *same* fp16-rounded weight the kernel dequantizes, so
quantization error is not part of the comparison: only the kernel's arithmetic is. The kernel
accumulates K products in float32 (each product of two fp16 values is exact in fp32) in some order,
then rounds once to fp16:
  - the final rounding to fp16 costs at most half an ulp: 2^-11 |y| (we allow 2^-10 |y|);
  - each of the K float32 additions is off by at most 2 ulp (2 * 2^-24 relative) of a partial
    sum no larger than sum |x_k w_k| (tensor cores align the products and truncate rather than
    round, hence 2 ulp rather than 1/2); we allow 4 K 2^-24 sum |x_k w_k|, which also covers the
    bias add and the split-K partial sums combined at the end;
  - plus one fp16 subnormal step (2^-24) so an exact 0 reference does not demand an exact 0.
This is a worst-case bound, so on random data it is loose: it catches wrong weights, wrong nibble
order, wrong groups or a missing bias by orders of magnitude, but not fp16 accumulation. That is
the exact test's job (activations in {-1, 0, 1}, power-of-two scales: every fp32 partial sum is
exact, so the output must equal the reference rounded once, bit for bit).

Normwise, for the baselines `w4 bench` times beside w4's kernels (cuBLAS, torch's int4 kernel):
||out - ref|| / ||ref|| against a float64 reference, because elementwise relative errors explode on
outputs near zero and say nothing. cases.py says which limit each baseline gets, and why.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class Mismatch(Exception):
    """Raised by a check: the compared things differ; the message says where and how, in one line."""


# ---- bit for bit ----

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
    if got.device != want.device:
        got, want = got.cpu(), want.cpu()
    a, b = raw_bits(got), raw_bits(want)
    if torch.equal(a, b):
        return None
    bad = (a != b).nonzero()
    index = tuple(int(i) for i in bad[0])
    return (f"{bad.shape[0]} of {a.numel()} elements differ; first at {list(index)}: "
            f"{got_label} {_value(got, index)} vs {want_label} {_value(want, index)}")


def require_identical(got: torch.Tensor, want: torch.Tensor, what: str, got_label: str = "got", want_label: str = "expected") -> None:
    diff = first_difference(got, want, got_label, want_label)
    if diff is not None:
        raise Mismatch(f"{what}: {diff}")


# ---- the GEMV bound ----

BOUND_TEXT = "|err| <= 2^-10 |ref| + 4 K 2^-24 (|x| @ |W|^T + |bias|) + 2^-24"


# x [M, K]; weight [N, K] (the fp16-rounded dequantized weight); ref [M, N]; bias [N] | None
# -> bound [M, N] float64
def gemv_bound(x: torch.Tensor, weight: torch.Tensor, ref: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    k = x.shape[-1]
    magnitude = x.abs().to(torch.float64) @ weight.abs().to(torch.float64).t()
    if bias is not None:
        magnitude = magnitude + bias.abs().to(torch.float64)
    return 2.0**-10 * ref.abs().to(torch.float64) + 4 * k * 2.0**-24 * magnitude + 2.0**-24


@dataclass(frozen=True)
class GemvErrors:
    """How far a GEMV output is from its float64 reference. The bound decides; the other numbers
    are there to compare with upstream (Marlin's mean relative error, torchao's SQNR)."""

    worst_over_bound: float  # max |err| / bound; inf when an output is not finite
    max_abs_err: float
    rel_err: float  # normwise ||out - ref|| / ||ref||
    mean_rel_err: float  # mean |err| / mean |ref|
    sqnr_db: float
    outside: str | None  # None inside the bound, else the first output outside it, in one line

    @property
    def passed(self) -> bool:
        return self.outside is None

    def require(self) -> GemvErrors:
        """self, or Mismatch naming the first output outside the bound."""
        if self.outside is not None:
            raise Mismatch(self.outside)
        return self


# out [M, N] fp16 kernel result; x [M, K] fp16; weight [N, K] the fp16 dequantized weight the
# kernel uses; bias [N] | None
def gemv_errors(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> GemvErrors:
    ref = x.to(torch.float64) @ weight.to(torch.float64).t()
    if bias is not None:
        ref = ref + bias.to(torch.float64)
    bound = gemv_bound(x, weight, ref, bias)
    o = out.to(torch.float64)
    err = (o - ref).abs()
    finite = torch.isfinite(o)
    bad = (err > bound) | ~finite
    outside = None
    if bool(bad.any()):
        index = tuple(int(i) for i in bad.nonzero()[0])
        outside = (f"{int(bad.sum())} of {o.numel()} outputs outside {BOUND_TEXT}; first at {list(index)}: "
                   f"kernel {o[index].item()!r} vs reference {ref[index].item()!r} (bound {bound[index].item():.3g})")
    ref_norm, noise = float(ref.norm()), float(err.norm())
    return GemvErrors(
        worst_over_bound=float((err / bound).max()) if bool(finite.all()) else float("inf"),
        max_abs_err=float(err.max()),
        rel_err=noise / ref_norm if ref_norm > 0 else noise,
        mean_rel_err=float(err.mean() / ref.abs().mean().clamp_min(1e-300)),
        sqnr_db=float("inf") if noise == 0 else 20 * torch.log10(torch.tensor(ref_norm / noise)).item(),
        outside=outside,
    )


# ---- normwise ----


def normwise_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref||, in float64."""
    ref = ref.to(torch.float64)
    return float((out.to(torch.float64) - ref).norm() / ref.norm().clamp_min(1e-300))


def require_normwise(out: torch.Tensor, ref: torch.Tensor, limit: float) -> None:
    err = normwise_error(out, ref)
    if not err < limit:
        raise Mismatch(f"normwise relative error {err:.3g} >= {limit}")
