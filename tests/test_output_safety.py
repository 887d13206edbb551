"""OUTPUT_DIR is written only where it was asked and nothing is ever lost: a directory that appears
during the run is never replaced, concurrent runs exclude each other, --force replaces only a
checkpoint, stop signals (INT, TERM, HUP) at any moment end in one line and exit 130 with nothing
left behind, and a bad output path or a full disk is one clear line.

Signals, locks and crashes are exercised on real `python -m w4cli` processes."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.awq_builder import Checkpoint, random_layer, small_model
from w4cli.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_REFUSED

REPO = Path(__file__).resolve().parents[1]
TEMP = ".w4tmp-"


def slow_model(directory: Path) -> Path:
    """Big enough that a CPU dequantize to float32 in 1 MB shards writes for about a second: time
    to signal a run, or to race it, while it writes."""
    layers = [random_layer(f"model.layers.{i}.mlp.up_proj", 1024, 1024, 128, seed=i) for i in range(8)]
    return Checkpoint(layers, group_size=128).write(directory)


SLOW_ARGS = ("--device", "cpu", "--dtype", "float32", "--max-shard-size", "1MB")


def start_w4(*args, cwd: Path, ignored: tuple[int, ...] = ()) -> subprocess.Popen:
    """`python -m w4cli ARGS` as a terminal starts it: every stop signal at its default, whatever this
    test process inherited (a suite run under nohup, or as a background job, ignores HUP or INT, and
    w4 keeps what its parent ignores), except those in `ignored`."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}

    def dispositions() -> None:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN if signum in ignored else signal.SIG_DFL)

    return subprocess.Popen(
        [sys.executable, "-m", "w4cli", *map(str, args)], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=dispositions,
    )


def wait_for(proc: subprocess.Popen, condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"w4 ended (exit {proc.returncode}) before {what}: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


def temps(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(out.name + TEMP))


def writing_a_shard(out: Path):
    return lambda: any(out.parent.glob(f"{out.name}{TEMP}*/model-*.safetensors"))


def writing_run(tmp_path: Path, ignored: tuple[int, ...] = ()) -> tuple[Path, Path, subprocess.Popen]:
    """A slow dequantize of a fresh model into tmp_path/out, returned once its first shard is being
    written: (source, out, the running process; `ignored`: as start_w4's)."""
    src = slow_model(tmp_path / "src")
    out = tmp_path / "out"
    proc = start_w4("dequantize", src, out, *SLOW_ARGS, cwd=tmp_path, ignored=ignored)
    wait_for(proc, writing_a_shard(out), "the first shard")
    return src, out, proc


def catches(pid: int, *signums: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
    return all(caught >> (signum - 1) & 1 for signum in signums)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def assert_complete(out: Path, dtype: torch.dtype) -> None:
    config = json.loads((out / "config.json").read_text())
    assert config["torch_dtype"] == str(dtype).removeprefix("torch.") and "quantization_config" not in config
    index = json.loads((out / "model.safetensors.index.json").read_text())
    tensors = {}
    for shard in set(index["weight_map"].values()):
        tensors.update(load_file(out / shard))
    assert tensors.keys() == index["weight_map"].keys()
    assert all(t.dtype == dtype for t in tensors.values())


@pytest.fixture(params=["renameat2", "nfs"])
def filesystem(request, monkeypatch):
    """The real renameat2, or one that answers EINVAL to its flags as NFS does, so that w4 falls
    back to rename(2) and moving the old directory aside."""
    if request.param == "nfs":
        import w4cli.write.rename as rename

        def nfs_renameat2(*args):
            ctypes.set_errno(errno.EINVAL)
            return -1

        monkeypatch.setattr(rename, "_renameat2", nfs_renameat2)
    return request.param


# --- a directory that appears at OUT, concurrent runs -------------------------------------------


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_a_directory_that_appears_at_out_during_the_run_is_never_replaced(tmp_path, w4, monkeypatch, filesystem, force):
    import w4cli.dequantize as dequantize

    src = small_model().write(tmp_path / "src")
    out = tmp_path / "out"
    real = dequantize.layer_weight

    def someone_creates_out(*args):
        # another program creates OUT and writes a file there while w4 converts
        if not out.exists():
            out.mkdir()
            (out / "notes.txt").write_text("mine")
        return real(*args)

    monkeypatch.setattr(dequantize, "layer_weight", someone_creates_out)
    result = w4("dequantize", src, out, "--device", "cpu", *(["--force"] if force else []))
    assert result.exit_code == EXIT_FAILED, result.stderr
    assert error_lines(result.stderr) == result.stderr.strip().splitlines()[-1:]
    assert "was created or changed by someone else during the conversion" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert (out / "notes.txt").read_text() == "mine"
    assert temps(out) == []


def test_three_runs_at_once_on_one_out_one_wins(tmp_path):
    src = slow_model(tmp_path / "src")
    out = tmp_path / "out"
    procs = [start_w4("dequantize", src, out, *SLOW_ARGS, cwd=tmp_path) for _ in range(3)]
    results = [(proc, *proc.communicate(timeout=300)) for proc in procs]
    winners = [proc for proc, _, _ in results if proc.returncode == EXIT_OK]
    assert len(winners) == 1, [(proc.returncode, stderr) for proc, _, stderr in results]
    for proc, _, stderr in results:
        if proc is winners[0]:
            continue
        # a run that starts while the winner writes is told who holds OUT; one that starts after
        # the winner finished finds OUT not empty
        assert (proc.returncode, error_lines(stderr)) in (
            (EXIT_FAILED, [f"error: OUTPUT_DIR {out} is being written by another w4 (pid {winners[0].pid})"]),
            (EXIT_REFUSED, [f"error: OUTPUT_DIR {out} is not empty (pass --force to replace it)"]),
        ), stderr
    assert_complete(out, torch.float32)
    assert temps(out) == []


def test_a_run_on_an_out_that_is_being_written_names_the_writer_and_leaves_it_alone(tmp_path, w4):
    src, out, writer = writing_run(tmp_path)
    second = w4("dequantize", src, out, "--force", "--device", "cpu")
    assert second.exit_code == EXIT_FAILED
    assert error_lines(second.stderr) == [f"error: OUTPUT_DIR {out} is being written by another w4 (pid {writer.pid})"]
    _, stderr = writer.communicate(timeout=300)
    assert writer.returncode == EXIT_OK, stderr
    assert_complete(out, torch.float32)
    assert temps(out) == []


# --- what --force may replace ---------------------------------------------------------------------


@pytest.mark.parametrize("where", ["cwd", "ancestor", "home"])
def test_force_never_replaces_the_current_directory_an_ancestor_or_home(tmp_path, w4, monkeypatch, where):
    src = small_model().write(tmp_path / "src")
    home = tmp_path / "home"
    cwd = tmp_path / "place" / "work"
    for directory in (home, cwd):
        directory.mkdir(parents=True)
        (directory / "keep.txt").write_text("mine")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    out = {"cwd": Path("."), "ancestor": Path(".."), "home": home}[where]
    result = w4("dequantize", src, out, "--force", "--device", "cpu")
    assert result.exit_code == EXIT_REFUSED, result.stderr
    assert len(error_lines(result.stderr)) == 1 and "w4 never replaces it" in result.stderr
    assert (home / "keep.txt").read_text() == "mine" and (cwd / "keep.txt").read_text() == "mine"
    assert not [p for p in tmp_path.rglob(f"*{TEMP}*")]


def test_force_never_replaces_the_root_directory(tmp_path, w4):
    src = small_model().write(tmp_path / "src")
    result = w4("dequantize", src, "/", "--force", "--device", "cpu")
    assert result.exit_code == EXIT_REFUSED
    assert error_lines(result.stderr) == ["error: OUTPUT_DIR / is the root directory: w4 never replaces it"]


def test_force_refuses_a_directory_that_holds_more_than_a_checkpoint_and_lists_it(tmp_path, w4):
    src = small_model().write(tmp_path / "src")
    out = tmp_path / "out"
    assert w4("dequantize", src, out, "--device", "cpu").exit_code == EXIT_OK
    (out / "data").mkdir()
    extras = ["data/", "notes.md", "run.sh", "train.py", "weights.bin", "x.csv", "y.csv"]
    for name in extras[1:]:
        (out / name).write_text("mine")
    before = sorted(p.name for p in out.iterdir())
    result = w4("dequantize", src, out, "--force", "--device", "cpu")
    assert result.exit_code == EXIT_REFUSED
    [line] = error_lines(result.stderr)
    assert line.endswith("would lose data/, notes.md, run.sh, train.py, weights.bin and 2 more"), line
    assert sorted(p.name for p in out.iterdir()) == before
    assert temps(out) == []


def test_force_refuses_a_directory_without_a_checkpoint(tmp_path, w4):
    src = small_model().write(tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    (out / "tokenizer.json").write_text("{}")  # a checkpoint file name, but no config.json and weights
    result = w4("dequantize", src, out, "--force", "--device", "cpu")
    assert result.exit_code == EXIT_REFUSED
    assert error_lines(result.stderr)[0].endswith("would lose tokenizer.json")
    assert (out / "tokenizer.json").read_text() == "{}"


def test_force_replaces_a_checkpoint_with_its_tokenizer_and_model_card(tmp_path, w4, filesystem):
    extra = {
        "tokenizer.json": "{}",
        "tokenizer_config.json": "{}",
        "generation_config.json": "{}",
        "special_tokens_map.json": "{}",
        "merges.txt": "",
        "tokenizer.model": "",
        "chat_template.jinja": "",
    }
    src = small_model().write(tmp_path / "src", extra_files=extra)
    out = tmp_path / "out"
    assert w4("dequantize", src, out, "--device", "cpu", "--dtype", "float32").exit_code == EXIT_OK
    for name in ("README.md", "LICENSE", "NOTICE", "USE_POLICY.md"):
        (out / name).write_text("card")
    result = w4("dequantize", src, out, "--force", "--device", "cpu")
    assert result.exit_code == EXIT_OK, result.stderr
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "float16"
    assert not (out / "README.md").exists()
    assert temps(out) == []


# --- stop signals ---------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_stop_signal_while_w4_starts_is_one_line_and_exit_130(tmp_path, signum):
    src = small_model().write(tmp_path / "src")
    proc = start_w4("dequantize", src, tmp_path / "out", cwd=tmp_path)
    # once TERM and HUP are caught, w4 is importing its command line (torch, typer): seconds
    wait_for(proc, lambda: catches(proc.pid, signal.SIGTERM, signal.SIGHUP), "w4 to handle TERM and HUP", timeout=30)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_INTERRUPTED, stderr
    assert stderr.splitlines() == ["error: interrupted"], stderr
    assert stdout == ""
    assert not (tmp_path / "out").exists() and temps(tmp_path / "out") == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_sigterm_and_sighup_while_writing_leave_nothing_behind(tmp_path, signum):
    src, out, proc = writing_run(tmp_path)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_INTERRUPTED, stderr
    assert error_lines(stderr) == [f"error: interrupted; OUTPUT_DIR {out} was not changed"], stderr
    assert "Traceback" not in stderr
    assert not out.exists()
    assert temps(out) == []


def test_a_hangup_the_parent_ignores_leaves_the_run_going(tmp_path):
    # `nohup w4 ...`: a hangup ignored before w4 started stays ignored, and the run completes
    src, out, proc = writing_run(tmp_path, ignored=(signal.SIGHUP,))
    proc.send_signal(signal.SIGHUP)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_OK, stderr
    assert_complete(out, torch.float32)
    assert temps(out) == []


def test_a_later_run_removes_what_a_killed_run_left_but_never_a_live_ones(tmp_path, w4):
    src, out, killed = writing_run(tmp_path)
    killed.kill()  # SIGKILL: no clean-up can run
    killed.communicate(timeout=60)
    left = temps(out)
    assert left
    live = tmp_path / f"out{TEMP}{os.getpid()}-0123abcd"  # this test's own pid: alive
    live.mkdir()
    (live / "model.safetensors").write_text("in use")
    result = w4("dequantize", src, out, "--device", "cpu")
    assert result.exit_code == EXIT_OK, result.stderr
    assert temps(out) == [live.name]
    assert (live / "model.safetensors").read_text() == "in use"
    # what the killed run left: its lock, and its output stamped with its pid
    assert f"out{TEMP}lock" in left and any(name.startswith(f"out{TEMP}{killed.pid}-") for name in left), left


INTERRUPT_REMOVING_OLD = """
import os, runpy, signal, sys
real_unlink = os.unlink

def unlink(path, *args, **kwargs):
    # Ctrl-C arrives while --force removes the previous OUTPUT_DIR, at its marker file
    if os.fsdecode(path).endswith("old-marker.safetensors"):
        os.kill(os.getpid(), signal.SIGINT)
    return real_unlink(path, *args, **kwargs)

os.unlink = unlink
sys.argv = ["w4", *sys.argv[1:]]
runpy.run_module("w4cli", run_name="__main__")
"""


def test_an_interrupt_while_removing_the_previous_output_says_so_and_the_next_run_finishes(tmp_path, w4):
    src = small_model().write(tmp_path / "src")
    out = tmp_path / "out"
    assert w4("dequantize", src, out, "--device", "cpu", "--dtype", "float32").exit_code == EXIT_OK
    (out / "old-marker.safetensors").write_bytes(b"")
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", INTERRUPT_REMOVING_OLD, "dequantize", str(src), str(out), "--force", "--device", "cpu"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == EXIT_INTERRUPTED, proc.stderr
    [line] = error_lines(proc.stderr)
    assert line.startswith(f"error: interrupted while removing the previous OUTPUT_DIR {out}: the new one is complete"), line
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "float16"
    assert load_file(out / "model.safetensors")
    [left] = [name for name in temps(out) if name != f"out{TEMP}lock"]
    assert left in line
    # the next run on OUT finishes the removal
    assert w4("dequantize", src, out, "--force", "--device", "cpu").exit_code == EXIT_OK
    assert temps(out) == []


# --- output path problems and a full disk -----------------------------------------------------


@pytest.mark.parametrize("problem", ["dangling symlink", "parent is a file", "name too long"])
def test_an_output_path_that_cannot_be_written_is_refused_before_any_work(tmp_path, w4, problem):
    if problem == "dangling symlink":
        out = tmp_path / "out"
        out.symlink_to(tmp_path / "nowhere")
        expected = "is a symbolic link to"
    elif problem == "parent is a file":
        (tmp_path / "file").write_text("mine")
        out = tmp_path / "file" / "out"
        expected = "cannot be written: Not a directory"
    else:
        out = tmp_path / ("o" * 300)
        expected = "cannot be written: File name too long"
    # a Hub id that is not in the cache: were it looked up first, the error would be about MODEL
    result = w4("dequantize", "org/not-in-the-cache", out)
    assert result.exit_code == EXIT_REFUSED, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: OUTPUT_DIR {out}") and expected in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == (["out"] if problem == "dangling symlink" else ["file"] if problem == "parent is a file" else [])


def run_on_tmpfs(tmp_path: Path, options: str, *args: str) -> tuple[int, str, list[str]]:
    """Run w4 with a tmpfs mounted at tmp_path/mnt, in a private mount namespace; returns its exit
    code, its stderr and what the tmpfs holds after it ended."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = f'mount -t tmpfs -o {options} tmpfs "$1" || exit 99; shift; "$@" 2>&1 >/dev/null; echo "exit $?"; ls -A "{mnt}"'
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    command = ["unshare", "--mount", "--map-root-user", "sh", "-c", script, "sh", str(mnt), sys.executable, "-m", "w4cli", *args]
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("exit "))
    return int(lines[at].split()[1]), "\n".join(lines[:at]), lines[at + 1 :]


def test_a_read_only_directory_is_refused_before_any_work(tmp_path):
    out = tmp_path / "mnt" / "out"
    code, stderr, left = run_on_tmpfs(tmp_path, "ro,size=64k", "dequantize", "org/not-in-the-cache", str(out))
    assert code == EXIT_REFUSED, stderr
    assert error_lines(stderr) == [f"error: OUTPUT_DIR {out} cannot be written: Read-only file system ({out}{TEMP}lock)"]
    assert left == []


def test_a_mount_point_is_refused_before_any_work(tmp_path):
    src = small_model().write(tmp_path / "src")
    out = tmp_path / "mnt"  # a volume mounted as OUTPUT_DIR: rename(2) cannot replace it
    code, stderr, left = run_on_tmpfs(tmp_path, "size=1m", "dequantize", str(src), str(out), "--device", "cpu")
    assert code == EXIT_REFUSED, stderr
    assert error_lines(stderr) == [f"error: OUTPUT_DIR {out} is a mount point, which a rename cannot replace: give a directory inside it"]
    assert left == []


def test_a_full_disk_is_one_line_and_leaves_nothing_behind(tmp_path):
    src = Checkpoint([random_layer("model.layers.0.mlp.up_proj", 512, 512, 128, seed=0)], group_size=128).write(tmp_path / "src")
    out = tmp_path / "mnt" / "out"
    # the fp16 output is 512 KB: the lock and the temporary directory fit, the shard does not
    code, stderr, left = run_on_tmpfs(tmp_path, "size=256k", "dequantize", str(src), str(out), "--device", "cpu")
    assert code == EXIT_FAILED, stderr
    assert error_lines(stderr) == [f"error: no space left on device while writing OUTPUT_DIR {out}"], stderr
    assert "Traceback" not in stderr
    assert left == []
