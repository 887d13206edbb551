"""`w4 verify` checks and how they read: an output holding files a conversion does not write
fails."""

from __future__ import annotations

import json

import pytest

from tests.awq_builder import small_model
from w4cli.errors import EXIT_FAILED

TOKENIZER = '{"model": {"type": "BPE"}}'


@pytest.fixture(autouse=True)
def no_debug(monkeypatch):
    monkeypatch.delenv("W4_DEBUG", raising=False)


@pytest.fixture
def source(tmp_path):
    return small_model(seed=6, bias=True).write(tmp_path / "src", extra_files={"tokenizer.json": TOKENIZER, "generation_config.json": "{}"})


def checks(path) -> dict[str, dict]:
    return {c["name"]: c for c in json.loads(path.read_text())["checks"]}


def file_set_row(w4, tmp_path, out, source, expect: int) -> dict:
    report = tmp_path / "report.json"
    result = w4("verify", out, "--against", source, "--json", report)
    assert "Traceback" not in result.stdout + result.stderr
    assert result.exit_code == expect, result.stdout + result.stderr
    return checks(report)["file set"]


# ---- only the files a conversion writes ---------------------------------------------------------


@pytest.mark.parametrize(
    "command,args",
    [("dequantize", ["--device", "cpu"]), ("dequantize", ["--device", "cpu", "--max-shard-size", "4KB"]), ("repack", [])],
)
def test_a_fresh_conversion_holds_exactly_the_files_it_writes(tmp_path, w4, source, command, args):
    out = tmp_path / "out"
    assert w4(command, source, out, *args).exit_code == 0
    row = file_set_row(w4, tmp_path, out, source, expect=0)
    assert row["status"] == "PASS" and f"{len(list(out.iterdir()))} files" in row["detail"]


@pytest.mark.parametrize(
    "planted",
    [
        {"pytorch_model.bin": b"\x80\x04not a pickle"},  # pickle weights a loader may prefer
        {"modeling_evil.py": b"import os\n"},  # code a loader runs with trust_remote_code
        {"model.gguf": b"GGUF"},
        {"notes.md": b"mine"},
        {".hidden": b""},
        {"pytorch_model.bin": b"x", "modeling_evil.py": b"y", "consolidated.pt": b"z"},
    ],
)
def test_files_a_conversion_does_not_write_fail_by_name(tmp_path, w4, source, planted):
    out = tmp_path / "out"
    assert w4("dequantize", source, out, "--device", "cpu").exit_code == 0
    for name, data in planted.items():
        (out / name).write_bytes(data)
    row = file_set_row(w4, tmp_path, out, source, expect=EXIT_FAILED)
    assert row["status"] == "FAIL"
    assert f"{len(planted)} files a conversion of SOURCE does not write" in row["detail"]
    for name in planted:
        assert name in row["detail"]


def test_a_directory_in_the_output_fails_by_name(tmp_path, w4, source):
    out = tmp_path / "out"
    assert w4("repack", source, out).exit_code == 0
    (out / "extra").mkdir()
    row = file_set_row(w4, tmp_path, out, source, expect=EXIT_FAILED)
    assert "extra" in row["detail"]


def test_shards_must_be_named_as_the_writer_names_them(tmp_path, w4, source):
    """Renamed shards with a matching index hold the right tensors, but w4 never wrote them."""
    out = tmp_path / "out"
    assert w4("dequantize", source, out, "--device", "cpu", "--max-shard-size", "4KB").exit_code == 0
    index_path = out / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    first = sorted(set(index["weight_map"].values()))[0]
    (out / first).rename(out / "weights-a.safetensors")
    index["weight_map"] = {k: ("weights-a.safetensors" if v == first else v) for k, v in index["weight_map"].items()}
    index_path.write_text(json.dumps(index))
    row = file_set_row(w4, tmp_path, out, source, expect=EXIT_FAILED)
    assert "weights-a.safetensors" in row["detail"]
