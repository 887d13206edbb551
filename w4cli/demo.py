"""The demo: a tiny AWQ checkpoint built deterministically, served from a local Hub cache.

`make demo` runs `python -m w4cli.demo DIR`, which writes DIR/hub (an offline Hub cache holding
w4-demo/tiny-llama-awq), then dequantizes it through the real huggingface_hub code path.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import torch

from w4cli.formats import awq_gemm

DEMO_REPO = "w4-demo/tiny-llama-awq"
GROUP_SIZE = 32

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 192,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float16",
}


def awq_quantize(weight: torch.Tensor, group_size: int) -> dict[str, torch.Tensor]:
    """AutoAWQ's zero-point quantization of an nn.Linear weight [N, K] into the gemm layout."""
    n, k = weight.shape
    w = weight.float().t().reshape(k // group_size, group_size, n)  # [groups, G, N]
    w_max, w_min = w.amax(dim=1), w.amin(dim=1)
    scales = ((w_max - w_min).clamp(min=1e-5) / 15).half()
    zeros = (-torch.round(w_min / scales.float())).clamp(0, 15)
    codes = (torch.round(w / scales.float().unsqueeze(1)) + zeros.unsqueeze(1)).clamp(0, 15)
    return {
        "qweight": awq_gemm.pack(codes.reshape(k, n).to(torch.int32)),
        "qzeros": awq_gemm.pack(zeros.to(torch.int32)),
        "scales": scales,
    }


def tiny_llama_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    c = TINY_LLAMA
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = c["num_key_value_heads"] * c["head_dim"]

    def randn(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.05).half()

    tensors = {"model.embed_tokens.weight": randn(v, h)}
    shapes = {
        "self_attn.q_proj": (h, h),
        "self_attn.k_proj": (kv, h),
        "self_attn.v_proj": (kv, h),
        "self_attn.o_proj": (h, h),
        "mlp.gate_proj": (i, h),
        "mlp.up_proj": (i, h),
        "mlp.down_proj": (h, i),
    }
    for layer in range(c["num_hidden_layers"]):
        base = f"model.layers.{layer}"
        tensors[f"{base}.input_layernorm.weight"] = (1 + randn(h)).half()
        tensors[f"{base}.post_attention_layernorm.weight"] = (1 + randn(h)).half()
        for name, shape in shapes.items():
            for part, value in awq_quantize(randn(*shape), GROUP_SIZE).items():
                tensors[f"{base}.{name}.{part}"] = value
    tensors["model.norm.weight"] = (1 + randn(h)).half()
    tensors["lm_head.weight"] = randn(v, h)
    return tensors


def write_tiny_checkpoint(directory: Path, seed: int = 0) -> None:
    from huggingface_hub import save_torch_state_dict

    directory.mkdir(parents=True, exist_ok=True)
    config = dict(TINY_LLAMA)
    config["quantization_config"] = {
        "quant_method": "awq",
        "zero_point": True,
        "group_size": GROUP_SIZE,
        "bits": 4,
        "version": "gemm",
        "modules_to_not_convert": None,
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (directory / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}) + "\n")
    (directory / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 256, "chat_template": "{{ messages }}"}) + "\n")
    # small shards so the demo exercises the index and a layer split across files
    save_torch_state_dict(tiny_llama_tensors(seed), directory, max_shard_size="40KB", metadata={"format": "pt"})


def install_in_hub_cache(cache: Path, repo_id: str, files: Path) -> str:
    """Lay `files` out as huggingface_hub's cache does (blobs/, snapshots/<commit>/, refs/main) and
    return the commit. The commit is a hash of the contents, so the same files give the same id."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    digest = hashlib.sha1()
    entries = []
    for path in sorted(files.iterdir()):
        blob = hashlib.sha256(path.read_bytes()).hexdigest()
        digest.update(path.name.encode() + blob.encode())
        entries.append((path, blob))
    commit = digest.hexdigest()
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for path, blob in entries:
        shutil.copyfile(path, repo / "blobs" / blob)
        link = snapshot / path.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(Path("..", "..", "blobs", blob))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return commit


def build(root: Path) -> Path:
    """Build the demo checkpoint into root/hub; returns the cache directory."""
    source = root / "source"
    if source.exists():
        shutil.rmtree(source)
    write_tiny_checkpoint(source)
    cache = root / "hub"
    install_in_hub_cache(cache, DEMO_REPO, source)
    return cache


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "demo")
    cache = build(root)
    print(f"built {DEMO_REPO} into the Hub cache {cache}", file=sys.stderr)
