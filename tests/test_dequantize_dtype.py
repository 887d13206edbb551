"""`--dtype`: the short names fp16 / bf16 / fp32 are the same as float16 / bfloat16 / float32, and
auto is the checkpoint's own dtype (its scales' when every layer agrees, else config.json's),
named in the summary."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.awq_builder import Checkpoint, random_layer, small_model


def dequantize(w4, src, out, *args):
    result = w4("dequantize", src, out, "--device", "cpu", "--json", "-", *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout), load_file(out / "model.safetensors")


@pytest.mark.parametrize("alias, name", [("fp16", "float16"), ("bf16", "bfloat16"), ("fp32", "float32")])
def test_short_names_are_the_same_as_the_long_ones(tmp_path, w4, alias, name):
    src = small_model().write(tmp_path / "src")
    short, short_tensors = dequantize(w4, src, tmp_path / "short", "--dtype", alias)
    long, long_tensors = dequantize(w4, src, tmp_path / "long", "--dtype", name)
    assert short["dtype"] == long["dtype"] == name
    assert json.loads((tmp_path / "short" / "config.json").read_text())["torch_dtype"] == name
    assert short_tensors.keys() == long_tensors.keys()
    for key, value in long_tensors.items():
        assert value.dtype == getattr(torch, name) or not value.is_floating_point()
        assert torch.equal(short_tensors[key].view(torch.uint8), value.view(torch.uint8)), key


def test_help_lists_the_short_names_and_auto(w4, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # the choices on one line
    text = w4("dequantize", "--help").stdout
    assert "float16|bfloat16|float32|fp16|bf16|fp32|auto" in text


def test_auto_takes_the_scales_dtype_when_every_layer_agrees(tmp_path, w4):
    layers = [random_layer("m.layers.0.mlp.up_proj", 64, 32, 32, seed=1, scale_dtype=torch.bfloat16),
              random_layer("m.layers.0.mlp.down_proj", 32, 64, 32, seed=2, scale_dtype=torch.bfloat16)]
    src = Checkpoint(layers, {"m.norm.weight": torch.ones(64).half()}).write(tmp_path / "src")  # config says float16
    summary, tensors = dequantize(w4, src, tmp_path / "out", "--dtype", "auto")
    assert summary["dtype"] == "bfloat16" and "scales" in summary["dtype_from"]
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}


def test_auto_falls_back_to_config_when_the_scales_disagree(tmp_path, w4):
    layers = [random_layer("m.layers.0.mlp.up_proj", 64, 32, 32, seed=1, scale_dtype=torch.bfloat16),
              random_layer("m.layers.0.mlp.down_proj", 32, 64, 32, seed=2, scale_dtype=torch.float16)]
    src = Checkpoint(layers, config={"torch_dtype": "float32"}).write(tmp_path / "src")
    summary, tensors = dequantize(w4, src, tmp_path / "out", "--dtype", "auto")
    assert summary["dtype"] == "float32" and "config.json torch_dtype" in summary["dtype_from"]
    assert {t.dtype for t in tensors.values()} == {torch.float32}


def test_the_default_stays_float16(tmp_path, w4):
    layers = [random_layer("m.layers.0.mlp.up_proj", 64, 32, 32, seed=1, scale_dtype=torch.bfloat16)]
    src = Checkpoint(layers).write(tmp_path / "src")
    summary, tensors = dequantize(w4, src, tmp_path / "out")
    assert summary["dtype"] == "float16" and summary["dtype_from"] == "--dtype"
