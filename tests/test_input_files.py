"""What w4 reads of a checkpoint: only regular files inside it, JSON within limits, safetensors
headers without duplicate names, and in time linear in the number of tensors. Each test builds
the hostile input a stranger's checkpoint could hold."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.awq_builder import install_hub_cache, small_model
from w4cli.errors import EXIT_FAILED, EXIT_REFUSED

REPO = "org/tiny-awq"


def one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    return lines[0]


def assert_refused(result, out: Path, *fragments: str) -> None:
    assert result.exit_code == EXIT_REFUSED, (result.exit_code, result.stderr)
    line = one_error_line(result)
    for fragment in fragments:
        assert fragment in line, line
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if ".w4tmp-" in p.name]


def run_w4(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    """The real command in a fresh interpreter: a hang becomes a test failure, not a stuck suite."""
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", **env}
    return subprocess.run([sys.executable, "-m", "w4cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=environment)


@pytest.fixture
def secret(tmp_path) -> Path:
    """A file outside every checkpoint, readable by its owner only."""
    path = tmp_path / "elsewhere" / "secret.txt"
    path.parent.mkdir()
    path.write_text("root:x:0:0:the contents of a file outside the checkpoint\n")
    path.chmod(0o640)
    return path


# -- symlinks that leave the checkpoint ------------------------------------------------------------

@pytest.mark.parametrize("name", ["tokenizer.json", "config.json", "model.safetensors", "generation_config.json"])
def test_symlink_out_of_a_local_checkpoint_is_refused(tmp_path, w4, secret, name):
    src = small_model().write(tmp_path / "src")
    (src / name).unlink(missing_ok=True)
    (src / name).symlink_to(secret)
    result = w4("dequantize", src, tmp_path / "out", "--device", "cpu")
    assert_refused(result, tmp_path / "out", name, "outside the checkpoint")


def test_symlink_out_of_a_hub_snapshot_is_refused(tmp_path, w4, secret):
    files = small_model().write(tmp_path / "files")
    cache = tmp_path / "hub"
    commit = install_hub_cache(cache, REPO, files)
    snapshot = cache / "models--org--tiny-awq" / "snapshots" / commit
    (snapshot / "tokenizer.json").symlink_to(secret)
    result = w4("dequantize", REPO, tmp_path / "out", "--cache-dir", cache, "--device", "cpu")
    assert_refused(result, tmp_path / "out", "tokenizer.json", "outside the checkpoint")


@pytest.mark.parametrize("ref", ["../../../evil", "/etc", "main"])
@pytest.mark.parametrize("command", ["dequantize", "verify"])
def test_a_cache_ref_that_is_not_a_commit_is_refused(tmp_path, w4, ref, command):
    """refs/main names the snapshot huggingface_hub answers from the cache; a path there would take
    it outside the cache, where a checkpoint waits to be read in place of the one asked for."""
    files = small_model().write(tmp_path / "files")
    cache = tmp_path / "cache" / "hub"
    install_hub_cache(cache, REPO, files)
    small_model(seed=1).write(tmp_path / "evil")  # where "../../../evil" leads from snapshots/
    (cache / "models--org--tiny-awq" / "refs" / "main").write_text(ref)
    args = ["dequantize", REPO, tmp_path / "out", "--device", "cpu"] if command == "dequantize" else ["verify", REPO]
    result = w4(*args, "--cache-dir", cache)
    assert_refused(result, tmp_path / "out", "refs/main", repr(ref), "not a commit hash")


def test_a_cache_ref_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    files = small_model().write(tmp_path / "files")
    cache = tmp_path / "hub"
    install_hub_cache(cache, REPO, files)
    ref = cache / "models--org--tiny-awq" / "refs" / "main"
    ref.unlink()
    os.mkfifo(ref)
    result = run_w4("verify", REPO, "--cache-dir", cache, timeout=60)
    assert result.returncode == EXIT_REFUSED, result.stderr
    assert "refs/main is a FIFO" in one_error_line(result)


def test_symlinks_into_the_repos_own_blobs_are_read(tmp_path, w4):
    """The Hub cache is made of links from snapshots/ into blobs/: they are the checkpoint."""
    files = small_model().write(tmp_path / "files", extra_files={"tokenizer.json": "{\"v\": 1}"})
    cache = tmp_path / "hub"
    install_hub_cache(cache, REPO, files)
    result = w4("dequantize", REPO, tmp_path / "out", "--cache-dir", cache, "--device", "cpu")
    assert result.exit_code == 0, result.stderr
    out = tmp_path / "out" / "tokenizer.json"
    assert not out.is_symlink() and out.read_text() == "{\"v\": 1}"


def test_symlink_inside_a_local_checkpoint_is_followed(tmp_path, w4):
    src = small_model().write(tmp_path / "src", extra_files={"tokenizer_real.json": "{\"v\": 2}"})
    (src / "tokenizer.json").symlink_to("tokenizer_real.json")
    result = w4("dequantize", src, tmp_path / "out", "--device", "cpu")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "out" / "tokenizer.json").read_text() == "{\"v\": 2}"


def test_copied_files_get_the_users_mode_not_the_sources(tmp_path, w4):
    src = small_model().write(tmp_path / "src", extra_files={"tokenizer.json": "{}"})
    (src / "tokenizer.json").chmod(0o600)
    result = w4("dequantize", src, tmp_path / "out", "--device", "cpu")
    assert result.exit_code == 0, result.stderr
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "out" / "tokenizer.json").stat().st_mode) == 0o666 & ~umask


# -- files that are not regular files ----------------------------------------------------------------

def test_fifo_as_config_json_is_refused_not_waited_on(tmp_path):
    src = small_model().write(tmp_path / "src")
    (src / "config.json").unlink()
    os.mkfifo(src / "config.json")
    result = run_w4("dequantize", src, tmp_path / "out", "--device", "cpu", timeout=60)
    assert result.returncode == EXIT_REFUSED, result.stderr
    assert "config.json is a FIFO" in one_error_line(result)


@pytest.mark.parametrize("name", ["tokenizer.json", "config.json"])
def test_dev_zero_behind_a_symlink_is_refused(tmp_path, name):
    src = small_model().write(tmp_path / "src")
    (src / name).unlink(missing_ok=True)
    (src / name).symlink_to("/dev/zero")
    result = run_w4("dequantize", src, tmp_path / "out", "--device", "cpu", timeout=60)
    assert result.returncode == EXIT_REFUSED, result.stderr
    assert name in one_error_line(result)
    assert not (tmp_path / "out").exists()


def test_directory_named_like_a_weight_file_is_refused(tmp_path, w4):
    src = small_model().write(tmp_path / "src")
    (src / "extra.safetensors").mkdir()
    result = w4("dequantize", src, tmp_path / "out", "--device", "cpu")
    assert result.exit_code == EXIT_REFUSED
    assert "extra.safetensors is a directory" in one_error_line(result)


# -- JSON limits -------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "text, why",
    [
        ("[" * 200_000 + "]" * 200_000, "nested deeper"),
        ('{"a": ' * 100 + "1" + "}" * 100, "nested deeper"),
        ('{"vocab_size": ' + "9" * 5000 + "}", "digits"),
        ("\xff\xfe{}", "not UTF-8"),
    ],
    ids=["200000-deep", "100-deep", "5000-digit-integer", "not-utf8"],
)
def test_hostile_json_is_not_valid_json(tmp_path, w4, text, why):
    src = small_model().write(tmp_path / "src")
    (src / "config.json").write_bytes(text.encode("latin-1"))
    result = w4("dequantize", src, tmp_path / "out", "--device", "cpu")
    assert_refused(result, tmp_path / "out", "config.json is not valid JSON", why)


def test_hostile_index_json_is_not_valid_json(tmp_path, w4):
    ckpt = small_model()
    src = ckpt.write(tmp_path / "src", shards={"model-00001-of-00001.safetensors": list(ckpt.all_tensors())})
    (src / "model.safetensors.index.json").write_text('{"weight_map": ' + "[" * 100_000 + "]" * 100_000 + "}")
    result = w4("verify", src)
    assert result.exit_code == EXIT_FAILED, result.stderr
    assert "files and index: model.safetensors.index.json is not valid JSON: nested deeper" in one_error_line(result)


# -- safetensors headers -----------------------------------------------------------------------------

def write_raw_safetensors(path: Path, header_json: str, data: bytes) -> None:
    header = header_json.encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(len(header).to_bytes(8, "little") + header + data)


def test_duplicate_tensor_name_in_a_header_is_refused(tmp_path, w4):
    """Both entries cover the same bytes, so the file passes the library's offset checks and the
    library keeps the last entry: the same name would mean two different tensors."""
    src = small_model().write(tmp_path / "src")
    norm = "model.layers.0.input_layernorm.weight"
    entry = '"%s": {"dtype": "%s", "shape": [4], "data_offsets": [0, 8]}'
    header = "{" + entry % (norm, "F16") + ", " + entry % (norm, "BF16") + "}"
    write_raw_safetensors(src / "extra.safetensors", header, torch.ones(4).half().numpy().tobytes())
    result = w4("dequantize", src, tmp_path / "out", "--device", "cpu")
    assert_refused(result, tmp_path / "out", "extra.safetensors", norm, "twice")


def test_tensor_data_read_back_at_its_own_offsets(tmp_path, w4):
    """Positioned reads: every tensor of a multi-tensor shard comes back with its own bytes."""
    from w4cli.read.checkpoint import open_checkpoint

    ckpt = small_model()
    src = ckpt.write(tmp_path / "src")
    checkpoint = open_checkpoint(src)
    for name, expected in ckpt.all_tensors().items():
        got = checkpoint.read_one(name)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert torch.equal(got.view(torch.uint8) if got.dtype != torch.bool else got,
                           expected.contiguous().view(torch.uint8) if got.dtype != torch.bool else expected)
    checkpoint.close()


# -- scale -------------------------------------------------------------------------------------------

def test_twenty_thousand_tensors_convert_in_linear_time(tmp_path):
    """Reading a tensor must not re-parse its shard's header (which lists every tensor): that made
    conversion quadratic, 95 s for 10k extra tensors. Linear, 20k take a few seconds here."""
    ckpt = small_model()
    for i in range(20_000):
        ckpt.plain[f"model.extra.{i}.weight"] = torch.full((4,), float(i % 1000)).half()
    src = ckpt.write(tmp_path / "src")
    start = time.perf_counter()
    result = run_w4("dequantize", src, tmp_path / "out", "--device", "cpu", timeout=90)
    assert result.returncode == 0, result.stderr
    assert time.perf_counter() - start < 60


# -- model card and license ---------------------------------------------------------------------------

LICENSE_FILES = {
    "README.md": "---\nlicense: llama3\n---\n# A model card\n",
    "LICENSE": "LLAMA 3 COMMUNITY LICENSE AGREEMENT\n",
    "LICENSE.txt": "a second license text\n",
    "NOTICE": "Notice: attribution\n",
    "USE_POLICY.md": "# Acceptable use\n",
}


def test_model_card_and_license_files_are_copied_unchanged(tmp_path, w4):
    src = small_model().write(tmp_path / "src", extra_files=LICENSE_FILES)
    result = w4("dequantize", src, tmp_path / "out", "--device", "cpu")
    assert result.exit_code == 0, result.stderr
    for name, text in LICENSE_FILES.items():
        assert (tmp_path / "out" / name).read_text() == text, name


def test_model_card_and_license_come_from_the_hub_too(tmp_path, w4):
    files = small_model().write(tmp_path / "files", extra_files=LICENSE_FILES)
    cache = tmp_path / "hub"
    install_hub_cache(cache, REPO, files)
    result = w4("dequantize", REPO, tmp_path / "out", "--cache-dir", cache, "--device", "cpu")
    assert result.exit_code == 0, result.stderr
    for name, text in LICENSE_FILES.items():
        assert (tmp_path / "out" / name).read_text() == text, name


# -- no network ----------------------------------------------------------------------------------------

def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_unreachable_hub_and_uncached_repo_fail_fast_in_one_line(tmp_path):
    endpoint = f"http://127.0.0.1:{closed_port()}"
    start = time.perf_counter()
    result = run_w4("dequantize", "org/not-cached", tmp_path / "out", "--cache-dir", tmp_path / "hub",
                    timeout=60, HF_HUB_OFFLINE="0", HF_ENDPOINT=endpoint)
    elapsed = time.perf_counter() - start
    assert result.returncode == EXIT_FAILED, result.stderr
    line = one_error_line(result)
    assert "not in the local cache and the Hub cannot be reached" in line
    assert "HF_HUB_OFFLINE=1" in line
    assert "Retry" not in result.stderr
    assert elapsed < 15, elapsed  # interpreter start and imports included; the retries took 26 s


def test_unreachable_hub_uses_the_cached_snapshot(tmp_path):
    files = small_model().write(tmp_path / "files")
    cache = tmp_path / "hub"
    install_hub_cache(cache, REPO, files)
    endpoint = f"http://127.0.0.1:{closed_port()}"
    start = time.perf_counter()
    result = run_w4("dequantize", REPO, tmp_path / "out", "--cache-dir", cache, "--device", "cpu",
                    timeout=60, HF_HUB_OFFLINE="0", HF_ENDPOINT=endpoint)
    assert result.returncode == 0, result.stderr
    assert "Retry" not in result.stderr
    assert time.perf_counter() - start < 15
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "llama"
