"""`w4 verify MODEL`: one quantized checkpoint (AWQ gemm, GPTQ, compressed-tensors or w4-gemv),
checked alone.

Not a quantized checkpoint w4 reads at all (no quantization_config, GPTQ, 8-bit...) is refused
(exit 4). Everything else becomes rows: files and index, tensors and shapes, scales, plain
tensors, nibbles, and on a GPU every layer through the dequantize kernel (bit-exact with the CPU
reference) and the GEMV kernel (repacked in memory for other layouts; inside w4cli/gpu/checks.py's
bound at every M of contract.CHECKED_BATCHES). Layers with no AWQ form (a permuting g_idx) are named, not run, on the GPU. Tensors are read one layer at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from w4cli.gpu.checks import Mismatch, gemv_errors, require_identical
from w4cli.read.checkpoint import CONFIG, Checkpoint, open_checkpoint
from w4cli.gpu.contract import CHECKED_BATCHES, checked_batches_text
from w4cli.dequantize import awq_tensors, cpu_dequantizer
from w4cli.errors import InputRefused
from w4cli.formats import w4_gemv
from w4cli.read.layers import QuantModel, check_group_maps, check_padding, check_scales, check_unquantized, check_zero_points, find_layers
from w4cli.read.quant_config import COMPRESSED_TENSORS, GPTQ, W4_GEMV, QuantScheme, read_scheme
from w4cli.read.safe_files import read_json
from w4cli.repack import w4_gemv_layer
from w4cli.verify.environment import Gpu
from w4cli.console import steps
from w4cli.verify.report import Report, run_check, skip

GROUP = "integrity"


def open_scheme(root: Path) -> QuantScheme:
    """The quantization the checkpoint declares; InputRefused (exit 4) if it is not one w4 reads."""
    return read_scheme(root, read_json(root / CONFIG))


def _files(root: Path, found: dict) -> Callable[[], str]:
    def body() -> str:
        checkpoint = open_checkpoint(root)
        found["checkpoint"] = checkpoint
        index = "index consistent" if checkpoint.sharded else "single file"
        return f"{len(checkpoint.tensors)} tensors in {len(checkpoint.weight_files)} safetensors files ({index})"

    return body


def _tensors(checkpoint: Checkpoint, scheme: QuantScheme, found: dict) -> Callable[[], str]:
    def body() -> str:
        model = find_layers(checkpoint, scheme)
        found["model"] = model
        if scheme.layout == COMPRESSED_TENSORS:
            g = "its config group's strategy and group size"
        else:
            g = "one group" if scheme.group_size == -1 else f"group_size {scheme.group_size}"
        return (f"{len(model.layers)} {scheme.layout} linears, {len(model.plain)} plain tensors, "
                f"{len(model.act_scales)} activation scales; every shape agrees with {g}; no stray tensors")

    return body


def _scales(model: QuantModel) -> Callable[[], str]:
    return lambda: f"{check_scales(model)} scale tensors finite and non-zero"


def _plain(model: QuantModel) -> Callable[[], str]:
    return lambda: f"{check_unquantized(model)} unquantized float tensors finite"


def _nibbles(model: QuantModel) -> Callable[[], str]:
    def body() -> str:
        layout = model.scheme.layout
        if layout == W4_GEMV:
            return f"w4-gemv padding codes (k >= K) are all 0 ({check_padding(model)} layers padded); meta agrees with every shape"
        words = "every 4-bit pattern is a code 0..15; words are int32 of the right shape"
        if layout == GPTQ:
            maps, zeros = check_group_maps(model), check_zero_points(model)
            sym = f"; sym: every zero point 8 in {zeros} layers" if zeros else ""
            return f"GPTQ: {words}; {maps} g_idx valid group maps{sym}"
        if layout == COMPRESSED_TENSORS:
            return f"compressed-tensors: {words}; {check_group_maps(model)} weight_g_idx valid group maps"
        return f"AWQ gemm: {words}"

    return body


def _layer_inputs(model: QuantModel, layer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The layer in the AWQ layout the kernels take; InputRefused if it has none."""
    return awq_tensors(model.scheme, layer, model.checkpoint.read(*layer.tensor_names))


def _gpu_dequantize(model: QuantModel, gpu: Gpu, advance) -> Callable[[], str]:
    def body() -> str:
        failures, skipped = [], []
        for layer in model.layers.values():
            try:
                qw, qz, s = _layer_inputs(model, layer)
            except InputRefused as exc:
                skipped.append(str(exc))
                advance(f"dequantize {layer.prefix}")
                continue
            ref = cpu_dequantizer(qw, qz, s, torch.float16)
            out = gpu.kernels.dequantize_awq(qw.cuda(), qz.cuda(), s.cuda(), dtype=torch.float16, transpose=True)
            try:
                require_identical(out, ref, layer.prefix, "kernel", "reference")
            except Mismatch as exc:
                failures.append(str(exc))
            advance(f"dequantize {layer.prefix}")
        if failures:
            raise Mismatch(f"{len(failures)} of {len(model.layers)} layers differ; {failures[0]}")
        note = f"; {len(skipped)} layers dequantized on the CPU only, first {skipped[0]}" if skipped else ""
        return f"{len(model.layers) - len(skipped)} layers bit-identical (fp16){note}"

    return body


def _gpu_gemv(model: QuantModel, gpu: Gpu, seed: int, advance) -> Callable[[], str]:
    def body() -> str:
        failures, skipped, worst = [], [], 0.0
        for i, layer in enumerate(model.layers.values()):
            try:
                w4 = w4_gemv_layer(model, layer, model.checkpoint.read(*layer.tensor_names))
            except InputRefused as exc:  # bf16 scales, or a shape the GEMV kernel does not take
                skipped.append(f"{layer.prefix} ({exc})")
                advance(f"gemv {layer.prefix}")
                continue
            glayer = {k: v.cuda() for k, v in w4.items()}
            w16 = w4_gemv.dequantize(**glayer, dtype=torch.float16)
            gen = torch.Generator().manual_seed(seed * 1_000_003 + i)
            x = torch.randn(max(CHECKED_BATCHES), layer.in_features, generator=gen).half().cuda()
            try:
                for m in CHECKED_BATCHES:
                    xm = x[:m].contiguous()
                    try:
                        worst = max(worst, gemv_errors(gpu.kernels.gemv(xm, **glayer), xm, w16).require().worst_over_bound)
                    except Mismatch as exc:
                        raise Mismatch(f"{layer.prefix} M={m}: {exc}") from None
            except Mismatch as exc:
                failures.append(str(exc))
            advance(f"gemv {layer.prefix}")
        if failures:
            raise Mismatch(f"{len(failures)} of {len(model.layers)} layers outside the bound; {failures[0]}")
        checked = len(model.layers) - len(skipped)
        if checked == 0:
            raise Mismatch(f"no layer could run through the GEMV kernel: {skipped[0]}")
        note = f"; {len(skipped)} layers not GEMV-able, first {skipped[0]}" if skipped else ""
        return f"{checked} layers within bound at M={checked_batches_text()} (worst err/bound {worst:.3f}){note}"

    return body


COMPARED = {
    "files and index": "safetensors headers, index weight_map, shard set",
    "tensors and shapes": "every linear's tensors present; shapes/dtypes vs each other and quantization_config",
    "scales": "every scale (and activation scale) finite and non-zero",
    "plain tensors": "every unquantized float tensor finite",
    "nibbles": "packed codes legal (w4-gemv: padding beyond K is 0; GPTQ, compressed-tensors: g_idx group maps, GPTQ sym zero points)",
    "gpu dequantize": "kernels.dequantize_awq vs CPU reference, every layer, fp16; raw bits",
    "gpu gemv": f"kernels.gemv (other layouts repacked in memory) vs float64 reference, every layer, M={checked_batches_text()} (every kernel path), bound",
}


def run(report: Report, root: Path, gpu: Gpu, seed: int, require_gpu: bool) -> None:
    scheme = open_scheme(root)  # InputRefused here: not a quantized checkpoint w4 reads (exit 4)
    found: dict = {}

    def check(name: str, body: Callable[[], str]) -> bool:
        return run_check(report, name, COMPARED[name], body, GROUP).status == "PASS"

    if not check("files and index", _files(root, found)):
        return
    if not check("tensors and shapes", _tensors(found["checkpoint"], scheme, found)):
        return
    model: QuantModel = found["model"]
    check("scales", _scales(model))
    check("plain tensors", _plain(model))
    check("nibbles", _nibbles(model))
    if not gpu.usable:
        for name in ("gpu dequantize", "gpu gemv"):
            skip(report, name, COMPARED[name], gpu.reason, GROUP, require_gpu)
        return
    with steps("w4 verify: layers on the GPU", 2 * len(model.layers)) as advance:
        run_check(report, "gpu dequantize", COMPARED["gpu dequantize"], _gpu_dequantize(model, gpu, advance), GROUP, True)
        run_check(report, "gpu gemv", COMPARED["gpu gemv"], _gpu_gemv(model, gpu, seed, advance), GROUP, True)
