"""What llama.cpp expects of an architecture: its GGUF name, the hyperparameter keys it reads, its
tensor names (the gguf package's own map), and the transforms llama.cpp's converter applies to
that architecture's tensors. Only architectures listed here are converted; others are refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import gguf
import numpy as np
import torch

from w4cli.errors import InputRefused


@dataclass(frozen=True)
class Architecture:
    hf_name: str  # config.json architectures[0]
    arch: gguf.MODEL_ARCH
    # llama.cpp's Llama graph applies rotary embeddings to interleaved pairs (GPT-J style), while
    # Hugging Face's Llama rotates the two halves of each head: the converter reorders the rows
    # of q_proj and k_proj (and their biases) so the same pairs meet
    permute_qk: bool

    @property
    def name(self) -> str:
        return gguf.MODEL_ARCH_NAMES[self.arch]


ARCHITECTURES = {
    a.hf_name: a
    for a in (
        Architecture("LlamaForCausalLM", gguf.MODEL_ARCH.LLAMA, True),
        Architecture("MistralForCausalLM", gguf.MODEL_ARCH.LLAMA, True),
        Architecture("MixtralForCausalLM", gguf.MODEL_ARCH.LLAMA, True),
        Architecture("Qwen2ForCausalLM", gguf.MODEL_ARCH.QWEN2, False),
        Architecture("Qwen2MoeForCausalLM", gguf.MODEL_ARCH.QWEN2MOE, False),
        Architecture("Qwen3ForCausalLM", gguf.MODEL_ARCH.QWEN3, False),
        Architecture("Qwen3MoeForCausalLM", gguf.MODEL_ARCH.QWEN3MOE, False),
    )
}
# tensors Hugging Face checkpoints carry that llama.cpp computes itself
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def architecture(config: dict[str, Any]) -> Architecture:
    names = config.get("architectures")
    name = names[0] if isinstance(names, list) and names and isinstance(names[0], str) else None
    if name not in ARCHITECTURES:
        supported = ", ".join(sorted(ARCHITECTURES))
        raise InputRefused(
            f"config.json architectures {names!r} is not one w4 gguf converts ({supported}); "
            "convert with `w4 dequantize`, then with llama.cpp's convert_hf_to_gguf.py and llama-quantize"
        )
    return ARCHITECTURES[name]


def positive_int(config: dict[str, Any], key: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise InputRefused(f"config.json {key} is {value!r}; a positive integer is needed for GGUF")
    return value


def heads(config: dict[str, Any]) -> tuple[int, int]:
    n_head = positive_int(config, "num_attention_heads")
    return n_head, config.get("num_key_value_heads") or n_head


def head_dim(config: dict[str, Any]) -> int:
    return config.get("head_dim") or positive_int(config, "hidden_size") // positive_int(config, "num_attention_heads")


def expert_count(config: dict[str, Any]) -> int:
    """Routed experts per MoE layer (Mixtral: num_local_experts; Qwen MoE: num_experts); 0: dense."""
    for key in ("num_local_experts", "num_experts"):
        if config.get(key):
            return positive_int(config, key)
    return 0


def rope_parameters(config: dict[str, Any]) -> dict[str, Any]:
    """rope_scaling (rope_parameters in newer configs), with rope_theta where the config keeps it
    beside it."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    if "rope_type" not in params and "type" in params:
        params["rope_type"] = params["type"]
    return params


def write_hparams(writer: gguf.GGUFWriter, config: dict[str, Any], arch: Architecture) -> None:
    """The hyperparameter keys llama.cpp reads for `arch`, from config.json."""
    writer.add_block_count(positive_int(config, "num_hidden_layers"))
    writer.add_context_length(positive_int(config, "max_position_embeddings"))
    writer.add_embedding_length(positive_int(config, "hidden_size"))
    writer.add_feed_forward_length(positive_int(config, "intermediate_size"))
    n_head, n_head_kv = heads(config)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    rope = rope_parameters(config)
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
    writer.add_key_length(head_dim(config))  # what llama.cpp assumes without it, said outright
    writer.add_value_length(head_dim(config))
    _write_rope_scaling(writer, rope)
    experts = expert_count(config)
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(positive_int(config, "num_experts_per_tok"))
    if "moe_intermediate_size" in config:
        writer.add_expert_feed_forward_length(positive_int(config, "moe_intermediate_size"))
    if "shared_expert_intermediate_size" in config:
        writer.add_expert_shared_feed_forward_length(positive_int(config, "shared_expert_intermediate_size"))
    if arch.arch == gguf.MODEL_ARCH.LLAMA:
        writer.add_vocab_size(positive_int(config, "vocab_size"))
        writer.add_rope_dimension_count(head_dim(config))


def _write_rope_scaling(writer: gguf.GGUFWriter, rope: dict[str, Any]) -> None:
    kind = str(rope.get("rope_type", "default")).lower()
    factor = rope.get("factor")
    if kind in ("default", "llama3"):  # llama3: the rope_freqs tensor (extra_tensors)
        return
    if kind == "linear" and factor is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(factor))
        return
    if kind == "yarn" and factor is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(float(factor))
        writer.add_rope_scaling_orig_ctx_len(int(rope["original_max_position_embeddings"]))
        return
    raise InputRefused(f"config.json rope scaling {rope.get('rope_type')!r} is not one w4 gguf writes (linear, yarn, llama3)")


def extra_tensors(config: dict[str, Any]) -> dict[str, np.ndarray]:
    """Tensors llama.cpp needs that the checkpoint does not hold: Llama 3's rope frequency factors
    (rope_type llama3), float32, one per rotary pair: 1 for short wavelengths, the factor for long
    ones, and a smooth blend between (the rule transformers applies to its inverse frequencies)."""
    rope = rope_parameters(config)
    if str(rope.get("rope_type", "")).lower() != "llama3":
        return {}
    dim = head_dim(config)
    base = float(rope["rope_theta"])
    factor = float(rope.get("factor", 8.0))
    low, high = float(rope.get("low_freq_factor", 1.0)), float(rope.get("high_freq_factor", 4.0))
    context = float(rope.get("original_max_position_embeddings", 8192))
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factors = []
    for freq in freqs.tolist():
        wavelength = 2 * math.pi / freq
        if wavelength < context / high:
            factors.append(1.0)
        elif wavelength > context / low:
            factors.append(factor)
        else:
            smooth = (context / wavelength - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return {gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight": np.array(factors, dtype=np.float32)}


class TensorNames:
    """Hugging Face tensor name -> GGUF tensor name, by the gguf package's map for the architecture."""

    def __init__(self, arch: Architecture, config: dict[str, Any]):
        self.map = gguf.get_tensor_name_map(arch.arch, positive_int(config, "num_hidden_layers"))
        self.arch = arch
        self.heads = heads(config)

    def gguf_name(self, name: str) -> str | None:
        """None for a tensor llama.cpp does not take (rotary inverse frequencies); InputRefused for
        one it has no name for."""
        if name.endswith(IGNORED_SUFFIXES):
            return None
        mapped = self.map.get_name(name, try_suffixes=(".weight", ".bias"))
        if mapped is None:
            raise InputRefused(f"{name} has no GGUF tensor name for architecture {self.arch.name}; w4 refuses tensors llama.cpp would not load")
        return mapped

    def permuted_heads(self, name: str) -> int | None:
        """The head count whose rows llama.cpp's Llama converter reorders in this q_proj / k_proj
        weight or bias (permute_rows); None: its rows stay as they are."""
        if not self.arch.permute_qk:
            return None
        n_head, n_head_kv = self.heads
        for suffix, count in (("q_proj", n_head), ("k_proj", n_head_kv)):
            if name.rsplit(".", 1)[0].endswith(suffix):
                return count
        return None


def permute_rows(rows: torch.Tensor, n_head: int) -> torch.Tensor:
    """Reorder dim 0 (N) as llama.cpp's converter does for rotary layout: rows [h, 2, half] become
    [h, half, 2]. Rows move whole, so any per-row data (GGUF blocks, a bias) moves with them."""
    n = rows.shape[0]
    return rows.reshape(n_head, 2, n // n_head // 2, *rows.shape[1:]).transpose(1, 2).reshape(rows.shape)
