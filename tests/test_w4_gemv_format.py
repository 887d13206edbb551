"""The w4-gemv layout (w4cli/formats/w4_gemv.py) on the CPU: lossless repacking on raw bits, the
documented nibble/tile positions, dequantization bit-identical to the AWQ reference, and
gemv_reference against float64."""

from __future__ import annotations

import pytest
import torch

from tests.awq_builder import autoawq_reference, random_layer
from w4cli.errors import InputRefused
from w4cli.formats import awq_gemm, w4_gemv
from w4cli.gpu.checks import raw_bits as bits  # raw bits: +0.0 != -0.0, NaN payloads compare


def full_range_words(rows: int, cols: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    words = torch.randint(-(2**31), 2**31, (rows, cols), generator=g, dtype=torch.int64).to(torch.int32)
    flat = words.view(-1)
    flat[: min(4, flat.numel())] = torch.tensor([-(2**31), -1, 0, 2**31 - 1], dtype=torch.int32)[: min(4, flat.numel())]
    return words


def random_scales(groups: int, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    magnitude = torch.empty(groups, n, dtype=torch.float64).uniform_(-12, 2, generator=g).exp2()
    sign = torch.randint(0, 2, (groups, n), generator=g) * 2 - 1
    return (magnitude * sign).to(torch.float16)


def awq_layer(k: int, n: int, group_size: int, seed: int):
    """Raw AWQ tensors: words over the full int32 range (sign bit included)."""
    groups = k // group_size
    return full_range_words(k, n // 8, seed), full_range_words(groups, n // 8, seed + 1), random_scales(groups, n, seed + 2)



# (K, N, G): groups 32/64/128, one group, K not a multiple of 128 (padding), N % 16 == 8
SHAPES = [
    (32, 8, 32),
    (64, 24, 32),
    (128, 40, 64),
    (256, 136, 128),
    (384, 16, 128),
    (96, 8, 96),  # one group, K % 128 != 0 and G % 32 == 0
    (40, 16, 40),  # one group, G not a multiple of 32
    (200, 56, 200),
    (160, 72, 32),  # K = 160: one and a quarter 128-k tiles
    (4096, 8, 4096),
]


@pytest.mark.parametrize("k,n,group_size", SHAPES)
def test_repack_round_trip_is_bit_exact(k, n, group_size):
    qweight, qzeros, scales = awq_layer(k, n, group_size, seed=k + n)
    assert (qweight < 0).any() or qweight.numel() < 4
    layer = w4_gemv.repack_from_awq(qweight, qzeros, scales)
    assert set(layer) == set(w4_gemv.TENSOR_NAMES)
    kp = -(-k // 128) * 128
    assert layer["qweight"].shape == (n // 8, kp // 128, 8, 16) and layer["qweight"].dtype == torch.int32
    assert layer["meta"].tolist() == [w4_gemv.LAYOUT_VERSION, k, n, group_size]
    assert w4_gemv.validate(**layer) == (k, n, group_size)
    back = w4_gemv.to_awq(**layer)
    assert torch.equal(back["qweight"], qweight)
    assert torch.equal(back["qzeros"], qzeros)
    assert torch.equal(bits(back["scales"]), bits(scales))


def test_padding_codes_are_zero():
    qweight, qzeros, scales = awq_layer(160, 16, 32, seed=5)
    layer = w4_gemv.repack_from_awq(qweight, qzeros, scales)
    # k-block 1 holds k 128..255; k >= 160 is words 4..15 of that block
    assert int(layer["qweight"][:, 1, :, 4:].abs().sum()) == 0
    assert int(layer["qweight"][:, 1, :, :4].ne(0).sum()) > 0


def test_documented_positions():
    # code[n, k] = a distinct pattern; check word [a, b, r, w] nibble i against the docstring:
    # row n = 8a + r, k = 128b + 8w + AWQ_ORDER[i]
    k, n = 256, 16
    nn_, kk = torch.meshgrid(torch.arange(n), torch.arange(k), indexing="ij")
    codes = ((nn_ * 7 + kk * 3 + (kk // 8)) % 16).to(torch.uint8)
    packed = w4_gemv.pack_codes(codes)
    for a, b, r, w, i in [(0, 0, 0, 0, 0), (1, 1, 7, 15, 7), (0, 1, 3, 5, 2), (1, 0, 6, 9, 4), (0, 0, 2, 1, 5)]:
        word = int(packed[a, b, r, w]) & 0xFFFFFFFF
        nib = (word >> (4 * i)) & 0xF
        assert nib == int(codes[8 * a + r, 128 * b + 8 * w + w4_gemv.AWQ_ORDER[i]])


def test_one_word_nibble_order():
    # 8 consecutive k with codes 0..7 -> nibbles hold k-offsets [0,2,4,6,1,3,5,7] -> 0x75316420
    codes = torch.zeros(8, 8, dtype=torch.uint8)
    codes[0] = torch.arange(8)
    word = int(w4_gemv.pack_codes(codes)[0, 0, 0, 0]) & 0xFFFFFFFF
    assert word == 0x75316420


@pytest.mark.parametrize("k,n,group_size", SHAPES)
def test_dequantize_bit_identical_to_awq_reference(k, n, group_size):
    qweight, qzeros, scales = awq_layer(k, n, group_size, seed=3 * k + n)
    layer = w4_gemv.repack_from_awq(qweight, qzeros, scales)
    for dtype in (torch.float16, torch.float32, torch.bfloat16):
        for transpose in (True, False):
            ours = w4_gemv.dequantize(**layer, dtype=dtype, transpose=transpose)
            ref = awq_gemm.dequantize(qweight, qzeros, scales, dtype, transpose)
            assert ours.shape == ref.shape
            assert torch.equal(bits(ours), bits(ref)), (dtype, transpose)


def test_dequantize_matches_autoawq_restatement():
    layer_awq = random_layer("l", 256, 40, 64, seed=11)
    t = layer_awq.tensors()
    layer = w4_gemv.repack_from_awq(t["l.qweight"], t["l.qzeros"], t["l.scales"])
    ref = autoawq_reference(t["l.qweight"], t["l.qzeros"], t["l.scales"], 64)  # [K, N] fp16
    assert torch.equal(bits(w4_gemv.dequantize(**layer, transpose=False)), bits(ref))


def test_unpack_is_the_code_matrix():
    qweight, qzeros, scales = awq_layer(160, 24, 32, seed=9)
    layer = w4_gemv.repack_from_awq(qweight, qzeros, scales)
    assert torch.equal(w4_gemv.unpack(layer["qweight"], layer["meta"]), awq_gemm.unpack(qweight).t())


@pytest.mark.parametrize("k,n,group_size,m", [(256, 40, 64, 1), (160, 24, 32, 3), (4096, 16, 128, 8), (96, 8, 96, 5)])
def test_gemv_reference_against_float64(k, n, group_size, m):
    qweight, qzeros, _ = awq_layer(k, n, group_size, seed=k * m)
    scales = random_scales(k // group_size, n, seed=m).abs().clamp(max=0.05) + 1e-3
    scales = scales.to(torch.float16)
    layer = w4_gemv.repack_from_awq(qweight, qzeros, scales)
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=g).half()
    bias = torch.randn(n, generator=g).half()
    out = w4_gemv.gemv_reference(x, **layer, bias=bias)
    w64 = awq_gemm.dequantize(qweight, qzeros, scales, torch.float16).double()
    ref = x.double() @ w64.t() + bias.double()
    assert out.dtype == torch.float32 and out.shape == (m, n)
    # fp32 summation of K exact products: |err| <= K * 2^-24 * (|x| @ |W|) (+ one rounding of ref)
    bound = k * 2.0**-24 * (x.double().abs() @ w64.abs().t() + bias.double().abs()) + 1e-30
    assert ((out.double() - ref).abs() <= bound).all()


@pytest.mark.parametrize(
    "k,n,group_size,match",
    [
        (64, 12, 32, "multiple of 8"),  # N % 8 (built by hand below)
        (96, 8, 48, "multiple of 32"),  # G = 48 with two groups
        (36, 8, 36, "multiple of 8"),  # K % 8 with one group
    ],
)
def test_repack_refuses_shapes_the_kernel_cannot_run(k, n, group_size, match):
    groups = k // group_size
    words = max(1, n // 8)
    qweight = torch.zeros(k, words, dtype=torch.int32)
    qzeros = torch.zeros(groups, words, dtype=torch.int32)
    scales = torch.ones(groups, words * 8 if n % 8 == 0 else n, dtype=torch.float16)
    with pytest.raises(InputRefused, match=match if n % 8 == 0 else "disagree"):
        w4_gemv.repack_from_awq(qweight, qzeros, scales)


def test_repack_refuses_bf16_scales_and_wrong_dtypes():
    qweight, qzeros, scales = awq_layer(64, 8, 32, seed=1)
    with pytest.raises(InputRefused, match="float16"):
        w4_gemv.repack_from_awq(qweight, qzeros, scales.to(torch.bfloat16))
    with pytest.raises(InputRefused, match="int32"):
        w4_gemv.repack_from_awq(qweight.to(torch.int64), qzeros, scales)


def test_validate_messages_are_one_line():
    qweight, qzeros, scales = awq_layer(128, 16, 32, seed=2)
    layer = w4_gemv.repack_from_awq(qweight, qzeros, scales)
    bad = dict(layer, qweight=layer["qweight"][:1])
    with pytest.raises(InputRefused) as info:
        w4_gemv.validate(**bad)
    assert "\n" not in str(info.value) and "qweight" in str(info.value)
    bad_meta = dict(layer, meta=torch.tensor([2, 128, 16, 32], dtype=torch.int32))
    with pytest.raises(InputRefused, match="version 2"):
        w4_gemv.validate(**bad_meta)
    with pytest.raises(InputRefused, match="meta"):
        w4_gemv.validate(**dict(layer, meta=layer["meta"].long()))
    with pytest.raises(InputRefused, match="activations"):
        w4_gemv.gemv_reference(torch.zeros(1, 64, dtype=torch.float16), **layer)
