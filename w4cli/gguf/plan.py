"""The GGUF tensors of a quantized checkpoint, planned from shapes alone and produced one at a time:
quantized linears as Q4_0 / Q4_1 blocks (w4cli/gguf/blocks.py), everything else in its own dtype
(or --outtype), under llama.cpp's names and with its converter's transforms. Every refusal happens
here, while planning, before anything is written.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import gguf
import numpy as np
import torch

from w4cli.read.checkpoint import DTYPES, FLOAT_CODES
from w4cli.dequantize import awq_tensors, packed_layer
from w4cli.errors import InputRefused
from w4cli.formats import awq_gemm, reference
from w4cli.formats.unpacked import UnpackedLinear, identity_groups
from w4cli.gguf import blocks
from w4cli.gguf.arch import Architecture, TensorNames, expert_count, extra_tensors, permute_rows
from w4cli.read.layers import QuantLinear, QuantModel
from w4cli.read.quant_config import AWQ_GEMM, COMPRESSED_TENSORS, GPTQ, W4_GEMV

Q = gguf.GGMLQuantizationType
BLOCK_TYPES = {blocks.Q4_0: Q.Q4_0, blocks.Q4_1: Q.Q4_1}
FLOAT_TYPES = {torch.float32: Q.F32, torch.float16: Q.F16, torch.bfloat16: Q.BF16}
OUTTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
PIECE_BYTES = 64 * 1024 * 1024  # an unquantized tensor is read, cast and written this much at a time
# one routed expert's linear: <base>.experts.<index>.<projection>
EXPERT = re.compile(r"(?P<base>.+\.experts)\.(?P<index>[0-9]+)\.(?P<projection>[^.]+)")
# routers, which llama.cpp's converter always writes in float32
ROUTERS = (gguf.MODEL_TENSOR.FFN_GATE_INP, gguf.MODEL_TENSOR.FFN_GATE_INP_SHEXP)


@dataclass
class GgufTensor:
    name: str  # GGUF name
    source: str  # the checkpoint's tensor (a quantized linear's prefix) it comes from
    qtype: gguf.GGMLQuantizationType
    byte_shape: tuple[int, ...]  # rows first; the last dimension in bytes
    # the tensor's bytes (uint8) as consecutive pieces along its first dimension, produced one at a
    # time: memory holds a piece, never a whole 2 GB embedding
    pieces: Callable[[], Iterator[np.ndarray]]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.byte_shape))


def symmetric(model: QuantModel, layer: QuantLinear) -> bool:
    """Whether every zero point of the layer is 8 by the checkpoint's own declaration (checked
    against the stored zeros by layers.check_zero_points and by blocks.pack)."""
    scheme = model.scheme
    if layer.layout == GPTQ:
        return scheme.gptq is not None and scheme.gptq.sym
    if layer.layout == COMPRESSED_TENSORS:
        return scheme.ct is not None and scheme.ct.weights_for(layer.prefix).symmetric
    return False


def unpacked(model: QuantModel, layer: QuantLinear, t: dict[str, torch.Tensor]) -> UnpackedLinear:
    if layer.layout in (AWQ_GEMM, W4_GEMV):
        return awq_gemm.unpack_linear(*awq_tensors(model.scheme, layer, t))
    return reference.unpack(packed_layer(model.scheme, layer, t))


def _check_layer(model: QuantModel, layer: QuantLinear) -> str:
    """The layer's block type, or InputRefused: act-order, shapes that are not whole blocks,
    scales fp16 cannot hold."""
    if layer.parts:
        raise blocks.refusal(layer.prefix, "it is a fused w4 linear (w4 repack --fuse)")
    blocks.check_shape(layer.prefix, layer.in_features, layer.group_size)
    checkpoint = model.checkpoint
    for suffix in ("g_idx", "weight_g_idx"):
        if suffix in layer.optional and not identity_groups(checkpoint.read_one(layer.tensor(suffix)), layer.group_size):
            raise blocks.refusal(layer.prefix, "its g_idx permutes the groups (act-order)")
    sym = symmetric(model, layer)
    blocks.check_scales(layer.prefix, checkpoint.read_one(layer.scales), sym)
    return blocks.Q4_0 if sym else blocks.Q4_1


def _bytes(value: torch.Tensor) -> np.ndarray:
    value = value.contiguous()
    return value.view(torch.uint8).numpy().reshape(*value.shape[:-1], -1) if value.dim() else value.view(torch.uint8).numpy()


class Planner:
    def __init__(self, model: QuantModel, arch: Architecture, outtype: str | None):
        self.model = model
        self.names = TensorNames(arch, model.checkpoint.config)
        self.outtype = OUTTYPES[outtype] if outtype else None
        self.routers = {gguf.TENSOR_NAMES[t].rsplit(".", 1)[-1] for t in ROUTERS}  # "blk.{bid}.ffn_gate_inp" -> "ffn_gate_inp"

    def float_dtype(self, gguf_name: str, stored: torch.dtype, ndim: int) -> torch.dtype:
        """1-D tensors and norms in float32, as llama.cpp takes them (a widening: exact); other
        float tensors in --outtype, else their own dtype (float64 as float32)."""
        if ndim <= 1 or gguf_name.endswith("_norm.weight") or gguf_name.split(".")[-2] in self.routers:
            return torch.float32
        if self.outtype is not None:
            return self.outtype
        return stored if stored in FLOAT_TYPES else torch.float32

    def layer(self, layer: QuantLinear) -> GgufTensor | None:
        name = self.names.gguf_name(layer.weight)
        if name is None:
            return None
        qtype = _check_layer(self.model, layer)
        heads = self.names.permuted_heads(layer.weight)
        model = self.model

        def produce() -> Iterator[np.ndarray]:
            whole = unpacked(model, layer, model.checkpoint.read(*layer.tensor_names))
            if heads:  # rows move between heads: pack all of them, then reorder (q/k: small)
                yield permute_rows(torch.from_numpy(blocks.pack(whole, qtype, layer.prefix)), heads).numpy()
                return
            for start in range(0, layer.out_features, blocks.ROWS_PER_CHUNK):
                rows = slice(start, min(layer.out_features, start + blocks.ROWS_PER_CHUNK))
                yield blocks.pack(UnpackedLinear(whole.codes[rows], whole.zeros[rows], whole.scales[rows]), qtype, layer.prefix)

        shape = (layer.out_features, layer.in_features // blocks.BLOCK * blocks.BLOCK_BYTES[qtype])
        return GgufTensor(name, layer.prefix, BLOCK_TYPES[qtype], shape, produce)

    def experts(self, layers: list[QuantLinear], stacked: str) -> GgufTensor:
        """A MoE layer's routed experts of one projection as one [experts, N, K] tensor, as
        llama.cpp stacks them: expert e's blocks are the e-th [N, K] slice."""
        name = self.names.gguf_name(stacked)
        count = expert_count(self.model.checkpoint.config)
        first = layers[0]
        if len(layers) != count or any(layer.bias for layer in layers):
            raise InputRefused(f"{stacked}: {len(layers)} experts where config.json has {count}, or an expert with a bias; llama.cpp stacks exactly that many, without biases")
        qtypes = {_check_layer(self.model, layer) for layer in layers}
        if len(qtypes) != 1 or any((l.in_features, l.out_features) != (first.in_features, first.out_features) for l in layers):
            raise InputRefused(f"{stacked}: its experts differ in shape or block type, which one stacked GGUF tensor cannot hold")
        qtype = qtypes.pop()
        model = self.model

        def produce() -> Iterator[np.ndarray]:
            for l in layers:
                yield blocks.pack(unpacked(model, l, model.checkpoint.read(*l.tensor_names)), qtype, l.prefix)[None]

        shape = (count, first.out_features, first.in_features // blocks.BLOCK * blocks.BLOCK_BYTES[qtype])
        return GgufTensor(name, stacked, BLOCK_TYPES[qtype], shape, produce)

    def plain(self, source: str) -> GgufTensor | None:
        name = self.names.gguf_name(source)
        if name is None:
            return None
        checkpoint = self.model.checkpoint
        info = checkpoint.tensors[source]
        if info.dtype not in FLOAT_CODES:
            raise InputRefused(f"{source} has dtype {info.dtype}; llama.cpp takes float tensors here")
        dtype = self.float_dtype(name, DTYPES[info.dtype], len(info.shape))
        heads = self.names.permuted_heads(source)

        narrowing = dtype.itemsize < DTYPES[info.dtype].itemsize or (dtype, DTYPES[info.dtype]) == (torch.float16, torch.bfloat16)

        def cast(value: torch.Tensor) -> torch.Tensor:
            out = value.to(dtype)
            # the values were checked finite on reading: an inf now is --outtype's overflow
            if narrowing and not bool(torch.isfinite(out).all()):
                raise InputRefused(f"{source} does not fit {str(dtype).removeprefix('torch.')} (--outtype): a value overflows to inf")
            return out

        def produce() -> Iterator[np.ndarray]:
            if heads or len(info.shape) < 2:  # a q/k bias or weight moves its rows: read whole (small)
                value = cast(checkpoint.read_one(source))
                yield _bytes(permute_rows(value, heads) if heads else value)
                return
            rows = max(1, PIECE_BYTES // max(1, info.nbytes // info.shape[0]))
            for start in range(0, info.shape[0], rows):
                yield _bytes(cast(checkpoint.read_rows(source, start, min(info.shape[0], start + rows))))

        shape = (*info.shape[:-1], info.shape[-1] * dtype.itemsize) if info.shape else (dtype.itemsize,)
        return GgufTensor(name, source, FLOAT_TYPES[dtype], tuple(shape), produce)


def plan_tensors(model: QuantModel, arch: Architecture, outtype: str | None) -> list[GgufTensor]:
    """Every GGUF tensor in checkpoint order (llama.cpp looks tensors up by name), plus those
    llama.cpp needs that the checkpoint does not hold. Refuses, before anything is written, what
    cannot be converted without a second quantization."""
    if model.act_scales:
        first = next(iter(model.act_scales.values()))
        raise InputRefused(f"{first.name}: activation scales (AutoAWQ ScaledActivation) have no place in llama.cpp's graphs for these architectures")
    planner = Planner(model, arch, outtype)
    experts: dict[str, list[QuantLinear]] = {}
    for layer in model.layers.values():
        if match := EXPERT.fullmatch(layer.prefix):
            experts.setdefault(f"{match['base']}.{match['projection']}.weight", []).append(layer)
    for group in experts.values():
        group.sort(key=lambda layer: int(EXPERT.fullmatch(layer.prefix)["index"]))
        if [int(EXPERT.fullmatch(layer.prefix)["index"]) for layer in group] != list(range(len(group))):
            raise InputRefused(f"{group[0].prefix}: the experts are not numbered 0..{len(group) - 1}")
    out: list[GgufTensor] = []
    for name, value in extra_tensors(model.checkpoint.config).items():
        out.append(GgufTensor(name, "(computed)", Q.F32, (value.nbytes,), lambda value=value: iter([value.view(np.uint8)])))
    for kind, name in model.order:
        if kind == "layer" and (match := EXPERT.fullmatch(name)):
            stacked = f"{match['base']}.{match['projection']}.weight"
            planned = [planner.experts(experts[stacked], stacked)] if match["index"] == "0" else []
        elif kind == "layer":
            layer = model.layers[name]
            planned = [planner.layer(layer), planner.plain(layer.bias) if layer.bias else None]
        else:
            planned = [planner.plain(name)]
        out += [t for t in planned if t is not None]
    seen: dict[str, str] = {}
    for t in out:
        if t.name in seen:
            raise InputRefused(f"{seen[t.name]} and {t.source} both map to GGUF tensor {t.name}")
        seen[t.name] = t.source
    return out


def file_type(tensors: list[GgufTensor]) -> gguf.LlamaFileType:
    """general.file_type: what most of the file's weights are (Q4_1 when any linear needed it)."""
    types = {t.qtype for t in tensors}
    return gguf.LlamaFileType.MOSTLY_Q4_1 if Q.Q4_1 in types else gguf.LlamaFileType.MOSTLY_Q4_0
