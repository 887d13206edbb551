"""Builds AWQ gemm checkpoints for the tests, written straight from the documented format
(docs/formats.md) and independently of w4cli's own packer, so a shared mistake cannot hide.

    qweight[k, c] |= q[k, 8c + ORDER[i]] << 4i     ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
    qzeros packed the same way along N; scales [K/G, N] fp16
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def pack_words(codes: np.ndarray) -> np.ndarray:
    """codes [R, C] in 0..15 -> [R, C/8] int32, one nibble at a time."""
    rows, cols = codes.shape
    words = np.zeros((rows, cols // 8), dtype=np.uint32)
    for col in range(cols // 8):
        for i in range(8):
            words[:, col] |= codes[:, 8 * col + ORDER[i]].astype(np.uint32) << np.uint32(4 * i)
    return words.view(np.int32)


def autoawq_reference(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """AutoAWQ's reference dequantization, restated from the format: shift out nibbles 0..7,
    gather them back into channel order, mask, repeat per group, (q - z) * s in the scales'
    dtype. Returns [K, N] like AutoAWQ (callers transpose for nn.Linear)."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    reverse = torch.tensor([0, 4, 1, 5, 2, 6, 3, 7])

    def unpack(packed: torch.Tensor) -> torch.Tensor:
        nibbles = (packed[:, :, None] >> shifts[None, None, :])  # [R, C/8, 8] nibble order
        nibbles = nibbles[:, :, reverse]  # channel order
        return nibbles.reshape(packed.shape[0], -1) & 0xF

    iweight = unpack(qweight)
    izeros = unpack(qzeros).repeat_interleave(group_size, dim=0)
    return (iweight - izeros) * scales.repeat_interleave(group_size, dim=0)


@dataclass
class Layer:
    """One quantized linear with its integer codes kept, so tests can check the math directly."""

    prefix: str
    k: int
    n: int
    group_size: int
    codes: np.ndarray  # [K, N]
    zeros: np.ndarray  # [K/G, N]
    scales: torch.Tensor  # [K/G, N] fp16
    bias: torch.Tensor | None = None

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {
            f"{self.prefix}.qweight": torch.from_numpy(pack_words(self.codes)),
            f"{self.prefix}.qzeros": torch.from_numpy(pack_words(self.zeros)),
            f"{self.prefix}.scales": self.scales,
        }
        if self.bias is not None:
            out[f"{self.prefix}.bias"] = self.bias
        return out


def random_layer(prefix: str, k: int, n: int, group_size: int, seed: int, bias: bool = False, scale_dtype=torch.float16) -> Layer:
    rng = np.random.default_rng(seed)
    groups = k // group_size
    codes = rng.integers(0, 16, size=(k, n), dtype=np.uint8)
    zeros = rng.integers(0, 16, size=(groups, n), dtype=np.uint8)
    # both signs and a wide range of magnitudes, never zero
    magnitude = torch.from_numpy(rng.uniform(-12, 2, size=(groups, n))).exp2()
    sign = torch.from_numpy(rng.choice([-1.0, 1.0], size=(groups, n)))
    scales = (magnitude * sign).to(scale_dtype)
    b = torch.from_numpy(rng.standard_normal(n)).half() if bias else None
    return Layer(prefix, k, n, group_size, codes, zeros, scales, b)


@dataclass
class Checkpoint:
    """An AWQ checkpoint on disk: tensors, their shard assignment and the config."""

    layers: list[Layer]
    plain: dict[str, torch.Tensor] = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    group_size: int = 32

    def all_tensors(self) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for layer in self.layers:
            out.update(layer.tensors())
        out.update(self.plain)
        return out

    def write(self, directory: Path, shards: dict[str, list[str]] | None = None, extra_files: dict[str, str | bytes] | None = None) -> Path:
        """shards: file name -> tensor names; default one model.safetensors. With several files
        an index is written."""
        directory.mkdir(parents=True, exist_ok=True)
        tensors = self.all_tensors()
        config = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "torch_dtype": "float16",
            "quantization_config": {
                "quant_method": "awq",
                "zero_point": True,
                "group_size": self.group_size,
                "bits": 4,
                "version": "gemm",
                "modules_to_not_convert": None,
            },
        }
        config.update(self.config)
        (directory / "config.json").write_text(json.dumps(config))
        if shards is None:
            save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
        else:
            weight_map = {}
            for file, names in shards.items():
                save_file({name: tensors[name] for name in names}, directory / file, metadata={"format": "pt"})
                weight_map.update({name: file for name in names})
            assert set(weight_map) == set(tensors), "every tensor must be assigned a shard"
            index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
            (directory / "model.safetensors.index.json").write_text(json.dumps(index))
        for name, content in (extra_files or {}).items():
            if isinstance(content, bytes):
                (directory / name).write_bytes(content)
            else:
                (directory / name).write_text(content)
        return directory


def small_model(seed: int = 0, group_size: int = 32, bias: bool = False) -> Checkpoint:
    """Two odd-shaped linears plus embeddings and a norm."""
    layers = [
        random_layer("model.layers.0.mlp.up_proj", 96, 40, group_size, seed, bias=bias),
        random_layer("model.layers.0.mlp.down_proj", 64, 24, group_size, seed + 1),
    ]
    g = torch.Generator().manual_seed(seed)
    plain = {
        "model.embed_tokens.weight": torch.randn(16, 64, generator=g).half(),
        "model.norm.weight": torch.randn(64, generator=g).half(),
        "lm_head.weight": torch.randn(16, 64, generator=g).half(),
    }
    return Checkpoint(layers, plain, group_size=group_size)


def install_hub_cache(cache: Path, repo_id: str, files: Path) -> str:
    from w4cli.demo import install_in_hub_cache

    return install_in_hub_cache(cache, repo_id, files)
