"""One linear's int4 weights once unpacked from its layout: the dequantization every format shares.

Each format module (awq_gemm, gptq, compressed_tensors) reads its tensors into a PackedLinear
(formats/packed.py), which formats/reference.py unpacks into an UnpackedLinear (K = in_features, N = out_features,
G = group size):

    codes   [N, K]       uint8    0..15, nn.Linear orientation
    zeros   [N, K/G]     uint8    0..15, the zero point of each channel and group
    scales  [N, K/G]     float16 | bfloat16, as the checkpoint stores them (a transposed view is fine)
    g_idx   [K] int64 | None      the group of each k; None: k // G (contiguous groups)
    W[n, k] = (codes[n, k] - zeros[n, g(k)]) * scales[n, g(k)]

(codes - zeros) is an integer in -15..15 and a 16-bit scale has at most 11 significant bits, so
their product needs at most 15 bits: float32 holds it exactly, and the only rounding is the final
cast to the output dtype. Rounded to the scales' own dtype, that is what every format's library
computes ((q - z) * s in the scales' dtype, one rounding), bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ROWS_PER_CHUNK = 256  # output rows per step: keeps the float32 temporaries in cache


@dataclass(frozen=True)
class UnpackedLinear:
    codes: torch.Tensor  # [N, K] uint8
    zeros: torch.Tensor  # [N, groups] uint8
    scales: torch.Tensor  # [N, groups] float16 | bfloat16
    g_idx: torch.Tensor | None = None  # [K] int64; None: contiguous groups of K / groups

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)  # (N, K)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """[N, K] in dtype: the exact (q - z) * s, rounded once."""
        n, k = self.codes.shape
        groups = self.zeros.shape[1]
        zeros = self.zeros.to(torch.float32)
        scales = self.scales.to(torch.float32)
        out = torch.empty((n, k), dtype=dtype, device=self.codes.device)
        if self.g_idx is None:
            # contiguous groups: broadcast each group's zero and scale along its G codes
            codes = self.codes.view(n, groups, k // groups)
            zeros, scales = zeros.unsqueeze(-1), scales.unsqueeze(-1)
            for start in range(0, n, ROWS_PER_CHUNK):
                rows = slice(start, min(n, start + ROWS_PER_CHUNK))
                out[rows] = codes[rows].to(torch.float32).sub_(zeros[rows]).mul_(scales[rows]).view(-1, k)
            return out
        for start in range(0, n, ROWS_PER_CHUNK):
            rows = slice(start, min(n, start + ROWS_PER_CHUNK))
            exact = self.codes[rows].to(torch.float32).sub_(zeros[rows][:, self.g_idx]).mul_(scales[rows][:, self.g_idx])
            out[rows] = exact
        return out


def identity_groups(g_idx: torch.Tensor, group_size: int) -> bool:
    """Whether g_idx is the plain grouping g_idx[k] == k // G (no act-order permutation)."""
    k = g_idx.shape[0]
    return bool(torch.equal(g_idx.to(torch.int64), torch.arange(k, dtype=torch.int64, device=g_idx.device) // group_size))


def group_map_problem(g_idx: torch.Tensor, k: int, group_size: int) -> str | None:
    """Why g_idx [K] is not a group map of K / G groups of G members each (None if it is).

    GPTQ's act-order assigns groups in the order of the permuted columns, so every group still
    holds exactly G columns; any other map was not written by a quantizer."""
    groups = k // group_size
    values = g_idx.to(torch.int64)
    low, high = int(values.min()), int(values.max())
    if low < 0 or high >= groups:
        bad = int(((values < 0) | (values >= groups)).nonzero()[0])
        return f"g_idx[{bad}] = {int(values[bad])} is not a group 0..{groups - 1}"
    counts = torch.bincount(values, minlength=groups)
    if bool((counts != group_size).any()):
        group = int((counts != group_size).nonzero()[0])
        return f"group {group} holds {int(counts[group])} columns in g_idx, not group_size {group_size}"
    return None


# words [...] int32 -> [..., 8] uint8: nibble i (bits 4i..4i+3) of each word at index i
def nibbles(words: torch.Tensor) -> torch.Tensor:
    if words.dtype != torch.int32:
        raise TypeError(f"packed int4 words must be int32, got {words.dtype}")
    # the little-endian bytes: byte b holds nibbles 2b (low) and 2b+1 (high); uint8 shifts are
    # logical, so the sign bit of the int32 word needs no care
    octets = words.contiguous().view(torch.uint8).view(*words.shape, 4)
    # written in place: no half-size temporaries beside the result (a 70B's linear: 2 x 117 MB)
    out = torch.empty((*words.shape, 4, 2), dtype=torch.uint8, device=words.device)
    torch.bitwise_and(octets, 0xF, out=out[..., 0])
    torch.bitwise_right_shift(octets, 4, out=out[..., 1])
    return out.view(*words.shape, 8)
