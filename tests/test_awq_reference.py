"""The pure-torch AWQ reference: exact pack/unpack over the full int32 range, and dequantization
bit-identical to AutoAWQ's own method."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.awq_builder import autoawq_reference, pack_words, random_layer
from w4cli.formats import awq_gemm
from w4cli.gpu.checks import raw_bits as bits  # raw bits: +0.0 != -0.0, NaN payloads compare


def full_range_words(rows: int, cols: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    words = torch.randint(-(2**31), 2**31, (rows, cols), generator=g, dtype=torch.int64).to(torch.int32)
    # the extremes too: sign bit alone, all ones, zero, largest positive
    flat = words.view(-1)
    flat[:4] = torch.tensor([-(2**31), -1, 0, 2**31 - 1], dtype=torch.int32)
    return words



def test_unpack_pack_round_trip_full_int32_range():
    words = full_range_words(37, 5, seed=1)
    assert (words < 0).any(), "the sign bit must be exercised"
    codes = awq_gemm.unpack(words)
    assert codes.shape == (37, 40) and codes.dtype == torch.uint8
    assert int(codes.max()) <= 15
    assert torch.equal(awq_gemm.pack(codes), words)


def test_unpack_matches_the_documented_nibble_order():
    # word 0x76543210 with AWQ order: nibble i holds element ORDER[i], so element j = nibble REV[j]
    word = torch.tensor([[0x76543210]], dtype=torch.int32)
    assert awq_gemm.unpack(word).tolist() == [[0, 4, 1, 5, 2, 6, 3, 7]]
    negative = torch.tensor([[np.array(0xF0000000, dtype=np.uint32).view(np.int32).item()]], dtype=torch.int32)
    assert awq_gemm.unpack(negative).tolist() == [[0, 0, 0, 0, 0, 0, 0, 15]]


def test_pack_agrees_with_an_independent_packer():
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 16, size=(9, 48), dtype=np.uint8)
    assert torch.equal(awq_gemm.pack(torch.from_numpy(codes)), torch.from_numpy(pack_words(codes)))


def test_pack_refuses_out_of_range_codes():
    with pytest.raises(ValueError):
        awq_gemm.pack(torch.full((1, 8), 16))
    with pytest.raises(ValueError):
        awq_gemm.pack(torch.zeros((1, 12), dtype=torch.int32))


@pytest.mark.parametrize(
    "k,n,group_size",
    [(32, 8, 32), (64, 24, 32), (128, 40, 64), (256, 136, 128), (96, 8, 96), (4096 // 16, 72, -1)],
)
def test_fp16_bit_identical_to_autoawq(k, n, group_size):
    g = k if group_size == -1 else group_size
    layer = random_layer("x", k, n, g, seed=k + n)
    t = layer.tensors()
    ours = awq_gemm.dequantize(t["x.qweight"], t["x.qzeros"], t["x.scales"], dtype=torch.float16)
    theirs = autoawq_reference(t["x.qweight"], t["x.qzeros"], t["x.scales"], g).t().contiguous()
    assert ours.shape == (n, k)
    assert torch.equal(bits(ours), bits(theirs))


def test_full_range_words_dequantize_like_autoawq():
    qweight = full_range_words(64, 4, seed=5)
    qzeros = full_range_words(2, 4, seed=6)
    scales = torch.randn(2, 32, generator=torch.Generator().manual_seed(7)).half()
    ours = awq_gemm.dequantize(qweight, qzeros, scales, dtype=torch.float16)
    theirs = autoawq_reference(qweight, qzeros, scales, 32).t().contiguous()
    assert torch.equal(bits(ours), bits(theirs))


def test_bf16_and_fp32_are_the_exactly_rounded_product():
    layer = random_layer("x", 64, 16, 32, seed=11)
    t = layer.tensors()
    # exact product in float64 from the integer codes, independent of the unpacking code
    diff = layer.codes.astype(np.float64) - np.repeat(layer.zeros, 32, axis=0).astype(np.float64)
    exact = torch.from_numpy(diff * np.repeat(layer.scales.double().numpy(), 32, axis=0)).t()
    for dtype in (torch.bfloat16, torch.float32, torch.float16):
        ours = awq_gemm.dequantize(t["x.qweight"], t["x.qzeros"], t["x.scales"], dtype=dtype)
        assert torch.equal(bits(ours), bits(exact.to(dtype).contiguous())), dtype


def test_bf16_scales_are_read_exactly():
    layer = random_layer("x", 64, 16, 32, seed=12, scale_dtype=torch.bfloat16)
    t = layer.tensors()
    ours = awq_gemm.dequantize(t["x.qweight"], t["x.qzeros"], t["x.scales"], dtype=torch.float32)
    diff = torch.from_numpy(layer.codes.astype(np.float64) - np.repeat(layer.zeros, 32, axis=0))
    exact = (diff * t["x.scales"].double().repeat_interleave(32, dim=0)).t()
    assert torch.equal(ours, exact.float())


def test_transpose_false_gives_the_kn_layout():
    layer = random_layer("x", 64, 16, 32, seed=13)
    t = layer.tensors()
    nk = awq_gemm.dequantize(t["x.qweight"], t["x.qzeros"], t["x.scales"])
    kn = awq_gemm.dequantize(t["x.qweight"], t["x.qzeros"], t["x.scales"], transpose=False)
    assert torch.equal(bits(kn), bits(nk.t().contiguous()))
