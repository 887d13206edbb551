"""Builds GPTQ checkpoints for the tests, written straight from the documented layout
(docs/formats.md, GPTQ) with numpy, one nibble at a time, independently of w4cli's reader:

    qweight[r, n] |= q[8r + i, n] << 4i            [K/8, N], packed along K
    qzeros[g, c]  |= z[g, 8c + i] << 4i            [K/G, N/8], packed along N
    v1 (checkpoint_format "gptq"): every qzeros word minus 0x11111111, modulo 2^32
    scales [K/G, N] fp16; g_idx [K] int32

Files are written with tests/awq_builder.py's Checkpoint (config, shards, index).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tests.awq_builder import Checkpoint

V1_OFFSET = np.uint32(0x11111111)


def pack_along_rows(codes: np.ndarray) -> np.ndarray:
    """codes [R, C] in 0..15 -> [R/8, C] int32: nibble i of word [r, c] is codes[8r + i, c]."""
    rows, cols = codes.shape
    words = np.zeros((rows // 8, cols), dtype=np.uint32)
    for r in range(rows // 8):
        for i in range(8):
            words[r] |= codes[8 * r + i].astype(np.uint32) << np.uint32(4 * i)
    return words.view(np.int32)


def pack_along_cols(codes: np.ndarray) -> np.ndarray:
    """codes [R, C] in 0..15 -> [R, C/8] int32: nibble i of word [r, c] is codes[r, 8c + i]."""
    return pack_along_rows(codes.T.copy()).T.copy()


@dataclass
class GptqLayer:
    """One GPTQ linear with its integer codes kept, so tests can check the math directly."""

    prefix: str
    k: int
    n: int
    group_size: int  # G as used (K for one group)
    codes: np.ndarray  # [K, N]
    zeros: np.ndarray  # [K/G, N], the true zero points
    scales: torch.Tensor  # [K/G, N]
    g_idx: np.ndarray  # [K] int32
    v1: bool = True
    bias: torch.Tensor | None = None
    with_g_idx: bool = True

    def qzeros(self) -> np.ndarray:
        words = pack_along_cols(self.zeros).view(np.uint32)
        if self.v1:
            words = words - V1_OFFSET  # whole words: a zero point of 0 borrows from the next nibble
        return words.view(np.int32)

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {
            f"{self.prefix}.qweight": torch.from_numpy(pack_along_rows(self.codes)),
            f"{self.prefix}.qzeros": torch.from_numpy(self.qzeros()),
            f"{self.prefix}.scales": self.scales,
        }
        if self.with_g_idx:
            out[f"{self.prefix}.g_idx"] = torch.from_numpy(self.g_idx.astype(np.int32))
        if self.bias is not None:
            out[f"{self.prefix}.bias"] = self.bias
        return out

    def exact(self) -> torch.Tensor:
        """(q - z) * s in float64 from the integer codes, [N, K]: every dtype is this, rounded once."""
        diff = self.codes.astype(np.float64) - self.zeros[self.g_idx]
        return (torch.from_numpy(diff) * self.scales.double()[torch.from_numpy(self.g_idx.astype(np.int64))]).t()


def random_gptq_layer(
    prefix: str,
    k: int,
    n: int,
    group_size: int,
    seed: int,
    sym: bool = False,
    desc_act: bool = False,
    v1: bool = True,
    scale_dtype: torch.dtype = torch.float16,
    bias: bool = False,
) -> GptqLayer:
    """Codes and zero points over 0..15 with the traps planted: in every qzeros word, zero points
    of 0 sit next to non-zero ones (the v1 borrow); with more than two groups, group 0 has zero
    point 0 and codes 1..15 (every weight of the group has the sign of its scale), the last group
    zero point 15 and codes 0..14 (the opposite sign); scales of both signs from 2^-23 (fp16 subnormals, so subnormal results)
    to 4."""
    rng = np.random.default_rng(seed)
    g = k if group_size == -1 else group_size
    groups = k // g
    codes = rng.integers(0, 16, size=(k, n), dtype=np.uint8)
    if sym:
        zeros = np.full((groups, n), 8, dtype=np.uint8)
    else:
        zeros = rng.integers(1, 16, size=(groups, n), dtype=np.uint8)
        zeros[:, 0::3] = 0
        if groups > 2:
            zeros[0] = 0
            zeros[-1] = 15
    if desc_act:
        perm = rng.permutation(k)
        g_idx = np.empty(k, dtype=np.int64)
        g_idx[perm] = np.arange(k) // g
    else:
        g_idx = np.arange(k) // g
    if not sym and groups > 2:
        codes[g_idx == 0] = rng.integers(1, 16, size=(int((g_idx == 0).sum()), n), dtype=np.uint8)
        last = g_idx == groups - 1
        codes[last] = rng.integers(0, 15, size=(int(last.sum()), n), dtype=np.uint8)
    magnitude = torch.from_numpy(rng.uniform(-23, 2, size=(groups, n))).exp2()
    sign = torch.from_numpy(rng.choice([-1.0, 1.0], size=(groups, n)))
    scales = (magnitude * sign).to(scale_dtype)
    b = torch.from_numpy(rng.standard_normal(n)).half() if bias else None
    return GptqLayer(prefix, k, n, g, codes, zeros, scales, g_idx.astype(np.int32), v1, b)


def gptq_config(group_size: int, sym: bool = False, desc_act: bool = False, checkpoint_format: str = "gptq") -> dict:
    return {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": group_size,
        "desc_act": desc_act,
        "sym": sym,
        "static_groups": False,
        "true_sequential": True,
        "damp_percent": 0.01,
        "checkpoint_format": checkpoint_format,
    }


def gptq_checkpoint(layers: list[GptqLayer], plain: dict[str, torch.Tensor] | None = None, **config) -> Checkpoint:
    ckpt = Checkpoint(layers, plain or {})  # type: ignore[arg-type]
    ckpt.config = {"quantization_config": gptq_config(**config)}
    return ckpt


def small_gptq_model(seed: int = 0, group_size: int = 32, sym: bool = False, desc_act: bool = False, v1: bool = True, bias: bool = False) -> Checkpoint:
    """Two odd-shaped linears plus embeddings and a norm."""
    layers = [
        random_gptq_layer("model.layers.0.mlp.up_proj", 96, 40, group_size, seed, sym, desc_act, v1, bias=bias),
        random_gptq_layer("model.layers.0.mlp.down_proj", 64, 24, group_size, seed + 1, sym, desc_act, v1),
    ]
    gen = torch.Generator().manual_seed(seed)
    plain = {
        "model.embed_tokens.weight": torch.randn(16, 64, generator=gen).half(),
        "model.norm.weight": torch.randn(64, generator=gen).half(),
        "lm_head.weight": torch.randn(16, 64, generator=gen).half(),
    }
    fmt = "gptq" if v1 else "gptq_v2"
    return gptq_checkpoint(layers, plain, group_size=group_size, sym=sym, desc_act=desc_act, checkpoint_format=fmt)


def gptqmodel_reference(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor, v1: bool) -> torch.Tensor:
    """GPTQ's torch dequantization, restated from the layout: v1 words back to v2 with a whole-word
    add (uint32, wrapping), shift out the nibbles, then scales[g_idx] * (q - z[g_idx]) in the scales'
    dtype. Returns [N, K] (nn.Linear)."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    words = qzeros.numpy().view(np.uint32)
    if v1:
        words = words + V1_OFFSET
    zwords = torch.from_numpy(words.view(np.int32).copy())
    zeros = ((zwords[:, :, None] >> shifts) & 0xF).reshape(zwords.shape[0], -1)  # [groups, N]
    weight = ((qweight[:, None, :] >> shifts[None, :, None]) & 0xF).reshape(-1, qweight.shape[1])  # [K, N]
    index = g_idx.long()
    return (scales[index] * (weight - zeros[index])).t().contiguous()
