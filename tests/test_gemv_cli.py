"""`w4 gemv` without a GPU: the reference-only mode, the exit codes, and the argument checks.
The kernel itself is checked on a GPU in tests/test_gemv_gpu.py, the command in tests/test_gemv_cli_gpu.py."""

from __future__ import annotations

import json

import pytest
import torch

from tests.awq_builder import Checkpoint, random_layer, small_model
from tests.ct_builder import small_ct_model
from tests.gptq_builder import small_gptq_model
from w4cli.errors import EXIT_ENVIRONMENT, EXIT_REFUSED, EXIT_USAGE
from w4cli.gpu.checks import gemv_bound, gemv_errors

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour; this machine has a CUDA GPU")


@no_gpu
def test_without_a_gpu_exit_3_in_one_line(w4):
    result = w4("gemv", "--shape", "256x64")
    assert result.exit_code == EXIT_ENVIRONMENT
    assert len(result.stderr.strip().splitlines()) == 1 and "--device cpu" in result.stderr


def test_reference_only_on_the_cpu_for_a_checkpoint(tmp_path, w4):
    src = small_model().write(tmp_path / "src")
    result = w4("gemv", src, "--device", "cpu", "--layer", "*.up_proj", "--json", "-")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["device"] == "cpu"
    assert [r["layer"] for r in doc["layers"]] == ["model.layers.0.mlp.up_proj"]
    assert doc["layers"][0]["passed"] is None  # nothing was checked, and it says so
    assert "reference alone" in result.stderr


def test_repacked_checkpoint_is_read_directly(tmp_path, w4):
    src = small_model().write(tmp_path / "src")
    assert w4("repack", src, tmp_path / "w4").exit_code == 0
    result = w4("gemv", tmp_path / "w4", "--device", "cpu", "--json", "-")
    assert result.exit_code == 0
    assert len(json.loads(result.stdout)["layers"]) == 2


def test_gptq_and_compressed_tensors_checkpoints_are_converted_in_memory(tmp_path, w4):
    models = {"gptq": small_gptq_model(seed=1), "ct": small_ct_model(seed=1, symmetric=False, scale_dtype=torch.float16)}
    for name, ckpt in models.items():
        result = w4("gemv", ckpt.write(tmp_path / name), "--device", "cpu", "--json", "-")
        assert result.exit_code == 0, result.stderr
        assert len(json.loads(result.stdout)["layers"]) == 2
    # bf16 scales: the kernel takes fp16 only, and the line says which layer and why
    result = w4("gemv", small_ct_model(seed=1).write(tmp_path / "bf16"), "--device", "cpu")
    assert result.exit_code == EXIT_REFUSED
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "down_proj" in errors[0] and "float16 scales" in errors[0]


@pytest.mark.parametrize(
    "args,fragment",
    [
        ((), "either MODEL or --shape"),
        (("--shape", "12by34"), "is not KxN"),
        (("--shape", "256x60"), "multiple of 8"),
        (("--shape", "200x64"), "multiple of the group size 128"),
    ],
)
def test_usage_errors(w4, args, fragment):
    result = w4("gemv", *args, "--device", "cpu")
    assert result.exit_code == EXIT_USAGE
    assert fragment in result.stderr


def test_no_matching_layer(tmp_path, w4):
    src = small_model().write(tmp_path / "src")
    result = w4("gemv", src, "--device", "cpu", "--layer", "nope.*")
    assert result.exit_code == EXIT_USAGE and "no quantized layer matches" in result.stderr


def test_layer_the_kernel_cannot_take_is_refused(tmp_path, w4):
    src = Checkpoint([random_layer("m.up", 64, 16, 16, seed=1)], group_size=16).write(tmp_path / "src")
    result = w4("gemv", src, "--device", "cpu")
    assert result.exit_code == EXIT_REFUSED and "m.up" in result.stderr


def test_the_tolerance_accepts_fp32_rounding_and_catches_a_wrong_weight():
    gen = torch.Generator().manual_seed(0)
    k, n = 4096, 64
    x = torch.randn(1, k, generator=gen).half()
    w = (torch.randn(n, k, generator=gen) * 0.02).half()
    ref = x.double() @ w.double().t()
    good = (x.float() @ w.float().t()).half()
    assert gemv_errors(good, x, w).passed
    wrong = w.clone()
    wrong[3, 100] += 0.5  # one weight off, as a flipped nibble with a large scale would be
    bad = (x.float() @ wrong.float().t()).half()
    assert not gemv_errors(bad, x, w).passed
    nan = good.clone()
    nan[0, 5] = float("nan")
    assert not gemv_errors(nan, x, w).passed
    assert (gemv_bound(x, w, ref) > 0).all()
