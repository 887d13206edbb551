"""`w4 verify` checks and how they read: an output holding files a conversion does not write
fails, skipped GPU checks fold into one line in the table (JSON and JUnit keep each), progress
shows on stderr without a terminal, and the full self-test fits a 2-core CPU box (a minute, 1 GB)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from tests.awq_builder import small_model
from w4cli.errors import EXIT_FAILED

TOKENIZER = '{"model": {"type": "BPE"}}'
REPO = Path(__file__).resolve().parent.parent
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU table; this machine has a CUDA GPU")


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
    count = f"{len(planted)} file{'s' if len(planted) > 1 else ''}"
    assert row["detail"].startswith(f"{count} a conversion of SOURCE does not write: ")
    for name in planted:
        assert name in row["detail"]


def test_a_directory_in_the_output_fails_by_name(tmp_path, w4, source):
    out = tmp_path / "out"
    assert w4("repack", source, out).exit_code == 0
    (out / "extra").mkdir()
    row = file_set_row(w4, tmp_path, out, source, expect=EXIT_FAILED)
    assert "extra" in row["detail"]


def test_a_sharded_output_without_its_index_fails(tmp_path, w4, source):
    out = tmp_path / "out"
    assert w4("dequantize", source, out, "--device", "cpu", "--max-shard-size", "4KB").exit_code == 0
    (out / "model.safetensors.index.json").unlink()
    row = file_set_row(w4, tmp_path, out, source, expect=EXIT_FAILED)
    assert row["detail"] == "1 file a conversion writes missing: model.safetensors.index.json"


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


# ---- skipped GPU checks fold into one line --------------------------------------------------------


def test_skipped_gpu_checks_fold_into_one_line_per_reason():
    from rich.console import Console

    from w4cli.verify.report import Check, Report, render_table

    reason = "no CUDA GPU is visible to torch"
    report = Report("t", {}, {}, [Check("ref a", "x"), *(Check(f"gpu {i}", "y", "SKIP", reason, needs_gpu=True) for i in range(47)),
                                  Check("gpu build", "z", "SKIP", "nvcc not found", needs_gpu=True), Check("ref b", "x", "FAIL", "differs")])
    console = Console(record=True, width=100, file=open(os.devnull, "w"))
    render_table(report, console)
    text = console.export_text()
    assert f"47 GPU checks skipped: {reason}" in text.splitlines()
    assert "1 GPU check skipped: nvcc not found" in text.splitlines()
    assert "gpu 3" not in text and "ref a" in text and "ref b" in text
    assert "1 passed, 1 failed, 48 skipped" in text


@no_gpu
def test_selftest_table_folds_while_json_and_junit_keep_every_check(tmp_path, w4):
    result = w4("verify", "--quick", "--json", tmp_path / "r.json", "--junit", tmp_path / "r.xml")
    assert result.exit_code == 0, result.stderr
    rows = json.loads((tmp_path / "r.json").read_text())["checks"]
    skipped = [c for c in rows if c["status"] == "SKIP"]
    assert len(skipped) == 14 and all(c["needs_gpu"] for c in skipped)
    reason = skipped[0]["detail"]
    assert f"14 GPU checks skipped: {reason}" in result.stdout.splitlines()
    assert "SKIP" not in result.stdout and "gpu dequantize" not in result.stdout
    suite = ET.parse(tmp_path / "r.xml").getroot().find("testsuite")
    assert sum(c.find("skipped") is not None for c in suite.findall("testcase")) == 14


# ---- progress on stderr --------------------------------------------------------------------------


def test_progress_lines_on_stderr_without_a_terminal(w4, monkeypatch):
    from w4cli import console

    monkeypatch.setattr(console, "STEP_LINE_SECONDS", 0.0)
    result = w4("verify", "--quick")
    assert result.exit_code == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("w4 verify: self-test: ")]
    assert len(lines) == 10, result.stderr  # one per tenth of the 25 checks
    assert lines[0].startswith("w4 verify: self-test: 3/25 after ") and lines[0].endswith(" ref gemv 32x8 g32")
    assert lines[-1].startswith("w4 verify: self-test: 25/25 after ")


# ---- the whole self-test on a 2-core CPU box --------------------------------------------------


@no_gpu
def test_full_selftest_fits_a_minute_and_a_gigabyte(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    env.pop("W4_DEBUG", None)
    with open(tmp_path / "out", "wb") as out, open(tmp_path / "err", "wb") as err:
        start = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-m", "w4cli", "verify"], stdout=out, stderr=err, env=env, cwd=tmp_path)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - start
    stdout, stderr = (tmp_path / "out").read_text(), (tmp_path / "err").read_text()
    assert os.waitstatus_to_exitcode(status) == 0, stdout + stderr
    assert seconds < 60, f"{seconds:.1f} s"
    assert usage.ru_maxrss < 1024 * 1024, f"peak RSS {usage.ru_maxrss / 1024:.0f} MB"  # ru_maxrss is in KB
    assert "47 GPU checks skipped: " in stdout and "SKIP" not in stdout
    assert "error" not in stderr
