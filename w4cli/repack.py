"""The repack step: every AWQ gemm linear becomes w4's GEMV layout (w4cli/formats/w4_gemv.py);
everything else is copied unchanged, activation scales included (the repacked checkpoint is
still a quantized one, and `w4 dequantize` folds them when it makes the dense checkpoint).
"""

from __future__ import annotations

from typing import Any

import torch

from w4cli.checkpoint import DTYPES
from w4cli.errors import InputRefused
from w4cli.formats import w4_gemv
from w4cli.layers import QuantLinear, QuantModel
from w4cli.quant_config import W4_GEMV, w4_gemv_config
from w4cli.writer import OutputTensor


class _LastLayer:
    """One linear's repacked tensors, kept while its four output tensors are written in a row, so
    each layer is read and repacked once."""

    def __init__(self, model: QuantModel):
        self.model = model
        self.prefix: str | None = None
        self.tensors: dict[str, torch.Tensor] = {}

    def get(self, layer: QuantLinear, suffix: str) -> torch.Tensor:
        if self.prefix != layer.prefix:
            t = self.model.checkpoint.read(layer.qweight, layer.qzeros, layer.scales)
            try:
                self.tensors = w4_gemv.repack_from_awq(t[layer.qweight], t[layer.qzeros], t[layer.scales])
            except InputRefused as exc:
                raise InputRefused(f"{layer.prefix}: {exc}") from None
            self.prefix = layer.prefix
        return self.tensors[suffix]


def check_repackable(model: QuantModel) -> None:
    """Refuse before writing anything: an already repacked input, or a layer the kernel cannot run."""
    if model.scheme.layout == W4_GEMV:
        raise InputRefused("the checkpoint is already in w4's GEMV layout (quant_method 'w4', format 'w4-gemv'); nothing to repack")
    for layer in model.layers.values():
        scales = model.checkpoint.tensors[layer.scales]
        shape_only = {
            "qweight": torch.empty((layer.in_features, layer.out_features // 8), dtype=torch.int32, device="meta"),
            "qzeros": torch.empty((layer.in_features // layer.group_size, layer.out_features // 8), dtype=torch.int32, device="meta"),
            "scales": torch.empty(scales.shape, dtype=DTYPES[scales.dtype], device="meta"),
        }
        try:
            w4_gemv.check_awq(shape_only["qweight"], shape_only["qzeros"], shape_only["scales"])
        except InputRefused as exc:
            raise InputRefused(f"{layer.prefix}: {exc}") from None


def plan_tensors(model: QuantModel) -> list[OutputTensor]:
    checkpoint = model.checkpoint
    cache = _LastLayer(model)
    tensors: list[OutputTensor] = []
    copied = set()
    for kind, name in model.order:
        if kind == "plain":
            tensors.append(_copied(model, name))
            copied.add(name)
            continue
        layer = model.layers[name]
        source_bytes = sum(checkpoint.tensors[n].nbytes for n in (layer.qweight, layer.qzeros, layer.scales))
        for i, (suffix, (shape, dtype)) in enumerate(w4_gemv.tensor_specs(layer.in_features, layer.out_features, layer.group_size).items()):
            tensors.append(
                OutputTensor(
                    name=f"{layer.prefix}.{suffix}",
                    shape=shape,
                    dtype=dtype,
                    produce=lambda layer=layer, suffix=suffix: cache.get(layer, suffix),
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


def repacked_config(config: dict[str, Any], model: QuantModel) -> dict[str, Any]:
    out = dict(config)
    out["quantization_config"] = w4_gemv_config(model.scheme)
    return out
