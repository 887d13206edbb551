"""The dequantize step: every quantized linear (AWQ, GPTQ, compressed-tensors, w4-gemv) becomes
`<prefix>.weight` [N, K] = (q - z) * s, rounded once to the output dtype; activation scales are
folded into the linear they feed; everything else is cast and copied.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from w4cli import console
from w4cli.read.checkpoint import DTYPES as SAFETENSORS_DTYPES
from w4cli.read.checkpoint import FLOAT_CODES
from w4cli.gpu.contract import OUT_DTYPES, PACK
from w4cli.errors import EnvironmentUnavailable, InputRefused
from w4cli.formats import awq_gemm, compressed_tensors, gptq, w4_gemv
from w4cli.formats.unpacked import UnpackedLinear
from w4cli.read.layers import QuantLinear, QuantModel
from w4cli.read.quant_config import AWQ_GEMM, GPTQ, W4_GEMV, QuantScheme
from w4cli.write.writer import OutputTensor

DTYPES = {name: getattr(torch, name) for name in OUT_DTYPES}  # what --dtype names, as torch dtypes

# (qweight [K, N/8] int32, qzeros [K/G, N/8] int32, scales [K/G, N], dtype) -> [N, K] dtype on the CPU;
# dtype float32 must be the exact product (q - z) * s
AwqDequantizer = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.dtype], torch.Tensor]


@dataclass(frozen=True)
class Dequantizer:
    """Where linears are dequantized: "cpu" (the pure-torch reference) or "cuda" (w4's kernel,
    which takes the AWQ gemm layout)."""

    device: str
    awq: AwqDequantizer

    def unpacked(self, layer: UnpackedLinear, dtype: torch.dtype) -> torch.Tensor:
        """A GPTQ or compressed-tensors linear. The GPU takes it in the AWQ layout, the same weights
        losslessly; a permuting g_idx (act-order) or N not a multiple of 8 has no AWQ form, so those
        layers run on the CPU reference, bit-identical either way."""
        if self.device == "cpu" or layer.g_idx is not None or layer.shape[0] % PACK:
            return layer.dequantize(dtype)
        return self.awq(*awq_gemm.pack_linear(layer), dtype)


def cpu_dequantizer(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return awq_gemm.dequantize(qweight, qzeros, scales, dtype=dtype, transpose=True)


def _cuda_dequantizer(kernels) -> AwqDequantizer:
    # The output is 4x the input, so the copy back dominates: it goes through one pinned staging
    # buffer (a DMA at full PCIe/NVLink-C2C speed, where pageable memory is staged by the driver in
    # small pieces), grown to the largest layer and reused, then into ordinary memory. Pinned
    # output tensors would be faster still, but torch's pinned allocator rounds every block up to
    # a power of two and keeps it: up to twice the output in host memory that never shrinks.
    staging = torch.empty(0, dtype=torch.uint8, pin_memory=True)

    def run(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        nonlocal staging
        out = kernels.dequantize_awq(qweight.cuda(), qzeros.cuda(), scales.cuda(), dtype=dtype, transpose=True)
        if staging.numel() < out.nbytes:
            staging = torch.empty(out.nbytes, dtype=torch.uint8, pin_memory=True)
        pinned = staging[: out.nbytes].view(out.dtype).view(out.shape)
        pinned.copy_(out)
        return pinned.clone()

    return run


def reference() -> Dequantizer:
    """The CPU reference: deterministic, the oracle the kernel is checked against."""
    return Dequantizer("cpu", cpu_dequantizer)


def select_dequantizer(device: str) -> tuple[str, Dequantizer]:
    """The GPU kernel when asked for or when auto finds it usable; the CPU reference otherwise."""
    if device == "cpu":
        return "cpu", reference()
    from w4cli.gpu import kernels

    usable, reason = kernels.probe()
    if usable:
        return "cuda", Dequantizer("cuda", _cuda_dequantizer(kernels))
    if device == "cuda":
        raise EnvironmentUnavailable(reason)
    console.note(f"note: {reason}; dequantizing with the CPU reference (--device cpu silences this)")
    return "cpu", reference()


def fold_act_scales(weight: torch.Tensor, act_scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """W[n, k] / a[k], rounded once to dtype.

    The quotient is computed in float64 and rounded to the output dtype: float64 -> float32 (on the
    way to a 16-bit type) -> 16-bit is still a correct rounding, because double rounding is
    harmless when the wider format has at least 2p+2 bits (24 >= 2*11+2).
    """
    return (weight.to(torch.float64) / act_scales.to(torch.float64).view(1, -1)).to(dtype)


def unpack_layer(scheme: QuantScheme, layer: QuantLinear, t: dict[str, torch.Tensor]) -> UnpackedLinear:
    """A GPTQ or compressed-tensors linear's codes, zeros and scales, from its tensors `t`."""
    optional = {suffix: t.get(layer.tensor(suffix)) for suffix in layer.optional}
    if layer.layout == GPTQ:
        assert scheme.gptq is not None
        return gptq.unpack_linear(
            t[layer.qweight], t[layer.qzeros], t[layer.scales], optional.get("g_idx"), layer.group_size, scheme.gptq.v1
        )
    assert scheme.ct is not None
    return compressed_tensors.unpack_linear(
        t[layer.tensor("weight_packed")],
        t[layer.scales],
        optional.get("weight_zero_point"),
        optional.get("weight_g_idx"),
        (layer.out_features, layer.in_features),
        scheme.ct.weights_for(layer.prefix),
    )


def awq_tensors(scheme: QuantScheme, layer: QuantLinear, t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One linear's (qweight, qzeros, scales) in the AWQ gemm layout, whatever layout it is stored
    in: the kernels take that one layout, and every other layout converts to it losslessly
    (InputRefused for a layer that has no AWQ form: a permuting g_idx, N not a multiple of 8)."""
    if layer.layout == AWQ_GEMM:
        return t[layer.qweight], t[layer.qzeros], t[layer.scales]
    if layer.layout == W4_GEMV:
        awq = w4_gemv.to_awq(*(t[layer.tensor(suffix)] for suffix in w4_gemv.TENSOR_NAMES))
        return awq["qweight"], awq["qzeros"], awq["scales"]
    unpacked = unpack_layer(scheme, layer, t)
    if unpacked.g_idx is not None:
        raise InputRefused(f"{layer.prefix}: its g_idx permutes the groups (act-order), which the AWQ layout the kernels take cannot express")
    if layer.out_features % PACK:
        raise InputRefused(f"{layer.prefix}: out_features {layer.out_features} is not a multiple of {PACK}, which the AWQ layout the kernels take needs")
    return awq_gemm.pack_linear(unpacked)


def layer_weight(scheme: QuantScheme, layer: QuantLinear, t: dict[str, torch.Tensor], dtype: torch.dtype, dequantizer: Dequantizer) -> torch.Tensor:
    """[N, K] in dtype from one linear's tensors `t`, whatever its layout."""
    if layer.layout in (AWQ_GEMM, W4_GEMV):
        return dequantizer.awq(*awq_tensors(scheme, layer, t), dtype)
    return dequantizer.unpacked(unpack_layer(scheme, layer, t), dtype)


def _layer_tensor(model: QuantModel, layer: QuantLinear, dtype: torch.dtype, dequantizer: Dequantizer) -> OutputTensor:
    checkpoint = model.checkpoint
    act = model.act_scales.get(layer.weight)
    inputs = layer.tensor_names + ([act.name] if act else [])

    def produce() -> torch.Tensor:
        t = checkpoint.read(*inputs)
        if act is None:
            return layer_weight(model.scheme, layer, t, dtype, dequantizer)
        exact = layer_weight(model.scheme, layer, t, torch.float32, dequantizer)
        return fold_act_scales(exact, t[act.name], dtype)

    return OutputTensor(
        name=layer.weight,
        shape=(layer.out_features, layer.in_features),
        dtype=dtype,
        produce=produce,
        source_bytes=sum(checkpoint.tensors[n].nbytes for n in inputs),
    )


def _plain_tensor(model: QuantModel, name: str, dtype: torch.dtype) -> OutputTensor:
    checkpoint = model.checkpoint
    info = checkpoint.tensors[name]
    act = model.act_scales.get(name)
    is_float = info.dtype in FLOAT_CODES
    out_dtype = dtype if is_float else SAFETENSORS_DTYPES[info.dtype]
    inputs = [name] + ([act.name] if act else [])

    def produce() -> torch.Tensor:
        t = checkpoint.read(*inputs)
        if act is not None:
            return fold_act_scales(t[name], t[act.name], out_dtype)
        return t[name].to(out_dtype)

    return OutputTensor(name, info.shape, out_dtype, produce, sum(checkpoint.tensors[n].nbytes for n in inputs))


class _LastFused:
    """A fused linear's whole weight or bias (w4cli/formats/fuse.py), kept while its parts are written in a
    row, so it is read and dequantized once."""

    def __init__(self) -> None:
        self.name: str | None = None
        self.value: torch.Tensor | None = None

    def get(self, whole: OutputTensor) -> torch.Tensor:
        if self.name != whole.name:
            self.name, self.value = whole.name, None  # the old one freed before the new one is made
            self.value = whole.produce()
        assert self.value is not None
        return self.value


def _split(whole: OutputTensor, layer: QuantLinear, suffix: str, cache: _LastFused) -> list[OutputTensor]:
    """A fused linear's weight [N, K] or bias [N] as its parts' own tensors: rows of the whole."""
    out = []
    start = 0
    for i, (part, n) in enumerate(layer.parts):
        rows = slice(start, start + n)
        out.append(OutputTensor(f"{part}.{suffix}", (n, *whole.shape[1:]), whole.dtype,
                                lambda rows=rows: cache.get(whole)[rows].clone(), whole.source_bytes if i == 0 else 0))
        start += n
    return out


def plan_tensors(model: QuantModel, dtype: torch.dtype, dequantizer: Dequantizer) -> list[OutputTensor]:
    tensors: list[OutputTensor] = []
    cache = _LastFused()
    for kind, name in model.order:
        if kind == "layer":
            layer = model.layers[name]
            weight = _layer_tensor(model, layer, dtype, dequantizer)
            bias = _plain_tensor(model, layer.bias, dtype) if layer.bias else None
            if layer.parts:
                tensors += _split(weight, layer, "weight", cache)
                tensors += _split(bias, layer, "bias", cache) if bias else []
            else:
                tensors += [weight, bias] if bias else [weight]
        else:
            tensors.append(_plain_tensor(model, name, dtype))
    return tensors


def choose_dtype(requested: str | None, model: QuantModel) -> tuple[str, str]:
    """(output dtype, where it came from) for `--dtype requested`: a name or its alias as given;
    auto, the checkpoint's own. That is the dtype of the scales when every quantized layer agrees,
    since each format's reference computes (q - z) * s in the scales' dtype; else config.json's
    `dtype` (`torch_dtype` in older files); float16 when neither names one. Without --dtype
    (None): float16 for AWQ and w4-gemv, whose scales are float16; auto for GPTQ and
    compressed-tensors, whose scales are often bfloat16 and whose libraries keep that dtype."""
    if requested is None:
        requested = "float16" if model.scheme.layout in (AWQ_GEMM, W4_GEMV) else "auto"
    if requested != "auto":
        return next((name for name, short in OUT_DTYPES.items() if requested in (name, short)), requested), "--dtype"
    scales = {torch_dtype_name(model.checkpoint.tensors[layer.scales].dtype) for layer in model.layers.values()}
    if len(scales) == 1 and next(iter(scales)) in OUT_DTYPES:
        return scales.pop(), "auto: the scales' dtype"
    for key in ("dtype", "torch_dtype"):
        value = model.checkpoint.config.get(key)
        if isinstance(value, str) and value in DTYPES:
            return value, f"auto: config.json {key}"
    return "float16", "auto: neither the scales nor config.json name one dtype, so float16"


def torch_dtype_name(code: str) -> str:
    """A safetensors dtype code as torch names the dtype: F16 -> float16."""
    return str(SAFETENSORS_DTYPES[code]).removeprefix("torch.")


def dense_config(config: dict[str, Any], dtype_name: str) -> dict[str, Any]:
    """config.json for the dense checkpoint: no quantization_config, dtype set under both the
    current key (`dtype`) and the one older transformers read (`torch_dtype`)."""
    out = {key: value for key, value in config.items() if key != "quantization_config"}
    out["torch_dtype"] = dtype_name
    out["dtype"] = dtype_name
    return out
