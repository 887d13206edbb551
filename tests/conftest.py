"""Shared fixtures. Tests never touch the network: the Hub is an offline cache built per test."""

from __future__ import annotations

import os

# huggingface_hub reads these at import time, so they are set before anything imports it
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import pytest  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from w4cli.cli import app  # noqa: E402


@pytest.fixture
def w4():
    """Run `w4 ARGS...` in process; returns the click Result (exit_code, stdout, stderr)."""
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)

    return invoke
