"""What w4 prints: names escaped so no file name can forge a line or drive the terminal, summaries
with units and a `bound by` that follows from the numbers, bench's markdown, and one JSON document
under --json even when the command fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.awq_builder import small_model
from w4cli import console
from w4cli.write.writer import ConversionReport
from w4cli.errors import EXIT_ENVIRONMENT, EXIT_INTERRUPTED, EXIT_REFUSED

FORGED = "o\nerror: all good"


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error")]


# ---- names escaped ----


@pytest.mark.parametrize("raw, shown", [
    ("a\nb", "a\\nb"),
    ("a\rb\tc", "a\\rb\\tc"),
    ("\x1b[31mred", "\\x1b[31mred"),
    ("del\x7f c1\x9b", "del\\x7f c1\\x9b"),
    ("line\u2028sep", "line\\u2028sep"),
    ("bidi\u202eevil", "bidi\\u202eevil"),
    ("bad byte \udcff", "bad byte \\udcff"),
    ("plain [brackets] é 中", "plain [brackets] é 中"),
])
def test_printable_escapes_what_acts_on_a_terminal(raw, shown):
    assert console.printable(raw) == shown


def test_forged_output_name_in_an_error_is_one_line(tmp_path, w4):
    src = small_model().write(tmp_path / "src")
    out = tmp_path / FORGED
    out.mkdir()
    (out / "keep").write_text("x")
    result = w4("dequantize", src, out, "--device", "cpu")
    assert result.exit_code == EXIT_REFUSED
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "o\\nerror: all good" in result.stderr


def test_forged_output_name_in_the_summary_stays_in_its_cell(tmp_path, w4, monkeypatch):
    src = small_model().write(tmp_path / "src")
    monkeypatch.chdir(tmp_path)  # a short relative OUTPUT_DIR, so the table does not wrap it
    out = Path(FORGED + "\x1b[2J")
    result = w4("dequantize", src, out, "--device", "cpu")
    assert result.exit_code == 0, result.stderr
    assert error_lines(result.stdout) == [] and error_lines(result.stderr) == []
    assert "\x1b" not in result.stdout
    assert "o\\nerror: all good\\x1b[2J" in result.stdout
    assert json.loads((out / "config.json").read_text())["dtype"] == "float16"


def test_undecodable_output_name_is_reported_not_a_crash(tmp_path, w4):
    src = small_model().write(tmp_path / "src")
    out = Path(str(tmp_path / "o") + "\udcff")  # how Python holds the byte 0xff of a file name
    out.mkdir()
    (out / "keep").write_text("x")
    result = w4("dequantize", src, out, "--device", "cpu")
    assert result.exit_code == EXIT_REFUSED, result.stderr
    assert "o\\udcff" in result.stderr and "internal error" not in result.stderr


# ---- units and bound by ----


def report(seconds: float, read: float, compute: float, write: float) -> ConversionReport:
    return ConversionReport(Path("out"), [], 1, 10**6, 4 * 10**6, seconds, read, compute, write)


@pytest.mark.parametrize("seconds, read, compute, write, bound", [
    (0.951, 0.012, 0.0, 0.0, "other work"),  # a tiny checkpoint: opening and checking dominate
    (0.0, 0.0, 0.0, 0.0, "other work"),
    (10.0, 1.0, 2.0, 8.0, "writing"),  # writing overlaps producing: 8 s of 10 is the slower stage
    (10.0, 6.0, 2.0, 5.0, "reading"),
    (10.0, 1.0, 7.0, 5.0, "compute"),
    (10.0, 1.0, 2.0, 2.5, "other work"),
])
def test_bound_by_follows_from_the_numbers(seconds, read, compute, write, bound):
    assert report(seconds, read, compute, write).bound_by == bound


def test_summary_table_shows_units(tmp_path, w4):
    src = small_model().write(tmp_path / "src")
    result = w4("dequantize", src, tmp_path / "out", "--device", "cpu")
    assert result.exit_code == 0, result.stderr
    rows = {" ".join(line.strip("│┃ ").split("│")[0].split()): line.split("│")[-2].strip()
            for line in result.stdout.splitlines() if line.count("│") == 3}
    assert rows["total time"].endswith(" s") and rows["write time"].endswith(" s")
    assert rows["throughput"].endswith(" MB/s") and rows["bytes out"].endswith(" MB")
    assert rows["bound by"] == "other work"
    assert "mb per s" not in result.stdout


def test_bench_dry_run_markdown_is_a_pipe_table(w4):
    result = w4("bench", "--shape", "4096x4096", "--shape", "4096x14336", "--dry-run", "--markdown")
    assert result.exit_code == 0, result.stderr
    table = [line for line in result.stdout.splitlines() if line.startswith("|")]
    assert table[0].split("|")[1].strip() == "K x N"
    assert set(table[1].replace("|", "").replace(":", "").split()) == {"---"}
    assert [row.split("|")[1].strip() for row in table[2:]] == ["4096x4096", "4096x14336"]
    assert not set("┏┃━│─┌└╭") & set(result.stdout)


# ---- one JSON document when a command fails ----


def test_refused_conversion_prints_its_failure_as_json(tmp_path, w4):
    src = small_model().write(tmp_path / "src")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("x")
    result = w4("dequantize", src, tmp_path / "out", "--json", "-")
    assert result.exit_code == EXIT_REFUSED
    doc = json.loads(result.stdout)
    assert doc["ok"] is False and doc["exit_code"] == EXIT_REFUSED and "not empty" in doc["error"]
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: ")


def test_json_file_holds_the_summary_beside_the_table(tmp_path, w4):
    src = small_model().write(tmp_path / "src")
    report_file = tmp_path / "summary.json"
    result = w4("repack", src, tmp_path / "w4", "--json", report_file)
    assert result.exit_code == 0, result.stderr
    assert "layers repacked" in result.stdout and f"wrote {report_file}" in result.stderr
    assert json.loads(report_file.read_text())["layers_repacked"] == 2


def test_refused_conversion_writes_its_failure_to_the_json_file(tmp_path, w4):
    src = small_model().write(tmp_path / "src")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("x")
    result = w4("repack", src, tmp_path / "out", "--json", tmp_path / "r.json")
    assert result.exit_code == EXIT_REFUSED and result.stdout == ""
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["command"] == "repack" and doc["exit_code"] == EXIT_REFUSED and "not empty" in doc["error"]


def test_interrupted_gemv_reports_the_layers_it_checked(tmp_path, w4, monkeypatch):
    import w4cli.commands.gemv as gemv_cmd

    src = small_model().write(tmp_path / "src")
    real = gemv_cmd._check_layer
    calls = []

    def check_then_interrupt(*args):
        if calls:
            raise KeyboardInterrupt  # Ctrl-C while the second layer is checked
        calls.append(args[0])
        return real(*args)

    monkeypatch.setattr(gemv_cmd, "_check_layer", check_then_interrupt)
    result = w4("gemv", src, "--device", "cpu", "--json", "-")
    assert result.exit_code == EXIT_INTERRUPTED
    doc = json.loads(result.stdout)
    assert doc["exit_code"] == EXIT_INTERRUPTED and doc["error"] == "interrupted"
    assert [layer["layer"] for layer in doc["done"]["layers"]] == calls


def test_json_file_gets_the_failure_document(tmp_path, w4):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text(json.dumps({"model_type": "llama", "quantization_config": {"quant_method": "gptq"}}))
    report_file = tmp_path / "report.json"
    result = w4("verify", tmp_path / "bad", "--json", report_file)
    assert result.exit_code == EXIT_REFUSED
    doc = json.loads(report_file.read_text())
    assert doc["ok"] is False and doc["exit_code"] == EXIT_REFUSED and doc["error"] == result.stderr.strip()[len("error: "):]


def test_bench_without_a_gpu_still_answers_json(w4, monkeypatch):
    from w4cli.gpu import kernels

    monkeypatch.setattr(kernels, "probe", lambda: (False, "no CUDA GPU is visible to torch"))
    result = w4("bench", "--shape", "4096x4096", "--json", "-")
    assert result.exit_code == EXIT_ENVIRONMENT
    assert json.loads(result.stdout)["exit_code"] == EXIT_ENVIRONMENT


def test_a_failed_check_is_reported_once_in_the_commands_own_document(tmp_path, w4, monkeypatch):
    import w4cli.commands.gemv as gemv_cmd

    src = small_model().write(tmp_path / "src")
    real = gemv_cmd._check_layer

    def failing(*args):
        result = real(*args)
        result.passed = False
        return result

    monkeypatch.setattr(gemv_cmd, "_check_layer", failing)
    result = w4("gemv", src, "--device", "cpu", "--json", "-")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)  # exactly one document: json.loads refuses a second
    assert "layers" in doc and "exit_code" not in doc
