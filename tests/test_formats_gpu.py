"""GPTQ and compressed-tensors on the GPU: `w4 dequantize --device cuda` (layers converted to the
AWQ layout the kernel takes; act-order layers on the CPU reference) gives the same bits as the CPU
reference, and `w4 verify MODEL` runs their layers through both kernels.

Run: pytest -m gpu tests/test_formats_gpu.py   (builds the kernels on first use)
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.ct_builder import small_ct_model
from tests.gptq_builder import gptq_checkpoint, random_gptq_layer
from tests.test_dequantize_cli import load_output
from w4cli.gpu.checks import raw_bits as bits

pytestmark = pytest.mark.gpu  # skipped without a CUDA GPU (conftest.py)


def _gptq(tmp_path):
    layers = [
        random_gptq_layer("model.layers.0.self_attn.q_proj", 256, 64, 32, seed=1),
        random_gptq_layer("model.layers.0.mlp.down_proj", 128, 64, 32, seed=2, desc_act=True),
    ]
    return gptq_checkpoint(layers, group_size=32, desc_act=True).write(tmp_path / "gptq")


def _ct(tmp_path, scale_dtype):
    return small_ct_model(seed=3, symmetric=False, scale_dtype=scale_dtype).write(tmp_path / f"ct-{scale_dtype}")


@pytest.mark.parametrize("which", ["gptq", "ct-bf16", "ct-fp16"])
def test_cuda_dequantize_matches_the_cpu_reference(kernels, tmp_path, w4, which):
    src = {"gptq": lambda: _gptq(tmp_path), "ct-bf16": lambda: _ct(tmp_path, torch.bfloat16), "ct-fp16": lambda: _ct(tmp_path, torch.float16)}[which]()
    for device in ("cpu", "cuda"):
        result = w4("dequantize", src, tmp_path / device, "--device", device, "--json", "-")
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["device"] == device
    a, b = load_output(tmp_path / "cpu"), load_output(tmp_path / "cuda")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(bits(a[name]), bits(b[name])), name


def test_verify_runs_gptq_and_ct_layers_on_the_gpu(kernels, tmp_path, w4):
    for src in (_gptq(tmp_path), _ct(tmp_path, torch.float16)):
        result = w4("verify", src, "--require-gpu", "--json", tmp_path / "r.json")
        assert result.exit_code == 0, result.stdout + result.stderr
        rows = {c["name"]: c for c in json.loads((tmp_path / "r.json").read_text())["checks"]}
        assert rows["gpu dequantize"]["status"] == rows["gpu gemv"]["status"] == "PASS"
