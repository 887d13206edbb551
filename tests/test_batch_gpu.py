"""The batch kernels (kernels/gemm_w4a16_batch.cu on mma.sync, M <= 64, and gemm_w4a16_wgmma.cu on
wgmma, compute capability 9.0: M <= 128, and any M on its warp-specialised kernel, one read of the
weight per tile of tokens), the GPU
dequantize of the w4-gemv layout (kernels/dequant_w4_gemv.cu) and the paths w4cli.gpu.kernels.gemv picks
by M, against the pure-torch reference: exact bits where the arithmetic is exact, the bound of
w4cli/gpu/checks.py elsewhere, every split-K reduction and row tiling, tile tails, determinism.

Run: pytest -m gpu tests/test_batch_gpu.py   (builds the kernels on first use, about a minute)
"""

from __future__ import annotations

import pytest
import torch

from w4cli.formats import w4_gemv
from test_gemv_gpu import DEV, activations, assert_close, assert_exact, bits, full_range_words, make_layer

pytestmark = pytest.mark.gpu  # skipped without a CUDA GPU (conftest.py)


def exact_bias(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator(device=DEV).manual_seed(seed)
    return (torch.randint(-64, 64, (n,), generator=gen, device=DEV) * 2.0**-6).half()


def kernel_or_skip(kernel: int) -> int:
    if kernel in (2, 3) and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernels need compute capability 9.0")
    return kernel


# every M the issue names, through the public entry (gemv, batch, wgmma, their chunked forms and
# dequant+cuBLAS);
# K = 4224 is 33 k-blocks, N = 8200 ends in a half-empty 16-row tile inside a partial row block;
# 34.6 M weights: large enough for every path (contract.TINY_LAYER, WGMMA_CHUNKED_MIN_LAYER)
@pytest.mark.parametrize("m", [9, 16, 17, 31, 32, 33, 64, 65, 100, 128, 129, 200, 256, 257, 300, 511, 1000, 4096])
def test_exact_every_batch_size_with_bias(kernels, m):
    k, n, g = 4224, 8200, 128
    layer = make_layer(k, n, g, seed=m, exact=True)
    x = activations(m, k, seed=200 + m, exact=True)
    bias = exact_bias(n, m)
    out = kernels.gemv(x, **layer, bias=bias)
    assert out.shape == (m, n) and out.dtype == torch.float16
    assert_exact(out, w4_gemv.gemv_reference(x, **layer, bias=bias))


# Past 24 tokens on a layer of more than 64 k-blocks whose four splits of 256-row blocks fill the SMs
# but whose row blocks alone do not, the barrier wgmma kernel's two tiles follow their permute kernel
# without PDL (its planner); K = 8320 is 65 k-blocks, N = 8200 33 row blocks of 256. In a PDL chain
# captured in a graph the next layer still reads only what this one wrote.
@pytest.mark.parametrize("m", [24, 25, 32])
def test_exact_long_layer_two_tiles_after_the_permute_kernel(kernels, m):
    k, n, g = 8320, 8200, 128
    assert kernels.gemv_path(m, k, n) == ("wgmma" if kernels.has_wgmma() else "batch")
    layer = make_layer(k, n, g, seed=m, exact=True)
    x = activations(m, k, seed=300 + m, exact=True)
    assert_exact(kernels.gemv(x, **layer), w4_gemv.gemv_reference(x, **layer))
    before = make_layer(4096, k, g, seed=400 + m, exact=False)
    after = make_layer(n, 4096, n, seed=500 + m, exact=False)  # one group: no multiple of 32 divides 8200
    assert_pdl_chain_replays(kernels, before, layer, m, 4096)
    assert_pdl_chain_replays(kernels, layer, after, m, k)


# (K, N, G): groups of 32, 64, 128, 256 and one group; K % 128 != 0 (a partial last k-block,
# activations past K never read); N % 16 == 8; N below one row block and above several
SHAPES = [
    (4096, 1032, 32),
    (2304, 136, 64),
    (8192, 520, 128),
    (4352, 264, 256),
    (4160, 40, 4160),
    (200, 56, 200),
    (1000, 8, 1000),
    (1152, 2056, 128),
]


# (kernel, M, row tiles, k order): the mma.sync kernel's variants (NT = 2 only at M <= 16), then the
# wgmma kernel's (one m64 tile per warpgroup from M = 65), then the warp-specialised kernel's six
# variants of one block a tile (tokens per tile 64, 64, 128, 128, 256 with 1, 2, 1, 2, 1 m64 tiles
# per warpgroup on two MMA warpgroups; 7: 128 tokens, one m64 tile on each of three, 192 rows): a
# partial tile of tokens, exactly one, several with a tail; the wgmma kernels with x permuted (1)
# and as it lies (2)
TILINGS = [(1, m, tiles, 0) for m, tiles in [(9, 2), (16, 2), (24, 1), (31, 2), (40, 1), (64, 2)]] + [
    (2, m, tiles, order) for m, tiles in [(1, 1), (9, 2), (16, 1), (17, 2), (32, 1), (40, 2), (64, 1), (65, 1), (100, 1),
                                          (128, 1)] for order in (1, 2)] + [
    (3, m, variant, order) for m, variant in [(1, 1), (64, 1), (130, 1), (17, 2), (200, 2), (100, 3), (128, 3), (300, 3),
                                              (65, 4), (257, 4), (129, 5), (256, 5), (511, 5), (100, 7), (128, 7),
                                              (300, 7)] for order in (1, 2)]


@pytest.mark.parametrize("k,n,g", SHAPES)
@pytest.mark.parametrize("kernel,m,tiles,order", TILINGS)
def test_exact_every_tiling_and_split(kernels, k, n, g, kernel, m, tiles, order):
    kernel_or_skip(kernel)
    layer = make_layer(k, n, g, seed=k + n + m, exact=True)
    x = activations(m, k, seed=m, exact=True)
    bias = exact_bias(n, k)
    if order == 2 and g != k and g % 128 != 0:  # x as it lies takes one scale a row and 128-k block
        with pytest.raises(RuntimeError, match="no kernel"):
            kernels._batch(x, **layer, bias=bias, tiles=tiles, kernel=kernel, order=order)
        return
    ref = w4_gemv.gemv_reference(x, **layer, bias=bias)
    kblocks = -(-k // 128)
    for splits in sorted({1, 2, 3, 7, kblocks}):
        out = kernels._batch(x, **layer, bias=bias, splits=min(splits, kblocks), tiles=tiles, kernel=kernel,
                             order=order)
        assert_exact(out, ref)


@pytest.fixture
def hopper(kernels):
    kernel_or_skip(2)  # the wgmma kernel exists for compute capability 9.0 only (sm_90a)
    return kernels


def stream_k_layer_shape(variant: int, m: int, k: int, more: int) -> int:
    """N that gives the warp-specialised kernel's `variant` at M tokens `more` tiles than the GPU has
    SMs (about; `more` < 0: fewer), its last row block ending in a half-empty 16-row tile."""
    tokens, rows = {1: (64, 128), 2: (64, 256), 3: (128, 128), 4: (128, 256), 5: (256, 128), 7: (128, 192)}[variant]
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    row_blocks = -(-(sms + more) // -(-m // tokens))
    return row_blocks * rows - 8


# Stream-K: without split-K the warp-specialised kernel runs one block per SM, whole tiles first,
# then a last wave at most 80% full (or a launch of more than half a wave) shared out in equal
# pieces of at least half a tile: a tile is cut between two or three blocks wherever the pieces
# end, and the first block adds the others' partials. Past a whole wave, the last whole wave
# mostly joins it, spread over every block (ranges longer than a tile, each tile cut once at
# most), but not where the last wave is 40-50% of one (60 tiles past 132 SMs: its halves alone).
# A launch of fewer tiles than half the SMs spreads its k-blocks over every SM where that pays (33
# k-blocks here: a tile in 4-6 pieces, some of them inside it) and runs a tile a block where it
# does not (2-3 k-blocks). Every variant; tile counts past whole waves and below one (cuts at
# different k-blocks), and without stream-K (a fuller last wave); K of 2-33 k-blocks (a partial
# last one); groups of 64 and single groups: the reference's bits.
@pytest.mark.parametrize("variant,m,more", [(1, 64, 1), (1, 64, -60), (1, 130, 70), (2, 200, 7), (2, 64, -100),
                                            (3, 128, 131), (3, 128, -40), (4, 257, 5), (5, 256, 40), (5, 256, 60),
                                            (5, 256, -50), (5, 256, -110), (5, 511, 3), (7, 128, 131), (7, 128, -40),
                                            (7, 300, 5)])
@pytest.mark.parametrize("k,g,order", [(384, 128, 1), (384, 128, 2), (200, 200, 2), (4160, 64, 1)])
def test_stream_k_exact(hopper, variant, m, more, k, g, order):
    n = stream_k_layer_shape(variant, m, k, more)
    layer = make_layer(k, n, g, seed=k + m + variant, exact=True)
    x = activations(m, k, seed=m, exact=True)
    bias = exact_bias(n, k)
    assert_exact(hopper._batch(x, **layer, bias=bias, splits=1, tiles=variant, kernel=3, order=order),
                 w4_gemv.gemv_reference(x, **layer, bias=bias))


# The last token tile's x box holds only its tokens (kernels/gemm_w4a16_wgmma.cu, xtail), so a
# stage's rows past M keep whatever an earlier launch left there. A launch whose x is all NaN
# leaves NaN in the stages of every SM it ran on; a launch after it whose last tile M leaves part
# empty must still give the reference's bits, with split-K and without, in both k orders.
@pytest.mark.parametrize("variant,m", [(1, 65), (2, 100), (3, 129), (4, 200), (5, 100), (5, 257), (7, 129)])
@pytest.mark.parametrize("splits,order", [(1, 1), (1, 2), (3, 2)])
def test_rows_past_m_left_from_an_earlier_launch(hopper, variant, m, splits, order):
    k, n, g = 4224, 1032, 128
    layer = make_layer(k, n, g, seed=variant, exact=True)
    poison = torch.full((512, k), float("nan"), dtype=torch.float16, device=DEV)
    assert hopper._batch(poison, **layer, splits=splits, tiles=variant, kernel=3, order=order).isnan().all()
    x = activations(m, k, seed=m, exact=True)
    assert_exact(hopper._batch(x, **layer, splits=splits, tiles=variant, kernel=3, order=order),
                 w4_gemv.gemv_reference(x, **layer))


# The barrier wgmma kernel's x boxes hold M rows, not the tile's (kernels/gemm_w4a16_wgmma.cu), so
# its stages' rows past M too keep what an earlier launch of the same tile left there.
@pytest.mark.parametrize("m,full,tiles", [(9, 16, 1), (17, 32, 1), (25, 32, 2), (33, 64, 2), (100, 128, 1)])
@pytest.mark.parametrize("splits,order", [(1, 1), (1, 2), (3, 2)])
def test_barrier_kernel_rows_past_m_left_from_an_earlier_launch(hopper, m, full, tiles, splits, order):
    k, n, g = 4224, 4104, 128
    layer = make_layer(k, n, g, seed=m, exact=True)
    poison = torch.full((full, k), float("nan"), dtype=torch.float16, device=DEV)
    assert hopper._batch(poison, **layer, splits=splits, tiles=tiles, kernel=2, order=order).isnan().all()
    x = activations(m, k, seed=m, exact=True)
    assert_exact(hopper._batch(x, **layer, splits=splits, tiles=tiles, kernel=2, order=order),
                 w4_gemv.gemv_reference(x, **layer))


def offset_by_one_word(t: torch.Tensor) -> torch.Tensor:
    """The same values in a contiguous view 4 bytes past a 16-byte boundary."""
    flat = torch.empty(t.numel() + 4, dtype=t.dtype, device=t.device)
    view = flat[1 : 1 + t.numel()].view_as(t)
    view.copy_(t)
    return view


# Where every row block lies inside N and a stage has one scale and zero a row, the producer copies
# a stage's scales and zeros with the bulk copy engine (kernels/gemm_w4a16_wgmma.cu,
# ws_bulk_constants); with qzeros 4 bytes off a 16-byte boundary (a view), by its 32 lanes'
# cp.async instead. Both ways give the reference's bits, split-K and persistent, both k orders,
# the pairs too. N is whole row blocks of 128, 192 and 256 rows.
@pytest.mark.parametrize("variant,splits,order", [(v, s, o) for v in (1, 2, 3, 4, 5, 7) for s in (1, 3)
                                                  for o in (1, 2)] + [(6, 1, 2)])
def test_scales_and_zeros_by_bulk_copy_or_by_lanes(hopper, variant, splits, order):
    k, n, g, m = 4224, 1536, 128, 300
    layer = make_layer(k, n, g, seed=variant, exact=True)
    x = activations(m, k, seed=m, exact=True)
    want = w4_gemv.gemv_reference(x, **layer)
    assert_exact(hopper._batch(x, **layer, splits=splits, tiles=variant, kernel=3, order=order), want)
    lanes = dict(layer, qzeros=offset_by_one_word(layer["qzeros"]))
    assert lanes["qzeros"].data_ptr() % 16 == 4
    assert_exact(hopper._batch(x, **lanes, splits=splits, tiles=variant, kernel=3, order=order), want)


def test_stream_k_random_and_deterministic(hopper):
    n = stream_k_layer_shape(5, 1000, 4096, 9)
    layer = make_layer(4096, n, 128, seed=11, exact=False)
    x = activations(1000, 4096, seed=11, exact=False)
    first = hopper._batch(x, **layer, splits=1, tiles=5, kernel=3)
    assert_close(first, x, layer, None)
    for _ in range(3):
        assert torch.equal(bits(hopper._batch(x, **layer, splits=1, tiles=5, kernel=3)), bits(first))


def test_stream_k_over_every_sm_random_and_deterministic(hopper):
    # Llama-3-70B's down_proj at M = 64: 32 tiles of 64 x 256 over 224 k-blocks, where the clusters of
    # split-K that fit at once would leave SMs idle and the planner may spread the tiles' k-blocks
    # over every SM instead (the choice depends on the GPU's clusters; the result may not)
    layer = make_layer(28672, 8192, 128, seed=14, exact=False)
    x = activations(64, 28672, seed=14, exact=False)
    for plan in ({}, {"splits": 1, "tiles": 2}):  # the planner's; stream-K over every SM, named
        first = hopper._batch(x, **layer, kernel=3, **plan)
        assert_close(first, x, layer, None)
        assert torch.equal(bits(hopper._batch(x, **layer, kernel=3, **plan)), bits(first))


def test_stream_k_chain_in_a_graph(hopper):
    # two stream-K layers back to back under PDL in one graph: each launch's flags kernel zeroes the
    # flags only once the GEMM before is done with its own, and every replay starts from zeroed flags
    n = stream_k_layer_shape(5, 1000, 4096, 20)
    first = make_layer(4096, n, 128, seed=12, exact=False)
    second = make_layer(n, 5120, n, seed=13, exact=False)  # K = N of the first: one group
    assert_pdl_chain_replays(hopper, first, second, 1000, 4096)


# Variant 6: variant 5's tiles in pairs of blocks, one cluster of two a pair, each block copying half
# of every stage's activations into both. An even and an odd row-block count (the last pair's
# second tile past N, on zeros), a partial tile of tokens, more pairs than clusters at once, K of a
# partial last k-block; x as it lies only. The reference's bits, and the same bits on every run.
@pytest.mark.parametrize("k,n,m", [(384, 384, 256), (384, 8 * 128 - 8, 300), (1000, 141 * 128, 600),
                                   (4160, 2 * 128, 1)])
def test_pairs_exact(hopper, k, n, m):
    layer = make_layer(k, n, 128 if k % 128 == 0 else k, seed=k + n + m, exact=True)
    x = activations(m, k, seed=m, exact=True)
    bias = exact_bias(n, k)
    out = hopper._batch(x, **layer, bias=bias, splits=1, tiles=6, kernel=3, order=2)
    assert_exact(out, w4_gemv.gemv_reference(x, **layer, bias=bias))
    assert torch.equal(bits(hopper._batch(x, **layer, bias=bias, splits=1, tiles=6, kernel=3, order=2)), bits(out))


def pairs_layer_shape(m: int, more: int, odd: bool) -> int:
    """N that gives the pairs at M tokens about `more` pairs past the clusters that run at once (half
    the SMs at most), with an odd row-block count if `odd`, the last row block ending in a
    half-empty 16-row tile."""
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    pairs_a_token_tile = -(-(sms // 2 + more) // -(-m // 256))
    return (2 * pairs_a_token_tile - (1 if odd else 0)) * 128 - 8


# Past one wave of pairs the last wave is shared out by stream-K over the clusters (with the last
# whole wave, or alone: 30 pairs past 66 clusters), as variant 5's: both blocks of a cluster cut
# their tiles at the same k-blocks, and each tile's first block adds the later blocks' partials of
# its own row block. Last waves of a few pairs and of most of a wave (cuts at different k-blocks),
# an odd row-block count (the last pair's second tile past N, on zeros, cut too), one full token
# tile and partial ones, K of 2-33 k-blocks and one group: the reference's bits, and the same bits
# on every run.
@pytest.mark.parametrize("m,more,odd", [(256, 5, True), (300, 3, False), (512, 40, True), (512, 30, False),
                                        (1000, 9, True), (257, 20, False)])
@pytest.mark.parametrize("k,g", [(384, 128), (4224, 128), (200, 200)])
def test_pairs_stream_k_exact(hopper, m, more, odd, k, g):
    n = pairs_layer_shape(m, more, odd)
    layer = make_layer(k, n, g, seed=k + m + more, exact=True)
    x = activations(m, k, seed=m + more, exact=True)
    bias = exact_bias(n, k)
    out = hopper._batch(x, **layer, bias=bias, splits=1, tiles=6, kernel=3, order=2)
    assert_exact(out, w4_gemv.gemv_reference(x, **layer, bias=bias))
    assert torch.equal(bits(hopper._batch(x, **layer, bias=bias, splits=1, tiles=6, kernel=3, order=2)), bits(out))


def test_pairs_stream_k_random_and_deterministic(hopper):
    # Llama-3-8B's gate_proj at M = 1000: 224 pairs, past three waves on 132 SMs
    layer = make_layer(4096, 14336, 128, seed=22, exact=False)
    x = activations(1000, 4096, seed=22, exact=False)
    first = hopper._batch(x, **layer, splits=1, tiles=6, kernel=3, order=2)
    assert_close(first, x, layer, None)
    for _ in range(3):
        assert torch.equal(bits(hopper._batch(x, **layer, splits=1, tiles=6, kernel=3, order=2)), bits(first))


def test_pairs_stream_k_chain_in_a_graph(hopper):
    # two layers whose planner's launch is the pairs past one wave (224 and 80 pairs at M = 1000 on
    # 132 SMs), back to back under PDL in one graph: each launch's flags kernel zeroes its flags only
    # once the GEMM before is done with its own
    first = make_layer(4096, 14336, 128, seed=23, exact=False)
    second = make_layer(14336, 5120, 128, seed=24, exact=False)
    assert_pdl_chain_replays(hopper, first, second, 1000, 4096)


def test_pairs_random_real_shape(hopper):
    layer = make_layer(8192, 28672, 128, seed=21, exact=False)
    x = activations(1000, 8192, seed=21, exact=False)
    assert_close(hopper._batch(x, **layer, splits=1, tiles=6, kernel=3, order=2), x, layer, None)


# the barrier wgmma kernel (2) up to 128 rows (at 16 and 24 with its scale after the wgmma where its
# tiles allow it), the warp-specialised one (3) beyond and at M = 100, each with the planner's own
# variant and split (on 132 SMs 4096x14336 at M = 1000 takes the pairs past one wave, x as it lies,
# and variant 5 with stream-K in the permuted order; 14336x4096 at M = 100 and 4096x6144 at
# M = 129-256 and 400 variant 7)
@pytest.mark.parametrize("k,n", [(4096, 4096), (4096, 6144), (14336, 4096), (4096, 14336), (8192, 28672)])
@pytest.mark.parametrize("m,kernel", [(16, 2), (24, 2), (64, 2), (100, 3), (128, 2), (129, 3), (256, 3), (400, 3),
                                      (1000, 3)])
@pytest.mark.parametrize("order", [1, 2])
def test_wgmma_random_real_shapes(hopper, k, n, m, kernel, order):
    layer = make_layer(k, n, 128, seed=k + n + m, exact=False)
    x = activations(m, k, seed=m, exact=False)
    assert_close(hopper._batch(x, **layer, kernel=kernel, order=order), x, layer, None)


REAL = [(4096, 4096), (4096, 14336), (14336, 4096), (8192, 1024), (11008, 4096)]


@pytest.mark.parametrize("k,n", REAL)
@pytest.mark.parametrize("m", [16, 48, 64, 200])
def test_random_real_shapes(kernels, k, n, m):
    layer = make_layer(k, n, 128, seed=k + n + m, exact=False)
    x = activations(m, k, seed=m, exact=False)
    bias = torch.randn(n, device=DEV).half() if m == 48 else None
    assert_close(kernels.gemv(x, **layer, bias=bias), x, layer, bias)


@pytest.mark.parametrize("m,kernel", [(16, 1), (64, 1), (40, 2), (128, 2), (300, 3)])
def test_deterministic_with_splits(kernels, m, kernel):
    # the split-K partials are added in split order whichever block arrives last
    kernel_or_skip(kernel)
    layer = make_layer(8192, 1024, 128, seed=3, exact=False)
    x = activations(m, 8192, seed=3, exact=False)
    for splits in (0, 5, 16):
        first = kernels._batch(x, **layer, splits=splits, kernel=kernel)
        for _ in range(5):
            assert torch.equal(bits(kernels._batch(x, **layer, splits=splits, kernel=kernel)), bits(first))


def test_outputs_and_counters_start_from_garbage(kernels):
    # every output is written, and the mma.sync kernel's split-K counters (scratch its launch zeroes
    # with a memset) are zeroed: blocks the allocator hands back full of old values must not matter
    # (the wgmma kernels have no counters: they add their splits within a cluster)
    layer = make_layer(4096, 520, 128, seed=4, exact=True)
    x = activations(37, 4096, seed=4, exact=True)
    ref = w4_gemv.gemv_reference(x, **layer)
    for splits in (1, 3, 5):
        for _ in range(3):
            poison = [torch.full((37, 520), float("nan"), dtype=torch.float16, device=DEV),  # y's size
                      torch.full((128,), 3, dtype=torch.int32, device=DEV)]  # the counters' 512-byte block
            del poison
            assert_exact(kernels._batch(x, **layer, splits=splits, kernel=1), ref)


@pytest.mark.parametrize("kernel,m", [(2, 40), (2, 128), (3, 100), (3, 300)])
def test_every_cluster_size(kernels, kernel, m):
    # split-K in clusters of S = 1..8 blocks: each block adds an uneven share of the tile's tokens
    # (S = 3, 5, 6, 7), in split order, so every S gives the reference's bits
    kernel_or_skip(kernel)
    layer = make_layer(2048, 1032, 128, seed=m, exact=True)
    x = activations(m, 2048, seed=m, exact=True)
    bias = exact_bias(1032, m)
    ref = w4_gemv.gemv_reference(x, **layer, bias=bias)
    for splits in range(1, 9):
        assert_exact(kernels._batch(x, **layer, bias=bias, splits=splits, kernel=kernel), ref)


def assert_pdl_chain_replays(kernels, first: dict, second: dict, m: int, k: int) -> None:
    """Two layers chained with pdl=True, captured in one graph and replayed on new inputs, give
    the bits of plain launches (a read too early would see the old values)."""
    x = activations(m, k, seed=m, exact=False)

    def chain(pdl: bool) -> torch.Tensor:
        return kernels.gemv(kernels.gemv(x, **first, pdl=pdl), **second, pdl=pdl)

    chain(True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(True)
    for seed in range(3):
        x.copy_(activations(m, k, seed=1000 + seed, exact=False))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(bits(out), bits(chain(False)))


@pytest.mark.parametrize("m", [20, 40, 100, 300])
@pytest.mark.parametrize("n", [4096, 8200])
def test_pdl_chain_in_a_graph(kernels, m, n):
    # with pdl=True each layer's kernels start under the previous kernel (Hopper): activations are
    # read only once written, so a chain of layers in one graph gives the bits of plain launches,
    # also when the input changes between replays; the second layer at N = 8200 takes x permuted
    # by an x kernel at M = 20 (the barrier kernel, above its 2^25 weights), as it lies from M = 33
    # (the first always as it lies)
    first = make_layer(4096, 4096, 128, seed=7, exact=False)
    second = make_layer(4096, n, 128, seed=8, exact=False)
    assert_pdl_chain_replays(kernels, first, second, m, 4096)


@pytest.mark.parametrize("kernel,order", [(1, 0), (2, 1), (2, 2), (3, 1), (3, 2)])
def test_cuda_graph_capture_with_splits(kernels, kernel, order):
    # the mma.sync kernel's split-K counters are zeroed inside the capture (a memset node) on every
    # replay, the wgmma kernels' clusters launch in it; the permuted activations are rewritten every
    # replay too
    kernel_or_skip(kernel)
    layer = make_layer(4096, 520, 128, seed=5, exact=True)
    ref = None
    x = activations(20, 4096, seed=5, exact=True)
    kernels._batch(x, **layer, splits=4, kernel=kernel, order=order)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernels._batch(x, **layer, splits=4, kernel=kernel, order=order)
    ref = w4_gemv.gemv_reference(x, **layer)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert_exact(out, ref)


@pytest.mark.parametrize("k,n,g", [(32, 8, 32), (200, 56, 200), (4160, 40, 4160), (2304, 136, 64), (8192, 1032, 128)])
def test_gpu_dequantize_bit_exact(kernels, k, n, g):
    layer = make_layer(k, n, g, seed=k + n, exact=False)
    want = w4_gemv.dequantize(**layer, dtype=torch.float16)
    got = kernels.dequantize_w4_gemv(layer["qweight"], layer["qzeros"], layer["scales"], k)
    assert got.shape == (n, k) and got.dtype == torch.float16
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_gpu_dequantize_extreme_scales(kernels):
    # subnormal and overflowing products: one rounding of the exact (q - z) * s, like the reference
    k, n, g = 256, 64, 32
    layer = make_layer(k, n, g, seed=11, exact=True)
    gen = torch.Generator(device=DEV).manual_seed(11)
    pick = torch.tensor([2.0**-24, 2.0**-14, 3.0 * 2.0**-20, 65504.0, -60000.0, 4400.0, -2.0**-24, 1.0], device=DEV)
    layer["scales"] = pick[torch.randint(0, 8, (k // g, n), generator=gen, device=DEV)].half()
    layer["qweight"] = full_range_words(layer["qweight"].shape, gen)
    want = w4_gemv.dequantize(**layer, dtype=torch.float16)
    got = kernels.dequantize_w4_gemv(layer["qweight"], layer["qzeros"], layer["scales"], k)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def off_by_one_element(t: torch.Tensor) -> torch.Tensor:
    """t's values in a contiguous view that starts one element into its storage (not 16-byte aligned)."""
    store = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    odd = store[1:].view(t.shape)
    odd.copy_(t)
    return odd


def test_unaligned_scales_and_zeros_take_every_path(kernels):
    k, n, g = 4096, 8200, 128  # large enough for every path
    layer = make_layer(k, n, g, seed=9, exact=True)
    shifted = dict(layer, scales=off_by_one_element(layer["scales"]), qzeros=off_by_one_element(layer["qzeros"]))
    for m in (3, 20, 100, 200, 300):
        x = activations(m, k, seed=m, exact=True)
        assert_exact(kernels.gemv(x, **shifted), w4_gemv.gemv_reference(x, **layer))


def test_binding_messages(kernels):
    layer = make_layer(256, 32, 64, seed=0, exact=True)
    mod = kernels.load()
    x = activations(129, 256, seed=0, exact=True)
    with pytest.raises(RuntimeError, match="at most 128"):
        mod.gemm_w4_batch(x, layer["qweight"], layer["qzeros"], layer["scales"], None, 0, 0)
    with pytest.raises(RuntimeError, match="splits"):
        mod.gemm_w4_batch(x[:20].contiguous(), layer["qweight"], layer["qzeros"], layer["scales"], None, 65, 0)
    with pytest.raises(RuntimeError, match="no kernel"):
        mod.gemm_w4_batch(x[:20].contiguous(), layer["qweight"], layer["qzeros"], layer["scales"], None, 0, 3)
    with pytest.raises(RuntimeError, match="no kernel"):  # mma.sync takes at most 64 rows
        mod.gemm_w4_batch(x[:100].contiguous(), layer["qweight"], layer["qzeros"], layer["scales"], None, 0, 0, 1)
    with pytest.raises(RuntimeError, match="kernel must be 1"):
        mod.gemm_w4_batch(x[:20].contiguous(), layer["qweight"], layer["qzeros"], layer["scales"], None, 0, 0, 0)
    if torch.cuda.get_device_capability() == (9, 0):
        huge = torch.zeros(65537, 256, dtype=torch.float16, device=DEV)
        with pytest.raises(RuntimeError, match="at most 65536"):
            mod.gemm_w4_batch(huge, layer["qweight"], layer["qzeros"], layer["scales"], None, 0, 0, 3)
        with pytest.raises(RuntimeError, match="no kernel"):  # the pairs (6) take x as it lies only
            mod.gemm_w4_batch(x, layer["qweight"], layer["qzeros"], layer["scales"], None, 0, 6, 3)
        with pytest.raises(RuntimeError, match="no kernel"):  # variants are 1..7
            mod.gemm_w4_batch(x, layer["qweight"], layer["qzeros"], layer["scales"], None, 0, 8, 3)
        with pytest.raises(RuntimeError, match="no kernel"):  # x as it lies: one scale a 128-k block
            mod.gemm_w4_batch(x, layer["qweight"], layer["qzeros"], layer["scales"], None, 0, 0, 3, False, 2)
    with pytest.raises(RuntimeError, match="order must be"):
        mod.gemm_w4_batch(x, layer["qweight"], layer["qzeros"], layer["scales"], None, 0, 0, 3, False, 3)
    with pytest.raises(RuntimeError, match="no kernel"):  # the mma.sync kernel has one order
        mod.gemm_w4_batch(x[:20].contiguous(), layer["qweight"], layer["qzeros"], layer["scales"], None, 0, 0, 1, False,
                          1)
    odd = off_by_one_element(layer["scales"])
    with pytest.raises(RuntimeError, match="16-byte aligned"):
        mod.gemm_w4_batch(x[:20].contiguous(), layer["qweight"], layer["qzeros"], odd, None, 0, 0)
