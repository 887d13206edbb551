"""Which quantization a checkpoint declares, and whether w4 reads it.

w4 reads, from `quantization_config` in config.json (or a legacy file beside it):
- AWQ as AutoAWQ writes it: quant_method "awq", version "gemm", 4 bits, zero points, any group
  size (-1: one group); legacy `quant_config.json` ({"w_bit", "q_group_size", "zero_point",
  "version": "GEMM"});
- GPTQ: quant_method "gptq", 4 bits, checkpoint_format "gptq" (v1) or "gptq_v2", sym and desc_act
  either way, any group size; legacy `quantize_config.json`;
- compressed-tensors "pack-quantized" with int 4-bit weights (w4cli/read/ct_config.py);
- its own repacked checkpoints (quant_method "w4", format "w4-gemv").
Everything else is refused with a line naming what was found (see docs/formats.md for the layouts).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from w4cli.errors import InputRefused
from w4cli.read.ct_config import CtConfig, parse_ct_config
from w4cli.read.safe_files import read_json

LEGACY_AWQ_CONFIG = "quant_config.json"
GPTQ_CONFIG = "quantize_config.json"


AWQ_GEMM = "awq-gemm"
W4_GEMV = "w4-gemv"
GPTQ = "gptq"
COMPRESSED_TENSORS = "compressed-tensors"
W4_METHOD = "w4"


@dataclass(frozen=True)
class GptqArgs:
    v1: bool  # checkpoint_format "gptq": every qzeros word stored minus 0x11111111
    sym: bool  # symmetric: every zero point is 8
    desc_act: bool  # act-order: g_idx may permute the groups


@dataclass(frozen=True)
class QuantScheme:
    layout: str  # AWQ_GEMM, W4_GEMV, GPTQ or COMPRESSED_TENSORS: which tensors make up one quantized linear
    group_size: int  # -1: one group spanning all of in_features; compressed-tensors: per layer (ct)
    modules_to_not_convert: tuple[str, ...]
    source: str  # the file the scheme came from
    config: dict[str, Any]  # the quantization config as read
    gptq: GptqArgs | None = None
    ct: CtConfig | None = None


def _refuse(found: str) -> InputRefused:
    return InputRefused(
        f"unsupported quantization: {found}; w4 reads 4-bit AWQ gemm, GPTQ (gptq, gptq_v2) and compressed-tensors pack-quantized checkpoints"
    )


def _describe_other(qc: dict[str, Any], method: str) -> str:
    details = [f"quant_method '{method}'"]
    for key in ("format", "checkpoint_format", "version", "bits"):
        if key in qc:
            details.append(f"{key} '{qc[key]}'")
    return ", ".join(details)


def read_scheme(root: Path, config: dict[str, Any]) -> QuantScheme:
    """The quantization that the checkpoint at `root`, whose config.json holds `config`, declares;
    InputRefused (exit 4) unless it is one w4 reads."""
    return _parse_scheme(*_declared_config(root, config))


def _declared_config(root: Path, config: dict[str, Any]) -> tuple[dict[str, Any], str]:
    qc = config.get("quantization_config")
    if qc is not None:
        if not isinstance(qc, dict):
            raise InputRefused("config.json: quantization_config must be a JSON object")
        return qc, "config.json"
    if (root / LEGACY_AWQ_CONFIG).is_file():
        legacy = read_json(root / LEGACY_AWQ_CONFIG)
        return {"quant_method": "awq", **legacy}, LEGACY_AWQ_CONFIG
    if (root / GPTQ_CONFIG).is_file():
        gptq = read_json(root / GPTQ_CONFIG)
        return {"quant_method": gptq.get("quant_method", "gptq"), **gptq}, GPTQ_CONFIG
    raise InputRefused("config.json has no quantization_config: this is not a quantized checkpoint")


def _parse_scheme(qc: dict[str, Any], source: str) -> QuantScheme:
    method = str(qc.get("quant_method", "")).lower()
    if method == W4_METHOD:
        return _w4_scheme(qc, source)
    if method == GPTQ:
        return _gptq_scheme(qc, source)
    if method == COMPRESSED_TENSORS:
        fmt = qc.get("format")
        if fmt != "pack-quantized":
            raise _refuse(_describe_other(qc, method))
        ct = parse_ct_config(qc, source, _refuse)
        return QuantScheme(COMPRESSED_TENSORS, -1, (), source, qc, ct=ct)
    if method != "awq":
        raise _refuse(_describe_other(qc, method or "(none)"))
    bits = qc.get("bits", qc.get("w_bit"))
    if bits != 4:
        raise _refuse(f"AWQ with {bits} bits")
    version = str(qc.get("version", "gemm")).lower()
    if version != "gemm":
        raise _refuse(f"AWQ version '{version}'")
    backend = str(qc.get("backend", "autoawq")).lower()
    if backend != "autoawq":
        raise _refuse(f"AWQ backend '{backend}' (its tensors use another layout)")
    if qc.get("zero_point", True) is not True:
        raise _refuse("AWQ without zero points (zero_point false)")
    return QuantScheme(AWQ_GEMM, _group_size(qc, source), _not_converted(qc, source), source, qc)


def _flag(qc: dict[str, Any], key: str, default: bool, source: str) -> bool:
    value = qc.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InputRefused(f"{source}: {key} must be true or false, got {value!r}")
    return value


def _gptq_scheme(qc: dict[str, Any], source: str) -> QuantScheme:
    from w4cli.formats import gptq

    bits = qc.get("bits")
    if bits != 4:
        raise _refuse(f"GPTQ with {bits} bits")
    if qc.get("is_marlin_format"):
        raise _refuse("GPTQ is_marlin_format (Marlin-permuted tensors)")
    fmt = str(qc.get("checkpoint_format") or "gptq").lower()
    if fmt not in gptq.CHECKPOINT_FORMATS:
        raise _refuse(f"GPTQ checkpoint_format '{fmt}'")
    args = GptqArgs(v1=fmt == "gptq", sym=_flag(qc, "sym", True, source), desc_act=_flag(qc, "desc_act", False, source))
    return QuantScheme(GPTQ, _group_size(qc, source), _not_converted(qc, source), source, qc, gptq=args)


def _group_size(qc: dict[str, Any], source: str) -> int:
    group_size = qc.get("group_size", qc.get("q_group_size"))
    if not isinstance(group_size, int) or isinstance(group_size, bool) or (group_size <= 0 and group_size != -1):
        raise InputRefused(f"{source}: group_size must be a positive integer or -1, got {group_size!r}")
    return group_size


def _not_converted(qc: dict[str, Any], source: str) -> tuple[str, ...]:
    skip = qc.get("modules_to_not_convert") or []
    if not isinstance(skip, list) or not all(isinstance(m, str) for m in skip):
        raise InputRefused(f"{source}: modules_to_not_convert must be a list of module names")
    return tuple(skip)


def _w4_scheme(qc: dict[str, Any], source: str) -> QuantScheme:
    from w4cli.formats import w4_gemv

    layout, version = qc.get("format"), qc.get("format_version")
    if layout != W4_GEMV:
        raise _refuse(f"quant_method 'w4' with format '{layout}'")
    if version != w4_gemv.LAYOUT_VERSION:
        raise InputRefused(
            f"{source}: w4-gemv format version {version}; this w4 reads version {w4_gemv.LAYOUT_VERSION} (re-run w4 repack)"
        )
    return QuantScheme(W4_GEMV, _group_size(qc, source), _not_converted(qc, source), source, qc)


def w4_gemv_config(scheme: QuantScheme, group_size: int) -> dict[str, Any]:
    """quantization_config of a repacked checkpoint: self-describing, and carrying the config it
    came from."""
    from w4cli.formats import w4_gemv

    return {
        "quant_method": W4_METHOD,
        "format": W4_GEMV,
        "format_version": w4_gemv.LAYOUT_VERSION,
        "bits": 4,
        "group_size": group_size,
        "zero_point": True,
        "modules_to_not_convert": list(scheme.modules_to_not_convert) or None,
        "source_quantization_config": scheme.config,
    }
