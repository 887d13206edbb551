"""Tiny Llama and Qwen2 checkpoints for the GGUF tests, as a quantizer would leave them: random
normal weights quantized per group of 32 the way AWQ does it (min-max of the group, zero point
rounded, so the codes crowd the middle of 0..15), stored as AWQ gemm or GPTQ (asymmetric, or
symmetric with zero point 8), with a byte-level BPE tokenizer trained here on a fixed text, its
pre-tokenizer the one the real model family uses.

Files are written by tests/awq_builder.py and tests/gptq_builder.py, independently of w4cli.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from tests.awq_builder import Checkpoint, Layer
from tests.gptq_builder import GptqLayer, gptq_config

GROUP = 128  # the common group size: each group is 4 GGUF blocks
LLAMA3_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's 42 degrees and we've been told 1234 times.",
    "Int4 checkpoints on the Hub are AWQ, GPTQ or compressed-tensors; llama.cpp runs GGUF files.",
    "A group of 32 weights shares one scale and one zero point, so the codes fit GGUF's blocks.",
    "Hello, world! Hello again, worlds: héllo wörld, naïve café, 日本語のテキスト, and some emoji 🦙.",
]
PROMPT = "The quick brown llama.cpp fox runs GGUF files, 2024 times: héllo!"

FAMILIES = {
    "llama": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "split": LLAMA3_SPLIT,
        "special": ["<|begin_of_text|>", "<|end_of_text|>"],
        "bias": False,
    },
    "llama2": {  # a SentencePiece tokenizer.model, as Llama 2 and Mistral 7B v0.1-v0.3 ship
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "sentencepiece": True,
        "special": ["<s>", "</s>"],
        "bias": False,
    },
    "mistral": {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "split": LLAMA3_SPLIT,
        "special": ["<s>", "</s>"],
        "bias": False,
    },
    "mixtral": {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "split": LLAMA3_SPLIT,
        "special": ["<s>", "</s>"],
        "bias": False,
        # routed experts: where they sit, their projections (gate, up, down), the router's name
        "moe": ("block_sparse_moe", ("w1", "w3", "w2"), "gate"),
        "config": {"num_local_experts": 4, "num_experts_per_tok": 2},
    },
    "qwen2": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "split": QWEN2_SPLIT,
        "special": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "bias": True,
    },
    "qwen3": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "split": QWEN2_SPLIT,
        "special": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "bias": False,
        "qk_norm": True,  # RMSNorm over each head's q and k
    },
    "qwen2moe": {
        "architectures": ["Qwen2MoeForCausalLM"],
        "model_type": "qwen2_moe",
        "split": QWEN2_SPLIT,
        "special": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "bias": True,
        "moe": ("mlp", ("gate_proj", "up_proj", "down_proj"), "gate"),
        "shared_expert": True,  # mlp.shared_expert.*_proj and its sigmoid gate mlp.shared_expert_gate
        "config": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128, "shared_expert_intermediate_size": 256,
                   "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": []},
    },
    "qwen3moe": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "split": QWEN2_SPLIT,
        "special": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "bias": False,
        "qk_norm": True,
        "moe": ("mlp", ("gate_proj", "up_proj", "down_proj"), "gate"),
        "config": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128, "norm_topk_prob": True,
                   "decoder_sparse_step": 1, "mlp_only_layers": []},
    },
}


def train_tokenizer(split: str, special: list[str], vocab_size: int = 400) -> str:
    """A byte-level BPE tokenizer.json: split by the family's regex, then bytes to GPT-2's
    printable alphabet, merges learned from CORPUS."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(split), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(CORPUS * 20, trainer)
    return tokenizer.to_str()


def _quantize(weight: torch.Tensor, sym: bool) -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
    """weight [N, K] -> codes [K, N], zeros [K/G, N], scales [K/G, N] fp16: AWQ's min-max rule
    (asymmetric) or a max-abs rule around 8 (symmetric)."""
    n, k = weight.shape
    w = weight.float().t().reshape(k // GROUP, GROUP, n)
    if sym:
        scales = (w.abs().amax(dim=1).clamp(min=1e-5) / 7.5).half()
        zeros = torch.full_like(scales, 8, dtype=torch.float32)
    else:
        hi, lo = w.amax(dim=1), w.amin(dim=1)
        scales = ((hi - lo).clamp(min=1e-5) / 15).half()
        zeros = (-torch.round(lo / scales.float())).clamp(0, 15)
    codes = (torch.round(w / scales.float().unsqueeze(1)) + zeros.unsqueeze(1)).clamp(0, 15)
    return codes.reshape(k, n).to(torch.uint8).numpy(), zeros.to(torch.uint8).numpy(), scales


def train_sentencepiece() -> bytes:
    """A SentencePiece BPE tokenizer.model as Llama 2's is made: <unk> <s> </s>, byte fallback (256
    <0xNN> pieces), a leading space added, no normalization."""
    import io

    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 20), model_writer=model, model_type="bpe", vocab_size=400, byte_fallback=True,
        character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, add_dummy_prefix=True,
        normalization_rule_name="identity", hard_vocab_limit=False, minloglevel=2,
    )
    return model.getvalue()


def prompt_ids(directory: Path) -> list[int]:
    """The checkpoint's own tokenization of PROMPT: transformers' for a tokenizer.json, the
    sentencepiece library's (with <s>, as Llama 2's tokenizer adds it) for a tokenizer.model."""
    if (directory / "tokenizer.model").exists():
        import sentencepiece

        return [1] + sentencepiece.SentencePieceProcessor(model_file=str(directory / "tokenizer.model")).encode(PROMPT)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)(PROMPT)["input_ids"]


def tokenizer_files(family: str) -> dict[str, str | bytes]:
    """tokenizer.json or tokenizer.model (trained), tokenizer_config.json with special tokens and a
    chat template, and a model card, for a checkpoint of `family`."""
    spec = FAMILIES[family]
    special = spec["special"]
    tokenizer_config = {
        "bos_token": special[0],
        "eos_token": special[1],
        "add_bos_token": family in ("llama", "llama2", "mistral"),
        "chat_template": "{% for m in messages %}" + special[-2] + "{{ m['role'] }}\n{{ m['content'] }}" + special[-1] + "{% endfor %}",
    }
    trained = {"tokenizer.model": train_sentencepiece()} if spec.get("sentencepiece") else {"tokenizer.json": train_tokenizer(spec["split"], special)}
    return {
        **trained,
        "tokenizer_config.json": json.dumps(tokenizer_config),
        "README.md": "---\nlicense: apache-2.0\ntags:\n- test\n---\n# tiny test model\n",
    }


def vocab_size(files: dict[str, str | bytes]) -> int:
    """The trained vocabulary and a few ids the tokenizer does not use (GGUF pads them)."""
    if "tokenizer.model" in files:
        import sentencepiece

        return sentencepiece.SentencePieceProcessor(model_proto=files["tokenizer.model"]).vocab_size() + 3
    return len(json.loads(files["tokenizer.json"])["model"]["vocab"]) + 3


def model_config(family: str, vocab: int, layers: int = 3, hidden: int = 128, inter: int = 256, heads: int = 4, kv_heads: int = 2) -> dict:
    spec = FAMILIES[family]
    return {
        "architectures": spec["architectures"],
        "model_type": spec["model_type"],
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "vocab_size": vocab,
        # the trained tokenizers' ids: <unk> <s> </s> first in a SentencePiece model
        "bos_token_id": 1 if spec.get("sentencepiece") else 0,
        "eos_token_id": 2 if spec.get("sentencepiece") else 1,
        "torch_dtype": "float16",
        **({"head_dim": hidden // heads, "attention_bias": False} if spec.get("qk_norm") else {}),
        **spec.get("config", {}),
    }


def build(directory: Path, family: str = "llama", fmt: str = "awq", sym: bool = False, seed: int = 0,
          layers: int = 3, extra_config: dict | None = None) -> Path:
    """A tiny `family` checkpoint quantized as `fmt` ("awq" or "gptq") into `directory`."""
    spec = FAMILIES[family]
    files = tokenizer_files(family)
    hidden, inter, heads, kv_heads = 128, 256, 4, 2
    head_dim = hidden // heads
    config = {**model_config(family, vocab_size(files), layers, hidden, inter, heads, kv_heads), **(extra_config or {})}
    g = torch.Generator().manual_seed(seed)

    def normal(*shape: int, std: float = 0.08) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * std).half()

    plain = {"model.embed_tokens.weight": normal(config["vocab_size"], hidden, std=0.5)}
    shapes = {
        "self_attn.q_proj": (heads * head_dim, hidden),
        "self_attn.k_proj": (kv_heads * head_dim, hidden),
        "self_attn.v_proj": (kv_heads * head_dim, hidden),
        "self_attn.o_proj": (hidden, heads * head_dim),
        "mlp.gate_proj": (inter, hidden),
        "mlp.up_proj": (inter, hidden),
        "mlp.down_proj": (hidden, inter),
    }
    quantized = []
    for i in range(layers):
        base = f"model.layers.{i}"
        plain[f"{base}.input_layernorm.weight"] = (1 + normal(hidden, std=0.1)).half()
        plain[f"{base}.post_attention_layernorm.weight"] = (1 + normal(hidden, std=0.1)).half()
        if spec.get("qk_norm"):
            plain[f"{base}.self_attn.q_norm.weight"] = (1 + normal(head_dim, std=0.1)).half()
            plain[f"{base}.self_attn.k_norm.weight"] = (1 + normal(head_dim, std=0.1)).half()
        layer_shapes = dict(shapes)
        if "moe" in spec:
            where, (gate, up, down), router = spec["moe"]
            ffn = config.get("moe_intermediate_size", inter)
            for name in ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
                del layer_shapes[name]
            experts = config.get("num_local_experts") or config["num_experts"]
            for e in range(experts):
                layer_shapes.update({f"{where}.experts.{e}.{gate}": (ffn, hidden), f"{where}.experts.{e}.{up}": (ffn, hidden),
                                     f"{where}.experts.{e}.{down}": (hidden, ffn)})
            plain[f"{base}.{where}.{router}.weight"] = normal(experts, hidden, std=0.5)
            if spec.get("shared_expert"):
                shared = config["shared_expert_intermediate_size"]
                layer_shapes.update({"mlp.shared_expert.gate_proj": (shared, hidden), "mlp.shared_expert.up_proj": (shared, hidden),
                                     "mlp.shared_expert.down_proj": (hidden, shared)})
                plain[f"{base}.mlp.shared_expert_gate.weight"] = normal(1, hidden, std=0.5)
        for name, (n, k) in layer_shapes.items():
            bias = normal(n, std=0.1) if spec["bias"] and name[-6:] in ("q_proj", "k_proj", "v_proj") else None
            codes, zeros, scales = _quantize(normal(n, k, std=1 / k**0.5), sym)
            if fmt == "awq":
                quantized.append(Layer(f"{base}.{name}", k, n, GROUP, codes, zeros, scales, bias))
            else:
                g_idx = (np.arange(k) // GROUP).astype(np.int32)
                quantized.append(GptqLayer(f"{base}.{name}", k, n, GROUP, codes, zeros, scales, g_idx, True, bias))
    plain["model.norm.weight"] = (1 + normal(hidden, std=0.1)).half()
    plain["lm_head.weight"] = normal(config["vocab_size"], hidden, std=0.5)
    checkpoint = Checkpoint(quantized, plain, group_size=GROUP)  # type: ignore[arg-type]
    checkpoint.config = dict(config)
    if fmt == "gptq":
        checkpoint.config["quantization_config"] = gptq_config(GROUP, sym=sym)
    return checkpoint.write(directory, extra_files=files)


def as_llama(checkpoint: Checkpoint, directory: Path, shards: dict[str, list[str]] | None = None) -> Path:
    """A builder checkpoint (tests/awq_builder.py, gptq_builder.py, ct_builder.py) with what a GGUF
    needs besides its tensors: a Llama config (its quantization config kept) and a tokenizer. Its
    shapes need not make a model llama.cpp can run: tensor-level tests read the file back."""
    files = tokenizer_files("llama")
    layers = 1 + max(int(n.split(".")[2]) for n in checkpoint.all_tensors() if n.startswith("model.layers."))
    checkpoint.config = {**model_config("llama", vocab_size(files), layers=layers, hidden=64, inter=96), **checkpoint.config}
    return checkpoint.write(directory, shards=shards, extra_files=files)
