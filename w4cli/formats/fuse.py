"""Fused projections in w4's GEMV layout: q/k/v as one `qkv_proj`, gate/up as one `gate_up_proj`,
concatenated along N, as serving engines load them (one launch, one larger N).

A fused linear is an ordinary w4-gemv linear plus `<prefix>.split` (int32 [parts]: each part's N,
in order), and config.json's quantization_config names the parts under "fused" ({"qkv_proj":
["q_proj", "k_proj", "v_proj"], ...}). Concatenating along N is exact in this layout: qweight
tiles hold 8 whole rows, qzeros words 8 whole columns, scales one column per row, so every part
(N a multiple of 8) keeps its own words. `w4 dequantize` and `w4 verify` split a fused linear back
into the parts' tensors, bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from w4cli.errors import InputRefused, UsageError

# --fuse name -> (fused linear's name, its parts in order along N)
FUSIONS = {
    "qkv": ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
    "gate_up": ("gate_up_proj", ("gate_proj", "up_proj")),
}
SPLIT_SUFFIX = "split"


def parse_fuse(value: str | None) -> tuple[str, ...]:
    """`--fuse qkv,gate_up` -> ("qkv", "gate_up"); UsageError for a name it does not know."""
    if not value:
        return ()
    names = tuple(dict.fromkeys(part.strip() for part in value.split(",") if part.strip()))
    unknown = [name for name in names if name not in FUSIONS]
    if unknown or not names:
        raise UsageError(f"--fuse takes a comma-separated list of {', '.join(FUSIONS)}; got {value!r}")
    return names


@dataclass(frozen=True)
class FusedGroup:
    """Linears fused into one: `prefix` (parent.fused_name) and the parts' prefixes, in order."""

    prefix: str
    parts: tuple[str, ...]


def fused_config(groups: Sequence[FusedGroup]) -> dict[str, list[str]]:
    """The "fused" entry of quantization_config: fused name -> part names."""
    names = {}
    for group in groups:
        names[group.prefix.rpartition(".")[2]] = [part.rpartition(".")[2] for part in group.parts]
    return names


def concat(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """One w4-gemv linear (qweight, qzeros, scales, meta, split) from its parts' w4-gemv tensors,
    which share K and G (the caller checked)."""
    meta = parts[0]["meta"].clone()
    meta[2] = sum(int(p["meta"][2]) for p in parts)
    return {
        "qweight": torch.cat([p["qweight"] for p in parts], dim=0),
        "qzeros": torch.cat([p["qzeros"] for p in parts], dim=1),
        "scales": torch.cat([p["scales"] for p in parts], dim=1),
        "meta": meta,
        SPLIT_SUFFIX: torch.tensor([int(p["meta"][2]) for p in parts], dtype=torch.int32),
    }


def fusions_in(config: dict) -> tuple[str, ...]:
    """The --fuse names a repacked checkpoint's config.json records (its quantization_config
    "fused" entry), in FUSIONS order: what `w4 verify --against` repacks SOURCE with."""
    qc = config.get("quantization_config")
    fused = qc.get("fused") if isinstance(qc, dict) else None
    if not isinstance(fused, dict):
        return ()
    return tuple(name for name, (fused_name, _) in FUSIONS.items() if fused_name in fused)


def refuse(message: str) -> InputRefused:
    return InputRefused(f"--fuse: {message}")
