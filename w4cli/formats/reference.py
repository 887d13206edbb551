"""The reference's side of a PackedLinear (formats/packed.py): each format's own unpacking of the
words into codes, then the one dequantization every format shares (formats/unpacked.py). What the
CPU kernel is checked against, and where it cannot be built, what runs instead.
"""

from __future__ import annotations

import torch

from w4cli.formats import awq_gemm, compressed_tensors, gptq
from w4cli.formats.packed import AWQ, K_IN_COLUMNS, PackedLinear
from w4cli.formats.unpacked import UnpackedLinear


def unpack(layer: PackedLinear) -> UnpackedLinear:
    if layer.layout == AWQ:
        codes = awq_gemm.unpack_codes(layer.words)
    elif layer.layout == K_IN_COLUMNS:
        codes = gptq.unpack_qweight(layer.words)
    else:
        codes = compressed_tensors.unpack_weight(layer.words, layer.shape[1])
    return UnpackedLinear(codes, layer.zeros, layer.scales, layer.g_idx)


# -> [N, K] in dtype: (q - z) * s exact, rounded once
def dequantize(layer: PackedLinear, dtype: torch.dtype) -> torch.Tensor:
    return unpack(layer).dequantize(dtype)
