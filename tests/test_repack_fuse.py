"""`w4 repack --fuse qkv,gate_up`: q/k/v and gate/up written as one linear each in w4's layout, and
`dequantize` and `verify` of that checkpoint give back every part's tensors bit for bit; groups that
cannot be fused and fused tensors that do not add up are refused with one line and exit 4."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.awq_builder import Checkpoint, random_layer
from tests.test_dequantize_cli import load_output
from w4cli.gpu.checks import raw_bits as bits
from w4cli.errors import EXIT_OK, EXIT_REFUSED, EXIT_USAGE
from w4cli.formats import w4_gemv

PROJ = {"q_proj": 64, "k_proj": 32, "v_proj": 32, "o_proj": 64, "gate_proj": 96, "up_proj": 96, "down_proj": 64}


def llama(layers: int = 2, qkv_bias: bool = False, drop: str | None = None) -> Checkpoint:
    """A Llama-shaped AWQ checkpoint (hidden 64, kv 32, MLP 96), group 32; `drop`: a projection
    left out of the last layer."""
    linears = []
    for i in range(layers):
        for name, n in PROJ.items():
            if i == layers - 1 and name == drop:
                continue
            parent = "self_attn" if name in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            k = 96 if name == "down_proj" else 64
            bias = qkv_bias and name in ("q_proj", "k_proj", "v_proj")
            linears.append(random_layer(f"model.layers.{i}.{parent}.{name}", k, n, 32, seed=10 * i + len(linears), bias=bias))
    g = torch.Generator().manual_seed(1)
    plain = {"model.embed_tokens.weight": torch.randn(16, 64, generator=g).half(), "model.norm.weight": torch.randn(64, generator=g).half()}
    return Checkpoint(linears, plain, group_size=32)


def repack(w4, src, out, *args):
    result = w4("repack", src, out, *args, "--json", "-")
    assert result.exit_code == EXIT_OK, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("qkv_bias", [False, True], ids=["no-bias", "qkv-bias"])
def test_fused_repack_dequantizes_and_verifies_to_the_original_tensors(tmp_path, w4, qkv_bias):
    src = llama(qkv_bias=qkv_bias).write(tmp_path / "src")
    summary = repack(w4, src, tmp_path / "fused", "--fuse", "qkv,gate_up")
    assert (summary["fused_linears"], summary["layers_fused"], summary["layers_repacked"]) == (4, 10, 14)
    qc = json.loads((tmp_path / "fused" / "config.json").read_text())["quantization_config"]
    assert qc["fused"] == {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}

    fused = load_file(tmp_path / "fused" / "model.safetensors")
    assert not any(".q_proj." in name or ".gate_proj." in name for name in fused)
    assert fused["model.layers.1.self_attn.qkv_proj.split"].tolist() == [64, 32, 32]
    assert fused["model.layers.0.mlp.gate_up_proj.meta"].tolist() == [w4_gemv.LAYOUT_VERSION, 64, 192, 32]
    assert ("model.layers.0.self_attn.qkv_proj.bias" in fused) == qkv_bias
    # the fused linear is the parts' own w4 layers, concatenated along N
    repack(w4, src, tmp_path / "plain")
    plain = load_file(tmp_path / "plain" / "model.safetensors")
    for suffix, dim in (("qweight", 0), ("qzeros", 1), ("scales", 1)):
        parts = [plain[f"model.layers.1.mlp.{p}.{suffix}"] for p in ("gate_proj", "up_proj")]
        assert torch.equal(fused[f"model.layers.1.mlp.gate_up_proj.{suffix}"], torch.cat(parts, dim=dim)), suffix

    for model in ("src", "fused"):
        result = w4("dequantize", tmp_path / model, tmp_path / f"dense-{model}", "--device", "cpu")
        assert result.exit_code == EXIT_OK, result.stderr
    want, got = load_output(tmp_path / "dense-src"), load_output(tmp_path / "dense-fused")
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(bits(got[name]), bits(want[name])), name

    report = tmp_path / "verify.json"
    checked = ((tmp_path / "fused",), (tmp_path / "fused", "--against", src), (tmp_path / "dense-fused", "--against", tmp_path / "fused"))
    for args in checked:
        result = w4("verify", *args, "--json", report)
        assert result.exit_code == EXIT_OK, result.stdout + result.stderr
        rows = json.loads(report.read_text())["checks"]
        assert all(row["status"] in ("PASS", "SKIP") for row in rows), [r for r in rows if r["status"] not in ("PASS", "SKIP")]


def test_verify_against_catches_a_fused_part_that_changed(tmp_path, w4):
    src = llama(layers=1).write(tmp_path / "src")
    repack(w4, src, tmp_path / "fused", "--fuse", "gate_up")
    path = tmp_path / "fused" / "model.safetensors"
    tensors = load_file(path)
    scales = tensors["model.layers.0.mlp.gate_up_proj.scales"]
    scales[0, 100] = -scales[0, 100]  # a column of up_proj (gate_proj is the first 96)
    save_file(tensors, path, metadata={"format": "pt"})
    result = w4("verify", tmp_path / "fused", "--against", src)
    assert result.exit_code != EXIT_OK and "gate_up_proj.scales" in result.stdout + result.stderr


def bf16_bias(layer):
    layer.bias = layer.bias.bfloat16()
    return layer


@pytest.mark.parametrize(
    ("model", "fuse", "message"),
    [
        (llama(drop="v_proj"), "qkv", "model.layers.1.self_attn.q_proj has no quantized model.layers.1.self_attn.v_proj"),
        (Checkpoint([random_layer("model.layers.0.mlp.up_proj", 64, 32, 32, 0)], group_size=32), "qkv", "no quantized q_proj"),
        (Checkpoint([random_layer("m.gate_proj", 64, 32, 32, 0, bias=True), random_layer("m.up_proj", 64, 32, 32, 1)], group_size=32),
         "gate_up", "some of m.gate_proj, m.up_proj have a bias"),
        (Checkpoint([random_layer("m.gate_proj", 64, 32, 32, 0), random_layer("m.up_proj", 96, 32, 32, 1)], group_size=32),
         "gate_up", "differ in in_features or group size"),
        (Checkpoint([random_layer("m.gate_proj", 64, 32, 32, 0, bias=True), bf16_bias(random_layer("m.up_proj", 64, 32, 32, 1, bias=True))],
                    group_size=32), "gate_up", "the biases of m.gate_proj, m.up_proj differ in dtype"),
    ],
    ids=["part-missing", "nothing-to-fuse", "bias-on-one-part", "different-k", "bias-dtypes"],
)
def test_groups_that_cannot_be_fused_are_refused_before_writing(tmp_path, w4, model, fuse, message):
    src = model.write(tmp_path / "src")
    result = w4("repack", src, tmp_path / "out", "--fuse", fuse)
    assert result.exit_code == EXIT_REFUSED, result.stdout + result.stderr
    [line] = result.stderr.strip().splitlines()
    assert message in line and line.startswith("error: --fuse:"), line
    assert not (tmp_path / "out").exists()


def test_an_unknown_fusion_is_a_usage_error(tmp_path, w4):
    src = llama(layers=1).write(tmp_path / "src")
    result = w4("repack", src, tmp_path / "out", "--fuse", "qkv,gate")
    assert result.exit_code == EXIT_USAGE
    assert "--fuse takes a comma-separated list of qkv, gate_up" in result.stderr


def _rewrite(path, change):
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.__setitem__("model.layers.0.self_attn.qkv_proj.split", torch.tensor([64, 40, 24], dtype=torch.int32)),
         None),  # still adds up, multiples of 8: a different but legal split is read as written
        (lambda t: t.__setitem__("model.layers.0.self_attn.qkv_proj.split", torch.tensor([64, 32, 31], dtype=torch.int32)),
         "qkv_proj.split holds [64, 32, 31]: the parts' N must be positive multiples of 8 adding up to N=128"),
        (lambda t: t.__setitem__("model.layers.0.self_attn.qkv_proj.split", torch.tensor([96, 32], dtype=torch.int32)),
         "qkv_proj.split must be I32 [3]"),
        (lambda t: t.__setitem__("model.layers.0.self_attn.k_proj.weight", torch.zeros(32, 64, dtype=torch.float16)),
         "qkv_proj is fused from model.layers.0.self_attn.k_proj, but the checkpoint also has model.layers.0.self_attn.k_proj.weight"),
    ],
    ids=["other-legal-split", "not-multiple-of-8", "wrong-length", "part-also-present"],
)
def test_fused_tensors_that_do_not_add_up_are_refused(tmp_path, w4, change, message):
    src = llama(layers=1).write(tmp_path / "src")
    repack(w4, src, tmp_path / "fused", "--fuse", "qkv")
    _rewrite(tmp_path / "fused" / "model.safetensors", change)
    result = w4("dequantize", tmp_path / "fused", tmp_path / "dense", "--device", "cpu")
    if message is None:
        assert result.exit_code == EXIT_OK, result.stderr
        assert load_output(tmp_path / "dense")["model.layers.0.self_attn.k_proj.weight"].shape == (40, 64)
        return
    assert result.exit_code == EXIT_REFUSED
    [line] = result.stderr.strip().splitlines()
    assert message in line, line


def test_a_split_without_the_config_entry_is_refused(tmp_path, w4):
    src = llama(layers=1).write(tmp_path / "src")
    repack(w4, src, tmp_path / "fused", "--fuse", "qkv")
    config_path = tmp_path / "fused" / "config.json"
    config = json.loads(config_path.read_text())
    del config["quantization_config"]["fused"]
    config_path.write_text(json.dumps(config))
    result = w4("dequantize", tmp_path / "fused", tmp_path / "dense", "--device", "cpu")
    assert result.exit_code == EXIT_REFUSED
    assert 'quantization_config has no "fused" entry naming the parts of qkv_proj' in result.stderr
