"""`w4 dequantize` end to end on checkpoints the tests build: local and through the Hub cache,
sharded inputs with a layer split across files, every dtype, act-scale folding, output layout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from tests.awq_builder import Checkpoint, autoawq_reference, install_hub_cache, random_layer, small_model
from w4cli.gpu.checks import raw_bits as bits  # raw bits: +0.0 != -0.0, NaN payloads compare



def load_output(directory: Path) -> dict[str, torch.Tensor]:
    index = directory / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(directory / file, framework="pt") as handle:
            metadata = handle.metadata()
            assert metadata["format"] == "pt"
            assert set(metadata) == {"format", "w4_source", "w4_source_revision", "w4_version", "w4_command"}
        out.update(load_file(directory / file))
    return out


def dequantized(w4, src, out, *args) -> tuple[dict, dict[str, torch.Tensor]]:
    """`w4 dequantize SRC OUT --device cpu --json - ARGS`: its JSON summary and the tensors written."""
    result = w4("dequantize", src, out, "--device", "cpu", "--json", "-", *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout), load_output(out)


def expected_fp16(ckpt: Checkpoint) -> dict[str, torch.Tensor]:
    out = {}
    for layer in ckpt.layers:
        t = layer.tensors()
        w = autoawq_reference(t[f"{layer.prefix}.qweight"], t[f"{layer.prefix}.qzeros"], t[f"{layer.prefix}.scales"], layer.group_size)
        out[f"{layer.prefix}.weight"] = w.t().contiguous()
    return out


def exact_weight(layer) -> torch.Tensor:
    """(q - z) * s in float64 from the integer codes, [N, K]."""
    g = layer.group_size
    diff = layer.codes.astype(np.float64) - np.repeat(layer.zeros, g, axis=0)
    return (torch.from_numpy(diff) * layer.scales.double().repeat_interleave(g, dim=0)).t()


def test_single_file_fp16_bit_identical_to_autoawq(tmp_path, w4):
    ckpt = small_model(bias=True)
    src = ckpt.write(tmp_path / "src", extra_files={"tokenizer.json": '{"t": 1}', "generation_config.json": "{}"})
    result = w4("dequantize", src, tmp_path / "out", "--device", "cpu")
    assert result.exit_code == 0, result.stderr
    out = load_output(tmp_path / "out")
    for name, value in expected_fp16(ckpt).items():
        assert torch.equal(bits(out[name]), bits(value)), name
    assert torch.equal(out["model.layers.0.mlp.up_proj.bias"], ckpt.layers[0].bias)
    assert torch.equal(out["lm_head.weight"], ckpt.plain["lm_head.weight"])
    assert not any(name.endswith(("qweight", "qzeros", "scales")) for name in out)
    assert sorted(os.listdir(tmp_path / "out")) == ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json"]
    assert (tmp_path / "out" / "tokenizer.json").read_text() == '{"t": 1}'
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["torch_dtype"] == "float16" and config["dtype"] == "float16"
    assert "layers dequantized" in result.stdout


@pytest.mark.parametrize("dtype,torch_dtype", [("bfloat16", torch.bfloat16), ("float32", torch.float32)])
def test_other_dtypes_are_the_exactly_rounded_product(tmp_path, w4, dtype, torch_dtype):
    ckpt = small_model()
    src = ckpt.write(tmp_path / "src")
    assert w4("dequantize", src, tmp_path / "out", "--dtype", dtype, "--device", "cpu").exit_code == 0
    out = load_output(tmp_path / "out")
    for layer in ckpt.layers:
        exact = exact_weight(layer).to(torch_dtype).contiguous()
        assert torch.equal(bits(out[f"{layer.prefix}.weight"]), bits(exact))
    assert out["model.norm.weight"].dtype == torch_dtype
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == dtype


def test_layer_split_across_input_shards_and_sharded_output(tmp_path, w4):
    ckpt = small_model(seed=4)
    up, down = "model.layers.0.mlp.up_proj", "model.layers.0.mlp.down_proj"
    shards = {
        "model-00001-of-00003.safetensors": [f"{up}.qweight", "model.embed_tokens.weight", f"{down}.scales"],
        "model-00002-of-00003.safetensors": [f"{up}.qzeros", f"{down}.qweight", "lm_head.weight"],
        "model-00003-of-00003.safetensors": [f"{up}.scales", f"{down}.qzeros", "model.norm.weight"],
    }
    src = ckpt.write(tmp_path / "src", shards=shards)
    result = w4("dequantize", src, tmp_path / "out", "--max-shard-size", "4KB", "--device", "cpu", "--json", "-")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["layers_dequantized"] == 2
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    out = load_output(tmp_path / "out")
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in out.values())
    for name, value in expected_fp16(ckpt).items():
        assert torch.equal(bits(out[name]), bits(value)), name


def test_through_the_offline_hub_cache(tmp_path, w4):
    ckpt = small_model(seed=5)
    src = ckpt.write(tmp_path / "src", extra_files={"tokenizer_config.json": "{}"})
    install_hub_cache(tmp_path / "hub", "org/tiny-awq", src)
    result = w4("dequantize", "org/tiny-awq", tmp_path / "out", "--cache-dir", tmp_path / "hub", "--device", "cpu")
    assert result.exit_code == 0, result.stderr
    out = load_output(tmp_path / "out")
    for name, value in expected_fp16(ckpt).items():
        assert torch.equal(bits(out[name]), bits(value))
    assert (tmp_path / "out" / "tokenizer_config.json").is_file()
    # no symlinks into the cache: the output stands on its own
    assert not any(p.is_symlink() for p in (tmp_path / "out").iterdir())


def test_revision_names_a_cached_commit(tmp_path, w4):
    src = small_model(seed=5).write(tmp_path / "src")
    commit = install_hub_cache(tmp_path / "hub", "org/tiny-awq", src)
    result = w4("dequantize", "org/tiny-awq", tmp_path / "out", "--revision", commit, "--cache-dir", tmp_path / "hub", "--device", "cpu")
    assert result.exit_code == 0, result.stderr
    missing = w4("dequantize", "org/tiny-awq", tmp_path / "out2", "--revision", "v9", "--cache-dir", tmp_path / "hub")
    assert missing.exit_code == 1 and "revision 'v9'" in missing.stderr
    assert not (tmp_path / "out2").exists()


def test_standard_cache_via_environment_in_a_real_process(tmp_path):
    """The installed `w4` command, HF_HUB_CACHE and HF_HUB_OFFLINE as a user would set them."""
    src = small_model(seed=6).write(tmp_path / "src")
    install_hub_cache(tmp_path / "hub", "org/tiny-awq", src)
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-m", "w4cli", "dequantize", "org/tiny-awq", str(tmp_path / "out"), "--device", "cpu", "--json", "-"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["layers_dequantized"] == 2
    missing = subprocess.run(
        [sys.executable, "-m", "w4cli", "dequantize", "org/not-cached", str(tmp_path / "out2")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 1
    assert "not in the local Hub cache" in missing.stderr
    assert "Traceback" not in missing.stderr
    assert not (tmp_path / "out2").exists()


def test_legacy_quant_config_json(tmp_path, w4):
    ckpt = small_model(seed=7)
    src = ckpt.write(tmp_path / "src")
    config = json.loads((src / "config.json").read_text())
    del config["quantization_config"]
    (src / "config.json").write_text(json.dumps(config))
    (src / "quant_config.json").write_text(json.dumps({"zero_point": True, "q_group_size": 32, "w_bit": 4, "version": "GEMM"}))
    assert w4("dequantize", src, tmp_path / "out", "--device", "cpu").exit_code == 0
    assert not (tmp_path / "out" / "quant_config.json").exists()
    out = load_output(tmp_path / "out")
    for name, value in expected_fp16(ckpt).items():
        assert torch.equal(bits(out[name]), bits(value))


def test_one_group_and_modules_to_not_convert(tmp_path, w4):
    layers = [random_layer("model.layers.0.self_attn.q_proj", 64, 16, 64, seed=8)]
    gate = torch.randn(4, 64).half()
    ckpt = Checkpoint(layers, {"model.layers.0.mlp.gate.weight": gate}, group_size=-1)
    ckpt.config = {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": -1, "version": "gemm", "zero_point": True, "modules_to_not_convert": ["gate"]}}
    src = ckpt.write(tmp_path / "src")
    assert w4("dequantize", src, tmp_path / "out", "--dtype", "bfloat16", "--device", "cpu").exit_code == 0
    out = load_output(tmp_path / "out")
    assert torch.equal(out["model.layers.0.mlp.gate.weight"], gate.to(torch.bfloat16))
    assert out["model.layers.0.self_attn.q_proj.weight"].shape == (16, 64)


def test_moe_experts(tmp_path, w4):
    layers = [
        random_layer(f"model.layers.0.block_sparse_moe.experts.{e}.{w}", 64, 32, 32, seed=10 * e + i)
        for e in range(3)
        for i, w in enumerate(["w1", "w2", "w3"])
    ]
    ckpt = Checkpoint(layers, {"model.layers.0.block_sparse_moe.gate.weight": torch.randn(3, 64).half()})
    src = ckpt.write(tmp_path / "src")
    assert w4("dequantize", src, tmp_path / "out", "--device", "cpu").exit_code == 0
    out = load_output(tmp_path / "out")
    for name, value in expected_fp16(ckpt).items():
        assert torch.equal(bits(out[name]), bits(value))


def test_activation_scales_are_folded_into_the_linear_they_feed(tmp_path, w4):
    up = random_layer("gpt_neox.layers.0.mlp.dense_h_to_4h", 32, 96, 32, seed=20)
    down = random_layer("gpt_neox.layers.0.mlp.dense_4h_to_h", 96, 32, 32, seed=21)
    act = (torch.rand(96, generator=torch.Generator().manual_seed(2)) + 0.5).half()
    ckpt = Checkpoint([up, down], {"gpt_neox.layers.0.mlp.act.scales": act})
    src = ckpt.write(tmp_path / "src")
    for dtype, torch_dtype in (("float16", torch.float16), ("float32", torch.float32)):
        out_dir = tmp_path / f"out-{dtype}"
        assert w4("dequantize", src, out_dir, "--dtype", dtype, "--device", "cpu").exit_code == 0
        out = load_output(out_dir)
        assert "gpt_neox.layers.0.mlp.act.scales" not in out
        folded = exact_weight(down) / act.double().view(1, -1)
        assert torch.equal(bits(out["gpt_neox.layers.0.mlp.dense_4h_to_h.weight"]), bits(folded.to(torch_dtype).contiguous()))
        # the linear that does not read the activation is untouched
        plain = exact_weight(up).to(torch_dtype).contiguous()
        assert torch.equal(bits(out["gpt_neox.layers.0.mlp.dense_h_to_4h.weight"]), bits(plain))


def test_force_replaces_a_previous_output(tmp_path, w4):
    src = small_model().write(tmp_path / "src")
    out = tmp_path / "out"
    assert w4("dequantize", src, out, "--max-shard-size", "2KB", "--device", "cpu").exit_code == 0
    assert list(out.glob("model-*.safetensors"))
    assert w4("dequantize", src, out, "--force", "--device", "cpu").exit_code == 0
    assert not list(out.glob("model-*.safetensors"))
    assert (out / "model.safetensors").is_file()
    assert not [p for p in tmp_path.iterdir() if ".w4tmp-" in p.name]


def test_cpu_fallback_is_announced_without_a_gpu(tmp_path, w4):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU: --device auto uses it")
    src = small_model().write(tmp_path / "src")
    result = w4("dequantize", src, tmp_path / "out")
    assert result.exit_code == 0
    assert "CPU reference" in result.stderr
    cuda = w4("dequantize", src, tmp_path / "out2", "--device", "cuda")
    assert cuda.exit_code == 3
    assert len(cuda.stderr.strip().splitlines()) == 1
