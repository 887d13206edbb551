"""The W4A16 GEMV kernel (kernels/gemv_w4a16.cu via w4cli.gpu.kernels.gemv) against the pure-torch
reference (w4cli.formats.w4_gemv.gemv_reference): exact bits where the arithmetic is exact,
a justified bound elsewhere, every M from 1 to 8 and token tiles up to 32 rows (the batch kernels:
test_batch_gpu.py), tile tails, determinism, and the binding's error messages.

Run: pytest -m gpu tests/test_gemv_gpu.py   (builds the kernels on first use, about a minute)
"""

from __future__ import annotations

import pytest
import torch

from w4cli.formats import w4_gemv
from w4cli.gpu.checks import gemv_errors

pytestmark = pytest.mark.gpu  # skipped without a CUDA GPU (conftest.py)

DEV = "cuda"


def full_range_words(shape, gen) -> torch.Tensor:
    return torch.randint(-(2**31), 2**31, shape, generator=gen, dtype=torch.int64, device=DEV).to(torch.int32)


def make_layer(k: int, n: int, group_size: int, seed: int, exact: bool):
    """AWQ tensors with random full-range words, repacked to w4-gemv on the GPU.

    exact: scales are +-2^-6 .. +-2^-3, so every (q - z) * s is a multiple of 2^-6 below 2."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    groups = k // group_size
    qweight = full_range_words((k, n // 8), gen)
    qzeros = full_range_words((groups, n // 8), gen)
    sign = torch.randint(0, 2, (groups, n), generator=gen, device=DEV) * 2 - 1
    if exact:
        expo = torch.randint(-6, -2, (groups, n), generator=gen, device=DEV)
    else:
        # per-group scales of real AWQ checkpoints: about 2^-9 .. 2^-4
        expo = torch.empty(groups, n, device=DEV).uniform_(-9, -4, generator=gen)
    scales = (sign * torch.exp2(expo.float())).half()
    return w4_gemv.repack_from_awq(qweight, qzeros, scales)


def activations(m: int, k: int, seed: int, exact: bool) -> torch.Tensor:
    gen = torch.Generator(device=DEV).manual_seed(seed)
    if exact:
        return (torch.randint(-1, 2, (m, k), generator=gen, device=DEV)).half()
    return torch.randn(m, k, generator=gen, device=DEV).half()


def bits(t: torch.Tensor) -> torch.Tensor:
    # + 0 maps -0.0 to +0.0 (the only sign-of-zero difference a different summation order can make)
    return (t + 0).contiguous().view(torch.int16)


def assert_exact(out: torch.Tensor, ref32: torch.Tensor) -> None:
    want = ref32.half()
    diff = (bits(out) != bits(want)).nonzero()
    assert diff.numel() == 0, f"{diff.shape[0]} of {out.numel()} outputs differ, first at {diff[0].tolist()}: " \
        f"{out[tuple(diff[0])].item()} vs {want[tuple(diff[0])].item()}"


def assert_close(out: torch.Tensor, x: torch.Tensor, layer, bias=None) -> None:
    """Inside the bound of w4cli/gpu/checks.py (its docstring says why), against float64."""
    w = w4_gemv.dequantize(**layer, dtype=torch.float16)  # [N, K], the kernel's exact W16
    errors = gemv_errors(out, x, w, bias)
    assert errors.passed, f"{errors.outside}; worst err/bound {errors.worst_over_bound:.3g}"


# (K, N, G): small odd shapes, tails (N % 16 == 8, K % 128 != 0), one group, G 32/64/128
ODD = [
    (32, 8, 32),
    (40, 8, 40),
    (96, 24, 96),
    (160, 40, 32),
    (200, 56, 200),
    (384, 72, 64),
    (1152, 136, 128),
    (2304, 24, 64),
    (4104, 8, 4104),
]


@pytest.mark.parametrize("k,n,group_size", ODD)
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8])
def test_exact_odd_shapes(kernels, k, n, group_size, m):
    layer = make_layer(k, n, group_size, seed=k * 31 + n, exact=True)
    x = activations(m, k, seed=m, exact=True)
    out = kernels.gemv(x, **layer)
    assert out.shape == (m, n) and out.dtype == torch.float16
    assert_exact(out, w4_gemv.gemv_reference(x, **layer))


@pytest.mark.parametrize("m", range(1, 9))
def test_exact_every_m_with_bias(kernels, m):
    k, n, g = 4096, 1032, 128  # N % 16 == 8: the last tile is half empty
    layer = make_layer(k, n, g, seed=7, exact=True)
    x = activations(m, k, seed=100 + m, exact=True)
    bias = (torch.randint(-64, 64, (n,), device=DEV) * 2.0**-6).half()
    out = kernels.gemv(x, **layer, bias=bias)
    assert_exact(out, w4_gemv.gemv_reference(x, **layer, bias=bias))


@pytest.mark.parametrize("splits", [1, 2, 3, 4, 8, 16])
def test_exact_every_split(kernels, splits):
    k, n, g = 8192, 64, 64
    layer = make_layer(k, n, g, seed=splits, exact=True)
    x = activations(4, k, seed=splits, exact=True)
    out = kernels._gemv_splits(x, **layer, splits=splits)
    assert_exact(out, w4_gemv.gemv_reference(x, **layer))


# G = 128, 256 and one group with K >= 4096 take the scale-after-mma path (the pipelined kernel);
# G = 64 and smaller K the per-weight one (the lean kernel).
# 4224 = 33 k-blocks: an odd count per warp leaves one whole k-block to the pipeline's checked tail;
# 4160 (one group) ends in a partial k-block; N = 1032, 264, 40, 136, 24, 2120 end in a half-empty
# 16-row tile, the others in whole ones; N >= 2112 gives at least as many tiles as an H100 or H200
# has SMs (132)
@pytest.mark.parametrize(
    "k,n,m,g",
    [(8192, 1032, 1, 128), (8192, 1032, 5, 256), (4224, 264, 2, 128), (4160, 40, 3, 4160), (2304, 136, 8, 64),
     (160, 24, 3, 160), (8192, 1024, 3, 128), (4224, 512, 1, 128), (8192, 992, 8, 256), (4160, 64, 2, 4160),
     (8192, 2120, 1, 128), (4352, 2176, 3, 256), (4096, 4096, 8, 128), (4096, 2112, 2, 4096)],
)
def test_exact_both_kernels(kernels, k, n, m, g):
    layer = make_layer(k, n, g, seed=k, exact=True)
    x = activations(m, k, seed=0, exact=True)
    ref = w4_gemv.gemv_reference(x, **layer)
    assert_exact(kernels.gemv(x, **layer), ref)
    for splits in (1, 3, 8):
        assert_exact(kernels._gemv_splits(x, **layer, splits=splits), ref)


# Two and four token tiles (M = 9..32 in one launch): every M past a tile edge, odd shapes and
# tails on both kernels (the pipelined one from K = 4096 with G % 128 == 0), every split.
TILE_M = [9, 15, 16, 17, 24, 31, 32]


@pytest.mark.parametrize("m", TILE_M)
@pytest.mark.parametrize("k,n,g", [(1152, 136, 128), (4104, 8, 4104), (2304, 24, 64), (4224, 264, 128),
                                   (8192, 1032, 256), (4160, 40, 4160)])
def test_exact_token_tiles(kernels, k, n, g, m):
    layer = make_layer(k, n, g, seed=k + m, exact=True)
    x = activations(m, k, seed=m, exact=True)
    bias = (torch.randint(-64, 64, (n,), device=DEV) * 2.0**-6).half()
    ref = w4_gemv.gemv_reference(x, **layer, bias=bias)
    for splits in (0, 1, 3, 8, 16):
        out = kernels._gemv_splits(x, **layer, bias=bias, splits=splits)
        assert out.shape == (m, n)
        assert_exact(out, ref)


@pytest.mark.parametrize("k,g", [(4096, 128), (2304, 64)])
def test_token_tiles_give_each_token_the_bits_it_gets_alone(kernels, k, g):
    # the same mma chains for every tile: at the same split, a token's result does not depend on
    # the rows beside it (random data, so any mixing of tokens or tiles shows)
    n = 1032
    layer = make_layer(k, n, g, seed=3, exact=False)
    x = activations(32, k, seed=3, exact=False)
    alone = torch.cat([kernels._gemv_splits(x[i : i + 8].contiguous(), **layer, splits=4) for i in range(0, 32, 8)])
    for m in (9, 16, 17, 32):
        assert torch.equal(bits(kernels._gemv_splits(x[:m].contiguous(), **layer, splits=4)), bits(alone[:m]))
    assert_close(alone, x, layer)


@pytest.mark.parametrize("m", [9, 16])
def test_token_tiles_on_a_layer_of_many_tiles(kernels, m):
    # 384 tiles of 16 rows: on a 132-SM GPU the 12-warp build of two token tiles gives each tile 4
    # warps where the 8-warp build gives 2 (launch_gemv_w4a16); either way, exact, and a token's
    # bits at a given split are the ones it gets alone
    k, n = 4096, 6144
    layer = make_layer(k, n, 128, seed=m, exact=True)
    x = activations(m, k, seed=m, exact=True)
    bias = (torch.randint(-64, 64, (n,), device=DEV) * 2.0**-6).half()
    ref = w4_gemv.gemv_reference(x, **layer, bias=bias)
    assert_exact(kernels.gemv(x, **layer, bias=bias), ref)
    for splits in (0, 1, 3, 4, 8):
        assert_exact(kernels._gemv_splits(x, **layer, bias=bias, splits=splits), ref)
    rnd = make_layer(k, n, 128, seed=m + 1, exact=False)
    xr = activations(m, k, seed=m + 1, exact=False)
    alone = torch.cat([kernels._gemv_splits(xr[i : i + 8].contiguous(), **rnd, splits=4) for i in range(0, m, 8)])
    assert torch.equal(bits(kernels._gemv_splits(xr, **rnd, splits=4)), bits(alone[:m]))
    assert_close(kernels.gemv(xr, **rnd), xr, rnd)


# real layer shapes (K x N), group 128
REAL = [(4096, 4096), (4096, 14336), (14336, 4096), (8192, 1024), (11008, 4096)]


@pytest.mark.parametrize("k,n", REAL)
@pytest.mark.parametrize("m", [1, 4, 8])
def test_random_real_shapes(kernels, k, n, m):
    layer = make_layer(k, n, 128, seed=k + n + m, exact=False)
    x = activations(m, k, seed=m, exact=False)
    bias = torch.randn(n, device=DEV).half() if m == 4 else None
    out = kernels.gemv(x, **layer, bias=bias)
    assert_close(out, x, layer, bias)


# small K with G = 128: the scale-after-mma path would skip the weight rounding by more than the
# tolerance allows here (2^-11 sum |x||w| against 4 K 2^-24 sum |x||w|), so these take the
# per-weight path; a K = 128 layer failed the bound before that rule
@pytest.mark.parametrize("k,n", [(128, 64), (1024, 136), (2048, 256), (3968, 72)])
@pytest.mark.parametrize("m", [1, 3, 8])
def test_random_small_k(kernels, k, n, m):
    layer = make_layer(k, n, 128, seed=k + m, exact=False)
    x = activations(m, k, seed=m, exact=False)
    assert_close(kernels.gemv(x, **layer), x, layer)


def test_vector_input(kernels):
    layer = make_layer(256, 32, 128, seed=1, exact=True)
    x = activations(1, 256, seed=1, exact=True)
    out = kernels.gemv(x[0], **layer)
    assert out.shape == (32,)
    assert_exact(out, w4_gemv.gemv_reference(x, **layer)[0])


def test_deterministic(kernels):
    layer = make_layer(14336, 4096, 128, seed=3, exact=False)
    x = activations(3, 14336, seed=3, exact=False)
    first = kernels.gemv(x, **layer)
    for _ in range(5):
        assert torch.equal(bits(kernels.gemv(x, **layer)), bits(first))


def test_every_output_written(kernels):
    # poison: free a NaN block of y's size right before the call, so the caching allocator hands
    # it back as y; any element the kernel skips stays NaN and fails the exact comparison
    layer = make_layer(256, 24, 64, seed=4, exact=True)
    x = activations(3, 256, seed=4, exact=True)
    ref = w4_gemv.gemv_reference(x, **layer)
    for _ in range(3):
        poison = torch.full((3, 24), float("nan"), dtype=torch.float16, device=DEV)
        del poison
        assert_exact(kernels.gemv(x, **layer), ref)


def test_cuda_graph_capture(kernels):
    layer = make_layer(1024, 64, 128, seed=5, exact=True)
    x = activations(2, 1024, seed=5, exact=True)
    kernels.gemv(x, **layer)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernels.gemv(x, **layer)
    graph.replay()
    torch.cuda.synchronize()
    assert_exact(out, w4_gemv.gemv_reference(x, **layer))


def binding_args(m=1, k=256, n=32, g=64):
    layer = make_layer(k, n, g, seed=0, exact=True)
    x = activations(m, k, seed=0, exact=True)
    return x, layer["qweight"], layer["qzeros"], layer["scales"]


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda a: (a[0].float(),) + a[1:], "x must be float16"),
        (lambda a: (a[0].cpu(),) + a[1:], "x must be on cuda"),
        (lambda a: (torch.zeros(256, 2, dtype=torch.float16, device=DEV).t(),) + a[1:], "x must be contiguous"),
        # a view 2 bytes into its storage: contiguous but not 16-byte aligned
        (lambda a: (torch.zeros(264, dtype=torch.float16, device=DEV)[1:257].view(1, 256),) + a[1:], "16-byte aligned"),
        (lambda a: (a[0][:, :128].contiguous(),) + a[1:], "k-blocks"),
        (lambda a: (a[0], a[1].view(torch.float32)) + a[2:], "qweight must be int32"),
        (lambda a: (a[0], a[1][..., :8].contiguous()) + a[2:], "qweight must be int32"),
        (lambda a: a[:2] + (a[2][:, :2].contiguous(), a[3]), "qzeros must be"),
        (lambda a: a[:3] + (a[3].float(),), "scales must be float16"),
        (lambda a: a[:3] + (a[3][:, :16].contiguous(),), "scales must be"),
        (lambda a: (torch.zeros(33, 256, dtype=torch.float16, device=DEV),) + a[1:], "at most 32"),
    ],
)
def test_binding_messages(kernels, mutate, match):
    args = mutate(binding_args())
    with pytest.raises(RuntimeError, match=match):
        kernels.load().gemv_w4(*args, None, 0)


def test_binding_bias_and_splits_messages(kernels):
    x, qw, qz, s = binding_args()
    with pytest.raises(RuntimeError, match="bias must be a contiguous float16"):
        kernels.load().gemv_w4(x, qw, qz, s, torch.zeros(31, dtype=torch.float16, device=DEV), 0)
    with pytest.raises(RuntimeError, match="splits"):
        kernels.load().gemv_w4(x, qw, qz, s, None, 17)


def test_binding_refuses_group_not_multiple_of_32(kernels):
    # two groups of 48: the kernel's 32-k runs would straddle groups (repack refuses it too)
    x = torch.zeros(1, 96, dtype=torch.float16, device=DEV)
    qw = torch.zeros(1, 1, 8, 16, dtype=torch.int32, device=DEV)
    qz = torch.zeros(2, 1, dtype=torch.int32, device=DEV)
    s = torch.ones(2, 8, dtype=torch.float16, device=DEV)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        kernels.load().gemv_w4(x, qw, qz, s, None, 0)


def test_scales_view_not_4_byte_aligned(kernels):
    # scales are read as 16-bit values: a view 2 bytes into its storage works as well
    k, n, g = 1024, 48, 128
    layer = make_layer(k, n, g, seed=9, exact=True)
    x = activations(2, k, seed=9, exact=True)
    store = torch.empty(layer["scales"].numel() + 1, dtype=torch.float16, device=DEV)
    odd = store[1:].view(k // g, n)
    odd.copy_(layer["scales"])
    assert odd.data_ptr() % 4 == 2
    out = kernels.gemv(x, layer["qweight"], layer["qzeros"], odd)
    assert_exact(out, w4_gemv.gemv_reference(x, **layer))


@pytest.mark.parametrize("m", [1, 8, 16])
def test_pdl_chain_gives_the_same_bits_eager_and_in_a_graph(kernels, m):
    # six layers in a chain, each reading the previous one's output: under programmatic dependent
    # launch a GEMV starts before the previous kernel ends and must still read its finished output
    chain = [(4096, 4096), (4096, 11008), (11008, 4096), (4096, 1024), (1024, 4096), (4096, 8192)]
    layers = [make_layer(k, n, 128, seed=50 + i, exact=False) for i, (k, n) in enumerate(chain)]
    for (k, _), layer in zip(chain, layers):
        # unit-variance outputs for unit-variance inputs (|q - z| has std 6.5): the chain stays finite
        layer["scales"] = torch.full_like(layer["scales"], 1.0 / (6.5 * k**0.5))
    x = activations(m, 4096, seed=m, exact=False)

    def run(pdl: bool) -> torch.Tensor:
        h = x
        for layer in layers:
            h = kernels.gemv(h, **layer, pdl=pdl)
        return h

    want = run(pdl=False)
    assert bool(torch.isfinite(want).all())
    assert torch.equal(bits(run(pdl=True)), bits(want))
    graph = torch.cuda.CUDAGraph()
    run(pdl=True)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        out = run(pdl=True)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(bits(out), bits(want))
