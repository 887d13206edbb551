"""The repack step: every AWQ gemm, GPTQ or compressed-tensors linear becomes w4's GEMV layout
(w4cli/formats/w4_gemv.py), by way of the AWQ gemm layout, the one every format converts to
losslessly; everything else is copied unchanged, activation scales included (the repacked
checkpoint is still a quantized one, and `w4 dequantize` folds them when it makes the dense
checkpoint). A symmetric format's implicit zero point (8) becomes explicit zeros.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from w4cli.formats import fuse
from w4cli.read.checkpoint import DTYPES
from w4cli.gpu.contract import gemv_refusal
from w4cli.dequantize import awq_tensors, torch_dtype_name
from w4cli.errors import InputRefused
from w4cli.formats import w4_gemv
from w4cli.formats.unpacked import identity_groups
from w4cli.formats.fuse import FusedGroup
from w4cli.read.layers import QuantLinear, QuantModel
from w4cli.read.quant_config import W4_GEMV, w4_gemv_config
from w4cli.write.writer import OutputTensor

DEQUANTIZE_STILL_WORKS = "w4 dequantize still reads the checkpoint"


def w4_gemv_layer(model: QuantModel, layer: QuantLinear, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One linear's w4-gemv tensors (qweight, qzeros, scales, meta) from its tensors `t`, whatever
    its layout: the one conversion `w4 repack` writes and the GPU checks run in memory. Raises
    InputRefused, naming the layer, for what the layout cannot hold (contract.gemv_refusal, a
    permuting g_idx)."""
    if layer.layout == W4_GEMV:
        return {suffix: t[layer.tensor(suffix)] for suffix in w4_gemv.TENSOR_NAMES}
    awq = awq_tensors(model.scheme, layer, t)
    try:
        return w4_gemv.repack_from_awq(*awq)
    except InputRefused as exc:
        raise InputRefused(f"{layer.prefix}: {exc}") from None


class _Kept:
    """The tensors of the linear (or fused group) made last, kept while its output tensors are
    written in a row, so each is read and repacked once."""

    def __init__(self) -> None:
        self.key: str | None = None
        self.tensors: dict[str, torch.Tensor] = {}

    def get(self, key: str, make: Callable[[], dict[str, torch.Tensor]], suffix: str) -> torch.Tensor:
        if self.key != key:
            self.key, self.tensors = None, {}  # the old ones freed before the new ones are made
            self.tensors, self.key = make(), key
        return self.tensors[suffix]


def check_repackable(model: QuantModel) -> None:
    """Refuse before writing anything: an already repacked input, or a layer the kernel cannot run
    (contract.gemv_refusal: shape, group size, bfloat16 scales) or that w4-gemv cannot express (a
    g_idx that permutes the groups: the GEMV has no column permutation)."""
    if model.scheme.layout == W4_GEMV:
        raise InputRefused("the checkpoint is already in w4's GEMV layout (quant_method 'w4', format 'w4-gemv'); nothing to repack")
    for layer in model.layers.values():
        scales = torch_dtype_name(model.checkpoint.tensors[layer.scales].dtype)
        why = gemv_refusal(layer.in_features, layer.out_features, layer.group_size, scales)
        if why is None:
            g_idx = next((layer.tensor(s) for s in ("g_idx", "weight_g_idx") if s in layer.optional), None)
            if g_idx is not None and not identity_groups(model.checkpoint.read_one(g_idx), layer.group_size):
                why = f"{g_idx.rpartition('.')[2]} permutes the groups (act-order), and w4's GEMV layout has no column permutation"
        if why is not None:
            raise InputRefused(f"{layer.prefix}: w4-gemv: {why}; {DEQUANTIZE_STILL_WORKS}")


def fused_groups(model: QuantModel, fusions: tuple[str, ...]) -> list[FusedGroup]:
    """The linears each --fuse name joins, per parent module, refusing before anything is written
    a group that is not whole (a part missing or not quantized), whose parts differ in K, group
    size or bias, or one with a folded activation scale (its fold would then reach the other
    parts' rows); and a name that matches nothing in the checkpoint."""
    groups = []
    for fusion in fusions:
        fused_name, names = fuse.FUSIONS[fusion]
        parents = [prefix.rpartition(".")[0] for prefix in model.layers if prefix.rpartition(".")[2] == names[0]]
        if not parents:
            raise fuse.refuse(f"{fusion}: the checkpoint has no quantized {names[0]} to fuse with {', '.join(names[1:])}")
        for parent in parents:
            parts = tuple(_child(parent, name) for name in names)
            missing = next((part for part in parts if part not in model.layers), None)
            if missing is not None:
                raise fuse.refuse(f"{fusion}: {parts[0]} has no quantized {missing} to fuse with")
            layers = [model.layers[part] for part in parts]
            if len({(layer.in_features, layer.group_size) for layer in layers}) > 1:
                raise fuse.refuse(f"{fusion}: {', '.join(parts)} differ in in_features or group size")
            if len({layer.bias is None for layer in layers}) > 1:
                raise fuse.refuse(f"{fusion}: some of {', '.join(parts)} have a bias and some do not")
            if len({model.checkpoint.tensors[layer.bias].dtype for layer in layers if layer.bias}) > 1:
                raise fuse.refuse(f"{fusion}: the biases of {', '.join(parts)} differ in dtype")
            scaled = next((layer.prefix for layer in layers if layer.weight in model.act_scales), None)
            if scaled is not None:
                raise fuse.refuse(f"{fusion}: {scaled} has an activation scale folded into it")
            taken = _child(parent, fused_name)
            if taken in model.layers or any(name.startswith(f"{taken}.") for name in model.checkpoint.tensors):
                raise fuse.refuse(f"{fusion}: the checkpoint already has tensors named {taken}.*")
            groups.append(fuse.FusedGroup(taken, parts))
    return groups


def _repacked(model: QuantModel, layer: QuantLinear) -> dict[str, torch.Tensor]:
    return w4_gemv_layer(model, layer, model.checkpoint.read(*layer.tensor_names))


def _child(parent: str, name: str) -> str:
    return f"{parent}.{name}" if parent else name


def _fused_layer(model: QuantModel, group: FusedGroup) -> dict[str, torch.Tensor]:
    layers = [model.layers[part] for part in group.parts]
    out = fuse.concat([_repacked(model, layer) for layer in layers])
    if layers[0].bias:
        out["bias"] = torch.cat([model.checkpoint.read_one(layer.bias) for layer in layers])
    return out


def _fused_tensors(model: QuantModel, group: FusedGroup, kept: _Kept) -> list[OutputTensor]:
    layers = [model.layers[part] for part in group.parts]
    first = layers[0]
    n = sum(layer.out_features for layer in layers)
    specs = dict(w4_gemv.tensor_specs(first.in_features, n, first.group_size))
    specs[fuse.SPLIT_SUFFIX] = ((len(layers),), torch.int32)
    if first.bias:
        specs["bias"] = ((n,), DTYPES[model.checkpoint.tensors[first.bias].dtype])
    names = [name for layer in layers for name in layer.tensor_names + ([layer.bias] if layer.bias else [])]
    source_bytes = sum(model.checkpoint.tensors[name].nbytes for name in names)
    return [
        OutputTensor(f"{group.prefix}.{suffix}", shape, dtype,
                     lambda suffix=suffix: kept.get(group.prefix, lambda: _fused_layer(model, group), suffix),
                     source_bytes if i == 0 else 0)
        for i, (suffix, (shape, dtype)) in enumerate(specs.items())
    ]


def plan_tensors(model: QuantModel, groups: Sequence[FusedGroup] = ()) -> list[OutputTensor]:
    """Every output tensor in checkpoint order; a fused group at the place of its first part."""
    checkpoint = model.checkpoint
    kept = _Kept()
    group_of = {part: group for group in groups for part in group.parts}
    tensors: list[OutputTensor] = []
    copied = set()
    for kind, name in model.order:
        if kind == "plain":
            tensors.append(_copied(model, name))
            copied.add(name)
            continue
        if name in group_of:
            group = group_of[name]
            if name == group.parts[0]:
                tensors += _fused_tensors(model, group, kept)
            continue
        layer = model.layers[name]
        source_bytes = sum(checkpoint.tensors[n].nbytes for n in layer.tensor_names)
        for i, (suffix, (shape, dtype)) in enumerate(w4_gemv.tensor_specs(layer.in_features, layer.out_features, layer.group_size).items()):
            tensors.append(
                OutputTensor(
                    name=f"{layer.prefix}.{suffix}",
                    shape=shape,
                    dtype=dtype,
                    produce=lambda layer=layer, suffix=suffix: kept.get(layer.prefix, lambda: _repacked(model, layer), suffix),
                    source_bytes=source_bytes if i == 0 else 0,
                )
            )
        if layer.bias:
            tensors.append(_copied(model, layer.bias))
    for act in model.act_scales.values():
        if act.name not in copied:
            tensors.append(_copied(model, act.name))
    return tensors


def _copied(model: QuantModel, name: str) -> OutputTensor:
    info = model.checkpoint.tensors[name]
    return OutputTensor(name, info.shape, DTYPES[info.dtype], lambda: model.checkpoint.read_one(name), info.nbytes)


def repacked_config(config: dict[str, Any], model: QuantModel, groups: Sequence[FusedGroup] = ()) -> dict[str, Any]:
    """config.json with the w4-gemv quantization_config. Its group_size is the source config's; for
    compressed-tensors, whose config groups may differ, the layers' (-1: one group each), or -1
    when they differ: each layer's `meta` holds its own. Fused groups are named under "fused"."""
    group_size = model.scheme.group_size
    if model.scheme.ct is not None:
        sizes = {-1 if layer.group_size == layer.in_features else layer.group_size for layer in model.layers.values()}
        group_size = sizes.pop() if len(sizes) == 1 else -1
    out = dict(config)
    out["quantization_config"] = w4_gemv_config(model.scheme, group_size)
    if groups:
        out["quantization_config"]["fused"] = fuse.fused_config(groups)
    return out
