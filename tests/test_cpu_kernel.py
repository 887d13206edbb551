"""w4's CPU dequantization kernel (kernels/cpu/dequant_w4_cpu.cpp) gives the reference's bits: every
packed layout, the full 32-bit range of words, group sizes from 3 to K, K and N tails around the
kernel's tiles, zero points 0 and 15, scales over the whole 16-bit range (subnormal, negative,
overflowing products, bf16 rounding ties), its AVX2 and scalar lookups, on 1, 2 and all threads;
and where it cannot be built, `w4 dequantize` says so in one line and writes the same bits.

The kernel is built here (the first test pays about 30 s): a machine with a C++ compiler, Python's
headers and ninja, as CI is, must run it, so a failed build fails these tests instead of skipping.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.awq_builder import small_model
from w4cli.cpu import kernel
from w4cli.read.ct_config import WeightArgs
from w4cli.formats import awq_gemm, compressed_tensors, gptq, reference
from w4cli.formats.packed import AWQ, K_IN_COLUMNS, K_IN_ROWS, PackedLinear

OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SCALE_DTYPES = (torch.float16, torch.bfloat16)
# words that put every nibble value in every position, the sign bit and its neighbours
SPECIAL_WORDS = (0, -1, -(2**31), 2**31 - 1, 0x01234567, 0x76543210, 0x89ABCDEF - 2**32, 0xFEDCBA98 - 2**32)


def words(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """int32 over the full 32-bit range, the special words first."""
    flat = torch.randint(-(2**31), 2**31, (int(torch.tensor(shape).prod()),), generator=gen, dtype=torch.int64)
    count = min(len(SPECIAL_WORDS), flat.numel())
    flat[:count] = torch.tensor(SPECIAL_WORDS[:count])
    return flat.to(torch.int32).view(shape)


def scales(n: int, groups: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """[N, groups] of random 16-bit patterns (any sign and exponent, subnormals included) that are
    finite and non-zero, as w4 accepts them, with chosen values first: the smallest and largest
    subnormals, the largest finite value (products overflow), negative ones (signed zeros when
    q = z), and 1 + 2^-8 and 1 + 3 * 2^-8 (ties when rounded to bf16)."""
    bits = torch.randint(0, 2**16, (n * groups,), generator=gen, dtype=torch.int32).to(torch.int16)
    values = bits.view(dtype).to(torch.float32)
    info = torch.finfo(dtype)
    chosen = torch.tensor([info.smallest_normal / 2 ** (info.bits - 6 if dtype == torch.float16 else 7), -info.tiny,
                           info.tiny * (1 - info.eps), info.max, -info.max, 1 + 2**-8, 1 + 3 * 2**-8, -0.75, 2**-20])
    good = torch.isfinite(values) & (values != 0)
    values = torch.where(good, values, torch.ones_like(values))
    count = min(len(chosen), values.numel())
    values[:count] = chosen[:count]
    return values.to(dtype).view(n, groups)


def zeros(n: int, groups: int, gen: torch.Generator) -> torch.Tensor:
    """[N, groups] uint8 0..15, row 0 all 0 and row 1 all 15."""
    z = torch.randint(0, 16, (n, groups), generator=gen, dtype=torch.int64).to(torch.uint8)
    z[0] = 0
    if n > 1:
        z[1] = 15
    return z


def packed(layout: int, n: int, k: int, group: int, scale_dtype: torch.dtype, act_order: bool = False, seed: int = 0) -> PackedLinear:
    gen = torch.Generator().manual_seed(seed)
    groups = k // group
    shape = {AWQ: (k, n // 8), K_IN_COLUMNS: (k // 8, n), K_IN_ROWS: (n, -(-k // 8))}[layout]
    g_idx = torch.randperm(k, generator=gen) % groups if act_order else None
    return PackedLinear(words(shape, gen), layout, (n, k), zeros(n, groups, gen), scales(n, groups, scale_dtype, gen), g_idx)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    raw = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(raw), b.view(raw))


# (layout, N, K, G, act-order): tiles are 64 rows x 512 k, AVX2 lookups 32 k at a time
CASES = [
    (AWQ, 8, 8, 8, False),  # the smallest layer
    (AWQ, 72, 1032, 8, False),  # a row tail of 8, a k tail of 8 after two tiles, 129 groups
    (AWQ, 136, 96, 32, False),
    (AWQ, 64, 520, 520, False),  # one group across the tile edge
    (AWQ, 16, 100, 20, False),  # K not a multiple of 8: the last 4 rows of words take the scalar unpacking
    (K_IN_COLUMNS, 13, 1040, 16, False),  # GPTQ, N not a multiple of 8
    (K_IN_COLUMNS, 130, 520, 520, False),
    (K_IN_COLUMNS, 13, 96, 32, True),  # act-order
    (K_IN_ROWS, 5, 84, 12, False),  # compressed-tensors, K not a multiple of 8 (padding nibbles)
    (K_IN_ROWS, 67, 1001, 7, False),  # odd groups that straddle every tile and AVX2 step
    (K_IN_ROWS, 3, 3, 3, False),
    (K_IN_ROWS, 70, 600, 40, True),
]


@pytest.mark.parametrize("layout, n, k, group, act_order", CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}-g{c[3]}{'-act' if c[4] else ''}" for c in CASES])
@pytest.mark.parametrize("scale_dtype", SCALE_DTYPES, ids=["fp16-scales", "bf16-scales"])
def test_the_kernel_gives_the_reference_bits(layout, n, k, group, act_order, scale_dtype):
    layer = packed(layout, n, k, group, scale_dtype, act_order)
    for dtype in OUT_DTYPES:
        expected = kernel.reference(layer, dtype)
        for simd in (True, False):
            assert same_bits(kernel.dequantize(layer, dtype, simd), expected), f"{dtype}, simd={simd}"


def test_the_same_bits_on_one_two_and_all_threads():
    layer = packed(K_IN_COLUMNS, 200, 1536, 128, torch.float16, seed=3)
    awq = packed(AWQ, 200, 1536, 64, torch.bfloat16, seed=4)
    expected = {(id(x), d): kernel.reference(x, d) for x in (layer, awq) for d in (torch.float16, torch.bfloat16)}
    before = torch.get_num_threads()
    try:
        for threads in sorted({1, 2, len(os.sched_getaffinity(0))}):
            torch.set_num_threads(threads)
            for (key, dtype), want in expected.items():
                x = layer if key == id(layer) else awq
                assert same_bits(kernel.dequantize(x, dtype), want), f"{threads} threads, {dtype}"
    finally:
        torch.set_num_threads(before)


def test_each_format_through_its_own_entry_gives_its_reference():
    """From the checkpoint's own tensors (v1 and v2 zero points, symmetric groups, act-order): each
    format's packed_linear, then the kernel against the reference."""
    gen = torch.Generator().manual_seed(5)
    k, n, g = 256, 48, 64
    s16 = scales(k // g, n, torch.float16, gen)
    qweight, qzeros = words((k, n // 8), gen), words((k // g, n // 8), gen)
    assert same_bits(kernel.dequantize(awq_gemm.packed_linear(qweight, qzeros, s16), torch.float16),
                     awq_gemm.dequantize(qweight, qzeros, s16, torch.float16))
    g_idx = (torch.randperm(k, generator=gen) % (k // g)).to(torch.int32)
    for v1 in (True, False):
        for idx in (None, g_idx):
            args = (words((k // 8, n), gen), words((k // g, n // 8), gen), s16, idx, g, v1)
            want = reference.dequantize(gptq.packed_linear(*args), torch.bfloat16)
            assert same_bits(kernel.dequantize(gptq.packed_linear(*args), torch.bfloat16), want)
    for symmetric in (True, False):
        wargs = WeightArgs(symmetric=symmetric, strategy="group", group_size=g)
        point = None if symmetric else words((n // 8, k // g), gen)
        args = (words((n, k // 8), gen), scales(n, k // g, torch.bfloat16, gen), point, None, (n, k), wargs)
        want = reference.dequantize(compressed_tensors.packed_linear(*args), torch.bfloat16)
        assert same_bits(kernel.dequantize(compressed_tensors.packed_linear(*args), torch.bfloat16), want)


def test_bad_tensors_are_refused_with_one_readable_line():
    layer = packed(AWQ, 16, 64, 32, torch.float16)
    wrong = PackedLinear(layer.words[:, :1].contiguous(), AWQ, layer.shape, layer.zeros, layer.scales)
    with pytest.raises(RuntimeError, match=r"words must be a contiguous CPU Int \[64, 2\], got Int \[64, 1\]"):
        kernel.dequantize(wrong, torch.float16)


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "w4cli", "dequantize", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=600)


def test_without_a_compiler_dequantize_says_so_once_and_writes_the_same_bits(tmp_path, w4):
    """The fallback, forced for real: a compiler that fails and an empty kernel cache."""
    src = small_model().write(tmp_path / "src")
    fast = w4("dequantize", src, tmp_path / "fast", "--device", "cpu")
    assert fast.exit_code == 0, fast.stderr
    slow = run_cli(str(src), str(tmp_path / "slow"), "--device", "cpu", "--json", "-",
                   env={"CXX": "/bin/false", "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert slow.returncode == 0, slow.stderr
    notes = [line for line in slow.stderr.splitlines() if "CPU kernel" in line]
    assert len(notes) == 1, slow.stderr
    assert "building w4's CPU kernel failed" in notes[0] and "torch reference" in notes[0]
    assert json.loads(slow.stdout)["device"] == "cpu"
    fast_tensors, slow_tensors = load_file(tmp_path / "fast" / "model.safetensors"), load_file(tmp_path / "slow" / "model.safetensors")
    assert fast_tensors.keys() == slow_tensors.keys()
    for name, value in fast_tensors.items():
        assert torch.equal(value.view(torch.uint8), slow_tensors[name].view(torch.uint8)), name
    assert "CPU kernel" not in fast.stderr


def test_threads_option(tmp_path, w4):
    src = small_model().write(tmp_path / "src")
    before = torch.get_num_threads()
    try:
        one = w4("dequantize", src, tmp_path / "one", "--device", "cpu", "--threads", "1", "--json", "-")
        every = w4("dequantize", src, tmp_path / "every", "--device", "cpu", "--json", "-")
    finally:
        torch.set_num_threads(before)
    assert one.exit_code == 0 and every.exit_code == 0, one.stderr + every.stderr
    assert json.loads(one.stdout)["threads"] == 1
    assert json.loads(every.stdout)["threads"] == len(os.sched_getaffinity(0))
    a, b = (load_file(tmp_path / d / "model.safetensors") for d in ("one", "every"))
    assert a.keys() == b.keys() and all(torch.equal(a[name].view(torch.uint8), b[name].view(torch.uint8)) for name in a)
    refused = w4("dequantize", src, tmp_path / "zero", "--threads", "0")
    assert refused.exit_code == 2 and "--threads" in refused.stderr
