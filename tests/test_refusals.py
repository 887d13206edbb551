"""Bad input: one clear line, a non-zero exit, no traceback, and nothing at OUTPUT_DIR that looks
complete. One test per refusal the dequantize issue lists, and then some."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.awq_builder import Checkpoint, install_hub_cache, random_layer, small_model
from w4cli.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_REFUSED, EXIT_USAGE

UP = "model.layers.0.mlp.up_proj"


def assert_refused(result, out: Path, *fragments: str, code: int = EXIT_REFUSED) -> None:
    assert result.exit_code == code, (result.exit_code, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    assert not out.exists() or not any(out.iterdir())
    assert not [p for p in out.parent.iterdir() if ".w4tmp-" in p.name]


def rewrite_tensors(src: Path, edit) -> None:
    """Edit a one-file checkpoint's tensors in place: edit(tensors) changes the dict."""
    tensors = load_file(src / "model.safetensors")
    edit(tensors)
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})


def assert_refused_by_dequantize_and_verify(w4, src: Path, out: Path, named: str) -> None:
    """dequantize refuses with one line naming `named`; verify reports it (a failed row or a refusal)."""
    assert_refused(w4("dequantize", src, out), out, named)
    verify = w4("verify", src)
    assert verify.exit_code in (EXIT_FAILED, EXIT_REFUSED) and named in verify.stdout + verify.stderr


def edit_config(src: Path, **quant) -> None:
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"].update(quant)
    (src / "config.json").write_text(json.dumps(config))


def test_truncated_shard(tmp_path, w4):
    src = small_model().write(tmp_path / "src")
    data = (src / "model.safetensors").read_bytes()
    (src / "model.safetensors").write_bytes(data[: len(data) - 100])
    assert_refused(w4("dequantize", src, tmp_path / "out"), tmp_path / "out", "model.safetensors", "not a valid safetensors")


def test_missing_tensor_named_by_the_index(tmp_path, w4):
    ckpt = small_model()
    names = list(ckpt.all_tensors())
    src = ckpt.write(tmp_path / "src", shards={"model-00001-of-00001.safetensors": names})
    index = json.loads((src / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.layers.0.mlp.gate_proj.qweight"] = "model-00001-of-00001.safetensors"
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    assert_refused(w4("dequantize", src, tmp_path / "out"), tmp_path / "out", "gate_proj.qweight", "missing")


def test_missing_shard_file(tmp_path, w4):
    ckpt = small_model()
    names = list(ckpt.all_tensors())
    src = ckpt.write(tmp_path / "src", shards={"a.safetensors": names[:3], "b.safetensors": names[3:]})
    (src / "b.safetensors").unlink()
    assert_refused(w4("dequantize", src, tmp_path / "out"), tmp_path / "out", "b.safetensors", "missing")


def test_missing_qzeros(tmp_path, w4):
    ckpt = small_model()
    tensors = ckpt.all_tensors()
    del tensors[f"{UP}.qzeros"]
    (tmp_path / "src").mkdir()
    ckpt.write(tmp_path / "src")
    save_file(tensors, tmp_path / "src" / "model.safetensors", metadata={"format": "pt"})
    assert_refused(w4("dequantize", tmp_path / "src", tmp_path / "out"), tmp_path / "out", f"{UP}.qzeros")


def test_shape_mismatch(tmp_path, w4):
    ckpt = small_model()
    tensors = ckpt.all_tensors()
    tensors[f"{UP}.scales"] = tensors[f"{UP}.scales"][:, :-8].contiguous()
    src = ckpt.write(tmp_path / "src")
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    assert_refused(w4("dequantize", src, tmp_path / "out"), tmp_path / "out", UP, "scales")


def test_group_size_mismatch(tmp_path, w4):
    src = small_model().write(tmp_path / "src")
    edit_config(src, group_size=64)  # the tensors were made with 32
    assert_refused(w4("dequantize", src, tmp_path / "out"), tmp_path / "out", "group_size 64")


def test_in_features_not_a_multiple_of_the_group(tmp_path, w4):
    layer = random_layer(UP, 96, 16, 32, seed=1)
    src = Checkpoint([layer], group_size=32).write(tmp_path / "src")
    edit_config(src, group_size=64)
    assert_refused(w4("dequantize", src, tmp_path / "out"), tmp_path / "out", "96 is not a multiple of group_size 64")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0])
def test_non_finite_or_zero_scale(tmp_path, w4, bad):
    ckpt = small_model()
    ckpt.layers[1].scales[1, 3] = bad
    src = ckpt.write(tmp_path / "src")
    assert_refused(w4("dequantize", src, tmp_path / "out"), tmp_path / "out", "down_proj.scales", "[1, 3]")


@pytest.mark.parametrize(
    "quant,named",
    [
        ({"version": "gemv"}, "AWQ version 'gemv'"),
        ({"version": "gemv_fast"}, "AWQ version 'gemv_fast'"),
        ({"version": "marlin"}, "AWQ version 'marlin'"),
        ({"bits": 8}, "8 bits"),
        ({"zero_point": False}, "zero_point false"),
        ({"backend": "llm-awq"}, "llm-awq"),
        ({"quant_method": "gptq", "checkpoint_format": "marlin"}, "GPTQ checkpoint_format 'marlin'"),
        ({"quant_method": "compressed-tensors", "format": "float-quantized"}, "format 'float-quantized'"),
        ({"quant_method": "bitsandbytes"}, "quant_method 'bitsandbytes'"),
    ],
)
def test_unsupported_formats_name_what_was_found(tmp_path, w4, quant, named):
    src = small_model().write(tmp_path / "src")
    edit_config(src, **quant)
    assert_refused(w4("dequantize", src, tmp_path / "out"), tmp_path / "out", "unsupported quantization", named)


def test_not_quantized_at_all(tmp_path, w4):
    src = small_model().write(tmp_path / "src")
    config = json.loads((src / "config.json").read_text())
    del config["quantization_config"]
    (src / "config.json").write_text(json.dumps(config))
    assert_refused(w4("dequantize", src, tmp_path / "out"), tmp_path / "out", "no quantization_config")


def test_unsupported_format_is_refused_before_the_weights_are_fetched(tmp_path, w4):
    """From the Hub, config.json is checked first: a refused checkpoint costs no weight download.
    The cache holds config.json only, so reaching for the weights would fail differently."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "gptq", "bits": 8}}))
    install_hub_cache(tmp_path / "hub", "org/gptq", src)
    result = w4("dequantize", "org/gptq", tmp_path / "out", "--cache-dir", tmp_path / "hub")
    assert_refused(result, tmp_path / "out", "GPTQ with 8 bits")


def test_pickle_only_repo(tmp_path, w4):
    src = tmp_path / "src"
    small_model().write(src)
    (src / "model.safetensors").unlink()
    (src / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    install_hub_cache(tmp_path / "hub", "org/pickles", src)
    for model in (str(src), "org/pickles"):
        result = w4("dequantize", model, tmp_path / "out", "--cache-dir", tmp_path / "hub")
        assert_refused(result, tmp_path / "out", "pickle", "pytorch_model.bin")


@pytest.mark.parametrize("entry", ["../other/model.safetensors", "/etc/model.safetensors", "sub/model.safetensors", "..\\x.safetensors"])
def test_index_path_traversal(tmp_path, w4, entry):
    ckpt = small_model()
    names = list(ckpt.all_tensors())
    src = ckpt.write(tmp_path / "src", shards={"model-00001-of-00001.safetensors": names})
    index = json.loads((src / "model.safetensors.index.json").read_text())
    index["weight_map"][names[0]] = entry
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    assert_refused(w4("dequantize", src, tmp_path / "out"), tmp_path / "out", "plain .safetensors file names")


def test_stray_weight_file_not_in_the_index(tmp_path, w4):
    ckpt = small_model()
    src = ckpt.write(tmp_path / "src", shards={"model-00001-of-00001.safetensors": list(ckpt.all_tensors())})
    save_file({"x": torch.zeros(1)}, src / "consolidated.safetensors")
    assert_refused(w4("dequantize", src, tmp_path / "out"), tmp_path / "out", "consolidated.safetensors")


def test_existing_output_dir_is_left_untouched(tmp_path, w4):
    src = small_model().write(tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = w4("dequantize", src, out)
    assert result.exit_code == EXIT_REFUSED
    assert "not empty" in result.stderr and "--force" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    assert (out / "keep.txt").read_text() == "mine"


def test_output_inside_the_input(tmp_path, w4):
    src = small_model().write(tmp_path / "src")
    result = w4("dequantize", src, src / "dense")
    assert result.exit_code == EXIT_REFUSED and "inside the input" in result.stderr
    assert not (src / "dense").exists()


def test_interruption_leaves_nothing_that_looks_complete(tmp_path, w4, monkeypatch):
    import w4cli.dequantize as dequantize
    import w4cli.write.output_dir as output_dir

    src = small_model().write(tmp_path / "src")
    real = dequantize.cpu_dequantizer
    written_before_interrupt = []

    def dequantize_then_interrupt(*args):
        if written_before_interrupt:
            raise KeyboardInterrupt
        out = real(*args)
        # the first layer's shard is on disk, in the temporary directory, when Ctrl-C comes
        written_before_interrupt.extend(tmp_path.glob(f"out{output_dir.TEMP_MARK}*/model-*.safetensors"))
        return out

    monkeypatch.setattr(dequantize, "cpu_dequantizer", dequantize_then_interrupt)
    result = w4("dequantize", src, tmp_path / "out", "--max-shard-size", "2KB", "--device", "cpu")
    assert written_before_interrupt, "the interruption must come after a shard file was started"
    assert result.exit_code == EXIT_INTERRUPTED
    assert "interrupted" in result.stderr
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if output_dir.TEMP_MARK in p.name]


def test_model_that_is_neither_dir_nor_repo_id(tmp_path, w4):
    result = w4("dequantize", "not a repo id!", tmp_path / "out")
    assert_refused(result, tmp_path / "out", "neither a local directory nor a valid Hub repo id", code=EXIT_USAGE)
    missing = w4("dequantize", str(tmp_path / "nope"), tmp_path / "out")
    assert_refused(missing, tmp_path / "out", "no such directory", code=EXIT_USAGE)


def test_bad_shard_size_is_a_usage_error(tmp_path, w4):
    src = small_model().write(tmp_path / "src")
    assert_refused(w4("dequantize", src, tmp_path / "out", "--max-shard-size", "lots"), tmp_path / "out", "--max-shard-size", code=EXIT_USAGE)


def test_ambiguous_activation_scales(tmp_path, w4):
    a = random_layer("m.layers.0.mlp.fc_a", 64, 32, 32, seed=1)
    b = random_layer("m.layers.0.mlp.fc_b", 64, 32, 32, seed=2)
    ckpt = Checkpoint([a, b], {"m.layers.0.mlp.act.scales": torch.ones(64).half()})
    src = ckpt.write(tmp_path / "src")
    assert_refused(w4("dequantize", src, tmp_path / "out"), tmp_path / "out", "cannot tell which linear", "fc_a", "fc_b")


def test_wrong_qweight_dtype(tmp_path, w4):
    ckpt = small_model()
    tensors = ckpt.all_tensors()
    tensors[f"{UP}.qweight"] = tensors[f"{UP}.qweight"].to(torch.int64)
    src = ckpt.write(tmp_path / "src")
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    assert_refused(w4("dequantize", src, tmp_path / "out"), tmp_path / "out", "qweight", "I64")
