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


def pytest_collection_modifyitems(config, items):
    """Tests marked gpu are skipped, saying why, where torch sees no CUDA GPU (`make test-gpu` runs
    them on the GPU machine)."""
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_tests:
        return
    import torch

    if not torch.cuda.is_available():
        for item in gpu_tests:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))


@pytest.fixture(scope="session")
def kernels():
    """w4cli.gpu.kernels with the extension built and loaded: the first GPU test that asks pays the build."""
    from w4cli.gpu import kernels as k

    k.load()
    return k
