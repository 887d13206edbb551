"""`w4 bench` on a GPU: one small shape at M = 1 and 4 through the CLI, every row checked and timed.

Run: pytest -m gpu tests/test_bench_gpu.py   (builds the kernels on first use, about a minute)
"""

from __future__ import annotations

import json

import pytest
import torch

from w4cli.bench import cases
from w4cli.gpu import timing

pytestmark = pytest.mark.gpu  # skipped without a CUDA GPU (conftest.py)


def test_short_bench_passes_every_check(w4, tmp_path):
    out = tmp_path / "bench.json"
    result = w4("bench", "--shape", "4096x1024", "--batch", "1,4", "--replays", "10", "--json", str(out))
    assert result.exit_code == 0, result.stderr + result.stdout
    doc = json.loads(out.read_text())
    assert doc["ok"] and doc["failures"] == 0
    assert doc["environment"]["gpu"] == torch.cuda.get_device_name()
    assert doc["copy"]["gbps"] > 100
    rows = {(r["m"], r["method"]): r for r in doc["results"]}
    expected = {(m, method) for m in (1, 4) for method in cases.LAYER_METHODS} | {(None, cases.W4_DEQUANT)}
    assert set(rows) == expected
    for key, r in rows.items():
        if key[1] == cases.TORCH_INT4 and r["status"] == "skipped":
            continue  # this torch has no usable _weight_int4pack_mm; the note says why
        assert r["status"] == "pass", r
        assert r["median_us"] > 0 and r["gbps"] > 0 and 0 < r["pct_of_copy"] < 200, r
        assert r["bytes_moved"] == cases.METHODS[r["method"]].bytes_moved(4096, 1024, r["m"], 128)
    assert "w4 GEMV" in result.stdout and "fp16 cuBLAS" in result.stdout


def test_timed_replays_span_the_asked_time():
    # a short call: 30 replays would take far less than timed_ms, so the harness must add replays
    src = torch.randn(1 << 20, device="cuda")

    def fn(a: torch.Tensor) -> torch.Tensor:
        return a * 2

    t = timing.measure(fn, lambda i: (src.clone(),), src.numel() * 8, lambda out, args: bool(torch.equal(out, args[0] * 2)),
                       warmup_ms=20.0, replays=5, timed_ms=60.0)
    replay_ms = t.median_us * t.input_sets / 1000
    assert t.replays > 5 and t.replays * replay_ms >= 0.5 * 60.0, (t.replays, replay_ms)


def test_decode_step_as_one_graph_on_a_small_dense_model(w4, tmp_path):
    # 4 decoder layers of a Llama-shaped model, fused and one layer each: the step graph replays the
    # eager step bit for bit for w4 (its check), and its numbers land in the JSON and the table
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632, "num_attention_heads": 16,
        "num_key_value_heads": 4, "num_hidden_layers": 4, "vocab_size": 32000}))
    for fuse in ("--fuse", "--no-fuse"):
        out = tmp_path / f"bench{fuse}.json"
        result = w4("bench", str(tmp_path / "m"), "--batch", "1,16", fuse, "--replays", "10", "--json", str(out))
        assert result.exit_code == 0, result.stderr + result.stdout
        doc = json.loads(out.read_text())
        results = {(r["m"], r["method"]): r for r in doc["decode_step"]["results"]}
        assert set(results) == {(m, method) for m in (1, 16) for method in ("fp16", "w4", "w4_pdl")}
        for r in results.values():
            assert r["layers_measured"] == r["layers_total"] == 4 and r["step_us"] > r["head_us"] > 0, r
            # each kind alone, its own graph checked like the step's (bit for bit for w4)
            kinds = 4 if fuse == "--fuse" else 7  # qkv, o, gate_up, down; or q, k, v, o, gate, up, down
            assert len(r["kinds"]) == (kinds if r["method"] in ("fp16", "w4_pdl") else 0), r
            assert all(k["us"] > 0 for k in r["kinds"])
        assert [row["m"] for row in doc["decode_step"]["rows"]] == [1, 16]
        assert "as one CUDA graph" in result.stdout
