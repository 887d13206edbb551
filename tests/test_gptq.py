"""GPTQ checkpoints end to end: `w4 dequantize` bit-identical to GPTQ's own dequantization (v1 and
v2 zero points, the v1 borrow, sym, act-order, every group size), the exactly rounded product in
other dtypes, shards, MoE names, the Hub cache, the legacy quantize_config.json, `w4 verify`,
`w4 repack`, and every refusal."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.awq_builder import install_hub_cache
from tests.gptq_builder import gptq_checkpoint, gptqmodel_reference, random_gptq_layer, small_gptq_model
from tests.test_dequantize_cli import dequantized, load_output
from tests.test_refusals import assert_refused, assert_refused_by_dequantize_and_verify, rewrite_tensors
from w4cli.gpu.checks import raw_bits as bits
from w4cli.errors import EXIT_FAILED

UP = "model.layers.0.mlp.up_proj"
FORMAT_ONLY = ("qweight", "qzeros", "scales", "g_idx")


def reference(layer) -> torch.Tensor:
    t = layer.tensors()
    p = layer.prefix
    return gptqmodel_reference(t[f"{p}.qweight"], t[f"{p}.qzeros"], t[f"{p}.scales"], torch.from_numpy(layer.g_idx), layer.v1)


@pytest.mark.parametrize(
    "group_size,sym,desc_act,v1",
    [(32, False, False, True), (64, True, False, True), (128, False, True, True), (-1, False, False, False), (32, False, True, False), (128, True, True, False)],
)
def test_dequantize_is_bit_identical_to_gptq(tmp_path, w4, group_size, sym, desc_act, v1):
    layers = [
        random_gptq_layer("model.layers.0.self_attn.q_proj", 256, 48, group_size, seed=1, sym=sym, desc_act=desc_act, v1=v1, bias=True),
        random_gptq_layer("model.layers.0.mlp.down_proj", 128, 40, group_size, seed=2, sym=sym, desc_act=desc_act, v1=v1),
    ]
    norm = torch.randn(48).half()
    fmt = "gptq" if v1 else "gptq_v2"
    ckpt = gptq_checkpoint(layers, {"model.norm.weight": norm}, group_size=group_size, sym=sym, desc_act=desc_act, checkpoint_format=fmt)
    src = ckpt.write(tmp_path / "src", extra_files={"tokenizer.json": "{}"})
    summary, out = dequantized(w4, src, tmp_path / "out")
    assert summary["dtype"] == "float16" and "scales" in summary["dtype_from"]
    for layer in layers:
        weight = out[f"{layer.prefix}.weight"]
        assert weight.shape == (layer.n, layer.k)
        assert torch.equal(bits(weight), bits(reference(layer))), layer.prefix
        assert torch.equal(bits(weight), bits(layer.exact().half().contiguous())), layer.prefix
        assert ((weight.abs() < 2**-14) & (weight != 0)).any(), "subnormal results must be covered"
    assert torch.equal(out["model.layers.0.self_attn.q_proj.bias"], layers[0].bias)
    assert torch.equal(out["model.norm.weight"], norm)
    assert not [name for name in out if name.rpartition(".")[2] in FORMAT_ONLY]
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float16"


def test_v1_zero_points_are_read_as_whole_words(tmp_path, w4):
    """The borrow is in the file: decoding the v1 words nibble by nibble (+1 each) gives other zero
    points than the true ones, and the output follows the true ones."""
    layer = random_gptq_layer(UP, 128, 32, 32, seed=3)
    stored = layer.qzeros().view(np.uint32)
    per_nibble = np.stack([((stored >> np.uint32(4 * i)) & 0xF) + 1 for i in range(8)], axis=-1).reshape(layer.zeros.shape)
    assert (per_nibble != layer.zeros).any(), "the checkpoint must hold a borrow"
    assert ((layer.zeros == 0) & (np.roll(layer.zeros, -1, axis=1) != 0)).any()
    src = gptq_checkpoint([layer], group_size=32).write(tmp_path / "src")
    _, out = dequantized(w4, src, tmp_path / "out")
    assert torch.equal(bits(out[f"{UP}.weight"]), bits(layer.exact().half().contiguous()))


@pytest.mark.parametrize("dtype,torch_dtype", [("bfloat16", torch.bfloat16), ("float32", torch.float32), ("float16", torch.float16)])
def test_other_dtypes_are_the_exactly_rounded_product(tmp_path, w4, dtype, torch_dtype):
    ckpt = small_gptq_model(seed=5, desc_act=True)
    src = ckpt.write(tmp_path / "src")
    summary, out = dequantized(w4, src, tmp_path / "out", "--dtype", dtype)
    assert summary["dtype"] == dtype and summary["dtype_from"] == "--dtype"
    for layer in ckpt.layers:
        assert torch.equal(bits(out[f"{layer.prefix}.weight"]), bits(layer.exact().to(torch_dtype).contiguous()))
    assert out["model.norm.weight"].dtype == torch_dtype


def test_bf16_scales_auto_keeps_bf16(tmp_path, w4):
    layer = random_gptq_layer(UP, 128, 32, 64, seed=6, scale_dtype=torch.bfloat16)
    src = gptq_checkpoint([layer], group_size=64).write(tmp_path / "src")
    summary, out = dequantized(w4, src, tmp_path / "out")
    assert summary["dtype"] == "bfloat16"
    assert torch.equal(bits(out[f"{UP}.weight"]), bits(reference(layer)))
    assert reference(layer).dtype == torch.bfloat16


def test_sharded_moe_through_the_offline_hub_cache(tmp_path, w4):
    layers = [
        random_gptq_layer(f"model.layers.0.mlp.experts.{e}.{w}", 64, 32, 32, seed=10 * e + i, desc_act=e == 1)
        for e in range(2)
        for i, w in enumerate(["gate_proj", "up_proj", "down_proj"])
    ]
    ckpt = gptq_checkpoint(layers, {"model.layers.0.mlp.gate.weight": torch.randn(2, 64).half()}, group_size=32, desc_act=True)
    names = list(ckpt.all_tensors())
    first = "model.layers.0.mlp.experts.0.gate_proj"
    shards = {
        "model-00001-of-00002.safetensors": [n for n in names if not n.startswith(first)] [::2] + [f"{first}.qweight", f"{first}.g_idx"],
        "model-00002-of-00002.safetensors": [n for n in names if not n.startswith(first)][1::2] + [f"{first}.qzeros", f"{first}.scales"],
    }
    src = ckpt.write(tmp_path / "src", shards=shards)
    install_hub_cache(tmp_path / "hub", "org/tiny-gptq", src)
    result = w4("dequantize", "org/tiny-gptq", tmp_path / "out", "--cache-dir", tmp_path / "hub", "--device", "cpu", "--max-shard-size", "4KB")
    assert result.exit_code == 0, result.stderr
    out = load_output(tmp_path / "out")
    for layer in layers:
        assert torch.equal(bits(out[f"{layer.prefix}.weight"]), bits(reference(layer))), layer.prefix
    assert (tmp_path / "out" / "model.safetensors.index.json").is_file()
    verify = w4("verify", "org/tiny-gptq", "--cache-dir", tmp_path / "hub")
    assert verify.exit_code == 0, verify.stdout + verify.stderr


def test_legacy_quantize_config_json_without_g_idx(tmp_path, w4):
    ckpt = small_gptq_model(seed=7, v1=True)
    for layer in ckpt.layers:
        layer.with_g_idx = False
    src = ckpt.write(tmp_path / "src")
    config = json.loads((src / "config.json").read_text())
    legacy = config.pop("quantization_config")
    del legacy["quant_method"]
    (src / "config.json").write_text(json.dumps(config))
    (src / "quantize_config.json").write_text(json.dumps(legacy))
    _, out = dequantized(w4, src, tmp_path / "out")
    assert not (tmp_path / "out" / "quantize_config.json").exists()
    for layer in ckpt.layers:
        assert torch.equal(bits(out[f"{layer.prefix}.weight"]), bits(layer.exact().half().contiguous()))


def test_verify_integrity_and_output_against_source(tmp_path, w4):
    src = small_gptq_model(seed=8, desc_act=True, bias=True).write(tmp_path / "src", extra_files={"tokenizer.json": "{}"})
    result = w4("verify", src, "--json", tmp_path / "i.json")
    assert result.exit_code == 0, result.stdout
    rows = {c["name"]: c for c in json.loads((tmp_path / "i.json").read_text())["checks"]}
    assert "2 g_idx valid group maps" in rows["nibbles"]["detail"]
    for dtype in ("float16", "bfloat16"):
        out = tmp_path / f"out-{dtype}"
        dequantized(w4, src, out, "--dtype", dtype)
        assert w4("verify", out, "--against", src).exit_code == 0
    # one ulp in one element is caught
    out = tmp_path / "out-float16"
    tensors = load_file(out / "model.safetensors")
    tensors[f"{UP}.weight"].view(torch.int16)[3, 5] += 1
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    assert w4("verify", out, "--against", src).exit_code == EXIT_FAILED


def test_verify_reports_a_bad_group_map_as_a_row(tmp_path, w4):
    ckpt = small_gptq_model(seed=9, desc_act=True)
    ckpt.layers[0].g_idx[5] = 7  # group 7 of 3
    src = ckpt.write(tmp_path / "src")
    result = w4("verify", src, "--json", tmp_path / "r.json")
    assert result.exit_code == EXIT_FAILED
    rows = {c["name"]: c for c in json.loads((tmp_path / "r.json").read_text())["checks"]}
    assert rows["nibbles"]["status"] == "FAIL" and "g_idx[5] = 7" in rows["nibbles"]["detail"]


@pytest.mark.parametrize("desc_act", [False, True])
def test_repack_is_lossless(tmp_path, w4, desc_act):
    """desc_act true with the identity grouping (static groups) repacks like desc_act false."""
    ckpt = small_gptq_model(seed=11, group_size=32, desc_act=False, bias=True)
    ckpt.config["quantization_config"]["desc_act"] = desc_act
    src = ckpt.write(tmp_path / "src")
    result = w4("repack", src, tmp_path / "w4", "--json", "-")
    assert result.exit_code == 0, result.stderr
    qc = json.loads((tmp_path / "w4" / "config.json").read_text())["quantization_config"]
    assert qc["format"] == "w4-gemv" and qc["group_size"] == 32 and qc["source_quantization_config"]["quant_method"] == "gptq"
    repacked = load_file(tmp_path / "w4" / "model.safetensors")
    assert not [name for name in repacked if name.endswith("g_idx")]
    _, a = dequantized(w4, src, tmp_path / "a")
    _, b = dequantized(w4, tmp_path / "w4", tmp_path / "b")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(bits(a[name]), bits(b[name])), name
    assert w4("verify", tmp_path / "w4", "--against", src).exit_code == 0


def test_repack_refuses_act_order_and_bf16_scales_but_dequantize_reads_them(tmp_path, w4):
    act_order = small_gptq_model(seed=12, desc_act=True).write(tmp_path / "act")
    assert_refused(w4("repack", act_order, tmp_path / "w4a"), tmp_path / "w4a", "g_idx permutes the groups", "w4 dequantize still reads")
    bf16 = gptq_checkpoint([random_gptq_layer(UP, 64, 32, 32, seed=13, scale_dtype=torch.bfloat16)], group_size=32).write(tmp_path / "bf16")
    assert_refused(w4("repack", bf16, tmp_path / "w4b"), tmp_path / "w4b", "float16 scales, not bfloat16", "w4 dequantize still reads")
    for src in (act_order, bf16):
        assert w4("dequantize", src, tmp_path / f"dense-{src.name}", "--device", "cpu").exit_code == 0


def _permute(tensors) -> None:
    tensors[f"{UP}.g_idx"] = tensors[f"{UP}.g_idx"].flip(0).contiguous()


@pytest.mark.parametrize(
    "config,edit,named",
    [
        ({"bits": 8}, None, "GPTQ with 8 bits"),
        ({"checkpoint_format": "awq_gemm"}, None, "GPTQ checkpoint_format 'awq_gemm'"),
        ({"is_marlin_format": True}, None, "is_marlin_format"),
        ({"group_size": 64}, None, "group_size 64"),
        ({}, _permute, "permutes the groups but config.json says desc_act false"),
        ({"desc_act": True}, lambda t: t[f"{UP}.g_idx"].__setitem__(0, -1), "g_idx[0] = -1 is not a group"),
        ({"desc_act": True}, lambda t: t[f"{UP}.g_idx"].__setitem__(0, 1), "group 0 holds 31 columns"),
        ({}, lambda t: t.__setitem__(f"{UP}.g_idx", t[f"{UP}.g_idx"][:-1].clone()), "g_idx has shape [95]"),
        ({}, lambda t: t.__setitem__(f"{UP}.g_idx", t[f"{UP}.g_idx"].long()), "g_idx is int32, got int64"),
        ({}, lambda t: t.pop(f"{UP}.qzeros"), f"{UP}.qweight has no {UP}.qzeros"),
        ({}, lambda t: t.__setitem__(f"{UP}.scales", t[f"{UP}.scales"][:, :-8].clone()), "holds 40 output channels but scales"),
        ({}, lambda t: t.__setitem__(f"{UP}.weight", torch.zeros(40, 96).half()), "has both qweight and weight"),
        ({"sym": True}, None, "says sym true"),
    ],
)
def test_refusals(tmp_path, w4, config, edit, named):
    ckpt = small_gptq_model(seed=14)
    ckpt.config["quantization_config"].update(config)
    src = ckpt.write(tmp_path / "src")
    if edit is not None:
        rewrite_tensors(src, edit)
    assert_refused_by_dequantize_and_verify(w4, src, tmp_path / "out", named)
