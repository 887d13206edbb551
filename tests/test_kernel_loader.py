"""CPU tests of the kernel loader (w4cli/gpu/kernels.py): no CUDA, no nvcc, nothing compiled."""

from __future__ import annotations

import importlib
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from w4cli.gpu import kernels
from w4cli.errors import EXIT_ENVIRONMENT, EnvironmentUnavailable

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(kernels, "_module", None)


@pytest.fixture
def fake_gpu_no_nvcc(monkeypatch):
    from torch.utils import cpp_extension

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    monkeypatch.setattr(kernels, "_module", None)


def test_probe_without_gpu_is_false_with_reason(no_gpu):
    ok, reason = kernels.probe()
    assert ok is False
    assert "CUDA" in reason or "GPU" in reason


def test_load_without_gpu_raises_environment_unavailable(no_gpu):
    with pytest.raises(EnvironmentUnavailable) as info:
        kernels.load()
    assert info.value.exit_code == EXIT_ENVIRONMENT
    assert "\n" not in str(info.value) and str(info.value)


def test_without_nvcc(fake_gpu_no_nvcc):
    ok, reason = kernels.probe()
    assert ok is False and "nvcc" in reason
    with pytest.raises(EnvironmentUnavailable, match="nvcc"):
        kernels.load()


def test_old_gpu_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla T4")
    monkeypatch.setattr(kernels, "_module", None)
    ok, reason = kernels.probe()
    assert not ok and "8.0" in reason
    with pytest.raises(EnvironmentUnavailable, match="7.5"):
        kernels.load()


def test_probe_never_raises(monkeypatch):
    def boom():
        raise RuntimeError("driver exploded")

    monkeypatch.setattr(torch.cuda, "is_available", boom)
    monkeypatch.setattr(kernels, "_module", None)
    ok, reason = kernels.probe()
    assert ok is False and "driver exploded" in reason


def test_dequantize_without_gpu_raises_environment(no_gpu):
    q = torch.zeros(32, 1, dtype=torch.int32)
    with pytest.raises(EnvironmentUnavailable):
        kernels.dequantize_awq(q, q[:1], torch.ones(1, 8, dtype=torch.float16))


def test_import_builds_nothing(tmp_path):
    """Importing w4cli.gpu.kernels in a fresh interpreter must not build, compile or touch the cache."""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path), PYTHONPATH=str(ROOT))
    code = (
        "import sys, w4cli.gpu.kernels as k; "
        "assert k._module is None; "
        "assert 'torch.utils.cpp_extension' not in sys.modules or True; "
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "w4").exists()


def test_cache_root_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert kernels.cache_root() == tmp_path / "w4" / "kernels"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert kernels.cache_root() == Path(os.path.expanduser("~")) / ".cache" / "w4" / "kernels"


def _copy_kernels(tmp_path: Path) -> Path:
    d = tmp_path / "kernels"
    shutil.copytree(ROOT / "kernels", d)
    return d


def test_cache_key_changes_with_sources(tmp_path):
    d = _copy_kernels(tmp_path)
    k1 = kernels.cache_key("90", d)
    assert k1 == kernels.cache_key("90", d)  # stable
    (d / "dequant_w4_awq.cu").write_text((d / "dequant_w4_awq.cu").read_text() + "\n// edit\n")
    k2 = kernels.cache_key("90", d)
    assert k2 != k1
    (d / "int4_convert.cuh").write_text((d / "int4_convert.cuh").read_text() + "\n")
    assert kernels.cache_key("90", d) != k2  # headers count too
    (d / "new_kernel.cu").write_text("// new\n")
    assert kernels.cache_key("90", d) not in (k1, k2)


def test_cache_key_changes_with_arch_and_toolchain(tmp_path):
    d = _copy_kernels(tmp_path)
    assert kernels.cache_key("90", d) != kernels.cache_key("80", d)
    assert kernels.cache_key("90", d, "nvcc 13.0") != kernels.cache_key("90", d, "nvcc 12.8")


def test_build_sources_globs_every_cu():
    names = [p.name for p in kernels.build_sources()]
    assert names[0] == "ops.cpp"
    assert "dequant_w4_awq.cu" in names
    assert all(n.endswith(".cu") for n in names[1:])


def test_stale_torch_lock_is_removed_under_our_lock(tmp_path):
    build = tmp_path / "build"
    build.mkdir()
    (build / "lock").write_text("")  # what a build killed halfway leaves behind
    with kernels._BuildLock(tmp_path / "k.lock", timeout=5):
        assert kernels.remove_stale_torch_lock(build) is True
    assert not (build / "lock").exists()
    with kernels._BuildLock(tmp_path / "k.lock", timeout=5):
        assert kernels.remove_stale_torch_lock(build) is False


def _hold_lock_then_die(path: str, ready) -> None:
    lock = kernels._BuildLock(Path(path), timeout=5)
    lock.__enter__()
    ready.set()
    time.sleep(60)  # killed long before this ends


def test_lock_of_a_killed_process_is_released(tmp_path):
    """A build killed while holding our lock must not block the next one (flock dies with the process)."""
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    p = ctx.Process(target=_hold_lock_then_die, args=(str(tmp_path / "k.lock"), ready))
    p.start()
    try:
        assert ready.wait(20)
        with pytest.raises(EnvironmentUnavailable, match="build lock"):
            with kernels._BuildLock(tmp_path / "k.lock", timeout=0.5, poll=0.05):
                pass
    finally:
        p.kill()
        p.join(10)
    t0 = time.monotonic()
    with kernels._BuildLock(tmp_path / "k.lock", timeout=5, poll=0.05):
        pass
    assert time.monotonic() - t0 < 2


def test_load_removes_stale_lock_before_building(tmp_path, monkeypatch):
    """load() path up to the build: with a leftover torch lock it must not hang (torch would wait forever)."""
    from torch.utils import cpp_extension

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(kernels, "_module", None)
    monkeypatch.setattr(kernels, "_nvcc_path", lambda: "/fake/nvcc")
    monkeypatch.setattr(kernels, "_nvcc_version", lambda nvcc: "fake")
    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: True)
    key = kernels.cache_key("90a", nvcc_version="fake")  # compute capability 9.0 builds sm_90a (wgmma)
    build = kernels.cache_root() / key
    build.mkdir(parents=True)
    (build / "lock").write_text("")
    seen = {}

    def fake_jit(name, build_dir, flags):
        seen["lock_present"] = (Path(build_dir) / "lock").exists()
        seen["flags"] = flags
        raise RuntimeError("Error building extension: nvcc said no\nline 2")

    monkeypatch.setattr(kernels, "_jit_load", fake_jit)
    with pytest.raises(EnvironmentUnavailable) as info:
        kernels.load()
    msg = str(info.value)
    assert seen["lock_present"] is False
    assert "-gencode=arch=compute_90a,code=sm_90a" in seen["flags"]
    assert not any("fast_math" in f for f in seen["flags"])
    assert "\n" not in msg and "build.log" in msg
    log = build / "build.log"
    assert "nvcc said no" in log.read_text()


def test_module_reimports_cleanly():
    importlib.reload(kernels)
    assert kernels._module is None


def test_gemv_paths_by_batch_size_and_shape():
    from w4cli.gpu import kernels
    from w4cli.gpu.contract import (BATCH_CHUNKED_MAX_M, BATCH_MAX_M, GEMV_MAX_M, GEMV_TILE_M, TINY_LAYER_DEQUANT_M,
                                    WGMMA_MIN_M, WGMMA_OVER_GEMV_M, WGMMA_SMALL_M_LAYER, WS_MAX_M, WS_MIN_M)

    big, small, medium = (8192, 8192), (4096, 1024), (4096, 4096)
    assert not kernels.has_wgmma()  # no CUDA GPU here: the machine's own answer is the mma.sync table
    for wgmma in (False, True):
        assert kernels.gemv_path(GEMV_TILE_M, *big, wgmma=wgmma) == "gemv"
        assert kernels.gemv_path(GEMV_TILE_M + 1, *big, wgmma=wgmma) == "batch"
        for m in (GEMV_TILE_M + 1, GEMV_MAX_M):  # latency-bound layers: the GEMV's token tiles
            assert kernels.gemv_path(m, *small, wgmma=wgmma) == "gemv"
        # medium layers: the GEMV's two token tiles, on Hopper until the wgmma kernel overtakes it
        last_gemv_m = WGMMA_OVER_GEMV_M - 1 if wgmma else 2 * GEMV_TILE_M
        for shape in (medium, (4096, 6144)):
            assert kernels.gemv_path(last_gemv_m, *shape, wgmma=wgmma) == "gemv"
            assert kernels.gemv_path(last_gemv_m + 1, *shape, wgmma=wgmma) == ("wgmma" if wgmma else "batch")
        assert kernels.gemv_path(last_gemv_m + 1, 4096, 6144 + 8, wgmma=wgmma) != "gemv"  # past the medium layers
        assert kernels.gemv_path(WGMMA_MIN_M - 1, *big, wgmma=wgmma) == "batch"
    assert kernels.gemv_path(GEMV_MAX_M + 1, *small, wgmma=False) == "batch"
    assert kernels.gemv_path(BATCH_MAX_M, *big, wgmma=False) == "batch"
    assert kernels.gemv_path(BATCH_MAX_M + 1, *big, wgmma=False) == "batch x2"
    assert kernels.gemv_path(BATCH_CHUNKED_MAX_M + 1, *big, wgmma=False) == "dequant+cuBLAS"
    assert kernels.gemv_path(BATCH_CHUNKED_MAX_M + 1, *big) == "dequant+cuBLAS"
    assert kernels.gemv_path(WGMMA_MIN_M, 4096, 6144, wgmma=True) == "wgmma"
    assert kernels.gemv_path(GEMV_MAX_M + 1, *small, wgmma=True) == "wgmma ws"
    assert kernels.gemv_path(WS_MIN_M - 1, *big, wgmma=True) == "wgmma"
    assert kernels.gemv_path(WS_MIN_M, *big, wgmma=False) == "batch"
    # Hopper at M = 9-16: the wgmma kernel on layers under WGMMA_SMALL_M_LAYER weights, mma.sync from it
    for m in (GEMV_TILE_M + 1, 2 * GEMV_TILE_M):
        for shape in ((14336, 4096), (4096, 14336)):
            assert kernels.gemv_path(m, *shape, wgmma=True) == "wgmma"
            assert kernels.gemv_path(m, *shape, wgmma=False) == "batch"
        for shape in (big, (4096, 28672)):
            assert big[0] * big[1] == WGMMA_SMALL_M_LAYER and kernels.gemv_path(m, *shape, wgmma=True) == "batch"
    wide = (4096, 14336)
    for m in (WS_MIN_M, 1025, 4096, WS_MAX_M):  # one launch at any M, on every layer but the tiny ones
        for shape in (big, wide, medium):
            assert kernels.gemv_path(m, *shape, wgmma=True) == "wgmma ws"
    for wgmma in (False, True):  # k_proj-sized layers fill too few SMs from 64 rows on
        assert kernels.gemv_path(TINY_LAYER_DEQUANT_M - 1, *small, wgmma=wgmma) != "dequant+cuBLAS"
        assert kernels.gemv_path(TINY_LAYER_DEQUANT_M, *small, wgmma=wgmma) == "dequant+cuBLAS"
        assert kernels.gemv_path(TINY_LAYER_DEQUANT_M, *medium, wgmma=wgmma) != "dequant+cuBLAS"


def test_long_layers_take_the_wgmma_kernel_up_to_its_last_row():
    from w4cli.gpu import kernels
    from w4cli.gpu.contract import WGMMA_MIN_M, WS_MIN_M

    # Llama-3-70B's down_proj (224 k-blocks, 32 row blocks of 256) and a layer of 65 k-blocks: the
    # barrier wgmma kernel from WGMMA_MIN_M rows to the warp-specialised kernel's first
    for down in ((28672, 8192), (8320, 8200)):
        assert kernels.gemv_path(WGMMA_MIN_M - 1, *down, wgmma=True) == "batch"
        for m in (WGMMA_MIN_M, 24, 25, WS_MIN_M - 1):
            assert kernels.gemv_path(m, *down, wgmma=True) == "wgmma"
            assert kernels.gemv_path(m, *down, wgmma=False) == "batch"
        assert kernels.gemv_path(WS_MIN_M, *down, wgmma=True) == "wgmma ws"
