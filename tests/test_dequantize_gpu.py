"""On a GPU, `w4 dequantize --device cuda` writes files bit-identical to the CPU reference path."""

from __future__ import annotations

import json

import pytest
import torch

from tests.awq_builder import Checkpoint, random_layer, small_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def read_all(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_cuda_and_cpu_outputs_are_byte_identical(tmp_path, w4, dtype):
    ckpt = small_model(seed=21, bias=True)
    # a real layer shape, a one-group layer and activation scales folded on the GPU path too
    ckpt.layers.append(random_layer("model.layers.1.mlp.down_proj", 4096, 512, 128, seed=22))
    ckpt.layers.append(random_layer("gpt.h.0.mlp.dense_4h_to_h", 256, 64, 256, seed=23))
    ckpt.layers.append(random_layer("gpt.h.0.mlp.dense_h_to_4h", 64, 256, 32, seed=24))
    ckpt.plain["gpt.h.0.mlp.act.scales"] = (torch.rand(256) + 0.5).half()
    names = list(ckpt.all_tensors())
    src = ckpt.write(tmp_path / "src", shards={"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]})
    cpu = w4("dequantize", src, tmp_path / "cpu", "--device", "cpu", "--dtype", dtype, "--max-shard-size", "1MB", "--json")
    gpu = w4("dequantize", src, tmp_path / "gpu", "--device", "cuda", "--dtype", dtype, "--max-shard-size", "1MB", "--json")
    assert cpu.exit_code == 0, cpu.stderr
    assert gpu.exit_code == 0, gpu.stderr
    assert json.loads(gpu.stdout)["device"] == "cuda"
    assert read_all(tmp_path / "cpu") == read_all(tmp_path / "gpu")


def test_auto_uses_the_gpu(tmp_path, w4):
    src = Checkpoint([random_layer("m.layers.0.mlp.up_proj", 128, 64, 32, seed=3)]).write(tmp_path / "src")
    result = w4("dequantize", src, tmp_path / "out", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["device"] == "cuda"
