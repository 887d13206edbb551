"""Scale benchmark (not a test): `w4 dequantize` and `w4 verify` on a checkpoint of ~100k small
tensors, the count of a large MoE (DeepSeek-V3 in AWQ: about 61 layers x 256 experts x 3
projections x 3 tensors), so time must be linear in the number of tensors.

    make bench-tensors           # or: python tests/perf_many_tensors.py [WORKDIR] [--experts E]

Builds the input once (kept in WORKDIR, default w4-many in the temp directory), sharded 10 ways with an index:
E experts x 3 projections, each a 64 x 32 AWQ linear (qweight, qzeros, scales), plus one norm per
expert: 10 tensors per expert, 100,000 for the default E = 10,000. Then runs each command in a
child process and reports wall time and the child's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

K, N, G, SHARDS = 64, 32, 32, 10


def build(root: Path, experts: int) -> Path:
    import torch
    from safetensors.torch import save_file

    marker = root / f"built-{experts}"
    if marker.exists():
        return root / "src"
    shutil.rmtree(root, ignore_errors=True)
    src = root / "src"
    src.mkdir(parents=True)
    gen = torch.Generator().manual_seed(0)
    words = lambda *shape: torch.randint(-(2**31), 2**31, shape, generator=gen, dtype=torch.int64).to(torch.int32)
    tensors = {}
    for e in range(experts):
        prefix = f"model.layers.{e // 256}.mlp.experts.{e % 256}"
        for proj in ("gate_proj", "up_proj", "down_proj"):
            tensors[f"{prefix}.{proj}.qweight"] = words(K, N // 8)
            tensors[f"{prefix}.{proj}.qzeros"] = words(K // G, N // 8)
            tensors[f"{prefix}.{proj}.scales"] = (torch.rand(K // G, N, generator=gen) * 0.01 + 1e-3).half()
        tensors[f"{prefix}.norm.weight"] = torch.ones(K).half()
    names = list(tensors)
    weight_map = {}
    per_shard = -(-len(names) // SHARDS)
    for i in range(SHARDS):
        file = f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors"
        part = names[i * per_shard : (i + 1) * per_shard]
        save_file({name: tensors[name] for name in part}, src / file, metadata={"format": "pt"})
        weight_map.update({name: file for name in part})
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": G, "zero_point": True, "version": "gemm"},
    }
    (src / "config.json").write_text(json.dumps(config))
    marker.touch()
    return src


def timed(args: list[str]) -> tuple[float, float]:
    """Wall seconds and the child's peak RSS in MB."""
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "w4cli", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(child.pid, 0)
    elapsed = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"w4 {' '.join(args)} failed: {child.stderr.read()}")
    return elapsed, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir", nargs="?", default=Path(tempfile.gettempdir()) / "w4-many", type=Path)
    parser.add_argument("--experts", type=int, default=10_000)
    args = parser.parse_args()
    src = build(args.workdir, args.experts)
    count = len(json.loads((src / "model.safetensors.index.json").read_text())["weight_map"])
    out = args.workdir / "out"
    shutil.rmtree(out, ignore_errors=True)
    rows = [
        ("dequantize --device cpu", timed(["dequantize", str(src), str(out), "--device", "cpu"])),
        ("verify MODEL", timed(["verify", str(src)])),
    ]
    print(f"{count:,} tensors in {SHARDS} shards ({args.experts:,} experts x 3 AWQ linears {K}x{N} + 1 norm)")
    for label, (seconds, rss) in rows:
        print(f"  w4 {label:<24} {seconds:7.1f} s   peak RSS {rss:,.0f} MB")


if __name__ == "__main__":
    main()
