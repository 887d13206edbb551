"""The linear layers of a model, from its config.json alone, and `--shape KxN` parsing.

Pure functions (no torch, no GPU), so every architecture below is tested on a CPU.

K is in_features and N out_features (nn.Linear.weight is [N, K]; AWQ qweight is [K, N/8]).
Supported config families:
    llama-style   llama, mistral, qwen2, qwen3, gemma*, olmo*, ... : q, k, v, o, gate, up, down
    MoE           mixtral (num_local_experts, experts w1/w3/w2), qwen2_moe / qwen3_moe / olmoe
                  (num_experts, moe_intermediate_size, shared_expert_*, decoder_sparse_step,
                  mlp_only_layers)
    fused qkv     gpt_neox (query_key_value, dense, dense_h_to_4h, dense_4h_to_h), falcon
                  (multi_query / new_decoder_architecture), phi3 (qkv_proj, gate_up_proj)
An unknown model_type that has the standard keys gets the llama-style set, with a note saying so;
one without them, or with multi-head latent attention (deepseek_v2/v3), is refused (exit 4).

lm_head: AWQ leaves it unquantized, so it is listed as an fp16 layer (timed with cuBLAS only, and
counted as fp16 in both the fp16 and the w4 per-token totals). Tied embeddings change nothing here:
the matmul and its bytes are the same. MoE router gates (hidden x experts, a fraction of a percent of
the bytes, kept in fp16 by AWQ) are left out, and a note says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from w4cli.gpu.contract import GEMV_GROUP
from w4cli.errors import InputRefused, UsageError

LLAMA_STYLE = {
    "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "olmo", "olmo2",
    "internlm2", "yi", "starcoder2", "granite", "cohere", "cohere2", "stablelm", "exaone", "mistral3",
}
MOE_TYPES = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "granitemoe"}


@dataclass(frozen=True)
class Linear:
    """One kind of linear layer of a model: `per_layer` instances in each of `layers` decoder layers.

    active: instances one token runs per decoder layer (top-k for routed experts, else per_layer).
    kind: "dense", "expert" (routed), "shared_expert", "lm_head".
    """

    name: str
    k: int
    n: int
    layers: int
    per_layer: int = 1
    active: float = 1.0
    kind: str = "dense"
    quantized: bool = True

    @property
    def per_model(self) -> int:
        return self.per_layer * self.layers


@dataclass(frozen=True)
class Shape:
    """One distinct (K, N) to measure, with the layers that have it (empty for --shape)."""

    k: int
    n: int
    quantized: bool = True
    linears: tuple[Linear, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.k}x{self.n}"

    @property
    def names(self) -> str:
        return ", ".join(dict.fromkeys(lin.name for lin in self.linears))

    @property
    def per_model(self) -> int:
        return sum(lin.per_model for lin in self.linears)


@dataclass
class ModelShapes:
    """What `w4 bench MODEL` measures: the model's linears grouped by shape, plus notes."""

    model: str
    model_type: str
    num_hidden_layers: int
    linears: list[Linear]
    num_experts: int = 0
    experts_per_token: int = 0
    notes: list[str] = field(default_factory=list)

    def shapes(self) -> list[Shape]:
        return group_shapes(self.linears)

    def fused(self) -> "ModelShapes":
        """The same model with q/k/v and gate/up concatenated along N, as serving engines load them
        (vLLM, SGLang, TensorRT-LLM: qkv_proj, gate_up_proj; experts' w1/w3)."""
        linears = fuse_projections(self.linears)
        if len(linears) == len(self.linears):
            return self
        note = "q/k/v and gate/up are fused along N, as serving engines run them (--no-fuse: one layer each)"
        return ModelShapes(self.model, self.model_type, self.num_hidden_layers, linears, self.num_experts,
                           self.experts_per_token, [*self.notes, note])


# the projections that read the same input, fused into one along N: (members' names, fused name), by
# the part of the name after the module prefix ("experts.", "shared_expert." or none)
FUSIONS = (
    (("q_proj", "k_proj", "v_proj"), "qkv_proj"),
    (("gate_proj", "up_proj"), "gate_up_proj"),
    (("w1", "w3"), "w13"),
)


def fuse_projections(linears: list[Linear]) -> list[Linear]:
    """Each complete set of FUSIONS members under one prefix (same K, counts and kind) becomes one
    Linear with the members' N added, at the first member's place; everything else is unchanged."""
    out = list(linears)
    for members, fused_name in FUSIONS:
        by_prefix: dict[str, list[int]] = {}
        for i, lin in enumerate(out):
            prefix, _, base = lin.name.rpartition(".")
            if base in members:
                by_prefix.setdefault(prefix, []).append(i)
        for prefix, idx in by_prefix.items():
            group = [out[i] for i in idx]
            first = group[0]
            same = {(lin.k, lin.layers, lin.per_layer, lin.active, lin.kind, lin.quantized) for lin in group}
            if sorted(lin.name.rpartition(".")[2] for lin in group) != sorted(members) or len(same) != 1:
                continue
            name = f"{prefix}.{fused_name}" if prefix else fused_name
            out[idx[0]] = Linear(name, first.k, sum(lin.n for lin in group), first.layers, first.per_layer,
                                 first.active, first.kind, first.quantized)
            for i in idx[1:]:
                out[i] = None  # type: ignore[call-overload]
        out = [lin for lin in out if lin is not None]
    return out


def group_shapes(linears: list[Linear]) -> list[Shape]:
    """Distinct (K, N, quantized), in first-seen order, each with the linears that have it."""
    groups: dict[tuple[int, int, bool], list[Linear]] = {}
    for lin in linears:
        groups.setdefault((lin.k, lin.n, lin.quantized), []).append(lin)
    return [Shape(k, n, q, tuple(lins)) for (k, n, q), lins in groups.items()]


# ---- --shape KxN ----

_SHAPE_RE = re.compile(r"^\s*(\d+)\s*[xX*]\s*(\d+)\s*$")


def parse_shape(text: str) -> tuple[int, int]:
    """'4096x14336' -> (K=4096, N=14336). Raises UsageError (exit 2) on anything else."""
    m = _SHAPE_RE.match(text)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise UsageError(f"--shape '{text}' is not KxN with positive integers, e.g. 4096x14336 (K = in_features)")
    return int(m.group(1)), int(m.group(2))


MAX_BATCH = 4096  # activation rows M a GEMV benchmark or check takes; beyond it a GEMM is the tool


def parse_batches(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4] (sorted, distinct). Raises UsageError on anything else."""
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        values = []
    if not values or values[0] < 1 or values[-1] > MAX_BATCH:
        raise UsageError(f"--batch '{text}': expected a comma list of batch sizes from 1 to {MAX_BATCH}, e.g. 1,4,16")
    return values


def check_group(group: int) -> None:
    if group < GEMV_GROUP or group % GEMV_GROUP:
        raise UsageError(f"--group {group}: the w4 kernels take a group size that is a multiple of {GEMV_GROUP} (AWQ uses 128)")


# ---- shapes from config.json ----


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    # multimodal configs (llava, qwen2_vl/mistral3, gemma3, llama4) nest the language model
    inner = config.get("text_config")
    if isinstance(inner, dict) and "hidden_size" not in config:
        merged = dict(inner)
        merged.setdefault("model_type", config.get("model_type", ""))
        for key in ("tie_word_embeddings", "vocab_size"):
            if key not in merged and key in config:
                merged[key] = config[key]
        return merged
    return config


class _Reader:
    """Typed access to config keys with one-line refusals."""

    def __init__(self, config: dict[str, Any], model_type: str):
        self.c, self.mt = config, model_type

    def get(self, *keys: str, default: int | None = None) -> int | None:
        for key in keys:
            value = self.c.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InputRefused(f"config.json: {key} must be a non-negative integer, got {value!r}")
            return value
        return default

    def need(self, *keys: str) -> int:
        value = self.get(*keys)
        if value is None or value == 0:
            raise InputRefused(f"config.json ({self.mt or 'no model_type'}) has no {keys[0]}: w4 bench cannot derive its layer shapes")
        return value


def from_config(config: dict[str, Any], model: str = "") -> ModelShapes:
    """The model's linear layers from config.json. Raises InputRefused for what it cannot derive."""
    config = _text_config(config)
    model_type = str(config.get("model_type") or "")
    r = _Reader(config, model_type)
    notes: list[str] = []
    if config.get("kv_lora_rank") is not None or model_type.startswith("deepseek_v"):
        raise InputRefused(
            f"config.json: {model_type or 'this model'} uses multi-head latent attention; w4 bench does not derive "
            "its shapes yet: measure them with --shape KxN"
        )

    layers = r.need("num_hidden_layers", "n_layer", "num_layers")
    hidden = r.need("hidden_size", "n_embd", "d_model")
    if model_type == "gpt_neox":
        linears = _gpt_neox(r, hidden, layers)
    elif model_type in ("falcon", "RefinedWeb", "RefinedWebModel"):
        linears = _falcon(r, hidden, layers)
    elif model_type == "phi3":
        linears = _phi3(r, hidden, layers)
    else:
        if model_type not in LLAMA_STYLE and model_type not in MOE_TYPES:
            notes.append(
                f"model_type '{model_type or '?'}' is not one w4 bench knows: shapes assume the llama-style "
                "q/k/v/o/gate/up/down set derived from the standard config keys"
            )
        linears = _attention_llama(r, hidden, layers)
        linears += _mlp_llama_or_moe(r, hidden, layers, model_type, notes)

    num_experts = r.get("num_local_experts", "num_experts", default=0) or 0
    top_k = r.get("num_experts_per_tok", "top_k", default=0) or 0
    if num_experts:
        notes.append("MoE router gates (hidden x experts, kept in fp16 by AWQ, well under 1% of the bytes) are not counted")

    vocab = r.get("vocab_size")
    if vocab:
        tied = bool(config.get("tie_word_embeddings", False))
        name = "embed_out" if model_type == "gpt_neox" else "lm_head"
        linears.append(Linear(name, hidden, vocab, layers=1, kind="lm_head", quantized=False))
        notes.append(
            f"{name} ({hidden}x{vocab}) stays fp16 in AWQ checkpoints: it is timed with cuBLAS and counted as fp16 "
            "in both the fp16 and the w4 totals" + (" (tied to the input embeddings: same matmul, same bytes)" if tied else "")
        )
    else:
        notes.append("config.json has no vocab_size: lm_head is left out")

    qc = config.get("quantization_config")
    if isinstance(qc, dict) and qc.get("modules_to_not_convert"):
        notes.append(f"quantization_config.modules_to_not_convert = {qc['modules_to_not_convert']}: not applied to these shapes")
    return ModelShapes(model, model_type, layers, linears, num_experts, top_k, notes)


def _heads(r: _Reader, hidden: int) -> tuple[int, int, int]:
    heads = r.need("num_attention_heads", "n_head", "num_heads")
    kv = r.get("num_key_value_heads", "num_kv_heads", default=None) or heads
    head_dim = r.get("head_dim", default=None)
    if not head_dim:
        if hidden % heads:
            raise InputRefused(f"config.json: hidden_size {hidden} is not a multiple of num_attention_heads {heads} and head_dim is not given")
        head_dim = hidden // heads
    return heads, kv, head_dim


def _attention_llama(r: _Reader, hidden: int, layers: int) -> list[Linear]:
    heads, kv, hd = _heads(r, hidden)
    return [
        Linear("q_proj", hidden, heads * hd, layers),
        Linear("k_proj", hidden, kv * hd, layers),
        Linear("v_proj", hidden, kv * hd, layers),
        Linear("o_proj", heads * hd, hidden, layers),
    ]


def _mlp(names: tuple[str, str, str], hidden: int, inter: int, layers: int, per_layer: int = 1,
         active: float | None = None, kind: str = "dense") -> list[Linear]:
    act = float(per_layer if active is None else active)
    gate, up, down = names
    return [
        Linear(gate, hidden, inter, layers, per_layer, act, kind),
        Linear(up, hidden, inter, layers, per_layer, act, kind),
        Linear(down, inter, hidden, layers, per_layer, act, kind),
    ]


def _mlp_llama_or_moe(r: _Reader, hidden: int, layers: int, model_type: str, notes: list[str]) -> list[Linear]:
    experts = r.get("num_local_experts", "num_experts", default=0) or 0
    if not experts:
        return _mlp(("gate_proj", "up_proj", "down_proj"), hidden, r.need("intermediate_size"), layers)

    top_k = r.need("num_experts_per_tok", "top_k")
    expert_inter = r.get("moe_intermediate_size") or r.need("intermediate_size")
    # which decoder layers are sparse: qwen2_moe / qwen3_moe put a dense MLP in mlp_only_layers
    # and in layers where (i + 1) % decoder_sparse_step != 0; mixtral and olmoe are all sparse
    step = r.get("decoder_sparse_step", default=1) or 1
    dense_only = set(r.c.get("mlp_only_layers") or [])
    sparse = sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
    dense = layers - sparse
    names = ("w1", "w3", "w2") if model_type == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    out = _mlp(tuple(f"experts.{n}" for n in names), hidden, expert_inter, sparse, experts, top_k, "expert")  # type: ignore[arg-type]
    shared = r.get("shared_expert_intermediate_size", default=0) or 0
    if shared:
        out += _mlp(("shared_expert.gate_proj", "shared_expert.up_proj", "shared_expert.down_proj"),
                    hidden, shared, sparse, kind="shared_expert")
    if dense:
        out += _mlp(("gate_proj", "up_proj", "down_proj"), hidden, r.need("intermediate_size"), dense)
        notes.append(f"{dense} of {layers} decoder layers have a dense MLP (mlp_only_layers / decoder_sparse_step)")
    notes.append(
        f"MoE: {experts} experts, {top_k} per token; a decode step at batch M runs the expected number of distinct "
        f"experts under uniform routing, E(1-(1-k/E)^M), each on about M*k/distinct rows"
    )
    return out


def _gpt_neox(r: _Reader, hidden: int, layers: int) -> list[Linear]:
    inter = r.get("intermediate_size") or 4 * hidden
    return [
        Linear("query_key_value", hidden, 3 * hidden, layers),
        Linear("dense", hidden, hidden, layers),
        Linear("dense_h_to_4h", hidden, inter, layers),
        Linear("dense_4h_to_h", inter, hidden, layers),
    ]


def _falcon(r: _Reader, hidden: int, layers: int) -> list[Linear]:
    heads = r.need("num_attention_heads", "n_head")
    if hidden % heads:
        raise InputRefused(f"config.json: hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    hd = hidden // heads
    if r.c.get("new_decoder_architecture"):
        qkv = (heads + 2 * (r.get("num_kv_heads", default=None) or heads)) * hd
    elif r.c.get("multi_query", True):
        qkv = hidden + 2 * hd
    else:
        qkv = 3 * hidden
    ffn = r.get("ffn_hidden_size") or 4 * hidden
    return [
        Linear("query_key_value", hidden, qkv, layers),
        Linear("dense", hidden, hidden, layers),
        Linear("dense_h_to_4h", hidden, ffn, layers),
        Linear("dense_4h_to_h", ffn, hidden, layers),
    ]


def _phi3(r: _Reader, hidden: int, layers: int) -> list[Linear]:
    heads, kv, hd = _heads(r, hidden)
    inter = r.need("intermediate_size")
    return [
        Linear("qkv_proj", hidden, (heads + 2 * kv) * hd, layers),
        Linear("o_proj", heads * hd, hidden, layers),
        Linear("gate_up_proj", hidden, 2 * inter, layers),
        Linear("down_proj", inter, hidden, layers),
    ]
