"""compressed-tensors "pack-quantized" (llm-compressor), int 4-bit weights: validation and
unpacking of one linear.

Layout (K = in_features, N = out_features, G = group size, G = K for strategy "channel"):
    weight_packed     [N, ceil(K/8)] int32  packed along K: nib[i] of word [n, j] is k = 8j + i
                                            (no interleave; nibbles past K are padding)
    weight_scale      [N, K/G]      float16 | bfloat16
    weight_zero_point [ceil(N/8), K/G] int32  asymmetric only; packed along N: nib[i] of word
                                            [r, g] is channel n = 8r + i
    weight_shape      [2]           int64 (int32 accepted)  (N, K)
    weight_g_idx      [K]           int32   optional (actorder "group"): the group of each k
    W[n, k] = (q[n, k] - z[n, g(k)]) * s[n, g(k)]

Every nibble holds a signed value plus 8, zero points included; the offsets cancel in q - z, so
the nibbles are used as they are. Symmetric groups store no zero point: it is signed 0, nibble 8.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from w4cli.gpu.contract import PACK
from w4cli.errors import InputRefused
from w4cli.formats.packed import K_IN_ROWS, PackedLinear
from w4cli.formats.unpacked import identity_groups, nibbles

REQUIRED = ("weight_packed", "weight_scale", "weight_shape")
OPTIONAL = ("weight_zero_point", "weight_g_idx")
SCALE_DTYPES = (torch.float16, torch.bfloat16)
SYMMETRIC_ZERO = 8  # signed 0 stored with the +8 offset


@dataclass(frozen=True)
class WeightArgs:
    """What a config group says of its weights (read/ct_config.py reads it)."""

    symmetric: bool  # no weight_zero_point: every zero point is 8 (signed 0)
    strategy: str  # "group" or "channel" (one group spanning K)
    group_size: int | None  # strategy "group" only


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _words(count: int) -> int:
    return -(-count // PACK)


# shapes and dtypes of one linear (meta-device tensors are enough); weight_shape read as (N, K)
# -> (K, N, G)
def validate(
    weight_packed: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_zero_point: torch.Tensor | None,
    weight_g_idx: torch.Tensor | None,
    weight_shape: tuple[int, int],
    args: WeightArgs,
) -> tuple[int, int, int]:
    """Raises InputRefused (one line, without the layer's name: the caller adds it)."""
    n, k = weight_shape
    if n < 1 or k < 1:
        raise InputRefused(f"weight_shape {[n, k]} is not a weight shape")
    if weight_packed.dtype != torch.int32 or tuple(weight_packed.shape) != (n, _words(k)):
        raise InputRefused(
            f"weight_packed is {_name(weight_packed.dtype)} {list(weight_packed.shape)}; weight_shape {[n, k]} needs int32 [{n}, {_words(k)}]"
        )
    if weight_scale.dtype not in SCALE_DTYPES:
        raise InputRefused(f"weight_scale is {_name(weight_scale.dtype)}; w4 reads float16 and bfloat16 scales")
    if args.strategy == "channel":
        g = k
    else:
        g = args.group_size
        if k % g:
            raise InputRefused(f"in_features {k} is not a multiple of group_size {g}")
    groups = k // g
    if tuple(weight_scale.shape) != (n, groups):
        grouping = "strategy channel" if args.strategy == "channel" else f"group_size {g}"
        raise InputRefused(f"weight_scale has shape {list(weight_scale.shape)}; {grouping} with weight_shape {[n, k]} needs [{n}, {groups}]")
    if args.symmetric and weight_zero_point is not None:
        raise InputRefused("weight_zero_point is present but its config group is symmetric")
    if not args.symmetric:
        if weight_zero_point is None:
            raise InputRefused("has no weight_zero_point but its config group is asymmetric")
        if weight_zero_point.dtype != torch.int32 or tuple(weight_zero_point.shape) != (_words(n), groups):
            raise InputRefused(
                f"weight_zero_point is {_name(weight_zero_point.dtype)} {list(weight_zero_point.shape)}; expected int32 [{_words(n)}, {groups}]"
            )
    if weight_g_idx is not None and (weight_g_idx.dtype != torch.int32 or tuple(weight_g_idx.shape) != (k,)):
        raise InputRefused(f"weight_g_idx is {_name(weight_g_idx.dtype)} {list(weight_g_idx.shape)}; expected int32 [{k}]")
    return k, n, g


# weight_packed [N, ceil(K/8)] int32 -> codes [N, K] uint8
def unpack_weight(weight_packed: torch.Tensor, k: int) -> torch.Tensor:
    codes = nibbles(weight_packed).view(weight_packed.shape[0], -1)
    return codes if codes.shape[1] == k else codes[:, :k].contiguous()


# weight_zero_point [ceil(N/8), K/G] int32 -> zeros [N, K/G] uint8
def unpack_zero_point(weight_zero_point: torch.Tensor, n: int) -> torch.Tensor:
    words, groups = weight_zero_point.shape
    return nibbles(weight_zero_point).permute(0, 2, 1).reshape(words * PACK, groups)[:n]


def packed_linear(
    weight_packed: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_zero_point: torch.Tensor | None,
    weight_g_idx: torch.Tensor | None,
    weight_shape: tuple[int, int],
    args: WeightArgs,
) -> PackedLinear:
    """One pack-quantized linear with its weights still packed, zeros and scales as [N, K/G]. A
    weight_g_idx that is the plain grouping k // G is dropped (contiguous groups)."""
    k, n, g = validate(weight_packed, weight_scale, weight_zero_point, weight_g_idx, weight_shape, args)
    if weight_zero_point is None:
        zeros = torch.full((n, k // g), SYMMETRIC_ZERO, dtype=torch.uint8, device=weight_packed.device)
    else:
        zeros = unpack_zero_point(weight_zero_point, n).contiguous()
    g_idx = None if weight_g_idx is None or identity_groups(weight_g_idx, g) else weight_g_idx.to(torch.int64)
    return PackedLinear(weight_packed, K_IN_ROWS, (n, k), zeros, weight_scale.contiguous(), g_idx)

