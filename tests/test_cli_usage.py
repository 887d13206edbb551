"""The command line itself: every usage error is one `error:` line and exit 2, found before any
work, in the Typer app (so the console script and the in-process runner agree); and `w4 --help`
imports nothing heavy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.awq_builder import small_model
from w4cli.errors import EXIT_USAGE

ROOT = Path(__file__).resolve().parents[1]


def assert_usage_error(result, *fragments: str) -> None:
    assert result.exit_code == EXIT_USAGE, (result.exit_code, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["dequantize", "m", "o", "--dtype", "int8"], "'int8' is not one of"),
        (["dequantize", "m", "o", "--no-such-flag"], "No such option: --no-such-flag"),
        (["dequantize", "m"], "Missing argument 'OUTPUT_DIR'"),
        (["repack", "m", "o", "extra"], "unexpected extra argument"),
        (["frobnicate"], "No such command 'frobnicate'"),
        (["gemv", "--shape", "256x64", "--device", "cpu", "--batch", "0"], "--batch"),
        (["gemv", "--shape", "256x64", "--device", "cpu", "--batch", "2000000000"], "--batch"),
        (["gemv", "--shape", "256x64", "--device", "cpu", "--group", "0"], "--group 0"),
        (["gemv", "--shape", "256x64", "--device", "cpu", "--group", "-32"], "--group -32"),
        (["gemv", "--shape", "256x64", "--device", "cpu", "--group", "16"], "--group 16"),
        (["gemv", "--shape", "256x64", "--device", "cpu", "--seed", "99999999999999999999999"], "--seed"),
        (["bench", "--shape", "4096x4096", "--batch", "2000000000"], "--batch"),
        (["verify", "--seed", "-1"], "--seed"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(w4, args, fragment):
    assert_usage_error(w4(*args), fragment)


def test_empty_model_or_output_is_refused_not_the_current_directory(tmp_path, w4, monkeypatch):
    src = small_model().write(tmp_path / "src")
    monkeypatch.chdir(src)  # "" must not mean this directory
    assert_usage_error(w4("dequantize", "", tmp_path / "out"), "MODEL", "empty")
    assert_usage_error(w4("dequantize", src, ""), "OUTPUT_DIR", "empty")
    assert_usage_error(w4("repack", src, ""), "OUTPUT_DIR", "empty")
    assert_usage_error(w4("verify", ""), "empty")
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in src.iterdir()) == ["config.json", "model.safetensors"]


@pytest.mark.parametrize("command, option", [
    (["dequantize", "m", "o"], "--json"),
    (["repack", "m", "o"], "--json"),
    (["gemv", "--shape", "256x64", "--device", "cpu"], "--json"),
    (["bench", "--shape", "4096x4096"], "--json"),
    (["verify", "--quick"], "--json"),
    (["verify", "--quick"], "--junit"),
])
def test_report_files_that_cannot_be_written_are_refused_first(tmp_path, w4, monkeypatch, command, option):
    from w4cli.gpu import kernels

    ran = []
    monkeypatch.setattr(kernels, "probe", lambda: ran.append("bench") or (False, "no GPU"))
    for path, fragment in [(tmp_path / "missing" / "r.json", "not a directory"), (tmp_path, "is a directory"),
                           ("/dev/full", "No space left")]:
        result = w4(*command, option, path)
        assert_usage_error(result, option, fragment)
        assert result.stdout == ""
    assert not ran and not (tmp_path / "missing").exists()


def test_usage_error_from_the_console_script_is_the_same_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "w4cli", "dequantize", "m", "o", "--dtype", "int8"],
                            capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == EXIT_USAGE
    assert result.stderr.splitlines() == [
        "error: Invalid value for '--dtype': 'int8' is not one of 'float16', 'bfloat16', 'float32', 'fp16', 'bf16', "
        "'fp32', 'auto'. (see python -m w4cli dequantize --help)"
    ]


def test_help_and_version_import_no_torch(tmp_path):
    """`w4 --help`, `w4 COMMAND --help` and `w4 --version` stay fast because nothing heavy is
    imported until a command runs."""
    probe = """
import sys
from typer.testing import CliRunner
from w4cli.cli import app
heavy = ("torch", "safetensors", "huggingface_hub", "numpy")
assert not [m for m in heavy if m in sys.modules], "import w4cli.cli"
for args in (["--help"], ["--version"], ["dequantize", "--help"], ["repack", "--help"], ["gemv", "--help"],
             ["bench", "--help"], ["verify", "--help"]):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, (args, result.output)
    loaded = [m for m in heavy if m in sys.modules]
    assert not loaded, (args, loaded)
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


@pytest.mark.parametrize("command", ["dequantize", "repack", "gemv", "bench", "verify"])
def test_help_ends_with_the_commands_examples(w4, command):
    import importlib

    result = w4(command, "--help")
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    assert "Examples:" in text
    for line in importlib.import_module(f"w4cli.commands.{command}").EXAMPLES:
        assert " ".join(line.split()) in text, line


def test_json_without_a_file_is_a_usage_error(w4):
    assert_usage_error(w4("gemv", "--shape", "256x64", "--json"), "--json", "requires an argument")


def test_json_to_stdout_on_a_usage_error_still_prints_a_document(w4):
    result = w4("dequantize", "m", "o", "--json", "-", "--dtype", "int8")
    assert_usage_error(result, "--dtype")
    doc = json.loads(result.stdout)
    assert doc["ok"] is False and doc["exit_code"] == EXIT_USAGE and "int8" in doc["error"]
