"""Streaming benchmark (not a test): time and peak memory of `w4 gguf` on the synthetic
Llama-7B-shaped AWQ checkpoint of tests/perf_dequantize_stream.py (32 layers, hidden 4096,
intermediate 11008, vocab 32000, G=128, random 32-bit code words), beside `w4 dequantize` of the
same checkpoint.

    make bench-gguf              # or: python tests/perf_gguf_stream.py [WORKDIR] [--70b-layer [--format=awq|gptq]]

Builds the ~3.9 GB input once (WORKDIR/awq-7b-gguf, default w4-stream in the temp directory; needs
~25 GB free), with the config keys and a tokenizer a GGUF needs, then runs each command in a child
process and reports its wall time and peak RSS (the child's own, from wait4).

--70b-layer: one decoder layer of Llama-3-70B's shapes instead (hidden 8192, intermediate 28672,
vocab 128256: a 2.1 GB fp16 embedding and lm_head, and the largest linears a 70B has), `w4 gguf`
alone: its peak RSS is a 70B's, since every other layer is one of the same.
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


SEVENTY_B_LAYER = {"HIDDEN": 8192, "INTER": 28672, "LAYERS": 1, "VOCAB": 128256, "KV": 1024}


def build_70b_layer(src: Path, fmt: str) -> None:
    """perf_dequantize_stream's builder with Llama-3-70B's shapes and one layer."""
    sys.path.insert(0, str(REPO))
    from tests import perf_dequantize_stream as shapes

    c = SEVENTY_B_LAYER
    shapes.HIDDEN, shapes.INTER, shapes.LAYERS, shapes.VOCAB = c["HIDDEN"], c["INTER"], c["LAYERS"], c["VOCAB"]
    shapes.LINEARS = {
        "self_attn.q_proj": (c["HIDDEN"], c["HIDDEN"]), "self_attn.k_proj": (c["HIDDEN"], c["KV"]),
        "self_attn.v_proj": (c["HIDDEN"], c["KV"]), "self_attn.o_proj": (c["HIDDEN"], c["HIDDEN"]),
        "mlp.gate_proj": (c["HIDDEN"], c["INTER"]), "mlp.up_proj": (c["HIDDEN"], c["INTER"]), "mlp.down_proj": (c["INTER"], c["HIDDEN"]),
    }
    shapes.build(src, fmt)


def prepare(src: Path, seventy_b: bool = False, fmt: str = "awq") -> None:
    """The AWQ checkpoint with what `w4 gguf` needs besides tensors."""
    if not (src / "tokenizer.json").exists():
        if seventy_b:
            subprocess.run([sys.executable, __file__, "--build-70b-layer", str(src), fmt], check=True)
        else:
            subprocess.run([sys.executable, str(REPO / "tests" / "perf_dequantize_stream.py"), "--build", str(src), "awq"], check=True)
        sys.path.insert(0, str(REPO))
        from tests.gguf_models import model_config, tokenizer_files

        config = json.loads((src / "config.json").read_text())
        heads, kv = (64, 8) if seventy_b else (32, 32)
        config = {**model_config("llama", config["vocab_size"], layers=config["num_hidden_layers"], hidden=config["hidden_size"],
                                 inter=config["intermediate_size"], heads=heads, kv_heads=kv), **config}
        config["max_position_embeddings"] = 4096
        (src / "config.json").write_text(json.dumps(config))
        for name, text in tokenizer_files("llama").items():
            (src / name).write_text(text)


def run(args: list[str]) -> tuple[float, float, dict]:
    """(seconds, peak RSS MB, --json document) of `python -m w4cli ARGS --json -` in a child; the
    document gains cpu_seconds (user + system), the measure that holds on a shared machine."""
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
        doc = json.loads(stdout.read())
        doc["cpu_seconds"] = usage.ru_utime + usage.ru_stime
        return seconds, usage.ru_maxrss / 1024, doc


def main() -> None:
    if sys.argv[1:2] == ["--build-70b-layer"]:
        build_70b_layer(Path(sys.argv[2]), sys.argv[3])
        return
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    work = Path(args[0] if args else Path(tempfile.gettempdir()) / "w4-stream")
    fmt = next((a.removeprefix("--format=") for a in sys.argv if a.startswith("--format=")), "awq")
    if "--70b-layer" in sys.argv:
        src, out = work / f"{fmt}-70b-layer", work / f"{fmt}-70b-layer.gguf"
        prepare(src, seventy_b=True, fmt=fmt)
        out.unlink(missing_ok=True)
        seconds, rss, doc = run(["gguf", str(src), str(out)])
        print(f"w4 gguf, one Llama-3-70B-shaped {fmt} layer: {seconds:6.1f} s wall, {doc['cpu_seconds']:6.1f} s CPU, {doc['bytes_out'] / 1e6:,.0f} MB written, peak RSS {rss:,.0f} MB")
        out.unlink()
        return
    src, gguf_out, dense = work / "awq-7b-gguf", work / "awq-7b.gguf", work / "awq-7b-dense"
    prepare(src)
    gguf_out.unlink(missing_ok=True)
    shutil.rmtree(dense, ignore_errors=True)
    seconds, rss, doc = run(["gguf", str(src), str(gguf_out)])
    print(f"w4 gguf:       {seconds:6.1f} s wall, {doc['cpu_seconds']:6.1f} s CPU, {doc['bytes_out'] / 1e6:,.0f} MB written, peak RSS {rss:,.0f} MB")
    gguf_out.unlink()
    seconds, rss, doc = run(["dequantize", str(src), str(dense), "--device", "cpu", "--max-shard-size", "500MB"])
    print(f"w4 dequantize: {seconds:6.1f} s wall, {doc['cpu_seconds']:6.1f} s CPU, {doc['bytes_out'] / 1e6:,.0f} MB written, peak RSS {rss:,.0f} MB")
    shutil.rmtree(dense)


if __name__ == "__main__":
    main()
