"""Streaming benchmark (not a test): peak memory and throughput of `w4 dequantize` on a synthetic
Llama-7B-shaped checkpoint (32 layers, hidden 4096, intermediate 11008, vocab 32000, G=128) in one
of the formats w4 reads: AWQ gemm (the default), GPTQ (v1, asymmetric, g_idx k // G, fp16
scales) or compressed-tensors (pack-quantized, symmetric W4A16, bf16 scales).

    make bench-stream            # or: python tests/perf_dequantize_stream.py [WORKDIR] [--device cuda]
                                 #     [--format awq|gptq|compressed-tensors] [--threads N]
                                 #     [--baseline CHECKOUT]

Builds the ~3.9 GB input once per format (kept in WORKDIR, default w4-stream in the temp
directory; needs ~35 GB free), then runs `python -m w4cli dequantize --max-shard-size 500MB` in a child process and
reports its peak RSS (that child's own, from wait4) and MB/s written, beside the time a plain
`cp -r` of the output takes right after (the disk's pace: its source read into the page cache
first, untimed, so it times the writing alone) and the ratio of the two. --baseline
runs another checkout's w4 (its w4cli first on the path) the same way just before, so a change is
measured back to back against what it replaces.
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

HIDDEN, INTER, LAYERS, VOCAB, G = 4096, 11008, 32, 32000, 128
LINEARS = {
    "self_attn.q_proj": (HIDDEN, HIDDEN),
    "self_attn.k_proj": (HIDDEN, HIDDEN),
    "self_attn.v_proj": (HIDDEN, HIDDEN),
    "self_attn.o_proj": (HIDDEN, HIDDEN),
    "mlp.gate_proj": (HIDDEN, INTER),
    "mlp.up_proj": (HIDDEN, INTER),
    "mlp.down_proj": (INTER, HIDDEN),
}  # name -> (K, N)


def awq_linear(k: int, n: int, gen):
    import torch

    full = lambda *shape: torch.randint(-(2**31), 2**31, shape, generator=gen, dtype=torch.int64).to(torch.int32)
    scales = (torch.rand(k // G, n, generator=gen) * 0.01 + 1e-3).half()
    return {"qweight": full(k, n // 8), "qzeros": full(k // G, n // 8), "scales": scales}


def gptq_linear(k: int, n: int, gen):
    import torch

    full = lambda *shape: torch.randint(-(2**31), 2**31, shape, generator=gen, dtype=torch.int64).to(torch.int32)
    scales = (torch.rand(k // G, n, generator=gen) * 0.01 + 1e-3).half()
    g_idx = (torch.arange(k) // G).to(torch.int32)
    return {"qweight": full(k // 8, n), "qzeros": full(k // G, n // 8), "scales": scales, "g_idx": g_idx}


def ct_linear(k: int, n: int, gen):
    import torch

    packed = torch.randint(-(2**31), 2**31, (n, k // 8), generator=gen, dtype=torch.int64).to(torch.int32)
    scales = (torch.rand(n, k // G, generator=gen) * 0.01 + 1e-3).bfloat16()
    return {"weight_packed": packed, "weight_scale": scales, "weight_shape": torch.tensor([n, k])}


LINEAR_BUILDERS = {"awq": awq_linear, "gptq": gptq_linear, "compressed-tensors": ct_linear}
QUANTIZATION_CONFIGS = {
    "awq": {"quant_method": "awq", "bits": 4, "group_size": G, "version": "gemm", "zero_point": True},
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": G, "desc_act": False, "sym": False, "checkpoint_format": "gptq"},
    "compressed-tensors": {
        "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed", "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
            "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": G, "dynamic": False}}},
    },
}


def build(root: Path, fmt: str = "awq") -> None:
    import torch
    from safetensors.torch import save_file

    if (root / "config.json").exists():
        return
    root.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    weight_map, shard, shard_bytes, index = {}, {}, 0, 1
    names: list[tuple[str, torch.Tensor]] = []

    def flush() -> None:
        nonlocal shard, shard_bytes, index
        if shard:
            file = f"model-{index:05d}.safetensors"
            save_file(shard, root / file, metadata={"format": "pt"})
            weight_map.update({name: file for name in shard})
            shard, shard_bytes, index = {}, 0, index + 1

    def add(name: str, tensor: torch.Tensor) -> None:
        nonlocal shard_bytes
        if shard_bytes + tensor.nbytes > 2_000_000_000:
            flush()
        shard[name] = tensor
        shard_bytes += tensor.nbytes

    add("model.embed_tokens.weight", (torch.randn(VOCAB, HIDDEN, generator=gen) * 0.02).half())
    for layer in range(LAYERS):
        base = f"model.layers.{layer}"
        add(f"{base}.input_layernorm.weight", torch.ones(HIDDEN).half())
        add(f"{base}.post_attention_layernorm.weight", torch.ones(HIDDEN).half())
        for name, (k, n) in LINEARS.items():
            for part, value in LINEAR_BUILDERS[fmt](k, n, gen).items():
                add(f"{base}.{name}.{part}", value)
    add("model.norm.weight", torch.ones(HIDDEN).half())
    add("lm_head.weight", (torch.randn(VOCAB, HIDDEN, generator=gen) * 0.02).half())
    flush()
    # rename to the -of-N pattern now that N is known
    total = index - 1
    renamed = {}
    for i in range(1, total + 1):
        old, new = f"model-{i:05d}.safetensors", f"model-{i:05d}-of-{total:05d}.safetensors"
        (root / old).rename(root / new)
        renamed[old] = new
    index_doc = {"metadata": {}, "weight_map": {k: renamed[v] for k, v in weight_map.items()}}
    (root / "model.safetensors.index.json").write_text(json.dumps(index_doc))
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
        "intermediate_size": INTER, "num_hidden_layers": LAYERS, "vocab_size": VOCAB, "torch_dtype": "float16",
        "quantization_config": QUANTIZATION_CONFIGS[fmt],
    }
    (root / "config.json").write_text(json.dumps(config))


def run(src: Path, work: Path, device: str, threads: int | None, checkout: Path | None, label: str) -> None:
    """One `w4 dequantize` of src in a child process, then `cp -r` of its output; prints both."""
    out, copy = work / "dense", work / "dense-copy"
    for path in (out, copy):
        shutil.rmtree(path, ignore_errors=True)
    env = dict(os.environ)
    if checkout is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(checkout), env.get("PYTHONPATH", "")])
    # `python -m` puts the working directory first on the path: the checkout's own, else the work dir
    if device == "cpu":
        # the CPU kernel's first-use build stays out of the measured run: its compiler would count in
        # the child's peak RSS (wait4 reports the largest of the child and its descendants) and time
        subprocess.run([sys.executable, "-c", "from w4cli.cpu import kernel; kernel.load()"], check=False, env=env,
                       cwd=checkout or Path.cwd(), capture_output=True)
    command = [sys.executable, "-m", "w4cli", "dequantize", str(src), str(out), "--max-shard-size", "500MB", "--device", device, "--json", "-"]
    command += ["--threads", str(threads)] if threads else []
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen(command, stdout=stdout, stderr=stderr, text=True, env=env, cwd=checkout or Path.cwd())
        # wait4: the child's peak RSS, or a descendant's if larger (hence the build above)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - start
        stdout.seek(0)
        stderr.seek(0)
        if proc.returncode:
            sys.exit(stderr.read())
        summary = json.loads(stdout.read())
    peak_mb = usage.ru_maxrss / 1024
    # the reference writes 13.5 GB through the page cache from a source read from memory, whatever
    # w4 left cached: its output written with O_DIRECT is not, and cp -r would time the disk's reads too
    for file in out.iterdir():
        with open(file, "rb") as handle:
            while handle.read(1 << 24):
                pass
    start = time.perf_counter()
    subprocess.run(["cp", "-r", str(out), str(copy)], check=True)
    subprocess.run(["sync"], check=True)
    cp_seconds = time.perf_counter() - start
    shutil.rmtree(copy, ignore_errors=True)
    written = summary["bytes_out"] / 1e6
    print(f"[{label}] input {summary['bytes_in'] / 1e6:,.0f} MB -> output {written:,.0f} MB in "
          f"{sum(f.endswith('.safetensors') for f in summary['files'])} shards, {summary['dtype']}, threads {summary.get('threads', '-')}")
    print(f"[{label}] w4 dequantize --device {device}: {seconds:.1f} s wall, {written / seconds:,.0f} MB/s written, peak RSS {peak_mb:,.0f} MB, "
          f"CPU {usage.ru_utime:.1f} s user + {usage.ru_stime:.1f} s system")
    print(f"[{label}]   of which reading {summary['read_seconds']:.1f} s, compute {summary['compute_seconds']:.1f} s, "
          f"writing {summary['write_seconds']:.1f} s: bound by {summary['bound_by']}")
    print(f"[{label}] cp -r of the output (the disk's pace): {cp_seconds:.1f} s, {written / cp_seconds:,.0f} MB/s; "
          f"w4 took {seconds / cp_seconds:.2f}x the cp -r", flush=True)


def main() -> None:
    if sys.argv[1:2] == ["--build"]:
        build(Path(sys.argv[2]), sys.argv[3])
        return
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", nargs="?", default=str(Path(tempfile.gettempdir()) / "w4-stream"))
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--format", choices=sorted(LINEAR_BUILDERS), default="awq")
    parser.add_argument("--threads", type=int, help="w4 dequantize --threads (default: w4's, every core)")
    parser.add_argument("--baseline", type=Path, help="a checkout of w4 to run first, the same way (before/after)")
    options = parser.parse_args()
    work = Path(options.workdir)
    src = work / f"{options.format}-7b"
    # built in a child, so the tensors it generates never inflate this process
    subprocess.run([sys.executable, __file__, "--build", str(src), options.format], check=True)
    print(f"{options.format} -> {options.device}")
    if options.baseline is not None:
        run(src, work, options.device, options.threads, options.baseline.resolve(), "baseline")
    run(src, work, options.device, options.threads, None, "this checkout")


if __name__ == "__main__":
    main()
