"""`w4 gguf` as a command: refusals (one line, exit 4, nothing written), the output file's safety
(--force, an existing file, the temporary directory), --json, --split-max-size, the metadata and
tokenizer keys llama.cpp reads."""

from __future__ import annotations

import json

import gguf
import pytest
import torch

from tests.awq_builder import Checkpoint, random_layer
from tests.ct_builder import ct_checkpoint, ct_config, random_ct_layer, weights_args
from tests.gguf_models import as_llama, build
from tests.gptq_builder import gptq_checkpoint, random_gptq_layer
from tests.test_gguf_blocks import _plain


def refused(w4, tmp_path, source, expected: str, *extra):
    out = tmp_path / "out.gguf"
    result = w4("gguf", source, out, *extra)
    assert result.exit_code == 4, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert not out.exists()
    assert not [p.name for p in tmp_path.iterdir() if ".w4tmp-" in p.name]
    return lines[0]


def test_act_order_refused(w4, tmp_path):
    layer = random_gptq_layer("model.layers.0.mlp.up_proj", 128, 40, 32, 1, desc_act=True)
    source = as_llama(gptq_checkpoint([layer], _plain(), group_size=32, desc_act=True), tmp_path / "m")
    line = refused(w4, tmp_path, source, "model.layers.0.mlp.up_proj: its g_idx permutes the groups (act-order)")
    assert "w4 dequantize" in line and "llama-quantize" in line


def test_group_not_a_multiple_of_32_refused(w4, tmp_path):
    layer = random_layer("model.layers.0.mlp.up_proj", 64, 40, 16, 2)
    source = as_llama(Checkpoint([layer], _plain(), group_size=16), tmp_path / "m")
    refused(w4, tmp_path, source, "model.layers.0.mlp.up_proj: group size 16 is not a multiple of 32")


def test_in_features_not_a_multiple_of_32_refused(w4, tmp_path):
    layer = random_layer("model.layers.0.mlp.up_proj", 80, 40, 80, 3)
    source = as_llama(Checkpoint([layer], _plain(), group_size=-1), tmp_path / "m")
    refused(w4, tmp_path, source, "model.layers.0.mlp.up_proj: in_features 80 is not a multiple of 32")


def test_bf16_scales_that_fp16_cannot_hold_refused(w4, tmp_path):
    """bf16 scales from 2^-23: below fp16's subnormals, d = s cannot be exact."""
    layer = random_ct_layer("model.layers.0.mlp.up_proj", 64, 40, 32, 4, True, torch.bfloat16)
    source = as_llama(ct_checkpoint([layer], _plain(), ct_config({"g": (["Linear"], weights_args(32))})), tmp_path / "m")
    refused(w4, tmp_path, source, "model.layers.0.mlp.up_proj: its bfloat16 scale")


def test_bf16_scales_that_fit_fp16_converted(w4, tmp_path):
    layer = random_ct_layer("model.layers.0.mlp.up_proj", 64, 40, 32, 4, True, torch.float16)
    layer.scales = layer.scales.bfloat16()  # bf16 values fp16 holds... where they are
    exact = layer.scales.float().half().float() == layer.scales.float()
    layer.scales = torch.where(exact, layer.scales, torch.ones_like(layer.scales))
    source = as_llama(ct_checkpoint([layer], _plain(), ct_config({"g": (["Linear"], weights_args(32))})), tmp_path / "m")
    assert w4("gguf", source, tmp_path / "out.gguf").exit_code == 0


def test_unsupported_architecture_refused(w4, tmp_path):
    ckpt = Checkpoint([random_layer("model.layers.0.mlp.up_proj", 64, 40, 32, 5)], _plain())
    ckpt.config = {"architectures": ["GPT2LMHeadModel"]}
    source = as_llama(ckpt, tmp_path / "m")
    refused(w4, tmp_path, source, "config.json architectures ['GPT2LMHeadModel'] is not one w4 gguf converts")


def test_unknown_tensor_refused(w4, tmp_path):
    plain = {**_plain(), "model.layers.0.mlp.adapter.weight": torch.zeros(4, 4).half()}
    source = as_llama(Checkpoint([random_layer("model.layers.0.mlp.up_proj", 64, 40, 32, 6)], plain), tmp_path / "m")
    refused(w4, tmp_path, source, "model.layers.0.mlp.adapter.weight has no GGUF tensor name")


def test_tokenizer_that_is_not_byte_level_bpe_refused(w4, tmp_path):
    source = build(tmp_path / "m", layers=1)
    document = json.loads((source / "tokenizer.json").read_text())
    document["model"]["byte_fallback"] = True
    (source / "tokenizer.json").write_text(json.dumps(document))
    refused(w4, tmp_path, source, "tokenizer.json is not a byte-level BPE tokenizer")


def test_existing_out_refused_then_replaced_with_force(w4, tmp_path):
    source = build(tmp_path / "m", layers=1)
    out = tmp_path / "out.gguf"
    out.write_bytes(b"not a gguf")
    result = w4("gguf", source, out)
    assert result.exit_code == 4 and "out.gguf exists (pass --force to replace it)" in result.stderr
    result = w4("gguf", source, out, "--force")
    assert result.exit_code == 4 and "--force replaces only a GGUF file" in result.stderr
    assert out.read_bytes() == b"not a gguf"
    out.unlink()
    assert w4("gguf", source, out).exit_code == 0
    assert w4("gguf", source, out, "--force").exit_code == 0
    assert "--force" in gguf.GGUFReader(out).fields["w4.command"].contents()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "out.gguf"]


def test_out_inside_the_checkpoint_or_a_directory_refused(w4, tmp_path):
    source = build(tmp_path / "m", layers=1)
    assert "inside the input checkpoint" in w4("gguf", source, source / "x.gguf").stderr
    assert "is a directory" in w4("gguf", source, tmp_path).stderr


def test_json_and_metadata(w4, tmp_path):
    source = build(tmp_path / "m", "qwen2", "awq", layers=2)
    out = tmp_path / "q.gguf"
    result = w4("gguf", source, out, "--json", "-")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["architecture"] == "qwen2" and doc["block_types"] == ["Q4_1"]
    assert doc["files"] == [str(out)] and doc["layers_quantized"] == 14
    fields = gguf.GGUFReader(out).fields
    value = {name: field.contents() for name, field in fields.items()}
    assert value["general.architecture"] == "qwen2"
    assert value["general.file_type"] == gguf.LlamaFileType.MOSTLY_Q4_1
    assert value["general.license"] == "apache-2.0"
    assert value["qwen2.block_count"] == 2 and value["qwen2.context_length"] == 256
    assert value["qwen2.embedding_length"] == 128 and value["qwen2.feed_forward_length"] == 256
    assert value["qwen2.attention.head_count"] == 4 and value["qwen2.attention.head_count_kv"] == 2
    assert value["qwen2.rope.freq_base"] == 10000.0
    assert value["qwen2.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    tokenizer = json.loads((source / "tokenizer.json").read_text())
    assert value["tokenizer.ggml.model"] == "gpt2" and value["tokenizer.ggml.pre"] == "qwen2"
    tokens = value["tokenizer.ggml.tokens"]
    assert len(tokens) == len(tokenizer["model"]["vocab"]) + 3 and tokens[-1].startswith("[PAD")
    assert all(tokens[i] == t for t, i in tokenizer["model"]["vocab"].items())
    assert len(value["tokenizer.ggml.merges"]) == len(tokenizer["model"]["merges"])
    assert value["tokenizer.ggml.token_type"][:3] == [gguf.TokenType.CONTROL] * 3
    assert value["tokenizer.ggml.bos_token_id"] == 0 and value["tokenizer.ggml.eos_token_id"] == 1
    assert "<|im_start|>" in value["tokenizer.chat_template"]
    assert value["w4.source"] == str(source) and value["w4.command"].startswith("w4 gguf ")


def test_split_max_size(w4, tmp_path):
    source = build(tmp_path / "m", layers=2)
    out = tmp_path / "s.gguf"
    result = w4("gguf", source, out, "--split-max-size", "100K", "--json", "-")
    assert result.exit_code == 0, result.stderr
    files = json.loads(result.stdout)["files"]
    assert len(files) > 1 and files[0].endswith(f"s-00001-of-{len(files):05d}.gguf")
    whole = tmp_path / "whole.gguf"
    assert w4("gguf", source, whole).exit_code == 0
    names = [t.name for f in files for t in gguf.GGUFReader(f).tensors]
    assert names == [t.name for t in gguf.GGUFReader(whole).tensors]
    assert gguf.GGUFReader(files[0]).fields["split.count"].contents() == len(files)


def test_a_stop_signal_while_writing_leaves_nothing_and_a_kill_is_cleaned_up_by_the_next_run(w4, tmp_path):
    import signal

    from tests.test_output_safety import start_w4, wait_for
    from w4cli.errors import EXIT_INTERRUPTED

    layers = [random_layer(f"model.layers.{i}.mlp.up_proj", 2048, 2048, 128, seed=i) for i in range(12)]
    source = as_llama(Checkpoint(layers, _plain(), group_size=128), tmp_path / "m")
    out = tmp_path / "out.gguf"

    def writing() -> bool:
        return any(tmp_path.glob("out.gguf.w4tmp-*/out.gguf"))

    def temps() -> list[str]:
        return sorted(p.name for p in tmp_path.iterdir() if ".w4tmp-" in p.name)

    for signum in (signal.SIGTERM, signal.SIGINT):
        proc = start_w4("gguf", source, out, cwd=tmp_path)
        wait_for(proc, writing, "the GGUF file")
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == EXIT_INTERRUPTED, stderr
        assert [line for line in stderr.splitlines() if line.startswith("error:")] == [f"error: interrupted; {out} was not written"]
        assert not out.exists() and temps() == []

    killed = start_w4("gguf", source, out, cwd=tmp_path)
    wait_for(killed, writing, "the GGUF file")
    killed.kill()
    killed.communicate(timeout=60)
    assert temps()  # what no clean-up could remove
    assert w4("gguf", source, out).exit_code == 0
    assert temps() == [] and out.exists()


def test_llama3_rope_frequencies_as_transformers_scales_them(w4, tmp_path):
    """rope_type llama3: the rope_freqs tensor llama.cpp divides each rotary frequency by is, pair
    for pair, the ratio of transformers' unscaled to its llama3-scaled inverse frequencies."""
    import numpy as np
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64, "rope_theta": 500000.0}
    source = build(tmp_path / "m", layers=1, extra_config={"rope_scaling": rope, "rope_theta": 500000.0})
    out = tmp_path / "out.gguf"
    assert w4("gguf", source, out).exit_code == 0
    tensors = {t.name: t for t in gguf.GGUFReader(out).tensors}
    factors = np.asarray(tensors["rope_freqs.weight"].data)
    config = LlamaConfig(**json.loads((source / "config.json").read_text()))
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config)
    dim = 128 // 4
    plain = 1.0 / (500000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    np.testing.assert_allclose(factors, (plain / scaled).numpy(), rtol=1e-5)
    assert factors.min() == 1.0 and factors.max() == 8.0  # both ends of the blend are reached


@pytest.mark.parametrize("kind", ["linear", "yarn"])
def test_rope_scaling_keys(w4, tmp_path, kind):
    rope = {"rope_type": kind, "factor": 4.0, "original_max_position_embeddings": 64}
    source = build(tmp_path / "m", "qwen2", layers=1, extra_config={"rope_scaling": rope})
    out = tmp_path / "out.gguf"
    assert w4("gguf", source, out).exit_code == 0
    value = {name: field.contents() for name, field in gguf.GGUFReader(out).fields.items()}
    assert value["qwen2.rope.scaling.type"] == kind and value["qwen2.rope.scaling.factor"] == 4.0
    if kind == "yarn":
        assert value["qwen2.rope.scaling.original_context_length"] == 64


def test_outtype_f16_that_overflows_is_refused_and_leaves_nothing(w4, tmp_path):
    """Found while the tensor is written (the values are read once): one error line, exit 4, and
    the partial file goes with its temporary directory."""
    plain = _plain()
    plain["lm_head.weight"][3, 5] = 1e6  # a bf16 value beyond fp16's 65504
    source = as_llama(Checkpoint([random_layer("model.layers.0.mlp.up_proj", 64, 40, 32, 15)], plain), tmp_path / "m")
    out = tmp_path / "out.gguf"
    result = w4("gguf", source, out, "--outtype", "f16")
    assert result.exit_code == 4
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: lm_head.weight does not fit float16 (--outtype): a value overflows to inf"]
    assert not out.exists() and not [p.name for p in tmp_path.iterdir() if ".w4tmp-" in p.name]


def test_moe_experts_stacked_and_routers_in_f32(w4, tmp_path):
    """Mixtral: each projection's experts one [experts, N, K] block tensor, expert e's blocks the
    e-th slice; the router in F32, as llama.cpp's converter writes it."""
    import numpy as np
    from safetensors.torch import load_file

    from tests.awq_builder import autoawq_reference

    source = build(tmp_path / "m", "mixtral", "awq", layers=1)
    out = tmp_path / "out.gguf"
    assert w4("gguf", source, out).exit_code == 0
    tensors = {t.name: t for t in gguf.GGUFReader(out).tensors}
    assert tensors["blk.0.ffn_gate_inp.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    stacked = tensors["blk.0.ffn_gate_exps.weight"]
    assert stacked.tensor_type == gguf.GGMLQuantizationType.Q4_1 and list(stacked.shape) == [128, 256, 4]  # ggml order: K, N, experts
    value = {name: field.contents() for name, field in gguf.GGUFReader(out).fields.items()}
    assert value["llama.expert_count"] == 4 and value["llama.expert_used_count"] == 2
    stored = load_file(source / "model.safetensors")
    data = np.asarray(stacked.data).reshape(4, 256, -1)
    for expert in range(4):
        prefix = f"model.layers.0.block_sparse_moe.experts.{expert}.w1"
        exact = autoawq_reference(stored[f"{prefix}.qweight"], stored[f"{prefix}.qzeros"], stored[f"{prefix}.scales"].float(), 128).t().numpy()
        got = gguf.quants.dequantize(data[expert], gguf.GGMLQuantizationType.Q4_1)
        assert np.abs(got - exact).max() <= 2.0**-11 * 15 * np.abs(stored[f"{prefix}.scales"].float().numpy()).max()
