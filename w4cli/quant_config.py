"""Which quantization a checkpoint declares, and whether w4 reads it.

w4 reads AWQ checkpoints as AutoAWQ writes them: `quantization_config` in config.json with
quant_method "awq", version "gemm", 4 bits, zero points, any group size (-1: one group), and the
legacy `quant_config.json` ({"w_bit", "q_group_size", "zero_point", "version": "GEMM"}); and its
own repacked checkpoints (quant_method "w4", format "w4-gemv"). Everything else is refused with a
line naming what was found (see docs/formats.md for the layouts).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from w4cli.checkpoint import read_json
from w4cli.errors import InputRefused

LEGACY_AWQ_CONFIG = "quant_config.json"
GPTQ_CONFIG = "quantize_config.json"


AWQ_GEMM = "awq-gemm"
W4_GEMV = "w4-gemv"
W4_METHOD = "w4"


@dataclass(frozen=True)
class QuantScheme:
    layout: str  # AWQ_GEMM or W4_GEMV: which tensors make up one quantized linear
    group_size: int  # -1: one group spanning all of in_features
    modules_to_not_convert: tuple[str, ...]
    source: str  # the file the scheme came from
    config: dict[str, Any]  # the quantization config as read


def _refuse(found: str) -> InputRefused:
    return InputRefused(f"unsupported quantization: {found}; w4 reads AWQ gemm checkpoints (4-bit, zero points)")


def _describe_other(qc: dict[str, Any], method: str) -> str:
    details = [f"quant_method '{method}'"]
    for key in ("format", "checkpoint_format", "version", "bits"):
        if key in qc:
            details.append(f"{key} '{qc[key]}'")
    return ", ".join(details)


def read_quantization_config(root: Path, config: dict[str, Any]) -> tuple[dict[str, Any], str]:
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


def parse_scheme(qc: dict[str, Any], source: str) -> QuantScheme:
    method = str(qc.get("quant_method", "")).lower()
    if method == W4_METHOD:
        return _w4_scheme(qc, source)
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


def w4_gemv_config(scheme: QuantScheme) -> dict[str, Any]:
    """quantization_config of a repacked checkpoint: self-describing, and carrying the AWQ config
    it came from."""
    from w4cli.formats import w4_gemv

    return {
        "quant_method": W4_METHOD,
        "format": W4_GEMV,
        "format_version": w4_gemv.LAYOUT_VERSION,
        "bits": 4,
        "group_size": scheme.group_size,
        "zero_point": True,
        "modules_to_not_convert": list(scheme.modules_to_not_convert) or None,
        "source_quantization_config": scheme.config,
    }
