"""One validation for every command that reads a quantized checkpoint: `dequantize`, `repack`,
`gemv` and `verify --against` refuse (exit 4) exactly what `verify MODEL` fails, with the same
words. Inputs: tensors the format does not define under a quantized linear, non-finite values in
unquantized tensors and biases, zero or non-finite scales, a quantized layer that
modules_to_not_convert says was left alone, and altered w4-gemv padding."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.awq_builder import Checkpoint, random_layer, small_model
from w4cli.errors import EXIT_FAILED, EXIT_REFUSED

UP = "model.layers.0.mlp.up_proj"
DOWN = "model.layers.0.mlp.down_proj"


@pytest.fixture(autouse=True)
def no_debug(monkeypatch):
    monkeypatch.delenv("W4_DEBUG", raising=False)


def add_tensors(src, **tensors) -> None:
    path = src / "model.safetensors"
    all_tensors = load_file(path)
    all_tensors.update(tensors)
    save_file(all_tensors, path, metadata={"format": "pt"})


def refusal(result) -> str:
    """The one `error:` line of a refused run, without its prefix."""
    text = result.stdout + result.stderr
    assert "Traceback" not in text, text
    assert result.exit_code == EXIT_REFUSED, f"exit {result.exit_code}\n{text}"
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and result.stderr.strip().endswith(errors[0]), result.stderr
    return errors[0].removeprefix("error: ")


def failed_row(w4, tmp_path, model, row: str) -> str:
    report = tmp_path / "verify.json"
    result = w4("verify", model, "--json", report)
    assert result.exit_code == EXIT_FAILED, result.stdout + result.stderr
    checks = {c["name"]: c for c in json.loads(report.read_text())["checks"]}
    assert checks[row]["status"] == "FAIL", checks[row]
    return checks[row]["detail"]


def every_reader_refuses(w4, tmp_path, src, row: str, *named: str) -> str:
    """Every command that reads `src` refuses it with the message `verify MODEL` puts in `row`."""
    detail = failed_row(w4, tmp_path, src, row)
    for fragment in named:
        assert fragment in detail, detail
    messages = {
        "dequantize": refusal(w4("dequantize", src, tmp_path / "dense", "--device", "cpu")),
        "repack": refusal(w4("repack", src, tmp_path / "w4")),
        "gemv": refusal(w4("gemv", src, "--device", "cpu")),
        "verify --against": refusal(w4("verify", tmp_path, "--against", src)),
    }
    assert messages == dict.fromkeys(messages, detail)
    assert not (tmp_path / "dense").exists() and not (tmp_path / "w4").exists()
    return detail


# ---- tensors the format does not define -----------------------------------------------------


@pytest.mark.parametrize(
    "name,value",
    [
        (f"{UP}.g_idx", torch.arange(96, dtype=torch.int32)),  # GPTQ act-order: AWQ has none
        (f"{UP}.weight_scale", torch.ones(40, dtype=torch.float16)),
        (f"{UP}.lora_A.weight", torch.zeros(4, 96, dtype=torch.float16)),  # deeper under the prefix
        (f"{UP}.meta", torch.tensor([1, 96, 40, 32], dtype=torch.int32)),  # w4-gemv's, not AWQ's
    ],
)
def test_unknown_tensor_under_a_quantized_linear_is_refused(tmp_path, w4, name, value):
    src = small_model().write(tmp_path / "src")
    add_tensors(src, **{name: value})
    detail = every_reader_refuses(w4, tmp_path, src, "tensors and shapes", name)
    assert f"{UP} may hold only bias, qweight, qzeros, scales" in detail


def test_unknown_tensor_under_a_repacked_linear_is_refused(tmp_path, w4):
    src = small_model().write(tmp_path / "src")
    assert w4("repack", src, tmp_path / "w4").exit_code == 0
    add_tensors(tmp_path / "w4", **{f"{UP}.g_idx": torch.arange(96, dtype=torch.int32)})
    detail = failed_row(w4, tmp_path, tmp_path / "w4", "tensors and shapes")
    assert f"{UP}.g_idx" in detail and "meta" in detail
    assert refusal(w4("dequantize", tmp_path / "w4", tmp_path / "dense", "--device", "cpu")) == detail


def test_plain_tensors_beside_a_quantized_linear_are_kept(tmp_path, w4):
    """Only what sits under a quantized prefix is refused: a sibling module's tensors, AutoAWQ's
    activation scales (`mlp.act.scales`) and a linear's bias are part of the model."""
    up = random_layer("m.layers.0.mlp.fc_in", 32, 96, 32, seed=3, bias=True)
    down = random_layer("m.layers.0.mlp.fc_out", 96, 32, 32, seed=4)
    plain = {
        "m.layers.0.mlp.act.scales": torch.full((96,), 0.5, dtype=torch.float16),
        "m.layers.0.mlp.fc_in_norm.weight": torch.ones(32, dtype=torch.float16),
        "m.layers.0.mlp.fc.weight": torch.ones(8, 32, dtype=torch.float16),  # a prefix of fc_in as text, not as a module
    }
    src = Checkpoint([up, down], plain).write(tmp_path / "src")
    assert w4("verify", src).exit_code == 0
    assert w4("dequantize", src, tmp_path / "dense", "--device", "cpu").exit_code == 0
    out = load_file(tmp_path / "dense" / "model.safetensors")
    assert {"m.layers.0.mlp.fc_in_norm.weight", "m.layers.0.mlp.fc.weight", "m.layers.0.mlp.fc_in.bias"} <= set(out)


# ---- values: one check for every command ----------------------------------------------------


def _nan_norm(ckpt: Checkpoint) -> None:
    ckpt.plain["model.norm.weight"][7] = float("nan")


def _inf_bias(ckpt: Checkpoint) -> None:
    ckpt.layers[0].bias[5] = float("-inf")


def _zero_scale(ckpt: Checkpoint) -> None:
    ckpt.layers[1].scales[1, 3] = 0.0


def _inf_scale(ckpt: Checkpoint) -> None:
    ckpt.layers[1].scales[0, 2] = float("inf")


@pytest.mark.parametrize(
    "plant,row,named",
    [
        (_nan_norm, "plain tensors", ["model.norm.weight", "nan", "[7]"]),
        (_inf_bias, "plain tensors", [f"{UP}.bias", "-inf", "[5]"]),
        (_zero_scale, "scales", [f"{DOWN}.scales", "0.0", "[1, 3]"]),
        (_inf_scale, "scales", [f"{DOWN}.scales", "inf", "[0, 2]"]),
    ],
)
def test_bad_values_are_refused_by_every_command(tmp_path, w4, plant, row, named):
    ckpt = small_model(seed=2, bias=True)
    plant(ckpt)
    src = ckpt.write(tmp_path / "src")
    every_reader_refuses(w4, tmp_path, src, row, *named)


def test_quantized_layer_named_in_modules_to_not_convert_is_refused(tmp_path, w4):
    ckpt = small_model(seed=3)
    ckpt.config = {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm",
                                           "zero_point": True, "modules_to_not_convert": ["mlp.up_proj"]}}
    src = ckpt.write(tmp_path / "src")
    every_reader_refuses(w4, tmp_path, src, "tensors and shapes", UP, "modules_to_not_convert")


def test_altered_w4_gemv_padding_is_refused_by_every_command(tmp_path, w4):
    """K = 96 pads to 128: a code in the padding changes no weight, but the file is not what
    `w4 repack` wrote."""
    src = small_model().write(tmp_path / "src")
    assert w4("repack", src, tmp_path / "w4").exit_code == 0
    path = tmp_path / "w4" / "model.safetensors"
    tensors = load_file(path)
    tensors[f"{UP}.qweight"][0, 0, 0, 15] = 1
    save_file(tensors, path, metadata={"format": "pt"})
    detail = failed_row(w4, tmp_path, tmp_path / "w4", "nibbles")
    assert f"{UP}.qweight" in detail and "padding" in detail
    assert refusal(w4("dequantize", tmp_path / "w4", tmp_path / "dense", "--device", "cpu")) == detail
    assert refusal(w4("gemv", tmp_path / "w4", "--device", "cpu")) == detail


def test_finiteness_is_checked_past_the_first_chunk(tmp_path, w4, monkeypatch):
    """Large tensors are tested a chunk at a time: a NaN in a later chunk is still found, with
    its index in the tensor (not in the chunk)."""
    from w4cli.read import layers

    monkeypatch.setattr(layers, "FINITE_CHUNK", 100)
    ckpt = small_model(seed=5)
    ckpt.plain["model.embed_tokens.weight"][9, 60] = float("nan")  # element 636 of [16, 64]
    ckpt.plain["model.embed_tokens.weight"][15, 1] = float("inf")  # and 961, two chunks later
    src = ckpt.write(tmp_path / "src")
    detail = every_reader_refuses(w4, tmp_path, src, "plain tensors", "model.embed_tokens.weight", "[9, 60]")
    assert "2 NaN or inf values, first nan at [9, 60]" in detail


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("bad", [float("nan"), float("-inf")])
def test_non_finite_values_are_found_in_every_float_dtype(tmp_path, w4, dtype, bad):
    ckpt = small_model(seed=7)
    norm = torch.ones(64, dtype=dtype)
    norm[33] = bad
    ckpt.plain["model.norm.weight"] = norm
    src = ckpt.write(tmp_path / "src")
    line = refusal(w4("dequantize", src, tmp_path / "dense", "--device", "cpu"))
    assert line == f"model.norm.weight holds 1 NaN or inf value, first {bad!r} at [33]"
