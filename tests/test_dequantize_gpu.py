"""On a GPU, `w4 dequantize --device cuda` writes files bit-identical to the CPU reference path."""

from __future__ import annotations

import json

import pytest
import torch

from tests.awq_builder import Checkpoint, random_layer

pytestmark = pytest.mark.gpu  # skipped without a CUDA GPU (conftest.py)


def read_all(directory):
    """Every file's bytes; a shard as (tensor entries, metadata, data bytes) with the metadata's
    command line left out: it names the device and the output directory, which differ here."""
    out = {}
    for path in sorted(directory.iterdir()):
        data = path.read_bytes()
        if path.suffix == ".safetensors":
            length = int.from_bytes(data[:8], "little")
            header = json.loads(data[8 : 8 + length])
            metadata = header.pop("__metadata__")
            assert metadata.pop("w4_command").startswith("w4 dequantize ")
            out[path.name] = (header, metadata, data[8 + length :])
        else:
            out[path.name] = data
    return out


def gpu_and_cpu(tmp_path, w4, src, dtype):
    args = ("--dtype", dtype, "--max-shard-size", "1MB", "--json", "-")
    cpu = w4("dequantize", src, tmp_path / f"cpu-{dtype}", "--device", "cpu", *args)
    gpu = w4("dequantize", src, tmp_path / f"gpu-{dtype}", "--device", "cuda", *args)
    assert cpu.exit_code == 0, cpu.stderr
    assert gpu.exit_code == 0, gpu.stderr
    assert json.loads(gpu.stdout)["device"] == "cuda"
    return read_all(tmp_path / f"cpu-{dtype}"), read_all(tmp_path / f"gpu-{dtype}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_cuda_and_cpu_outputs_are_byte_identical(tmp_path, w4, dtype):
    # a real layer shape, odd widths, a bias, and activation scales folded on the GPU path too
    layers = [
        random_layer("model.layers.0.mlp.up_proj", 128, 40, 128, seed=21, bias=True),
        random_layer("model.layers.1.mlp.down_proj", 4096, 512, 128, seed=22),
        random_layer("gpt.h.0.mlp.dense_h_to_4h", 128, 384, 128, seed=23),
        random_layer("gpt.h.0.mlp.dense_4h_to_h", 384, 136, 128, seed=24),
    ]
    plain = {"gpt.h.0.mlp.act.scales": (torch.rand(384) + 0.5).half(), "lm_head.weight": torch.randn(16, 128).half()}
    ckpt = Checkpoint(layers, plain, group_size=128)
    names = list(ckpt.all_tensors())
    src = ckpt.write(tmp_path / "src", shards={"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]})
    cpu, gpu = gpu_and_cpu(tmp_path, w4, src, dtype)
    assert cpu == gpu


def test_one_group_layers_too(tmp_path, w4):
    ckpt = Checkpoint([random_layer("m.layers.0.mlp.down_proj", 320, 72, 320, seed=5)], group_size=-1)
    cpu, gpu = gpu_and_cpu(tmp_path, w4, ckpt.write(tmp_path / "src"), "float16")
    assert cpu == gpu


def test_auto_uses_the_gpu(tmp_path, w4):
    src = Checkpoint([random_layer("m.layers.0.mlp.up_proj", 128, 64, 32, seed=3)]).write(tmp_path / "src")
    result = w4("dequantize", src, tmp_path / "out", "--json", "-")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["device"] == "cuda"
