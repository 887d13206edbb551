"""compressed-tensors pack-quantized checkpoints end to end: `w4 dequantize` bit-identical to the
library's own dequantization (group and channel, symmetric and asymmetric, fp16 and bf16 scales,
actorder), several config groups with targets and the ignore list, shards, MoE names, the Hub
cache, `w4 verify`, `w4 repack`, and every refusal."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.awq_builder import install_hub_cache
from tests.ct_builder import ct_checkpoint, ct_config, random_ct_layer, small_ct_model, weights_args
from tests.test_dequantize_cli import dequantized, load_output
from tests.test_refusals import assert_refused, assert_refused_by_dequantize_and_verify, rewrite_tensors
from w4cli.gpu.checks import raw_bits as bits
from w4cli.errors import EXIT_FAILED

UP = "model.layers.0.mlp.up_proj"
FORMAT_ONLY = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx")


@pytest.mark.parametrize(
    "group_size,symmetric,scale_dtype,actorder",
    [
        (32, True, torch.bfloat16, False),
        (64, False, torch.float16, False),
        (None, True, torch.float16, False),
        (None, False, torch.bfloat16, False),
        (32, False, torch.bfloat16, True),
    ],
)
def test_dequantize_is_bit_identical_to_compressed_tensors(tmp_path, w4, group_size, symmetric, scale_dtype, actorder):
    layers = [
        random_ct_layer("model.layers.0.self_attn.o_proj", 256, 48, group_size, 1, symmetric, scale_dtype, actorder, bias=True),
        random_ct_layer("model.layers.0.mlp.down_proj", 128, 40, group_size, 2, symmetric, scale_dtype, actorder),
    ]
    norm = torch.randn(48).to(scale_dtype)
    config = ct_config({"group_0": (["Linear"], weights_args(group_size, symmetric, "group" if actorder else None))})
    src = ct_checkpoint(layers, {"model.norm.weight": norm}, config).write(tmp_path / "src", extra_files={"tokenizer.json": "{}"})
    summary, out = dequantized(w4, src, tmp_path / "out")
    name = str(scale_dtype).removeprefix("torch.")
    assert summary["dtype"] == name and "scales" in summary["dtype_from"]
    for layer in layers:
        weight = out[f"{layer.prefix}.weight"]
        assert weight.shape == (layer.n, layer.k)
        assert torch.equal(bits(weight), bits(layer.library())), layer.prefix
        assert torch.equal(bits(weight), bits(layer.exact().to(scale_dtype))), layer.prefix
    if scale_dtype == torch.float16:
        assert ((weight.abs() < 2**-14) & (weight != 0)).any(), "subnormal results must be covered"
    assert torch.equal(out["model.layers.0.self_attn.o_proj.bias"], layers[0].bias)
    assert not [n for n in out if n.rpartition(".")[2] in FORMAT_ONLY]
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == name


@pytest.mark.parametrize("dtype,torch_dtype", [("float16", torch.float16), ("float32", torch.float32)])
def test_other_dtypes_are_the_exactly_rounded_product(tmp_path, w4, dtype, torch_dtype):
    ckpt = small_ct_model(seed=3, symmetric=False)  # bf16 scales
    src = ckpt.write(tmp_path / "src")
    _, out = dequantized(w4, src, tmp_path / "out", "--dtype", dtype)
    for layer in ckpt.layers:
        assert torch.equal(bits(out[f"{layer.prefix}.weight"]), bits(layer.exact().to(torch_dtype)))


def test_config_groups_ignore_moe_shards_and_the_hub_cache(tmp_path, w4):
    """Two config groups (a pattern beats Linear), the ignore list by name and by pattern, MoE
    expert names, K not a multiple of 8 (padding nibbles) and N not a multiple of 8, a layer split
    across shards, all read from an offline Hub cache."""
    experts = [
        random_ct_layer(f"model.layers.0.mlp.experts.{e}.{w}", 64, 32, 32, seed=10 * e + i, symmetric=False)
        for e in range(2)
        for i, w in enumerate(["gate_proj", "up_proj", "down_proj"])
    ]
    attn = random_ct_layer("model.layers.0.self_attn.q_proj", 100, 20, None, seed=30)  # channel, K = 100, N = 20
    plain = {
        "lm_head.weight": torch.randn(16, 64).bfloat16(),
        "model.layers.0.mlp.gate.weight": torch.randn(2, 64).bfloat16(),
        "model.layers.0.self_attn.k_proj.weight": torch.randn(8, 100).bfloat16(),
    }
    config = ct_config(
        {"group_0": (["re:.*self_attn.*"], weights_args(None)), "group_1": (["Linear"], weights_args(32, symmetric=False))},
        ignore=["lm_head", "re:.*mlp\\.gate$", "model.layers.0.self_attn.k_proj"],
    )
    ckpt = ct_checkpoint([*experts, attn], plain, config)
    names = list(ckpt.all_tensors())
    first = experts[0].prefix
    rest = [n for n in names if not n.startswith(first + ".")]
    shards = {
        "model-00001-of-00002.safetensors": rest[::2] + [f"{first}.weight_packed", f"{first}.weight_shape"],
        "model-00002-of-00002.safetensors": rest[1::2] + [f"{first}.weight_scale", f"{first}.weight_zero_point"],
    }
    src = ckpt.write(tmp_path / "src", shards=shards)
    install_hub_cache(tmp_path / "hub", "org/tiny-ct", src)
    result = w4("dequantize", "org/tiny-ct", tmp_path / "out", "--cache-dir", tmp_path / "hub", "--device", "cpu", "--max-shard-size", "4KB")
    assert result.exit_code == 0, result.stderr
    out = load_output(tmp_path / "out")
    for layer in [*experts, attn]:
        assert torch.equal(bits(out[f"{layer.prefix}.weight"]), bits(layer.library())), layer.prefix
    for name, value in plain.items():
        assert torch.equal(out[name], value)
    assert w4("verify", "org/tiny-ct", "--cache-dir", tmp_path / "hub").exit_code == 0
    assert w4("verify", tmp_path / "out", "--against", "org/tiny-ct", "--cache-dir", tmp_path / "hub").exit_code == 0


def test_verify_catches_one_ulp(tmp_path, w4):
    src = small_ct_model(seed=4).write(tmp_path / "src")
    dequantized(w4, src, tmp_path / "out")
    assert w4("verify", tmp_path / "out", "--against", src).exit_code == 0
    tensors = load_file(tmp_path / "out" / "model.safetensors")
    tensors[f"{UP}.weight"].view(torch.int16)[1, 2] += 1
    save_file(tensors, tmp_path / "out" / "model.safetensors", metadata={"format": "pt"})
    result = w4("verify", tmp_path / "out", "--against", src)
    assert result.exit_code == EXIT_FAILED and f"{UP}.weight" in result.stdout + result.stderr


@pytest.mark.parametrize("group_size,symmetric", [(32, True), (None, False)])
def test_repack_fp16_is_lossless(tmp_path, w4, group_size, symmetric):
    """A symmetric layer's implicit zero point becomes explicit zeros of 8."""
    ckpt = small_ct_model(seed=5, group_size=group_size, symmetric=symmetric, scale_dtype=torch.float16)
    src = ckpt.write(tmp_path / "src")
    result = w4("repack", src, tmp_path / "w4")
    assert result.exit_code == 0, result.stderr
    qc = json.loads((tmp_path / "w4" / "config.json").read_text())["quantization_config"]
    assert qc["group_size"] == (32 if group_size else -1)
    repacked = load_file(tmp_path / "w4" / "model.safetensors")
    if symmetric:
        assert (repacked[f"{UP}.qzeros"].view(-1) == int.from_bytes(b"\x88" * 4, "little", signed=True)).all()
    _, a = dequantized(w4, src, tmp_path / "a")
    _, b = dequantized(w4, tmp_path / "w4", tmp_path / "b", "--dtype", "float16")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(bits(a[name]), bits(b[name])), name
    assert w4("verify", tmp_path / "w4", "--against", src).exit_code == 0


def test_repack_refuses_bf16_scales_and_actorder(tmp_path, w4):
    src = small_ct_model(seed=6).write(tmp_path / "bf16")
    assert_refused(w4("repack", src, tmp_path / "w4"), tmp_path / "w4", "float16 scales, not bfloat16", "w4 dequantize still reads")
    layer = random_ct_layer(UP, 64, 32, 32, seed=7, scale_dtype=torch.float16, actorder=True)
    config = ct_config({"group_0": (["Linear"], weights_args(32, actorder="group"))})
    act = ct_checkpoint([layer], {}, config).write(tmp_path / "act")
    assert_refused(w4("repack", act, tmp_path / "w4b"), tmp_path / "w4b", "weight_g_idx permutes the groups")


def _weights(**changes) -> dict:
    return {**weights_args(32), **changes}


@pytest.mark.parametrize(
    "config,edit,named",
    [
        ({"format": "marlin-24"}, None, "format 'marlin-24'"),
        ({"config_groups": {"g": {"targets": ["Linear"], "weights": _weights(num_bits=8)}}}, None, "int 8-bit weights"),
        ({"config_groups": {"g": {"targets": ["Linear"], "weights": _weights(type="float")}}}, None, "float 4-bit weights"),
        ({"config_groups": {"g": {"targets": ["Linear"], "weights": _weights(strategy="tensor")}}}, None, "strategy 'tensor'"),
        ({"config_groups": {"g": {"targets": ["Linear"], "weights": _weights(), "input_activations": {"num_bits": 8}}}}, None, "input_activations"),
        ({"config_groups": {"g": {"targets": ["Embedding"], "weights": _weights()}}}, None, "target class 'Embedding'"),
        ({"config_groups": {"g": {"targets": ["re:.*self_attn.*"], "weights": _weights()}}}, None, "no compressed-tensors config group targets it"),
        ({"config_groups": {"g": {"targets": ["Linear"], "weights": _weights(group_size=64)}}}, None, "group_size 64"),
        ({"config_groups": {"g": {"targets": ["Linear"], "weights": _weights(symmetric=False)}}}, None, "no weight_zero_point"),
        ({"quantization_status": "frozen"}, None, "quantization_status 'frozen'"),
        ({"kv_cache_scheme": {"num_bits": 8, "type": "float"}}, None, "kv_cache_scheme"),
        ({"ignore": ["re:.*up_proj"]}, None, "lists 're:.*up_proj' in ignore"),
        ({}, lambda t: t.__setitem__(f"{UP}.weight_zero_point", torch.zeros(5, 3, dtype=torch.int32)), "weight_zero_point is present but its config group is symmetric"),
        ({}, lambda t: t.__setitem__(f"{UP}.weight_shape", torch.tensor([40, 104])), "weight_shape [40, 104] needs int32 [40, 13]"),
        ({}, lambda t: t.__setitem__(f"{UP}.weight_scale", t[f"{UP}.weight_scale"][:, :2].clone()), "weight_scale has shape [40, 2]"),
        ({}, lambda t: t.__setitem__(f"{UP}.weight_scale", t[f"{UP}.weight_scale"].float()), "weight_scale is float32"),
        ({}, lambda t: t.pop(f"{UP}.weight_shape"), f"{UP}.weight_packed has no {UP}.weight_shape"),
        ({}, lambda t: t[f"{UP}.weight_scale"].__setitem__((3, 1), 0.0), "NaN, inf or zero"),
    ],
)
def test_refusals(tmp_path, w4, config, edit, named):
    ckpt = small_ct_model(seed=8)
    ckpt.config["quantization_config"].update(config)
    src = ckpt.write(tmp_path / "src")
    if edit is not None:
        rewrite_tensors(src, edit)
    assert_refused_by_dequantize_and_verify(w4, src, tmp_path / "out", named)
