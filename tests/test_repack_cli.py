"""`w4 repack`: lossless (dequantizing the repacked checkpoint gives the same bits as dequantizing
the original), self-describing, and refusing what it cannot or need not do."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from tests.awq_builder import Checkpoint, install_hub_cache, random_layer, small_model
from tests.test_dequantize_cli import load_output
from w4cli.errors import EXIT_REFUSED
from w4cli.gpu.checks import raw_bits as bits  # raw bits: +0.0 != -0.0, NaN payloads compare



def test_repack_then_dequantize_is_bit_identical(tmp_path, w4):
    ckpt = small_model(seed=3, bias=True)
    src = ckpt.write(tmp_path / "src", extra_files={"tokenizer.json": "{}"})
    result = w4("repack", src, tmp_path / "w4", "--json", "-")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["layers_repacked"] == 2
    config = json.loads((tmp_path / "w4" / "config.json").read_text())
    qc = config["quantization_config"]
    assert qc["quant_method"] == "w4" and qc["format"] == "w4-gemv" and qc["format_version"] == 1
    assert qc["source_quantization_config"]["quant_method"] == "awq"
    assert (tmp_path / "w4" / "tokenizer.json").read_text() == "{}"
    repacked = load_file(tmp_path / "w4" / "model.safetensors")
    assert "model.layers.0.mlp.up_proj.meta" in repacked
    assert torch.equal(repacked["model.layers.0.mlp.up_proj.bias"], ckpt.layers[0].bias)

    for dtype in ("float16", "bfloat16"):
        assert w4("dequantize", src, tmp_path / f"a-{dtype}", "--dtype", dtype, "--device", "cpu").exit_code == 0
        assert w4("dequantize", tmp_path / "w4", tmp_path / f"b-{dtype}", "--dtype", dtype, "--device", "cpu").exit_code == 0
        a, b = load_output(tmp_path / f"a-{dtype}"), load_output(tmp_path / f"b-{dtype}")
        assert a.keys() == b.keys()
        for name in a:
            assert torch.equal(bits(a[name]), bits(b[name])), name


def test_repack_keeps_activation_scales_and_dequantize_folds_them(tmp_path, w4):
    up = random_layer("gpt_neox.layers.0.mlp.dense_h_to_4h", 64, 128, 32, seed=1)
    down = random_layer("gpt_neox.layers.0.mlp.dense_4h_to_h", 128, 64, 32, seed=2)
    act = (torch.rand(128, generator=torch.Generator().manual_seed(3)) + 0.5).half()
    src = Checkpoint([up, down], {"gpt_neox.layers.0.mlp.act.scales": act}).write(tmp_path / "src")
    assert w4("repack", src, tmp_path / "w4").exit_code == 0
    assert "gpt_neox.layers.0.mlp.act.scales" in load_file(tmp_path / "w4" / "model.safetensors")
    assert w4("dequantize", src, tmp_path / "a", "--device", "cpu").exit_code == 0
    assert w4("dequantize", tmp_path / "w4", tmp_path / "b", "--device", "cpu").exit_code == 0
    a, b = load_output(tmp_path / "a"), load_output(tmp_path / "b")
    for name in a:
        assert torch.equal(bits(a[name]), bits(b[name])), name


def test_repack_through_the_hub_cache_sharded(tmp_path, w4):
    ckpt = small_model(seed=9)
    names = list(ckpt.all_tensors())
    src = ckpt.write(tmp_path / "src", shards={"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]})
    install_hub_cache(tmp_path / "hub", "org/tiny", src)
    result = w4("repack", "org/tiny", tmp_path / "w4", "--cache-dir", tmp_path / "hub", "--max-shard-size", "3KB")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "w4" / "model.safetensors.index.json").is_file()


def test_repacking_a_repacked_checkpoint_is_refused(tmp_path, w4):
    src = small_model().write(tmp_path / "src")
    assert w4("repack", src, tmp_path / "w4").exit_code == 0
    again = w4("repack", tmp_path / "w4", tmp_path / "w4b")
    assert again.exit_code == EXIT_REFUSED
    assert "already in w4's GEMV layout" in again.stderr
    assert not (tmp_path / "w4b").exists()


def test_a_flipped_meta_version_is_refused(tmp_path, w4):
    src = small_model().write(tmp_path / "src")
    assert w4("repack", src, tmp_path / "w4").exit_code == 0
    config = json.loads((tmp_path / "w4" / "config.json").read_text())
    config["quantization_config"]["format_version"] = 99
    (tmp_path / "w4" / "config.json").write_text(json.dumps(config))
    result = w4("dequantize", tmp_path / "w4", tmp_path / "out")
    assert result.exit_code == EXIT_REFUSED and "format version 99" in result.stderr


def test_a_layer_the_kernel_cannot_run_is_refused_before_writing(tmp_path, w4):
    # group size 16 is legal AWQ but not a shape the GEMV kernel takes
    layer = random_layer("model.layers.0.mlp.up_proj", 64, 16, 16, seed=1)
    src = Checkpoint([layer], group_size=16).write(tmp_path / "src")
    result = w4("repack", src, tmp_path / "w4")
    assert result.exit_code == EXIT_REFUSED
    assert "model.layers.0.mlp.up_proj" in result.stderr and "group size" in result.stderr
    assert not (tmp_path / "w4").exists()
