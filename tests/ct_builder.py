"""Builds compressed-tensors pack-quantized checkpoints for the tests, written straight from the
documented layout (docs/formats.md, compressed-tensors) with numpy, independently of w4cli's reader:

    signed values v in -8..7 stored as v + 8
    weight_packed[n, j]     |= (q[n, 8j + i] + 8) << 4i     [N, ceil(K/8)], packed along K
    weight_zero_point[r, g] |= (z[8r + i, g] + 8) << 4i     [ceil(N/8), K/G], packed along N
    weight_scale [N, K/G]; weight_shape [2] int64 = (N, K)

Files are written with tests/awq_builder.py's Checkpoint (config, shards, index).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tests.awq_builder import Checkpoint
from tests.gptq_builder import pack_along_rows


def pack_k(values: np.ndarray) -> np.ndarray:
    """signed [N, K] -> [N, ceil(K/8)] int32, nibble i of word j = value at k = 8j + i, plus 8;
    padding nibbles 0."""
    n, k = values.shape
    stored = np.zeros((n, -(-k // 8) * 8), dtype=np.uint8)
    stored[:, :k] = values + 8
    return pack_along_rows(stored.T.copy()).T.copy()


def pack_n(values: np.ndarray) -> np.ndarray:
    """signed [N, G] -> [ceil(N/8), G] int32, nibble i of word r = value at n = 8r + i, plus 8."""
    n, groups = values.shape
    stored = np.zeros((-(-n // 8) * 8, groups), dtype=np.uint8)
    stored[:n] = values + 8
    return pack_along_rows(stored)


@dataclass
class CtLayer:
    prefix: str
    k: int
    n: int
    group_size: int  # G as used (K for strategy channel)
    values: np.ndarray  # [N, K] signed -8..7
    zero_points: np.ndarray | None  # [N, K/G] signed -8..7; None: symmetric
    scales: torch.Tensor  # [N, K/G]
    g_idx: np.ndarray | None = None  # [K], stored as weight_g_idx
    bias: torch.Tensor | None = None

    def groups_of_k(self) -> np.ndarray:
        return self.g_idx if self.g_idx is not None else np.arange(self.k) // self.group_size

    def tensors(self) -> dict[str, torch.Tensor]:
        p = self.prefix
        out = {
            f"{p}.weight_packed": torch.from_numpy(pack_k(self.values)),
            f"{p}.weight_scale": self.scales,
            f"{p}.weight_shape": torch.tensor([self.n, self.k], dtype=torch.int64),
        }
        if self.zero_points is not None:
            out[f"{p}.weight_zero_point"] = torch.from_numpy(pack_n(self.zero_points))
        if self.g_idx is not None:
            out[f"{p}.weight_g_idx"] = torch.from_numpy(self.g_idx.astype(np.int32))
        if self.bias is not None:
            out[f"{p}.bias"] = self.bias
        return out

    def exact(self) -> torch.Tensor:
        """(q - z) * s in float64 from the signed values, [N, K]."""
        groups = torch.from_numpy(self.groups_of_k().astype(np.int64))
        zero = np.zeros_like(self.values) if self.zero_points is None else self.zero_points[:, self.groups_of_k()]
        return torch.from_numpy(self.values.astype(np.float64) - zero) * self.scales.double()[:, groups]

    def library(self) -> torch.Tensor:
        """compressed-tensors' own dequantization, restated: (x_q - zp) * scale with the values and
        zero points cast to the scale's dtype, per group."""
        groups = torch.from_numpy(self.groups_of_k().astype(np.int64))
        x = torch.from_numpy(self.values.astype(np.int8)).to(self.scales.dtype)
        if self.zero_points is not None:
            x = x - torch.from_numpy(self.zero_points.astype(np.int8)).to(self.scales.dtype)[:, groups]
        return x * self.scales[:, groups]


def random_ct_layer(
    prefix: str,
    k: int,
    n: int,
    group_size: int | None,
    seed: int,
    symmetric: bool = True,
    scale_dtype: torch.dtype = torch.bfloat16,
    actorder: bool = False,
    bias: bool = False,
) -> CtLayer:
    """group_size None: strategy channel. With more than two groups, group 0 holds only values
    above its zero point and the last group only values below (one-sign groups); scales of both
    signs from 2^-23 to 4 (subnormal fp16 results)."""
    rng = np.random.default_rng(seed)
    g = k if group_size is None else group_size
    groups = k // g
    values = rng.integers(-8, 8, size=(n, k), dtype=np.int64)
    g_idx = None
    if actorder:
        perm = rng.permutation(k)
        g_idx = np.empty(k, dtype=np.int64)
        g_idx[perm] = np.arange(k) // g
    of_k = g_idx if g_idx is not None else np.arange(k) // g
    zero_points = None if symmetric else rng.integers(-8, 8, size=(n, groups), dtype=np.int64)
    if groups > 2:
        zp = np.zeros((n, groups), dtype=np.int64) if zero_points is None else zero_points
        zp[:, 0], zp[:, -1] = -8, 7
        values[:, of_k == 0] = rng.integers(-7, 8, size=(n, int((of_k == 0).sum())))
        values[:, of_k == groups - 1] = rng.integers(-8, 7, size=(n, int((of_k == groups - 1).sum())))
        if zero_points is None:
            values[:, of_k == 0] = np.abs(values[:, of_k == 0]) % 8
            values[:, of_k == groups - 1] = -(np.abs(values[:, of_k == groups - 1]) % 8)
    magnitude = torch.from_numpy(rng.uniform(-23, 2, size=(n, groups))).exp2()
    sign = torch.from_numpy(rng.choice([-1.0, 1.0], size=(n, groups)))
    scales = (magnitude * sign).to(scale_dtype)
    b = torch.from_numpy(rng.standard_normal(n)).to(scale_dtype) if bias else None
    return CtLayer(prefix, k, n, g, values, zero_points, scales, g_idx, b)


def weights_args(group_size: int | None, symmetric: bool = True, actorder: str | None = None) -> dict:
    return {
        "num_bits": 4,
        "type": "int",
        "symmetric": symmetric,
        "strategy": "channel" if group_size is None else "group",
        "group_size": group_size,
        "dynamic": False,
        "actorder": actorder,
        "observer": "minmax",
        "observer_kwargs": {},
        "block_structure": None,
    }


def ct_config(groups: dict[str, tuple[list[str], dict]], ignore: list[str] | None = None) -> dict:
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {
            name: {"targets": targets, "weights": weights, "input_activations": None, "output_activations": None}
            for name, (targets, weights) in groups.items()
        },
        "ignore": ignore if ignore is not None else ["lm_head"],
        "quantization_status": "compressed",
        "kv_cache_scheme": None,
        "global_compression_ratio": None,
        "sparsity_config": {},
    }


def ct_checkpoint(layers: list[CtLayer], plain: dict[str, torch.Tensor] | None = None, config: dict | None = None) -> Checkpoint:
    ckpt = Checkpoint(layers, plain or {})  # type: ignore[arg-type]
    ckpt.config = {"torch_dtype": "bfloat16", "quantization_config": config or ct_config({"group_0": (["Linear"], weights_args(32))})}
    return ckpt


def small_ct_model(seed: int = 0, group_size: int | None = 32, symmetric: bool = True, scale_dtype: torch.dtype = torch.bfloat16) -> Checkpoint:
    layers = [
        random_ct_layer("model.layers.0.mlp.up_proj", 96, 40, group_size, seed, symmetric, scale_dtype),
        random_ct_layer("model.layers.0.mlp.down_proj", 64, 24, group_size, seed + 1, symmetric, scale_dtype),
    ]
    gen = torch.Generator().manual_seed(seed)
    plain = {
        "model.embed_tokens.weight": torch.randn(16, 64, generator=gen).to(scale_dtype),
        "model.norm.weight": torch.randn(64, generator=gen).to(scale_dtype),
        "lm_head.weight": torch.randn(16, 64, generator=gen).to(scale_dtype),
    }
    return ct_checkpoint(layers, plain, ct_config({"group_0": (["Linear"], weights_args(group_size, symmetric))}))
