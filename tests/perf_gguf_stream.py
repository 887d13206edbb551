"""Streaming benchmark (not a test): time and peak memory of `w4 gguf` on the synthetic
Llama-7B-shaped AWQ checkpoint of tests/perf_dequantize_stream.py (32 layers, hidden 4096,
intermediate 11008, vocab 32000, G=128, random 32-bit code words), beside `w4 dequantize` of the
same checkpoint.

    make bench-gguf              # or: python tests/perf_gguf_stream.py [WORKDIR]

Builds the ~3.9 GB input once (WORKDIR/awq-7b-gguf, default w4-stream in the temp directory; needs
~25 GB free), with the config keys and a tokenizer a GGUF needs, then runs each command in a child
process and reports its wall time and peak RSS (the child's own, from wait4).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def prepare(src: Path) -> None:
    """The 7B-shaped AWQ checkpoint with what `w4 gguf` needs besides tensors."""
    if not (src / "tokenizer.json").exists():
        subprocess.run([sys.executable, str(REPO / "tests" / "perf_dequantize_stream.py"), "--build", str(src), "awq"], check=True)
        sys.path.insert(0, str(REPO))
        from tests.gguf_models import model_config, tokenizer_files

        config = json.loads((src / "config.json").read_text())
        config = {**model_config("llama", config["vocab_size"], layers=32, hidden=4096, inter=11008, heads=32, kv_heads=32), **config}
        config["max_position_embeddings"] = 4096
        (src / "config.json").write_text(json.dumps(config))
        for name, text in tokenizer_files("llama").items():
            (src / name).write_text(text)


def run(args: list[str]) -> tuple[float, float, dict]:
    """(seconds, peak RSS MB, --json document) of `python -m w4cli ARGS --json -` in a child."""
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "w4cli", *args, "--json", "-"], stdout=stdout, stderr=stderr, text=True, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        stdout.seek(0)
        stderr.seek(0)
        if os.waitstatus_to_exitcode(status):
            sys.exit(stderr.read())
        return seconds, usage.ru_maxrss / 1024, json.loads(stdout.read())


def main() -> None:
    work = Path(sys.argv[1] if len(sys.argv) > 1 else Path(tempfile.gettempdir()) / "w4-stream")
    src, gguf_out, dense = work / "awq-7b-gguf", work / "awq-7b.gguf", work / "awq-7b-dense"
    prepare(src)
    gguf_out.unlink(missing_ok=True)
    shutil.rmtree(dense, ignore_errors=True)
    seconds, rss, doc = run(["gguf", str(src), str(gguf_out)])
    print(f"w4 gguf:       {seconds:6.1f} s wall, {doc['bytes_out'] / 1e6:,.0f} MB written ({doc['bytes_out'] / 1e6 / seconds:,.0f} MB/s), peak RSS {rss:,.0f} MB")
    gguf_out.unlink()
    seconds, rss, doc = run(["dequantize", str(src), str(dense), "--device", "cpu", "--max-shard-size", "500MB"])
    print(f"w4 dequantize: {seconds:6.1f} s wall, {doc['bytes_out'] / 1e6:,.0f} MB written ({doc['bytes_out'] / 1e6 / seconds:,.0f} MB/s), peak RSS {rss:,.0f} MB")
    shutil.rmtree(dense)


if __name__ == "__main__":
    main()
