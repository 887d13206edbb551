"""`w4 verify` on a CUDA GPU: the self-test's GPU rows run and pass, every layer of a checkpoint
goes through both kernels, and a kernel that is off by one bit is caught.

Run: pytest -m gpu tests/test_verify_gpu.py   (builds the kernels on first use)
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.awq_builder import small_model
from w4cli.errors import EXIT_FAILED

pytestmark = pytest.mark.gpu  # skipped without a CUDA GPU (conftest.py)


def run(w4, tmp_path, *args, expect: int) -> dict[str, dict]:
    result = w4("verify", *args, "--json", tmp_path / "r.json")
    text = result.stdout + result.stderr
    assert "Traceback" not in text
    assert result.exit_code == expect, text
    return {c["name"]: c for c in json.loads((tmp_path / "r.json").read_text())["checks"]}


def test_selftest_quick_runs_every_gpu_check(kernels, tmp_path, w4):
    rows = run(w4, tmp_path, "--quick", "--require-gpu", expect=0)
    gpu = [c for c in rows.values() if c["name"].startswith("gpu ")]
    assert gpu and all(c["status"] == "PASS" for c in gpu), [c for c in gpu if c["status"] != "PASS"]
    for kind in ("gpu dequantize", "gpu repack", "gpu gemv exact", "gpu gemv random"):
        assert any(c["name"].startswith(kind + " ") for c in gpu), kind


def test_full_selftest_passes(kernels, tmp_path, w4):
    rows = run(w4, tmp_path, "--require-gpu", expect=0)
    assert all(c["status"] == "PASS" for c in rows.values())
    assert "gpu gemv random 4096x14336 g128" in rows


def test_integrity_runs_every_layer_on_the_gpu(kernels, tmp_path, w4):
    src = small_model(seed=2, bias=True).write(tmp_path / "src")
    rows = run(w4, tmp_path, src, "--require-gpu", expect=0)
    assert rows["gpu dequantize"]["status"] == "PASS" and "2 layers" in rows["gpu dequantize"]["detail"]
    assert rows["gpu gemv"]["status"] == "PASS" and "2 layers" in rows["gpu gemv"]["detail"]
    assert w4("repack", src, tmp_path / "w4").exit_code == 0
    rows = run(w4, tmp_path, tmp_path / "w4", "--require-gpu", expect=0)
    assert rows["gpu gemv"]["status"] == "PASS"


def test_a_dequantize_kernel_one_bit_off_is_caught(kernels, tmp_path, w4, monkeypatch):
    real = kernels.dequantize_awq

    def one_bit_off(*args, **kwargs):
        out = real(*args, **kwargs).clone()
        ints = out.view({2: torch.int16, 4: torch.int32}[out.element_size()]).view(-1)
        ints[ints.numel() - 1] ^= 1
        return out

    monkeypatch.setattr(kernels, "dequantize_awq", one_bit_off)
    rows = run(w4, tmp_path, "--quick", expect=EXIT_FAILED)
    failed = {name for name, c in rows.items() if c["status"] == "FAIL"}
    assert failed and all(name.startswith("gpu dequantize") for name in failed)


def test_a_gemv_kernel_one_ulp_off_is_caught(kernels, tmp_path, w4, monkeypatch):
    real = kernels.gemv

    def one_ulp_off(x, *args, **kwargs):
        out = real(x, *args, **kwargs).clone()
        out.view(torch.int16).view(-1)[0] += 1
        return out

    monkeypatch.setattr(kernels, "gemv", one_ulp_off)
    rows = run(w4, tmp_path, "--quick", expect=EXIT_FAILED)
    assert all(c["status"] == "FAIL" for name, c in rows.items() if name.startswith("gpu gemv exact"))
