"""kernels/check.sh's report: one line per kernel file and arch unless V=1, and a failure printed in
full. nvcc is replaced by a script that replays a ptxas log captured from the real one
(tests/data/ptxas/, gemv_w4a16.cu for sm_90), so this runs on any machine with bash."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOG = ROOT / "tests" / "data" / "ptxas" / "gemv_w4a16.sm_90.log"
KERNELS_IN_LOG = 4
FAKE_NVCC = """#!/usr/bin/env bash
cat "$PTXAS_LOG"
exit "${NVCC_EXIT:-0}"
"""


@pytest.fixture
def check(tmp_path):
    """Run a copy of check.sh over two .cu files with the replaying nvcc; returns (exit, lines)."""
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    shutil.copy(ROOT / "kernels" / "check.sh", kernels / "check.sh")
    for name in ("a.cu", "b.cu"):
        (kernels / name).write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvcc").write_text(FAKE_NVCC)
    (bin_dir / "nvcc").chmod(0o755)

    def run(log_text: str, nvcc_exit: int = 0, verbose: str = ""):
        log = tmp_path / "ptxas.log"
        log.write_text(log_text)
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PTXAS_LOG": str(log),
               "NVCC_EXIT": str(nvcc_exit), "V": verbose}
        result = subprocess.run(["bash", str(kernels / "check.sh")], capture_output=True, text=True, env=env)
        return result.returncode, result.stdout.splitlines()

    return run


def test_one_line_per_file_and_arch(check):
    code, lines = check(LOG.read_text())
    assert code == 0
    assert len(lines) == 2 * 3 + 1, lines
    assert lines[:3] == [
        f"a.cu                 sm_80  {KERNELS_IN_LOG} kernels, registers max 128, spills 0 bytes",
        f"a.cu                 sm_90  {KERNELS_IN_LOG} kernels, registers max 128, spills 0 bytes",
        f"a.cu                 sm_90a  {KERNELS_IN_LOG} kernels, registers max 128, spills 0 bytes",
    ]
    assert lines[-1] == "check.sh: all kernels compiled for sm_80 90 90a, no spills"


def test_v1_lists_every_kernel(check):
    code, lines = check(LOG.read_text(), verbose="1")
    assert code == 0
    assert len(lines) == 2 * 3 * KERNELS_IN_LOG + 1, lines
    assert sum("128 registers" in line for line in lines) == 2 * 3


def test_a_spill_fails_and_is_shown_in_full(check):
    text = LOG.read_text()
    spilled = text.replace("0 bytes spill stores, 0 bytes spill loads", "8 bytes spill stores, 12 bytes spill loads", 1)
    code, lines = check(spilled)
    assert code == 1
    assert "a.cu                 sm_80  4 kernels, registers max 128, spills 20 bytes" in lines
    assert "FAIL spills in a.cu sm_80:" in lines
    assert any("8 bytes spill stores, 12 bytes spill loads" in line for line in lines)
    assert any("Function properties for" in line for line in lines)  # the lines above it, as ptxas wrote them


def test_a_failed_compile_prints_the_whole_log(check):
    log = "kernels/a.cu(12): error: identifier \"x\" is undefined\n" + "note: detail\n" * 30
    code, lines = check(log, nvcc_exit=2)
    assert code == 1
    assert lines[0] == "FAIL compile a.cu sm_80"
    assert lines.count("note: detail") == 30 * 6  # 2 files x 3 archs


# ptxas's words when it serialises a kernel's wgmmas, under two of its codes (the C7515 line is the
# one a one-segment `break` in the warp-specialised kernel's MMA loop drew, sm_90a, CUDA 13.0)
SERIALIZED = {
    "C7515": "ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized due "
             "to non wgmma instructions defining accumulator registers of a wgmma between start and end of the "
             "pipeline stage in the function '_Z6kernelv'",
    "C7513": "ptxas info    : (C7513) Potential Performance Loss: wgmma.mma_async instructions are serialized due "
             "to the presence of Extern calls in the function '_Z6kernelv'",
}


@pytest.mark.parametrize("code_name", sorted(SERIALIZED))
def test_serialized_wgmma_fails_whatever_its_code(check, code_name):
    code, lines = check(LOG.read_text() + SERIALIZED[code_name] + "\n")
    assert code == 1
    assert "FAIL serialized wgmma in a.cu sm_80:" in lines
    assert any(f"({code_name})" in line for line in lines)
