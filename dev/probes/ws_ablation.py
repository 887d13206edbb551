"""Where the warp-specialised kernel's time goes: the same kernel built with one part taken out at a
time, timed on the bench's harness (lab only: the ablated kernels compute wrong results, so no
output is checked here). Each measurement's wall-clock window is printed, so that a power log
(nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm -lms 100) can be matched to it.

    PYTHONPATH=. python3 dev/probes/ws_ablation.py [--shapes 8192x28672] [--m 1024,4096] [--variants 3,5]
        [--splits 0] [--kernel 3] [--builds base,noscale,...] [--reps 1]

Builds (each from a patched copy of kernels/ in /tmp/w4_ablation/<name>; `shipped` is w4's own
build, the one the tests ran, with no second compile):
    base       the kernel as shipped
    noscale    no per-weight scale multiply (the natural k order's, which 128-token tiles and more
               take)
    noconvert  no conversion at all in that order: the packed words go to the tensor cores as they
               are
    nodata     the persistent launch's producer copies only the first stages, then completes each
               stage's barriers with no bytes (the MMA warps never wait for data)
    nodata_split  the same for split-K launches' producer
    mma_only   noconvert and nodata together: the wgmma stream and its barriers alone
    nosz       no scale and zero copies (cp.async) after the first stages
    nomma      the MMA warps wait for each stage and release it with no conversion and no wgmma:
               the ring inside the kernel, fed by its own producer (dev/probes/tma_rate.cu feeds it
               from a bare one)
    nox        no activation copies after the first stages
    now        no weight copies after the first stages
    noreduce   split-K: the partial tiles left in shared memory and the cluster's barriers passed,
               but nothing added or written (the warp-specialised kernel only)
    nostore    no output stores (the warp-specialised kernel without split-K): the epilogue's cost
    nomc       the pairs (variant 6) without multicast: each block copies its own x atoms whole
    solo       nomc, and each block's stages released on its own barriers only: the pairs uncoupled
    v2words    the natural k order converting as the permuted one does (each lane its own 16-byte
               chunk of a row once a stage, whole words: 1 shift, 4 lop3, 2 sub, 2 fma, 4 mul), x as
               it lies: the instruction stream a repacked layout in the mma fragments' order would
               give that order (the words are the version 1 layout's, so the results are wrong)
    v2words_nodata  v2words with no data after the first stages, persistent and split launches alike
    v2words_nox, v2words_now  v2words with no activation copies, or no weight copies, after the first
               stages (both launches): which of the data binds once the conversion is by whole words
"""

from __future__ import annotations

import argparse
import shutil
import textwrap
import time
from pathlib import Path

import torch

from w4cli.gpu import kernels, timing
from w4cli.bench import cases

KERNEL = "gemm_w4a16_wgmma.cu"

# the natural k order's conversion (launches of 128-token tiles and more; the permuted order's is
# left as it is)
CONVERT = """        for (int j = 0; j < 4; ++j) {  // per weight: q - z (kPost), or (q - z) * s rounded once, the W16
          const uint32_t dl = u4_pair_minus_zero_f16x2(wl[j], pair_shift, zlo[i].biased[0]);
          const uint32_t dh = u4_pair_minus_zero_f16x2(wh[j], pair_shift, zhi[i].biased[0]);
          af[i][2 * j] = kPost ? dl : mul_f16x2(dl, slo[i]);
          af[i][2 * j + 1] = kPost ? dh : mul_f16x2(dh, shi[i]);
        }"""
NOSCALE = """        for (int j = 0; j < 4; ++j) {
          af[i][2 * j] = u4_pair_minus_zero_f16x2(wl[j], pair_shift, zlo[i].biased[0]);
          af[i][2 * j + 1] = u4_pair_minus_zero_f16x2(wh[j], pair_shift, zhi[i].biased[0]);
        }"""
NOCONVERT = """        for (int j = 0; j < 4; ++j) {
          af[i][2 * j] = wl[j] + slo[i] + zlo[i].biased[0];
          af[i][2 * j + 1] = wh[j] + shi[i] + zhi[i].biased[0];
        }"""
# the persistent producer's ring step (nodata leaves split launches' own producer as it is)
LOOP = """      if (i >= S::kStages) mbar_wait(b.empty_a + 8 * s, parity);
      if (i > 0) ws_copy_constants<S, kBulk>(a, wmap, smem0, b, i, seg.cb, kb, atom, wpolicy, lane);
      if (lane == 0) copy_x(st + S::kXOff, x, kb * 128, m0, b.full_a + 8 * s);
      if (i >= S::kStages) mbar_wait(b.empty_b + 8 * s, parity);
      if (lane == 0) {
        mbar_arrive_expect_tx(b.full_b + 8 * s, atom);
        copy_x(st + S::kXOff + kAtom, x, kb * 128 + 64, m0, b.full_b + 8 * s);
      }"""
# a stage past the first ring completed with no bytes (the producer's arrivals alone), at the
# indentation of the loop it replaces: the persistent producer's or the split one's
def no_bytes(indent: int) -> str:
    return textwrap.indent("""if (i >= S::kStages) {
  mbar_wait(b.empty_a + 8 * s, parity);
  if (lane == 0) mbar_arrive_expect_tx(b.full_a + 8 * s, 0);
  mbar_arrive(b.full_a + 8 * s);  // (the 32 lanes' cp.async arrivals, now plain ones)
  mbar_wait(b.empty_b + 8 * s, parity);
  if (lane == 0) mbar_arrive_expect_tx(b.full_b + 8 * s, 0);
  continue;
}
""", " " * indent)


NODATA = no_bytes(6) + """      if (i > 0) ws_copy_constants<S, kBulk>(a, wmap, smem0, b, i, seg.cb, kb, atom, wpolicy, lane);
      if (lane == 0) copy_x(st + S::kXOff, x, kb * 128, m0, b.full_a + 8 * s);
      if (lane == 0) {
        mbar_arrive_expect_tx(b.full_b + 8 * s, atom);
        copy_x(st + S::kXOff + kAtom, x, kb * 128 + 64, m0, b.full_b + 8 * s);
      }"""

SPLIT_LOOP = """    if (i >= S::kStages) mbar_wait(b.empty_a + 8 * s, parity);
    if (i > 0) ws_copy_constants<S, kBulk>(a, wmap, smem0, b, i, cb, kb0 + i, atom, wpolicy, lane);
    if (lane == 0) tensor_copy_2d_g2s(st + S::kXOff, x, k0, m0, b.full_a + 8 * s, xpolicy);
    if (i >= S::kStages) mbar_wait(b.empty_b + 8 * s, parity);"""
NODATA_SPLIT = no_bytes(4) + """    if (i > 0) ws_copy_constants<S, kBulk>(a, wmap, smem0, b, i, cb, kb0 + i, atom, wpolicy, lane);
    if (lane == 0) tensor_copy_2d_g2s(st + S::kXOff, x, k0, m0, b.full_a + 8 * s, xpolicy);"""

SZ_LOOP = """    if (slot < a.run_slots) {
      const int n0 = cb * S::kRows + 8 * c;"""
NOSZ = """    if (slot < a.run_slots && i < S::kStages) {
      const int n0 = cb * S::kRows + 8 * c;"""
XA = """    mbar_arrive_expect_tx(full, atom + kTiles8 * 512);"""
NOXA = """    mbar_arrive_expect_tx(full, (i < S::kStages ? atom : 0) + kTiles8 * 512);"""
XA3 = """tensor_copy_2d_g2s(st + S::kXOff, x,"""
NOXA3 = """if (i < S::kStages) tensor_copy_2d_g2s(st + S::kXOff, x,"""
XB = """mbar_arrive_expect_tx(b.full_b + 8 * s, atom);"""
NOXB = """mbar_arrive_expect_tx(b.full_b + 8 * s, i < S::kStages ? atom : 0);"""
XB2 = """tensor_copy_2d_g2s(st + S::kXOff + kAtom,"""
NOXB2 = """if (i < S::kStages) tensor_copy_2d_g2s(st + S::kXOff + kAtom,"""
XP = """if (lane == 0) copy_x(st + S::kXOff,"""  # the persistent producer's
NOXP = """if (lane == 0 && i < S::kStages) copy_x(st + S::kXOff,"""
XP2 = """copy_x(st + S::kXOff + kAtom,"""
NOXP2 = """if (i < S::kStages) copy_x(st + S::kXOff + kAtom,"""
W = """    mbar_arrive_expect_tx(full, atom + kTiles8 * 512);
    tensor_copy_4d_g2s("""
NOW = """    mbar_arrive_expect_tx(full, atom + (i < S::kStages ? kTiles8 * 512 : 0));
    if (i < S::kStages) tensor_copy_4d_g2s("""
SPLIT = """      reduce_split_cluster_of<MT, S::kRows, S::kMmaThreads>(a, smem0, blockIdx.y, blockIdx.z * MT,
                                                            blockIdx.x * S::kRows);
"""
NOREDUCE = ""
STORE = """        store_result_tile<MT, S::kRows, NT, kPasses, kThreads>("""
NOSTORE = """        if (acc[0][0][0] == 1234567.f) store_result_tile<MT, S::kRows, NT, kPasses, kThreads>("""

# the pairs (variant 6): each block copying its whole x atoms itself, no multicast (the stages still
# released on both blocks' barriers); and that with each block's barriers its own alone (no coupling)
MC = """tensor_copy_2d_g2s_multicast<0x3>(dst + rank * (kAtom / 2), x, k0, m0 + rank * (S::kTokens / 2), bar);"""
NOMC = """(void)rank;
      tensor_copy_2d_g2s(dst, x, k0, m0, bar, xpolicy);
      tensor_copy_2d_g2s(dst + kAtom / 2, x, k0, m0 + S::kTokens / 2, bar, xpolicy);"""
PAIR_RELEASE = """    if (lane == 0) mbar_arrive_remote(bar, cluster_rank() ^ 1);"""
OWN_RELEASE = ""
PAIR_COUNT = "S::kMmaThreads + (kPair ? kMmaWarps : 0)"
OWN_COUNT = "S::kMmaThreads"

# the MMA warps' loop with no work: each waits for a stage and releases its parts where wgmma_stage
# would, so the ring runs at what the producer and the copies give it inside the real kernel
STAGE = """      wgmma_stage<S, NT, kNatural, false, kPair>(smem + off, smem0 + off, warp >> 2, warp & 3, lane, slot, acc,
                                          kb > seg.kb_lo ? b.empty_b + 8 * ((i - 1) % S::kStages) : 0u,
                                          kSplit || kb + 1 < seg.kb_hi ? b.empty_a + 8 * s : 0u);"""
NOSTAGE = """      (void)off;
      if (kb > seg.kb_lo) release_stage<kPair>(b.empty_b + 8 * ((i - 1) % S::kStages), lane);
      if (kSplit || kb + 1 < seg.kb_hi) release_stage<kPair>(b.empty_a + 8 * s, lane);"""

V2_LOAD = "  load_chunks(kNatural ? 0 : lane & 3);"
V2_LOAD_NEW = "  load_chunks(lane & 3);"
V2_CONVERT = "      if constexpr (kNatural) {"
V2_CONVERT_NEW = "      if constexpr (false) {"
V2_NEXT = "    if (kNatural && c < 3) load_chunks(c + 1);"
V2_NEXT_NEW = ""

NOX = [(KERNEL, XA, NOXA), (KERNEL, XA3, NOXA3), (KERNEL, XB, NOXB), (KERNEL, XB2, NOXB2), (KERNEL, XP, NOXP),
       (KERNEL, XP2, NOXP2)]
V2WORDS = [(KERNEL, V2_LOAD, V2_LOAD_NEW), (KERNEL, V2_CONVERT, V2_CONVERT_NEW), (KERNEL, V2_NEXT, V2_NEXT_NEW)]

BUILDS = {  # name: [(file, old, new)]
    "base": [],
    "noscale": [(KERNEL, CONVERT, NOSCALE)],
    "noconvert": [(KERNEL, CONVERT, NOCONVERT)],
    "nodata": [(KERNEL, LOOP, NODATA)],
    "nodata_split": [(KERNEL, SPLIT_LOOP, NODATA_SPLIT)],
    "mma_only": [(KERNEL, CONVERT, NOCONVERT), (KERNEL, LOOP, NODATA)],
    "nosz": [(KERNEL, SZ_LOOP, NOSZ)],
    "nomma": [(KERNEL, STAGE, NOSTAGE)],
    "nox": NOX,
    "now": [(KERNEL, W, NOW)],
    "noreduce": [(KERNEL, SPLIT, NOREDUCE)],
    "nostore": [(KERNEL, STORE, NOSTORE)],
    "nomc": [(KERNEL, MC, NOMC)],
    "v2words": V2WORDS,
    "v2words_nodata": [*V2WORDS, (KERNEL, LOOP, NODATA), (KERNEL, SPLIT_LOOP, NODATA_SPLIT)],
    "v2words_nox": [*V2WORDS, *NOX],
    "v2words_now": [*V2WORDS, (KERNEL, W, NOW)],
    "solo": [(KERNEL, MC, NOMC), (KERNEL, PAIR_RELEASE, OWN_RELEASE), (KERNEL, PAIR_COUNT, OWN_COUNT)],
}


def build_tree(name: str, src: Path, patches: list[tuple[str, str, str]] = ()):
    """A copy of the kernel tree `src` in /tmp/w4_ablation/<name>, patched, JIT-built for sm_90a."""
    from torch.utils import cpp_extension

    root = Path("/tmp/w4_ablation") / name
    tree, staged = root / "kernels", root / "kernels.staged"
    if staged.exists():
        shutil.rmtree(staged)
    shutil.copytree(src, staged)
    for file, old, new in patches:  # every occurrence (the split and persistent producer loops share lines)
        text = (staged / file).read_text()
        assert text.count(old) >= 1, f"{name}: patch target not found in {file}"
        (staged / file).write_text(text.replace(old, new))
    # a tree built before from the same files is kept as it is, so that its build is not redone
    # (the patched files would be newer than their objects)
    def files(d: Path) -> dict:
        return {f.relative_to(d): f.read_bytes() for f in d.rglob("*") if f.is_file()}
    if tree.exists() and files(tree) == files(staged):
        shutil.rmtree(staged)
    else:
        if tree.exists():
            shutil.rmtree(tree)
        staged.rename(tree)
    arch = "90a"
    return cpp_extension.load(
        name=f"w4_ablation_{name}",
        sources=[str(p) for p in kernels.build_sources(tree)],
        build_directory=str(root),
        extra_cflags=["-O3"],
        extra_cuda_cflags=["-O3", f"-gencode=arch=compute_{arch},code=sm_{arch}", "-lineinfo"],
        extra_include_paths=[str(tree)],
        verbose=False,
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8192x28672")
    ap.add_argument("--m", default="1024,4096")
    ap.add_argument("--variants", default="3,5")
    ap.add_argument("--builds", default=",".join(BUILDS))
    ap.add_argument("--splits", default="0", help="split-K counts to run (0 = the planner's)")
    ap.add_argument("--reps", type=int, default=1, help="times through the variants, one after another")
    ap.add_argument("--kernel", type=int, default=3, help="3 = warp-specialised (--variants), 2 = the barrier wgmma kernel (--variants = its tiles)")
    args = ap.parse_args()
    mods = {}
    for name in args.builds.split(","):
        t = time.time()
        mods[name] = kernels.load() if name == "shipped" else build_tree(name, kernels.KERNEL_DIR, BUILDS[name])
        print(f"built {name} in {time.time() - t:.0f}s", flush=True)
    print(f"{torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        layer = cases.Layer(k, n, 128, seed=1)
        for m in (int(v) for v in args.m.split(",")):
            flops = 2 * m * k * n
            for variant in [int(v) for v in args.variants.split(",")] * args.reps:  # (alternating)
                for splits in (int(v) for v in args.splits.split(",")):
                    row = []
                    for name, mod in mods.items():
                        def run(x, qw, qz, s, mod=mod, variant=variant, splits=splits):
                            return mod.gemm_w4_batch(x, qw, qz, s, None, splits, variant, args.kernel)
                        began = time.time()
                        t = timing.measure(run, lambda i: (layer.x(m, i), *layer.gemv(i)), 0, lambda out, a: True,
                                           name=f"{name}")
                        row.append(f"{name} {t.median_us:.1f} us ({flops / t.median_us / 1e6:.0f} TFLOP/s)")
                        # wall-clock bounds, to match with a power log (nvidia-smi --query-gpu=timestamp,...)
                        print(f"  window {shape} M={m} v{variant} s{splits} {name}: {began:.2f} {time.time():.2f}",
                              flush=True)
                    print(f"{shape} M={m} kernel {args.kernel} variant {variant} splits {splits}: " + " | ".join(row),
                          flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
