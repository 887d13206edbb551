"""`w4 gemv` on a GPU: every layer checked and timed, the JSON has every number, exit 0."""

from __future__ import annotations

import json

import pytest

from tests.awq_builder import Checkpoint, random_layer

pytestmark = pytest.mark.gpu  # skipped without a CUDA GPU (conftest.py)


def test_random_shapes_checked_and_timed(w4):
    result = w4("gemv", "--shape", "4096x4096", "--shape", "1024x136", "--batch", "4", "--json", "-")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["device"] == "cuda" and doc["copy_gbps"] > 0
    for row in doc["layers"]:
        assert row["passed"] is True
        assert row["worst_err_over_bound"] <= 1.0
        assert row["median_us"] > 0 and row["gbps"] > 0


def test_checkpoint_layers_with_bias(tmp_path, w4):
    layers = [random_layer("m.layers.0.mlp.up_proj", 256, 72, 128, seed=1, bias=True), random_layer("m.layers.0.mlp.down_proj", 128, 64, 128, seed=2)]
    src = Checkpoint(layers, group_size=128).write(tmp_path / "src")
    assert w4("repack", src, tmp_path / "w4").exit_code == 0
    for model in (src, tmp_path / "w4"):
        result = w4("gemv", model, "--batch", "3", "--no-time", "--json", "-")
        assert result.exit_code == 0, result.stderr
        rows = json.loads(result.stdout)["layers"]
        assert [r["passed"] for r in rows] == [True, True]
