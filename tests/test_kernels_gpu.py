"""GPU tests of the AWQ dequantize kernel: bit-exact against w4cli.formats.awq_gemm.dequantize.

Exactness is the contract (kernels/dequant_w4_awq.cu): (q - z) * s is exact in fp32 and rounded once,
so the kernel and the reference must agree on every bit; compared as raw int16/int32 with torch.equal.
"""

from __future__ import annotations

import pytest
import torch

from w4cli.formats import awq_gemm
from w4cli.gpu.checks import raw_bits as bits  # raw bits: +0.0 != -0.0, NaN payloads compare

pytestmark = pytest.mark.gpu  # skipped without a CUDA GPU (conftest.py)

DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def make_layer(K: int, N: int, G: int, seed: int, scale_dtype=torch.float16, device="cuda"):
    """Random AWQ layer: words from the full 32-bit range (sign bit included), random-sign scales."""
    gen = torch.Generator().manual_seed(seed)
    qweight = torch.randint(-(2**31), 2**31, (K, N // 8), generator=gen, dtype=torch.int64).to(torch.int32)
    qzeros = torch.randint(-(2**31), 2**31, (K // G, N // 8), generator=gen, dtype=torch.int64).to(torch.int32)
    scales = (torch.randn(K // G, N, generator=gen) * 0.02).to(scale_dtype)
    scales[scales == 0] = 0.01  # non-zero scales
    return qweight.to(device), qzeros.to(device), scales.to(device)



def assert_bit_exact(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype
    ob, rb = bits(out), bits(ref.to(out.device))
    if not torch.equal(ob, rb):
        bad = (ob != rb).nonzero()
        i = tuple(bad[0].tolist())
        raise AssertionError(f"{bad.shape[0]} of {ob.numel()} elements differ; first at {i}: kernel {out[i].item()!r} vs reference {ref[i].item()!r}")


def check(kernels, K, N, G, dtype, transpose, seed=0, scale_dtype=torch.float16):
    qw, qz, s = make_layer(K, N, G, seed, scale_dtype)
    out = kernels.dequantize_awq(qw, qz, s, dtype=dtype, transpose=transpose)
    ref = awq_gemm.dequantize(qw, qz, s, dtype=dtype, transpose=transpose)  # same inputs, on the GPU
    assert_bit_exact(out, ref)
    return qw, qz, s, out


@pytest.mark.parametrize("transpose", [True, False], ids=["NK", "KN"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize(
    "K,N,G",
    [
        (256, 512, 32),
        (256, 512, 64),
        (512, 384, 128),
        (384, 1024, 384),  # one group (G = K)
        (32, 8, 32),  # smallest legal shape
        (160, 136, 32),  # N/8 = 17, K = 160: tails in both dimensions of both kernels
        (96, 1032, 96),  # one group, K not a multiple of the 128-row tile
        (4128, 200, 32),  # K = 4096 + 32
        (120, 64, 40),  # G = 40 (not a multiple of 8): per-row group lookup path
        (36, 16, 12),  # K not a multiple of 8: unaligned [N, K] rows, element-wise tail stores
    ],
)
def test_bit_exact_shapes(kernels, K, N, G, dtype, transpose):
    check(kernels, K, N, G, dtype, transpose, seed=K * 7 + N + G)


@pytest.mark.parametrize("transpose", [True, False], ids=["NK", "KN"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_bit_exact_bf16_scales(kernels, dtype, transpose):
    check(kernels, 384, 264, 64, dtype, transpose, seed=3, scale_dtype=torch.bfloat16)


@pytest.mark.parametrize("transpose", [True, False], ids=["NK", "KN"])
@pytest.mark.parametrize("K,N", [(4096, 4096), (4096, 14336)])
def test_real_layer_shapes(kernels, K, N, transpose):
    for dtype in DTYPES:
        check(kernels, K, N, 128, dtype, transpose, seed=K + N)


def test_extreme_scales_round_once(kernels):
    """Scales near fp16 max / subnormal range: overflow to inf and subnormal rounding must match too."""
    K, N, G = 64, 64, 32
    qw, qz, _ = make_layer(K, N, G, 11)
    s = torch.tensor([65504.0, -6.0e-8, 6.1e-5, -3.0e-6, 4500.0, -1.0e-4, 1.0, -2.5e3], dtype=torch.float16)
    s = s.repeat(K // G, N // 8).cuda()
    for dtype in DTYPES:
        for transpose in (True, False):
            out = kernels.dequantize_awq(qw, qz, s, dtype=dtype, transpose=transpose)
            assert_bit_exact(out, awq_gemm.dequantize(qw, qz, s, dtype=dtype, transpose=transpose))


def test_deterministic(kernels):
    qw, qz, s = make_layer(1024, 2048, 128, 5)
    for transpose in (True, False):
        a = kernels.dequantize_awq(qw, qz, s, transpose=transpose)
        b = kernels.dequantize_awq(qw, qz, s, transpose=transpose)
        assert torch.equal(bits(a), bits(b))


# Layers with at least 16 waves of 32-column tiles (two blocks per SM), so that 2-byte outputs take
# the 32-column [N, K] tile (fp32 keeps the 16-column one), with tails in both dimensions:
# 8200x17416: 65 x 69 tiles (an odd column-tile count: the last band is half empty), G = 40;
# 1048584x8: 8193 x 1 tiles, one group, one packed column in a 32-column tile, 8 rows in the last.
@pytest.mark.parametrize("K,N,G", [(8200, 17416, 40), (1048584, 8, 1048584)])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_large_layer_exact(kernels, K, N, G, dtype):
    check(kernels, K, N, G, dtype, True, seed=21)


def test_writes_every_element(kernels):
    """No unwritten tails: the output of a tail-heavy shape never contains the allocator's garbage."""
    torch.cuda.empty_cache()
    K, N, G = 200, 136, 40
    qw, qz, s = make_layer(K, N, G, 13)
    for _ in range(3):
        poison = torch.full((N * K * 4,), float("nan"), device="cuda")  # poison freed memory
        del poison
        for dtype in DTYPES:
            out = kernels.dequantize_awq(qw, qz, s, dtype=dtype, transpose=True)
            assert_bit_exact(out, awq_gemm.dequantize(qw, qz, s, dtype=dtype, transpose=True))


def test_uses_current_stream(kernels):
    qw, qz, s = make_layer(512, 512, 128, 17)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out = kernels.dequantize_awq(qw, qz, s)
    stream.synchronize()
    assert_bit_exact(out, awq_gemm.dequantize(qw, qz, s))


# ---- the binding's error messages --------------------------------------------------------------


def _err(kernels, match, qw, qz, s, dtype=torch.float16):
    with pytest.raises(RuntimeError, match=match):
        kernels.dequantize_awq(qw, qz, s, dtype=dtype)


def test_error_cpu_tensor(kernels):
    qw, qz, s = make_layer(64, 64, 32, 1)
    _err(kernels, "must be a CUDA tensor", qw.cpu(), qz, s)
    _err(kernels, "scales must be a CUDA tensor", qw, qz, s.cpu())


def test_error_dtypes(kernels):
    qw, qz, s = make_layer(64, 64, 32, 1)
    _err(kernels, "qweight must be int32", qw.to(torch.int64), qz, s)
    _err(kernels, "qzeros must be int32", qw, qz.to(torch.int16), s)
    _err(kernels, "scales must be float16 or bfloat16", qw, qz, s.float())
    ext = kernels.load()
    with pytest.raises(RuntimeError, match="out_dtype must be"):
        ext.dequantize_awq(qw, qz, s, torch.float64, True)
    with pytest.raises(ValueError):
        kernels.dequantize_awq(qw, qz, s, dtype=torch.int8)


def test_error_non_contiguous(kernels):
    qw, qz, s = make_layer(64, 128, 32, 1)
    _err(kernels, "qweight must be contiguous", qw.t().contiguous().t(), qz, s)
    s2 = torch.empty(s.shape[1], s.shape[0], dtype=s.dtype, device="cuda").t()
    s2.copy_(s)
    _err(kernels, "scales must be contiguous", qw, qz, s2)


def test_error_misaligned(kernels):
    qw, qz, s = make_layer(64, 64, 32, 1)
    flat = torch.empty(s.numel() + 1, dtype=s.dtype, device="cuda")
    s_mis = flat[1:].view(s.shape)  # contiguous, but 2 bytes off a 16-byte boundary
    s_mis.copy_(s)
    _err(kernels, "16-byte aligned", qw, qz, s_mis)


def test_error_shapes(kernels):
    qw, qz, s = make_layer(64, 64, 32, 1)
    _err(kernels, r"scales must be \[K/G, N\]", qw, qz, s[:, :56].contiguous())
    _err(kernels, r"qzeros must be \[K/G, N/8\]", qw, qz[:, :7].contiguous(), s)
    _err(kernels, "same number of groups", qw, qz[:1].contiguous(), s)
    qw3, qz3, s3 = make_layer(96, 64, 32, 2)  # 3 groups; 64 rows of qweight do not divide by 3
    _err(kernels, "not a multiple of the group size", qw3[:64].contiguous(), qz3, s3)
    _err(kernels, "must be 2-D", qw.view(-1), qz, s)
    _err(kernels, "empty qweight", qw[:0], qz, s)
