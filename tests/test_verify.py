"""`w4 verify` on the CPU: the self-test's reference checks, integrity of one checkpoint, and an
output against its source, with planted faults (one ulp, one nibble, a missing or extra tensor, a
wrong config dtype, a changed tokenizer file) that must each be caught. GPU rows are SKIP here;
tests/test_verify_gpu.py runs them."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.awq_builder import install_hub_cache, small_model
from w4cli.errors import EXIT_ENVIRONMENT, EXIT_FAILED, EXIT_REFUSED, EXIT_USAGE

TOKENIZER = '{"model": {"type": "BPE"}}'


@pytest.fixture(autouse=True)
def no_debug(monkeypatch):
    monkeypatch.delenv("W4_DEBUG", raising=False)


def verify(w4, *args, expect: int):
    result = w4("verify", *args)
    text = result.stdout + result.stderr
    assert "Traceback" not in text, text
    assert result.exit_code == expect, f"exit {result.exit_code}\n{text}"
    return result


def checks(path) -> dict[str, dict]:
    return {c["name"]: c for c in json.loads(path.read_text())["checks"]}


@pytest.fixture
def source(tmp_path):
    return small_model(seed=4, bias=True).write(tmp_path / "src", extra_files={"tokenizer.json": TOKENIZER, "generation_config.json": "{}"})


def converted(w4, source, out, *args):
    result = w4(*args[:1], source, out, *args[1:])
    assert result.exit_code == 0, result.stderr
    return out


# ---- self-test -------------------------------------------------------------------------------


def test_selftest_quick_passes_on_cpu_with_gpu_checks_skipped(tmp_path, w4):
    result = verify(w4, "--quick", "--json", tmp_path / "r.json", "--junit", tmp_path / "r.xml", expect=0)
    assert "seed 0" in result.stdout
    rows = checks(tmp_path / "r.json")
    ref = [c for c in rows.values() if c["name"].startswith("ref ")]
    gpu = [c for c in rows.values() if c["name"].startswith("gpu ")]
    assert ref and all(c["status"] == "PASS" for c in ref)
    assert {"ref dequantize", "ref repack", "ref gemv"} <= {c["name"].rsplit(" ", 2)[0] for c in ref}
    if not torch.cuda.is_available():
        assert gpu and all(c["status"] == "SKIP" and c["detail"] for c in gpu)
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["environment"]["seed"] == 0 and doc["environment"]["torch"] == torch.__version__
    assert "cuda" in doc["environment"] and "gpu" in doc["environment"]


def test_junit_counts(tmp_path, w4):
    verify(w4, "--quick", "--junit", tmp_path / "r.xml", expect=0)
    suite = ET.parse(tmp_path / "r.xml").getroot().find("testsuite")
    cases = suite.findall("testcase")
    assert int(suite.get("tests")) == len(cases) > 0
    assert int(suite.get("failures")) == sum(c.find("failure") is not None for c in cases) == 0
    assert int(suite.get("skipped")) == sum(c.find("skipped") is not None for c in cases)
    if not torch.cuda.is_available():
        assert int(suite.get("skipped")) > 0


def test_same_seed_same_report(tmp_path, w4):
    a = verify(w4, "--quick", "--seed", "7", "--json", tmp_path / "a.json", expect=0)
    b = verify(w4, "--quick", "--seed", "7", "--json", tmp_path / "b.json", expect=0)
    assert a.stdout == b.stdout and "seed 7" in a.stdout

    def strip(path):
        return [{k: v for k, v in c.items() if k != "seconds"} for c in json.loads(path.read_text())["checks"]]

    assert strip(tmp_path / "a.json") == strip(tmp_path / "b.json")


def test_json_to_stdout(w4):
    doc = json.loads(verify(w4, "--quick", "--json", "-", expect=0).stdout)
    assert doc["summary"]["failed"] == 0 and doc["target"]["mode"] == "selftest"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_require_gpu_without_cuda_exits_3(tmp_path, w4):
    result = verify(w4, "--quick", "--require-gpu", "--junit", tmp_path / "r.xml", expect=EXIT_ENVIRONMENT)
    assert "GPU checks could not run" in result.stderr
    suite = ET.parse(tmp_path / "r.xml").getroot().find("testsuite")
    errors = [c for c in suite.findall("testcase") if c.find("error") is not None]
    assert int(suite.get("errors")) == len(errors) > 0 and int(suite.get("failures")) == 0


def test_restatement_catches_a_wrong_reference(tmp_path, w4, monkeypatch):
    """The reference check is not vacuous: a reference that is off by one ulp somewhere fails."""
    from w4cli.formats import awq_gemm

    real = awq_gemm.dequantize

    def off_by_one_ulp(*args, **kwargs):
        out = real(*args, **kwargs).clone()
        flat = out.view(-1).view({2: torch.int16, 4: torch.int32}[out.element_size()])
        flat[flat.numel() // 2] += 1
        return out

    monkeypatch.setattr(awq_gemm, "dequantize", off_by_one_ulp)
    result = verify(w4, "--quick", "--json", tmp_path / "r.json", expect=EXIT_FAILED)
    failed = [c for c in checks(tmp_path / "r.json").values() if c["status"] == "FAIL"]
    assert failed and all(c["name"].startswith("ref ") for c in failed)
    assert "elements differ; first at" in failed[0]["detail"]
    assert "checks failed" in result.stderr


# ---- one checkpoint ----------------------------------------------------------------------------


def test_integrity_of_a_good_awq_checkpoint_and_its_repack(tmp_path, w4, source):
    verify(w4, source, "--json", tmp_path / "a.json", expect=0)
    rows = checks(tmp_path / "a.json")
    for name in ("files and index", "tensors and shapes", "scales", "plain tensors", "nibbles"):
        assert rows[name]["status"] == "PASS", rows[name]
    if not torch.cuda.is_available():
        assert rows["gpu dequantize"]["status"] == rows["gpu gemv"]["status"] == "SKIP"
    converted(w4, source, tmp_path / "w4", "repack")
    verify(w4, tmp_path / "w4", "--json", tmp_path / "b.json", expect=0)
    assert "padding" in checks(tmp_path / "b.json")["nibbles"]["detail"]


def test_integrity_through_the_hub_cache(tmp_path, w4, source):
    install_hub_cache(tmp_path / "hub", "org/tiny", source)
    verify(w4, "org/tiny", "--cache-dir", tmp_path / "hub", expect=0)


def test_integrity_failures_are_rows(tmp_path, w4):
    ckpt = small_model(seed=1)
    ckpt.layers[0].scales[0, 3] = float("nan")
    bad = ckpt.write(tmp_path / "nan")
    verify(w4, bad, "--json", tmp_path / "r.json", expect=EXIT_FAILED)
    assert "NaN" in checks(tmp_path / "r.json")["scales"]["detail"] or "nan" in checks(tmp_path / "r.json")["scales"]["detail"]

    good = small_model(seed=1).write(tmp_path / "good")
    tensors = load_file(good / "model.safetensors")
    del tensors["model.layers.0.mlp.up_proj.qzeros"]
    save_file(tensors, good / "model.safetensors", metadata={"format": "pt"})
    verify(w4, good, "--json", tmp_path / "s.json", expect=EXIT_FAILED)
    row = checks(tmp_path / "s.json")["tensors and shapes"]
    assert row["status"] == "FAIL" and "qzeros" in row["detail"]


def test_not_a_quantized_checkpoint_is_refused(tmp_path, w4, source):
    dense = converted(w4, source, tmp_path / "dense", "dequantize", "--device", "cpu")
    result = verify(w4, dense, expect=EXIT_REFUSED)
    assert "not a quantized checkpoint" in result.stderr


# ---- an output against its source ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_good_dequantized_output_passes(tmp_path, w4, source, dtype):
    out = converted(w4, source, tmp_path / "dense", "dequantize", "--dtype", dtype, "--device", "cpu")
    verify(w4, out, "--against", source, "--json", tmp_path / "r.json", expect=0)
    rows = checks(tmp_path / "r.json")
    assert [r["status"] for r in rows.values()] == ["PASS"] * 7, rows
    assert json.loads((tmp_path / "r.json").read_text())["target"]["output_kind"] == f"dequantized ({dtype})"


def test_good_sharded_output_against_a_hub_source_passes(tmp_path, w4, source):
    install_hub_cache(tmp_path / "hub", "org/tiny", source)
    out = converted(w4, "org/tiny", tmp_path / "dense", "dequantize", "--device", "cpu", "--max-shard-size", "4KB", "--cache-dir", tmp_path / "hub")
    assert (out / "model.safetensors.index.json").is_file()
    verify(w4, out, "--against", "org/tiny", "--cache-dir", tmp_path / "hub", expect=0)


def test_good_repacked_output_passes(tmp_path, w4, source):
    out = converted(w4, source, tmp_path / "w4", "repack")
    verify(w4, out, "--against", source, "--json", tmp_path / "r.json", expect=0)
    rows = checks(tmp_path / "r.json")
    assert rows["repacked words"]["status"] == rows["dequantized both sides"]["status"] == "PASS"


def _rewrite(path, edit):
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def test_one_ulp_in_one_element_is_caught(tmp_path, w4, source):
    out = converted(w4, source, tmp_path / "dense", "dequantize", "--device", "cpu")
    name = "model.layers.0.mlp.down_proj.weight"

    def bump(tensors):
        tensors[name].view(torch.int16)[5, 17] += 1

    _rewrite(out / "model.safetensors", bump)
    result = verify(w4, out, "--against", source, "--json", tmp_path / "r.json", expect=EXIT_FAILED)
    row = checks(tmp_path / "r.json")["tensors"]
    assert row["status"] == "FAIL"
    assert f"1 of " in row["detail"] and name in row["detail"] and "[5, 17]" in row["detail"]
    assert "output " in row["detail"] and "fresh " in row["detail"]
    assert name in result.stderr


def test_flipped_nibble_in_repacked_qweight_is_caught(tmp_path, w4, source):
    out = converted(w4, source, tmp_path / "w4", "repack")
    name = "model.layers.0.mlp.up_proj.qweight"

    def flip(tensors):
        tensors[name].view(-1)[3] ^= 0x10  # one nibble, one code

    _rewrite(out / "model.safetensors", flip)
    verify(w4, out, "--against", source, "--json", tmp_path / "r.json", expect=EXIT_FAILED)
    rows = checks(tmp_path / "r.json")
    assert rows["repacked words"]["status"] == "FAIL" and name in rows["repacked words"]["detail"]
    assert rows["dequantized both sides"]["status"] == "FAIL"
    assert "model.layers.0.mlp.up_proj.weight" in rows["dequantized both sides"]["detail"]


def test_flipped_padding_nibble_is_caught(tmp_path, w4, source):
    """K = 96 pads to 128: a code in the padding changes no weight but is still not what repack writes."""
    out = converted(w4, source, tmp_path / "w4", "repack")
    name = "model.layers.0.mlp.up_proj.qweight"  # K = 96: words 12..15 of each row are padding
    _rewrite(out / "model.safetensors", lambda t: t[name][0, 0, 0].__setitem__(15, 1))
    verify(w4, out, "--against", source, "--json", tmp_path / "r.json", expect=EXIT_FAILED)
    assert checks(tmp_path / "r.json")["repacked words"]["status"] == "FAIL"
    verify(w4, out, "--json", tmp_path / "i.json", expect=EXIT_FAILED)
    assert checks(tmp_path / "i.json")["nibbles"]["status"] == "FAIL"


def test_missing_tensor_is_caught(tmp_path, w4, source):
    out = converted(w4, source, tmp_path / "dense", "dequantize", "--device", "cpu")
    _rewrite(out / "model.safetensors", lambda t: t.pop("model.norm.weight"))
    verify(w4, out, "--against", source, "--json", tmp_path / "r.json", expect=EXIT_FAILED)
    row = checks(tmp_path / "r.json")["tensor names"]
    assert row["status"] == "FAIL" and "1 missing (first model.norm.weight)" in row["detail"]


def test_extra_tensor_is_caught(tmp_path, w4, source):
    out = converted(w4, source, tmp_path / "dense", "dequantize", "--device", "cpu")
    _rewrite(out / "model.safetensors", lambda t: t.__setitem__("model.extra.weight", torch.zeros(4, dtype=torch.float16)))
    verify(w4, out, "--against", source, "--json", tmp_path / "r.json", expect=EXIT_FAILED)
    row = checks(tmp_path / "r.json")["tensor names"]
    assert row["status"] == "FAIL" and "unexpected (first model.extra.weight)" in row["detail"]


def test_wrong_config_dtype_is_caught(tmp_path, w4, source):
    out = converted(w4, source, tmp_path / "dense", "dequantize", "--device", "cpu")
    config = json.loads((out / "config.json").read_text())
    config["torch_dtype"] = config["dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(config))
    verify(w4, out, "--against", source, "--json", tmp_path / "r.json", expect=EXIT_FAILED)
    rows = checks(tmp_path / "r.json")
    assert rows["config.json"]["status"] == "FAIL" and "bfloat16" in rows["config.json"]["detail"]
    assert rows["tensors"]["status"] == "FAIL" and "dtype float16, fresh bfloat16" in rows["tensors"]["detail"]


def test_config_keeping_quantization_config_is_caught(tmp_path, w4, source):
    out = converted(w4, source, tmp_path / "dense", "dequantize", "--device", "cpu")
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq"}
    (out / "config.json").write_text(json.dumps(config))
    verify(w4, out, "--against", source, "--json", tmp_path / "r.json", expect=EXIT_FAILED)
    assert "'quantization_config' unexpected" in checks(tmp_path / "r.json")["config.json"]["detail"]


def test_changed_tokenizer_file_is_caught(tmp_path, w4, source):
    out = converted(w4, source, tmp_path / "dense", "dequantize", "--device", "cpu")
    (out / "tokenizer.json").write_text(TOKENIZER.replace("BPE", "WordPiece"))
    verify(w4, out, "--against", source, "--json", tmp_path / "r.json", expect=EXIT_FAILED)
    row = checks(tmp_path / "r.json")["copied files"]
    assert row["status"] == "FAIL" and "tokenizer.json differs" in row["detail"]
    (out / "tokenizer.json").unlink()
    verify(w4, out, "--against", source, "--json", tmp_path / "s.json", expect=EXIT_FAILED)
    assert "tokenizer.json is missing" in checks(tmp_path / "s.json")["copied files"]["detail"]


def test_failures_in_junit(tmp_path, w4, source):
    out = converted(w4, source, tmp_path / "dense", "dequantize", "--device", "cpu")
    (out / "tokenizer.json").write_text("{}")
    verify(w4, out, "--against", source, "--junit", tmp_path / "r.xml", expect=EXIT_FAILED)
    suite = ET.parse(tmp_path / "r.xml").getroot().find("testsuite")
    failures = [c.find("failure") for c in suite.findall("testcase") if c.find("failure") is not None]
    assert int(suite.get("failures")) == len(failures) == 1
    assert "tokenizer.json differs" in failures[0].get("message")


def test_refused_source_exits_4(tmp_path, w4, source):
    dense = converted(w4, source, tmp_path / "dense", "dequantize", "--device", "cpu")
    verify(w4, dense, "--against", dense, expect=EXIT_REFUSED)


@pytest.mark.parametrize(
    "args,match",
    [
        (["--against", "x"], "needs the OUTPUT directory"),
        (["somewhere-that-does-not-exist", "--against", "x"], "is neither a GGUF file nor a directory"),
        (["./no-such-model"], "no such directory"),
    ],
)
def test_usage_errors(tmp_path, w4, args, match):
    assert match in verify(w4, *args, expect=EXIT_USAGE).stderr


def test_quick_with_a_model_is_a_usage_error(tmp_path, w4, source):
    assert "--quick" in verify(w4, source, "--quick", expect=EXIT_USAGE).stderr
