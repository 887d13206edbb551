"""One linear's int4 weights still packed, its zero points and scales already unpacked: what the
CPU kernel reads (w4cli/cpu/kernel.py); formats/reference.py unpacks it for the reference.

The zero points and scales are 1/G of the weights, so unpacking them first costs nothing; the
weights stay in the words the checkpoint holds, one of three layouts (K = in_features,
N = out_features, nib[i] = bits 4i..4i+3 of an int32 word):

    AWQ           words [K, N/8]        nib[i] of word [k, c] is channel n = 8c + AWQ_ORDER[i]
    K_IN_COLUMNS  words [K/8, N]        nib[i] of word [j, n] is k = 8j + i            (GPTQ)
    K_IN_ROWS     words [N, ceil(K/8)]  nib[i] of word [n, j] is k = 8j + i, padded  (compressed-tensors)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# the kernel's layout numbers (kernels/cpu/dequant_w4_cpu.cpp, enum Layout)
AWQ, K_IN_COLUMNS, K_IN_ROWS = 0, 1, 2


@dataclass(frozen=True)
class PackedLinear:
    words: torch.Tensor  # int32, in `layout`
    layout: int  # AWQ | K_IN_COLUMNS | K_IN_ROWS
    shape: tuple[int, int]  # (N, K)
    zeros: torch.Tensor  # [N, groups] uint8 0..15, contiguous
    scales: torch.Tensor  # [N, groups] float16 | bfloat16, contiguous
    g_idx: torch.Tensor | None = None  # [K] int64; None: contiguous groups of K / groups
