"""`w4 gguf`, tensor by tensor, against GGUF's own reference: every block w4 writes, dequantized by the
gguf package (llama.cpp's Python library), must equal the checkpoint's s * (q - z) up to the one
rounding of m (docs/formats.md, GGUF): Q4_0 bit for bit, Q4_1 exactly s * q + fp16(-z * s), within
max(2^-11 |z * s|, 2^-25) of the exact weight. The expectations come from the builders' own codes,
zeros and scales, not from w4's readers.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from tests.awq_builder import Checkpoint, install_hub_cache, random_layer
from tests.ct_builder import ct_checkpoint, ct_config, random_ct_layer, weights_args
from tests.gguf_models import as_llama, build
from tests.gptq_builder import gptq_checkpoint, random_gptq_layer

Q = gguf.GGMLQuantizationType


def _plain(k: int = 64) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {
        "model.embed_tokens.weight": torch.randn(16, k, generator=g).half(),
        "model.norm.weight": torch.randn(k, generator=g).half(),
        "lm_head.weight": torch.randn(16, k, generator=g).bfloat16(),
    }


def _expanded(values: np.ndarray, k: int) -> np.ndarray:
    """[N, groups] -> [N, K], each group's value over its K / groups columns."""
    return np.repeat(values, k // values.shape[1], axis=1)


def awq_expected(layer) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q, z, s) [N, K] of an awq_builder / gptq_builder layer (codes [K, N], zeros and scales
    [K/G, N])."""
    k = layer.k
    return layer.codes.T.astype(np.int64), _expanded(layer.zeros.T.astype(np.int64), k), _expanded(layer.scales.float().numpy().T, k)


def ct_expected(layer) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """compressed-tensors stores signed codes and zero points; GGUF's are those plus 8."""
    k = layer.k
    zeros = np.zeros((layer.n, layer.scales.shape[1]), dtype=np.int64) if layer.zero_points is None else layer.zero_points
    return layer.values + 8, _expanded(zeros + 8, k), _expanded(layer.scales.float().numpy(), k)


def read_gguf(path) -> dict[str, gguf.ReaderTensor]:
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def bits(values: np.ndarray) -> np.ndarray:
    """float32 bit patterns, -0 counted as +0 (q = z gives a zero whose sign depends on the order
    of the sum, not on the weight)."""
    return (values.astype(np.float32) + np.float32(0)).view(np.uint32)


def check_blocks(tensor: gguf.ReaderTensor, q: np.ndarray, z: np.ndarray, s: np.ndarray) -> None:
    """The tensor's blocks against the mapping, through gguf.quants.dequantize."""
    got = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    s64, exact = s.astype(np.float64), s.astype(np.float64) * (q - z)
    assert got.shape == q.shape
    if tensor.tensor_type == Q.Q4_0:
        assert (z == 8).all()
        np.testing.assert_array_equal(bits(got), bits(exact))
        return
    assert tensor.tensor_type == Q.Q4_1
    m = (-z * s64).astype(np.float16).astype(np.float64)  # the one rounding
    promised = s64 * q + m  # exact in float32: see w4cli/gguf/blocks.py
    np.testing.assert_array_equal(bits(got), bits(promised))
    bound = np.maximum(2.0**-11 * np.abs(z * s64), 2.0**-25)
    assert (np.abs(got - exact) <= bound).all()


def convert(w4, source, out, *extra):
    result = w4("gguf", source, out, *extra)
    assert result.exit_code == 0, result.stderr
    return read_gguf(out)


@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
def test_awq_every_group_size(w4, tmp_path, group_size):
    k_up, k_down = 384, 128  # whole groups of every size; 12 and 4 blocks a row
    layers = [
        random_layer("model.layers.0.mlp.up_proj", k_up, 40, k_up if group_size == -1 else group_size, 1),
        random_layer("model.layers.0.mlp.down_proj", k_down, 24, k_down if group_size == -1 else group_size, 2),
    ]
    ckpt = Checkpoint(layers, _plain(), group_size=group_size)
    tensors = convert(w4, as_llama(ckpt, tmp_path / "m"), tmp_path / "out.gguf")
    for layer, name in zip(layers, ("blk.0.ffn_up.weight", "blk.0.ffn_down.weight")):
        assert tensors[name].tensor_type == Q.Q4_1
        check_blocks(tensors[name], *awq_expected(layer))


def test_awq_codes_kept_bit_for_bit(w4, tmp_path):
    """The nibbles of every block are the checkpoint's codes, over random 32-bit words (every
    nibble value in every position), and d is the scale's own fp16 bits."""
    layer = random_layer("model.layers.0.mlp.up_proj", 96, 40, 32, 3)
    tensors = convert(w4, as_llama(Checkpoint([layer], _plain()), tmp_path / "m"), tmp_path / "out.gguf")
    raw = np.asarray(tensors["blk.0.ffn_up.weight"].data).reshape(40, 3, 20)
    d = raw[..., :2].copy().view(np.float16)[..., 0]
    qs = raw[..., 4:]
    codes = np.concatenate([qs & 0xF, qs >> 4], axis=-1).reshape(40, 96)
    np.testing.assert_array_equal(codes, layer.codes.T)
    np.testing.assert_array_equal(d.view(np.uint16), layer.scales.numpy().T.view(np.uint16))


@pytest.mark.parametrize("sym", [False, True])
def test_gptq(w4, tmp_path, sym):
    """GPTQ v1 with its traps (zero points of 0 beside others, one-sign groups, subnormal scales):
    asymmetric as Q4_1, symmetric as Q4_0, bit for bit."""
    layers = [
        random_gptq_layer("model.layers.0.mlp.up_proj", 128, 40, 32, 4, sym=sym),
        random_gptq_layer("model.layers.0.mlp.down_proj", 64, 24, 32, 5, sym=sym),
    ]
    ckpt = gptq_checkpoint(layers, _plain(), group_size=32, sym=sym)
    tensors = convert(w4, as_llama(ckpt, tmp_path / "m"), tmp_path / "out.gguf")
    for layer, name in zip(layers, ("blk.0.ffn_up.weight", "blk.0.ffn_down.weight")):
        assert tensors[name].tensor_type == (Q.Q4_0 if sym else Q.Q4_1)
        check_blocks(tensors[name], *awq_expected(layer))


@pytest.mark.parametrize("symmetric,group_size", [(True, 32), (False, 64), (False, None)])
def test_compressed_tensors(w4, tmp_path, symmetric, group_size):
    """fp16 scales; N = 37 (no multiple of anything); per channel (group_size None)."""
    layers = [
        random_ct_layer("model.layers.0.mlp.up_proj", 128, 37, group_size, 6, symmetric, torch.float16),
        random_ct_layer("model.layers.0.mlp.down_proj", 64, 24, group_size, 7, symmetric, torch.float16),
    ]
    ckpt = ct_checkpoint(layers, _plain(), ct_config({"group_0": (["Linear"], weights_args(group_size, symmetric))}))
    tensors = convert(w4, as_llama(ckpt, tmp_path / "m"), tmp_path / "out.gguf")
    for layer, name in zip(layers, ("blk.0.ffn_up.weight", "blk.0.ffn_down.weight")):
        assert tensors[name].tensor_type == (Q.Q4_0 if symmetric else Q.Q4_1)
        check_blocks(tensors[name], *ct_expected(layer))


def test_unquantized_tensors_keep_their_dtype(w4, tmp_path, monkeypatch):
    """Embeddings and lm_head as stored (F16, BF16), bit for bit; norms widened to F32 (exact), as
    llama.cpp takes 1-D tensors; --outtype f32 widens the 2-D ones too. Streamed in pieces of a few
    rows (a 2 GB embedding is never whole in memory), here 3 rows of 64 fp16 at a time."""
    from w4cli.gguf import plan

    monkeypatch.setattr(plan, "PIECE_BYTES", 3 * 64 * 2)
    plain = _plain()
    ckpt = Checkpoint([random_layer("model.layers.0.mlp.up_proj", 64, 32, 32, 8)], plain)
    source = as_llama(ckpt, tmp_path / "m")
    tensors = convert(w4, source, tmp_path / "out.gguf")
    assert tensors["token_embd.weight"].tensor_type == Q.F16
    np.testing.assert_array_equal(np.asarray(tensors["token_embd.weight"].data), plain["model.embed_tokens.weight"].numpy())
    assert tensors["output.weight"].tensor_type == Q.BF16
    stored = np.asarray(tensors["output.weight"].data).view(np.uint16).reshape(16, 64)
    np.testing.assert_array_equal(stored, plain["lm_head.weight"].view(torch.int16).numpy().view(np.uint16))
    assert tensors["output_norm.weight"].tensor_type == Q.F32
    np.testing.assert_array_equal(np.asarray(tensors["output_norm.weight"].data), plain["model.norm.weight"].float().numpy())
    widened = convert(w4, source, tmp_path / "f32.gguf", "--outtype", "f32")
    assert widened["output.weight"].tensor_type == Q.F32
    np.testing.assert_array_equal(np.asarray(widened["output.weight"].data), plain["lm_head.weight"].float().numpy())


def _rotary_order(rows: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's Llama row order, restated: head h's rows [first half, second half] become
    interleaved pairs (row i of the first half, row i of the second half)."""
    n = rows.shape[0]
    half = n // n_head // 2
    order = [h * 2 * half + part * half + i for h in range(n_head) for i in range(half) for part in (0, 1)]
    return rows[order]


def test_llama_q_and_k_rows_permuted(w4, tmp_path):
    """q_proj and k_proj rows reordered for llama.cpp's rotary layout, whole rows with their blocks;
    v_proj untouched."""
    from safetensors.torch import load_file

    source = build(tmp_path / "m", "llama", "awq", layers=1)
    tensors = convert(w4, source, tmp_path / "out.gguf")
    stored = load_file(source / "model.safetensors")
    from tests.awq_builder import autoawq_reference

    for proj, heads, name in (("q_proj", 4, "attn_q"), ("k_proj", 2, "attn_k"), ("v_proj", None, "attn_v")):
        prefix = f"model.layers.0.self_attn.{proj}"
        exact = autoawq_reference(stored[f"{prefix}.qweight"], stored[f"{prefix}.qzeros"], stored[f"{prefix}.scales"].float(), 128)
        exact = exact.t().numpy()  # [N, K]
        got = gguf.quants.dequantize(tensors[f"blk.0.{name}.weight"].data, Q.Q4_1)
        want = _rotary_order(exact, heads) if heads else exact
        # Q4_1's one rounding of m: the bound of docs/formats.md, |z| <= 15
        scale = np.abs(_rotary_order(exact, heads) if heads else exact).max()
        assert np.abs(got - want).max() <= 2.0**-11 * 15 * scale


def test_multi_shard_source_and_hub_cache(w4, tmp_path):
    """A layer whose qweight, qzeros and scales sit in different shards; MODEL given as a Hub id
    served from an offline cache gives the same file as the directory."""
    layers = [random_layer("model.layers.0.mlp.up_proj", 96, 40, 32, 9), random_layer("model.layers.0.mlp.down_proj", 64, 24, 32, 10)]
    ckpt = Checkpoint(layers, _plain())
    names = list(ckpt.all_tensors())
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    source = as_llama(ckpt, tmp_path / "m", shards)
    local = convert(w4, source, tmp_path / "local.gguf")
    for layer, name in zip(layers, ("blk.0.ffn_up.weight", "blk.0.ffn_down.weight")):
        check_blocks(local[name], *awq_expected(layer))
    cache = tmp_path / "hub"
    install_hub_cache(cache, "w4-test/tiny-awq", source)
    hub = convert(w4, "w4-test/tiny-awq", tmp_path / "hub.gguf", "--cache-dir", cache)
    for name, tensor in local.items():
        np.testing.assert_array_equal(np.asarray(hub[name].data), np.asarray(tensor.data))
    fields = gguf.GGUFReader(tmp_path / "hub.gguf").fields
    assert fields["general.source.repo_url"].contents() == "https://huggingface.co/w4-test/tiny-awq"
    assert fields["w4.source"].contents() == "w4-test/tiny-awq"


def test_a_repacked_checkpoint_gives_the_same_blocks(w4, tmp_path):
    """w4's own layout (w4 repack) holds the same codes, zeros and scales: the same GGUF tensors."""
    layers = [random_layer("model.layers.0.mlp.up_proj", 128, 40, 32, 11), random_layer("model.layers.0.mlp.down_proj", 64, 24, 32, 12)]
    source = as_llama(Checkpoint(layers, _plain()), tmp_path / "m")
    assert w4("repack", source, tmp_path / "r").exit_code == 0
    direct = convert(w4, source, tmp_path / "direct.gguf")
    repacked = convert(w4, tmp_path / "r", tmp_path / "repacked.gguf")
    for name in ("blk.0.ffn_up.weight", "blk.0.ffn_down.weight"):
        np.testing.assert_array_equal(np.asarray(repacked[name].data), np.asarray(direct[name].data))


def test_a_quantized_lm_head(w4, tmp_path):
    """Some GPTQ checkpoints quantize lm_head too: it becomes GGUF's output tensor in blocks."""
    plain = {k: v for k, v in _plain().items() if k != "lm_head.weight"}
    layers = [random_layer("model.layers.0.mlp.up_proj", 64, 40, 32, 13), random_layer("lm_head", 64, 16, 32, 14)]
    tensors = convert(w4, as_llama(Checkpoint(layers, plain), tmp_path / "m"), tmp_path / "out.gguf")
    assert tensors["output.weight"].tensor_type == Q.Q4_1
    check_blocks(tensors["output.weight"], *awq_expected(layers[1]))
