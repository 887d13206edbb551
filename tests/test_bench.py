"""`w4 bench` on a CPU: shapes from configs, byte counting, rendering from recorded numbers, the
runner's control flow with the GPU pieces replaced by CPU references, and the CLI's exit codes.

Run: .venv/bin/python -m pytest -q tests/test_bench.py
"""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch

from w4cli.gpu import contract, timing
from w4cli.bench import cases, render, runner, shapes
from w4cli.gpu.checks import Mismatch
from w4cli.bench.results import FAIL, PASS, SKIPPED, Report, Result, expected_distinct_experts, project
from w4cli.errors import EXIT_ENVIRONMENT, EXIT_FAILED, EXIT_REFUSED, EXIT_USAGE, InputRefused, UsageError
from w4cli.formats import awq_gemm, w4_gemv

LLAMA3_8B = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
    "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256, "tie_word_embeddings": False,
}
QWEN3_06B = {
    "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 28, "vocab_size": 151936, "tie_word_embeddings": True,
}
MIXTRAL = {
    "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
    "num_key_value_heads": 8, "num_hidden_layers": 32, "num_local_experts": 8, "num_experts_per_tok": 2,
    "vocab_size": 32000,
}
QWEN2_MOE = {
    "model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632, "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 16,
    "num_hidden_layers": 24, "num_experts": 60, "num_experts_per_tok": 4, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "vocab_size": 151936,
}


def by_shape(model: shapes.ModelShapes) -> dict[tuple[int, int], shapes.Shape]:
    return {(s.k, s.n): s for s in model.shapes()}


# ---- shapes ----


def test_llama3_8b_shapes():
    m = shapes.from_config(LLAMA3_8B, "meta-llama/Meta-Llama-3-8B")
    got = by_shape(m)
    assert [(s.k, s.n) for s in m.shapes()] == [(4096, 4096), (4096, 1024), (4096, 14336), (14336, 4096), (4096, 128256)]
    assert got[4096, 4096].names == "q_proj, o_proj" and got[4096, 4096].per_model == 64
    assert got[4096, 1024].names == "k_proj, v_proj" and got[4096, 1024].per_model == 64
    assert got[4096, 14336].names == "gate_proj, up_proj" and got[14336, 4096].names == "down_proj"
    head = got[4096, 128256]
    assert not head.quantized and head.names == "lm_head" and head.per_model == 1
    assert any("lm_head" in n and "fp16" in n for n in m.notes)


def test_qwen3_head_dim_and_tied_embeddings():
    m = shapes.from_config(QWEN3_06B)
    got = by_shape(m)
    # head_dim 128 is not hidden/heads = 64: q_proj is 1024 -> 2048 and o_proj 2048 -> 1024
    assert got[1024, 2048].names == "q_proj" and got[2048, 1024].names == "o_proj"
    assert got[1024, 1024].names == "k_proj, v_proj"
    assert not got[1024, 151936].quantized
    assert any("tied" in n for n in m.notes)


def test_mixtral_experts_counted_per_model_and_per_token():
    m = shapes.from_config(MIXTRAL)
    got = by_shape(m)
    experts = got[4096, 14336]
    assert experts.names == "experts.w1, experts.w3" and experts.per_model == 2 * 8 * 32
    assert got[14336, 4096].names == "experts.w2"
    assert m.num_experts == 8 and m.experts_per_token == 2
    assert all(lin.active == 2 for lin in experts.linears)
    assert any("router" in n for n in m.notes)


def test_qwen2_moe_shared_expert_and_expert_size():
    m = shapes.from_config(QWEN2_MOE)
    got = by_shape(m)
    assert got[2048, 1408].names == "experts.gate_proj, experts.up_proj" and got[2048, 1408].per_model == 2 * 60 * 24
    assert got[1408, 2048].names == "experts.down_proj"
    shared = got[2048, 5632]
    assert shared.names == "shared_expert.gate_proj, shared_expert.up_proj" and shared.per_model == 2 * 24
    assert all(lin.kind == "shared_expert" for lin in shared.linears)


def test_qwen3_moe_dense_layers_from_sparse_step_and_mlp_only_layers():
    cfg = {**QWEN2_MOE, "model_type": "qwen3_moe", "shared_expert_intermediate_size": 0, "num_hidden_layers": 8,
           "decoder_sparse_step": 2, "mlp_only_layers": [1], "intermediate_size": 6144}
    m = shapes.from_config(cfg)
    # sparse where (i+1) % 2 == 0 and i not in [1]: i = 3, 5, 7
    experts = [lin for lin in m.linears if lin.kind == "expert"]
    assert {lin.layers for lin in experts} == {3}
    dense = [lin for lin in m.linears if lin.name == "gate_proj"]
    assert dense[0].layers == 5 and dense[0].n == 6144


def test_gpt_neox_and_falcon_fused_qkv():
    neox = shapes.from_config({"model_type": "gpt_neox", "hidden_size": 2048, "intermediate_size": 8192,
                               "num_attention_heads": 16, "num_hidden_layers": 16, "vocab_size": 50304})
    got = by_shape(neox)
    assert got[2048, 6144].names == "query_key_value" and got[2048, 2048].names == "dense"
    assert got[2048, 50304].names == "embed_out"
    falcon7 = shapes.from_config({"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71,
                                  "num_hidden_layers": 32, "multi_query": True, "vocab_size": 65024})
    qkv = next(lin for lin in falcon7.linears if lin.name == "query_key_value")
    assert (qkv.k, qkv.n) == (4544, 4544 + 2 * 64)
    # K = 4544 is not a multiple of 128: measured in fp16 only, with the reason
    assert contract.gemv_refusal(4544, 4672, 128) is not None
    falcon40 = shapes.from_config({"model_type": "falcon", "hidden_size": 8192, "num_attention_heads": 128,
                                   "num_kv_heads": 8, "new_decoder_architecture": True, "num_hidden_layers": 60})
    qkv = next(lin for lin in falcon40.linears if lin.name == "query_key_value")
    assert qkv.n == (128 + 16) * 64


def test_phi3_fused_qkv_and_gate_up():
    m = shapes.from_config({"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
                            "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 32})
    got = by_shape(m)
    assert got[3072, 9216].names == "qkv_proj" and got[3072, 16384].names == "gate_up_proj"


def test_fused_projections_as_engines_load_them():
    m = shapes.from_config(LLAMA3_8B).fused()
    assert [(lin.name, lin.k, lin.n) for lin in m.linears[:4]] == [
        ("qkv_proj", 4096, 4096 + 2 * 1024), ("o_proj", 4096, 4096), ("gate_up_proj", 4096, 2 * 14336),
        ("down_proj", 14336, 4096)]
    assert m.linears[-1].name == "lm_head" and any("fused" in n for n in m.notes)
    assert sum(lin.per_model for lin in m.linears) == 4 * 32 + 1  # one launch where there were two or three
    moe = {lin.name: lin for lin in shapes.from_config(QWEN2_MOE).fused().linears}
    assert (moe["experts.gate_up_proj"].n, moe["experts.gate_up_proj"].per_layer) == (2 * 1408, 60)
    assert moe["experts.gate_up_proj"].kind == "expert" and moe["experts.gate_up_proj"].active == 4
    assert moe["shared_expert.gate_up_proj"].n == 2 * 5632 and "experts.down_proj" in moe
    mixtral = {lin.name for lin in shapes.from_config(MIXTRAL).fused().linears}
    assert {"qkv_proj", "experts.w13", "experts.w2"} <= mixtral and "experts.w1" not in mixtral
    # already fused, or nothing to fuse: unchanged, no note
    phi3 = shapes.from_config({"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
                               "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 32})
    assert phi3.fused() is phi3


def test_decode_step_plan_wiring_and_bytes():
    from w4cli.bench import step

    m = shapes.from_config(LLAMA3_8B).fused()
    p = step.plan(m)
    assert [lin.name for lin in p.layer] == ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
    assert p.decoder_layers == 32 and p.head.name == "lm_head"
    calls = step.wire(p.layer, 4096, 2)
    # qkv reads the input; o_proj (K 4096) the newest 4096-wide buffer (the input: qkv is 6144 wide);
    # gate_up reads o_proj's output; down_proj (K 14336) half of gate_up's (28672 wide); the next
    # layer's qkv reads down_proj's output
    assert calls[:5] == [(0, 0, 1, False), (0, 1, 2, False), (2, 2, 3, False), (3, 3, 4, True), (4, 0, 5, False)]
    unfused = step.plan(shapes.from_config(LLAMA3_8B))
    assert [c[3] for c in step.wire(unfused.layer, 4096, 1)] == [False] * 7  # down_proj reads up_proj's output
    one_layer = 4096 * 6144 + 4096 * 4096 + 4096 * 28672 + 14336 * 4096
    assert step.layer_bytes(p.layer, step.FP16, 128) == 2 * one_layer
    assert step.layers_that_fit(p, step.FP16, 128, 10 * 2 * one_layer) == 7  # 70% of ten layers' bytes
    assert step.layers_that_fit(p, step.W4, 128, 10**12) == 32
    assert isinstance(step.plan(shapes.from_config(MIXTRAL)), str)  # routed experts: per-shape projection only
    # a layer w4's kernels refuse (K = 4544 is no multiple of the group): no step, one note, no GPU touched
    falcon = shapes.from_config({"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71,
                                 "num_hidden_layers": 2, "multi_query": True, "vocab_size": 1000})
    results, why = step.measure(falcon, [1], 128, None, 5, lambda label: None, "cpu", None)
    assert results == [] and "query_key_value" in why and "multiple" in why


def test_decode_step_times_each_method_twice_around_the_others(cpu_runner, monkeypatch):
    # fp16, w4, w4 PDL, w4 PDL, w4, fp16: each method's step (and its kinds) the mean of its two passes
    from w4cli.bench import step

    model = shapes.from_config({"model_type": "qwen2", "hidden_size": 256, "intermediate_size": 512,
                                "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
                                "vocab_size": 1000}).fused()
    timed = []

    def numbered_measure(*args, name="kernel", **kwargs):
        timed.append(name)
        return dataclasses.replace(fake_measure(*args, name=name, **kwargs), median_us=float(len(timed)))

    monkeypatch.setattr(timing, "measure", numbered_measure)
    results, why = step.measure(model, [1], 128, None, 5, lambda label: None, "cpu", cpu_runner.gemv)
    assert why is None
    steps = [(i + 1, name.split()[-1]) for i, name in enumerate(timed) if name.startswith("decode step ")
             and len(name.split()) == 3]
    assert [method for _, method in steps] == list(step.PASS_ORDER)
    by = {r.method: r for r in results}
    for method in (step.FP16, step.W4, step.W4_PDL):
        at = [i for i, m in steps if m == method]
        assert by[method].measured_us == pytest.approx(sum(at) / 2)
    kinds = [(i + 1, name) for i, name in enumerate(timed) if name.startswith("decode step fp16 ")]
    first = {name: i for i, name in reversed(kinds)}
    last = {name: i for i, name in kinds}
    assert [k.us for k in by[step.FP16].kinds] == [pytest.approx((first[n] + last[n]) / 2) for n in
                                                   (f"decode step fp16 {k.name}" for k in by[step.FP16].kinds)]


def test_multimodal_text_config_is_used():
    m = shapes.from_config({"model_type": "mistral3", "text_config": {**LLAMA3_8B, "model_type": "mistral"}})
    assert (4096, 14336) in by_shape(m)


def test_unknown_architecture_gets_llama_style_with_a_note():
    m = shapes.from_config({**LLAMA3_8B, "model_type": "brandnew"})
    assert (4096, 1024) in by_shape(m)
    assert any("brandnew" in n and "llama-style" in n for n in m.notes)


@pytest.mark.parametrize("config", [
    {"model_type": "mamba", "d_inner": 4096},
    {"model_type": "deepseek_v3", **LLAMA3_8B, "kv_lora_rank": 512},
    {**LLAMA3_8B, "hidden_size": "4096"},
])
def test_refused_configs(config):
    with pytest.raises(InputRefused):
        shapes.from_config(config)


def test_parse_shape_and_batches():
    assert shapes.parse_shape("4096x14336") == (4096, 14336)
    assert shapes.parse_shape(" 8192X1024 ") == (8192, 1024)
    for bad in ("4096", "4096x", "0x128", "ax b", "4096x14336x2"):
        with pytest.raises(UsageError):
            shapes.parse_shape(bad)
    assert shapes.parse_batches("16,1,4,4") == [1, 4, 16]
    for bad in ("", "0", "a,b", "1,-2"):
        with pytest.raises(UsageError):
            shapes.parse_batches(bad)


# ---- bytes ----


def bytes_moved(method: str, k: int, n: int, m: int, group: int) -> int:
    return cases.METHODS[method].bytes_moved(k, n, m, group)


def test_byte_counts_match_the_anchors():
    # docs: 8192x28672 at M=1: W4 122.102 MB, dequantize 591.790 MB moved, fp16 weight 469.762 MB
    assert bytes_moved(cases.W4_GEMV, 8192, 28672, 1, 128) == 122_101_760
    assert bytes_moved(cases.W4_DQ_MM, 8192, 28672, 1, 128) == 122_101_760
    assert bytes_moved(cases.W4_DEQUANT, 8192, 28672, 1, 128) == 591_790_080
    assert bytes_moved(cases.FP16, 8192, 28672, 1, 128) == 469_762_048 + 2 * 8192 + 2 * 28672
    assert bytes_moved(cases.TORCH_INT4, 4096, 4096, 16, 128) == 4096 * 4096 // 2 + 32 * 4096 * 4 + 16 * 4096 * 4
    # the dequantize count does not depend on M
    assert bytes_moved(cases.W4_DEQUANT, 4096, 4096, 16, 128) == bytes_moved(cases.W4_DEQUANT, 4096, 4096, 1, 128)


# ---- results, projection, rendering (made-up numbers) ----


def fake_result(k, n, m, method, us, status=PASS, note=""):
    if status != PASS:
        return Result(k, n, m, method, status, note)
    b = bytes_moved(method, k, n, m or 1, 128)
    gbps = b / (us * 1e-6) / 1e9
    return Result(k, n, m, method, PASS, note, b, us, us * 0.98, us * 1.03, us * 0.97, 0.05, gbps, 100 * gbps / 3000.0,
                  30, 4, 4 * 50 * 2**20, 50 * 2**20)


def fake_report(model=None, fail=False) -> Report:
    shape_list = model.shapes() if model else [shapes.Shape(4096, 4096)]
    batches = [1, 4]
    results = []
    for s in shape_list:
        w = s.k * s.n / 1e6  # us scale ~ size
        for m in batches:
            results.append(fake_result(s.k, s.n, m, cases.FP16, 4.0 * w))
            if s.quantized:
                results.append(fake_result(s.k, s.n, m, cases.W4_GEMV, 1.25 * w))
                results.append(fake_result(s.k, s.n, m, cases.W4_DQ_MM, 8.0 * w))
                results.append(fake_result(s.k, s.n, m, cases.TORCH_INT4, 2.0 * w if m == 1 else 6.0 * w))
        if s.quantized:
            results.append(fake_result(s.k, s.n, None, cases.W4_DEQUANT, 5.0 * w))
    if fail:
        s = shape_list[0]
        results = [r if (r.method, r.m) != (cases.W4_GEMV, 4) or (r.k, r.n) != (s.k, s.n)
                   else Result(s.k, s.n, 4, cases.W4_GEMV, FAIL, "out[0,3]=1.5, reference 1.25: 2.1x the bound")
                   for r in results]
    env = {"gpu": "NVIDIA H200", "sm_count": 132, "l2_bytes": 60 * 2**20, "memory_bytes": 141 * 2**30,
           "torch": "2.11.0+cu130", "cuda": "13.0", "date_utc": "2026-11-21 12:00", "command": "w4 bench --shape 4096x4096"}
    return Report(env, 4235.0, "d2d copy (memcpy) 512 MiB", 128, batches, shape_list, results, model)


def test_projection_sums_layers_times_calls():
    model = shapes.from_config(LLAMA3_8B, "llama3-8b")
    report = fake_report(model)
    rows = project(report)
    assert [r["m"] for r in rows] == [1, 4]
    # fp16 total = sum(4w * calls); lm_head counts as fp16 in the w4 column too
    fp16 = sum(4.0 * lin.k * lin.n / 1e6 * lin.per_model for lin in model.linears)
    head = next(lin for lin in model.linears if lin.kind == "lm_head")
    w4 = sum((1.25 if lin.quantized else 4.0) * lin.k * lin.n / 1e6 * lin.per_model for lin in model.linears)
    assert rows[0]["fp16_us"] == pytest.approx(fp16)
    assert rows[0]["w4_gemv_us"] == pytest.approx(w4)
    assert rows[0]["w4_gemv_speedup"] == pytest.approx(fp16 / w4)
    assert rows[0]["w4_gemv_speedup"] < 4.0 / 1.25  # the fp16 lm_head holds it below the per-layer ratio
    assert head.quantized is False


def test_projection_of_moe_uses_expected_distinct_experts():
    assert expected_distinct_experts(8, 2, 1) == pytest.approx(2.0)
    assert expected_distinct_experts(8, 2, 1000) == pytest.approx(8.0)
    model = shapes.from_config(MIXTRAL, "mixtral")
    rows = project(fake_report(model))
    # M=1: 2 experts per layer run, not 8
    fp16_m1 = sum(4.0 * lin.k * lin.n / 1e6 * lin.layers * (2 if lin.kind == "expert" else lin.per_layer)
                  for lin in model.linears)
    assert rows[0]["fp16_us"] == pytest.approx(fp16_m1)


def test_failed_kernel_has_no_time_and_no_total():
    model = shapes.from_config(LLAMA3_8B, "llama3-8b")
    report = fake_report(model, fail=True)
    assert len(report.failures) == 1
    rows = project(report)
    assert rows[0]["w4_gemv_us"] is not None and rows[1]["w4_gemv_us"] is None
    assert rows[1]["w4_best_us"] is not None  # dequant+mm still passed there
    md = render.markdown(report)
    assert "| 4096x4096 | q_proj, o_proj | 4 | 67.11 | FAIL |" in md
    doc = render.to_json(report)
    assert doc["ok"] is False and doc["failures"] == 1
    bad = [r for r in doc["results"] if r["status"] == FAIL]
    assert len(bad) == 1 and bad[0]["median_us"] is None and bad[0]["gbps"] is None


def test_markdown_and_json_from_recorded_numbers():
    report = fake_report()
    md = render.markdown(report)
    lines = md.splitlines()
    assert lines[0].startswith("NVIDIA H200, 132 SMs, L2 60 MiB, 141 GiB, torch 2.11.0+cu130, CUDA 13.0, copy 4,235 GB/s")
    assert "Command: `w4 bench --shape 4096x4096`" in md
    row = next(line for line in lines if line.startswith("| 4096x4096 | - | 1 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3] == "67.11" and cells[4] == "20.97" and cells[6] == "3.20x" and cells[9] == "2.00x"
    assert "| 4096x4096 | 83.89 |" in md  # the dequantize table
    doc = json.loads(json.dumps(render.to_json(report)))
    assert doc["ok"] is True and doc["environment"]["gpu"] == "NVIDIA H200"
    assert doc["bytes_definition"][cases.W4_GEMV].startswith("K*N/2")
    assert {(r["m"], r["method"]) for r in doc["results"]} == {(m, meth) for m in (1, 4) for meth in cases.LAYER_METHODS} | {(None, cases.W4_DEQUANT)}
    assert all(r["status"] == PASS and r["gbps"] > 0 for r in doc["results"])
    assert doc["summary"] == []


def test_rich_tables_render(capsys):
    from rich.console import Console

    report = fake_report(shapes.from_config(MIXTRAL, "mixtral"), fail=True)
    console = Console(width=200, record=True, file=open("/dev/null", "w"))
    for table in (render.shapes_table(report), render.results_table(report), render.summary_table(report)):
        console.print(table)
    text = console.export_text()
    assert "FAIL" in text and "3.20x" in text and "experts.w1, experts.w3" in text and "NVIDIA H200" in text
    assert render.bar(4.0) == "█" * 8 and render.bar(1.0) == "██" and render.bar(0.0) == ""


# ---- the runner's control flow on a CPU (GPU pieces replaced by references) ----

FAKE_L2 = 64 * 1024


def fake_measure(fn, inputs, bytes_moved, check, *, name="kernel", copy=None, replays=30, l2_multiple=4.0,
                 min_sets=2, **_):
    sets = timing.make_input_sets(inputs, FAKE_L2, l2_multiple, min_sets)  # the harness's own size rule
    out = fn(*sets[0])
    timing._run_check(check, out, sets[0], name, "output on input set 0")
    us = 10.0
    gbps = bytes_moved / (us * 1e-6) / 1e9
    ws = sum(timing._nbytes(a) for a in sets)
    return timing.Timing(name, us, us, us, us, 0.0, bytes_moved, gbps, None, replays, len(sets), ws, FAKE_L2, "cpu")


def _fake_gemv(x, qweight, qzeros, scales, meta=None, bias=None, pdl=False):
    k, n, groups = x.shape[1], scales.shape[1], scales.shape[0]
    meta = torch.tensor([1, k, n, k // groups], dtype=torch.int32)
    return w4_gemv.gemv_reference(x, qweight, qzeros, scales, meta).half()


@pytest.fixture
def cpu_runner(monkeypatch):
    """runner on the CPU: reference kernels, a harness that checks but does not time."""
    from w4cli.gpu import kernels

    fake = SimpleNamespace(
        dequantize_awq=lambda qw, qz, s, dtype=torch.float16, transpose=True: awq_gemm.dequantize(qw, qz, s, dtype, transpose),
        gemv=_fake_gemv,
    )
    monkeypatch.setattr(runner, "DEV", "cpu")
    monkeypatch.setattr(cases, "kernels", fake)
    monkeypatch.setattr(timing, "measure", fake_measure)
    monkeypatch.setattr(timing, "copy_bandwidth", lambda **kw: SimpleNamespace(gbps=1000.0, name="fake copy"))
    monkeypatch.setattr(runner, "environment", lambda: {"gpu": "fake", "sm_count": 1, "l2_bytes": FAKE_L2,
                                                        "memory_bytes": 2**30, "torch": torch.__version__, "cuda": None})
    monkeypatch.setattr(kernels, "probe", lambda: (True, ""))
    return fake


def test_runner_checks_every_kernel(cpu_runner):
    steps = []
    todo = [shapes.Shape(256, 64), shapes.Shape(256, 1000, quantized=False, linears=(shapes.Linear("lm_head", 256, 1000, 1, kind="lm_head", quantized=False),))]
    report = runner.run(todo, [1, 4], 128, step=steps.append)
    by = {(r.k, r.n, r.m, r.method): r for r in report.results}
    for m in (1, 4):
        for method in (cases.FP16, cases.W4_GEMV, cases.W4_DQ_MM):
            assert by[256, 64, m, method].status == PASS, by[256, 64, m, method]
        # this CPU torch cannot pack int4: skipped with why, never FAIL
        assert by[256, 64, m, cases.TORCH_INT4].status in (PASS, SKIPPED)
        assert by[256, 1000, m, cases.FP16].status == PASS
        assert (256, 1000, m, cases.W4_GEMV) not in by  # fp16 layer: cuBLAS only
    assert by[256, 64, None, cases.W4_DEQUANT].status == PASS
    assert len(steps) == runner.steps_for(todo, [1, 4], 128)
    assert not report.failures


def test_runner_times_fp16_and_w4_twice_in_turn(cpu_runner, monkeypatch):
    # in each cell the ratio's two methods are timed fp16, w4, w4, fp16 (each once right after the
    # other), and each reports the mean of its two medians; the others are timed once
    timed = []

    def numbered_measure(*args, **kwargs):
        t = fake_measure(*args, **kwargs)
        timed.append(t.name)
        us = 10.0 * len(timed)  # every measurement slower than the one before it
        return dataclasses.replace(t, median_us=us, p10_us=us, p90_us=us, min_us=us, gbps=t.bytes_moved / us / 1e3)

    monkeypatch.setattr(timing, "measure", numbered_measure)
    steps = []
    report = runner.run([shapes.Shape(256, 64)], [4], 128, step=steps.append)
    by = {(r.m, r.method): r for r in report.results}
    fp16, w4 = (f"{cases.label(key)} 256x64 M=4" for key in (cases.FP16, cases.W4_GEMV))
    first = timed.index(fp16)
    assert timed[first:first + 4] == [fp16, w4, w4, fp16] and timed.count(fp16) == timed.count(w4) == 2
    assert by[4, cases.FP16].median_us == pytest.approx(10.0 * ((first + 1) + (first + 4)) / 2)
    assert by[4, cases.W4_GEMV].median_us == pytest.approx(10.0 * ((first + 2) + (first + 3)) / 2)
    assert by[4, cases.FP16].replays == 2 * by[4, cases.W4_DQ_MM].replays
    assert timed.count(f"{cases.label(cases.W4_DQ_MM)} 256x64 M=4") == 1
    assert len(steps) == runner.steps_for([shapes.Shape(256, 64)], [4], 128)


def test_runner_reports_a_wrong_kernel_as_fail(cpu_runner):
    cpu_runner.gemv = lambda x, qw, qz, s, bias=None: _fake_gemv(x, qw, qz, s) * 1.01  # 1% off: beyond the bound
    cpu_runner.dequantize_awq = lambda qw, qz, s, dtype, transpose: awq_gemm.dequantize(qw, qz, s, dtype, transpose).neg()
    report = runner.run([shapes.Shape(256, 64)], [1], 128)
    by = {(r.m, r.method): r for r in report.results}
    assert by[1, cases.W4_GEMV].status == FAIL and "bound" in by[1, cases.W4_GEMV].note
    assert by[None, cases.W4_DEQUANT].status == FAIL and "differ" in by[None, cases.W4_DEQUANT].note
    assert by[1, cases.W4_DQ_MM].status == FAIL
    assert by[1, cases.FP16].status == PASS
    assert by[1, cases.W4_GEMV].median_us is None


def test_gemv_check_bound_is_tight_enough():
    # the fp32 reference rounded to fp16 passes; a wrong nibble order fails
    layer = cases.Layer(512, 64, 128, seed=5, device="cpu")
    case = cases.W4_GEMV_KERNEL.case(layer, 2)
    args = case.inputs(0)
    good = w4_gemv.gemv_reference(args[0], *args[1:4], layer.meta).half()
    case.check(good, args)
    with pytest.raises(Mismatch):
        case.check(good.flip(1), args)


# ---- the CLI ----


def test_no_gpu_is_exit_3_with_one_line(w4, monkeypatch):
    from w4cli.gpu import kernels

    monkeypatch.setattr(kernels, "probe", lambda: (False, "no CUDA GPU is visible to torch"))
    result = w4("bench", "--shape", "4096x4096", "--batch", "1,4")
    assert result.exit_code == EXIT_ENVIRONMENT
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "CUDA" in lines[0]
    assert result.stdout == ""


@pytest.mark.parametrize("args, needle", [
    (["--shape", "4096by4096"], "KxN"),
    (["--shape", "4000x4096"], "multiple of the group size"),
    (["--shape", "4096x4100"], "multiple of 8"),
    (["--shape", "4096x4096", "--batch", "0"], "--batch"),
    (["--shape", "4096x4096", "--group", "100"], "--group"),
    ([], "--shape"),
])
def test_usage_errors_are_exit_2_before_the_gpu_check(w4, monkeypatch, args, needle):
    from w4cli.gpu import kernels

    monkeypatch.setattr(kernels, "probe", lambda: (False, "no CUDA GPU"))
    result = w4("bench", *args)
    assert result.exit_code == EXIT_USAGE, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and needle in result.stderr


def test_model_dry_run_reads_config_only(w4, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    result = w4("bench", str(tmp_path), "--dry-run", "--no-fuse", "--json", "-")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [(s["k"], s["n"]) for s in doc["shapes"]][:2] == [(4096, 4096), (4096, 1024)]
    assert any("lm_head" in n for n in doc["notes"])
    fused = json.loads(w4("bench", str(tmp_path), "--dry-run", "--json", "-").stdout)  # fused by default
    assert [(s["k"], s["n"]) for s in fused["shapes"]][:2] == [(4096, 6144), (4096, 4096)]
    assert any("fused" in n for n in fused["notes"])


def test_unknown_config_is_refused_with_exit_4(w4, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba", "d_inner": 4096}))
    result = w4("bench", str(tmp_path), "--dry-run")
    assert result.exit_code == EXIT_REFUSED
    assert len(result.stderr.strip().splitlines()) == 1 and "hidden_size" not in result.stdout


def test_cli_run_writes_json_and_markdown(w4, tmp_path, cpu_runner):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
        "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 1000}))
    out = tmp_path / "bench.json"
    result = w4("bench", str(tmp_path / "m"), "--batch", "1,2", "--json", str(out), "--markdown")
    assert result.exit_code == 0, result.stderr
    assert "| 256x512 | qkv_proj | 1 |" in result.stdout and "| 256x256 | o_proj | 1 |" in result.stdout
    assert "One decode step" in result.stdout and "as one CUDA graph" in result.stdout
    doc = json.loads(out.read_text())
    assert doc["ok"] and doc["model"]["model_type"] == "qwen2"
    assert doc["environment"]["command"].startswith("w4 bench ")
    assert [row["m"] for row in doc["summary"]] == [1, 2] and doc["summary"][0]["fp16_us"] > 0
    step_rows = doc["decode_step"]["rows"]
    assert [row["m"] for row in step_rows] == [1, 2] and all(row["w4_us"] > 0 and row["fp16_us"] > 0 for row in step_rows)
    assert {(r["method"], r["layers_measured"], r["layers_total"]) for r in doc["decode_step"]["results"]} == {
        ("fp16", 2, 2), ("w4", 2, 2), ("w4_pdl", 2, 2)}
    # where the step goes: each fused kind alone for fp16 and w4 with PDL, its bytes those of the
    # step's body (lm_head is measured apart), every graph 10 us (fake_measure)
    kinds = [(row["m"], row["kind"]) for row in doc["decode_step"]["kinds"]]
    names = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj", "all kinds"]
    assert kinds == [(m, name) for m in (1, 2) for name in names]
    for r in doc["decode_step"]["results"]:
        assert [k["name"] for k in r["kinds"]] == (names[:-1] if r["method"] in ("fp16", "w4_pdl") else [])
        head = 256 * 1000 * 2 + r["m"] * (256 + 1000) * 2
        assert not r["kinds"] or sum(k["bytes"] for k in r["kinds"]) == r["bytes_per_step"] - head
        assert all(k["us"] == 10.0 for k in r["kinds"])  # both decoder layers measured: nothing scaled
    shares = [row["w4_share"] for row in doc["decode_step"]["kinds"] if row["m"] == 1]
    assert shares == [25.0, 25.0, 25.0, 25.0, 100.0]
    assert "Where the decode step goes" in result.stdout and "| 1 | gate_up_proj |" in result.stdout


def test_cli_exits_1_when_a_kernel_fails(w4, cpu_runner):
    cpu_runner.gemv = lambda x, qw, qz, s, bias=None: torch.zeros(x.shape[0], s.shape[1], dtype=torch.float16)
    result = w4("bench", "--shape", "256x64", "--batch", "1")
    assert result.exit_code == EXIT_FAILED
    assert "FAIL" in result.stdout
    assert result.stderr.strip().splitlines()[-1].startswith("error: 1 kernel check(s) failed")
