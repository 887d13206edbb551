"""compressed-tensors' quantization_config: what w4 reads of it, and which config group quantizes
which linear.

    {"quant_method": "compressed-tensors", "format": "pack-quantized",
     "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int",
         "symmetric": true, "strategy": "group", "group_size": 128, "dynamic": false, ...},
         "input_activations": null, "output_activations": null}},
     "ignore": ["lm_head", "re:.*mlp.gate$"], "quantization_status": "compressed", "kv_cache_scheme": null}

w4 reads weight-only int 4-bit groups with strategy "group" or "channel". A target or an ignore
entry matches a module by its exact name, by a `re:` pattern (Python `re.match` on the name), or
by the class name "Linear", which every packed linear is; an exact name beats a pattern, which
beats a class name.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from w4cli.errors import InputRefused
from w4cli.formats.compressed_tensors import WeightArgs

STRATEGIES = ("group", "channel")
LINEAR = "Linear"


@dataclass(frozen=True)
class CtConfig:
    groups: dict[str, tuple[tuple[str, ...], WeightArgs]]  # name -> (targets, weights)
    ignore: tuple[str, ...]

    def weights_for(self, prefix: str) -> WeightArgs:
        """The weights of the config group that quantizes the linear `prefix`."""
        matched = [(rank, name) for name, (targets, _) in self.groups.items() if (rank := best_match(prefix, targets)) is not None]
        if not matched:
            raise InputRefused(f"{prefix} is quantized but no compressed-tensors config group targets it")
        best = min(rank for rank, _ in matched)
        winners = [name for rank, name in matched if rank == best]
        schemes = {self.groups[name][1] for name in winners}
        if len(schemes) > 1:
            raise InputRefused(f"{prefix} is targeted by config groups {', '.join(winners)} with different weight schemes")
        return self.groups[winners[0]][1]

    def ignored_by(self, prefix: str) -> str | None:
        """The ignore entry that names the linear `prefix`, if any."""
        return next((entry for entry in self.ignore if best_match(prefix, (entry,)) is not None), None)


def best_match(name: str, targets: tuple[str, ...]) -> int | None:
    """0 an exact name, 1 a `re:` pattern, 2 the class name Linear; None if no target matches."""
    ranks = []
    for target in targets:
        if target == name:
            ranks.append(0)
        elif target.startswith("re:") and re.match(target[3:], name):
            ranks.append(1)
        elif target == LINEAR:
            ranks.append(2)
    return min(ranks, default=None)


def _strings(value: Any, what: str, source: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InputRefused(f"{source}: {what} must be a list of strings")
    for entry in value:
        if entry.startswith("re:"):
            try:
                re.compile(entry[3:])
            except re.error as exc:
                raise InputRefused(f"{source}: {what} entry {entry!r} is not a valid pattern ({exc})") from None
    return tuple(value)


def _weights(name: str, weights: Any, source: str, refuse: Callable[[str], InputRefused]) -> WeightArgs:
    if not isinstance(weights, dict):
        raise refuse(f"compressed-tensors config group '{name}' without weights")
    kind, bits = weights.get("type", "int"), weights.get("num_bits")
    if kind != "int" or bits != 4:
        raise refuse(f"compressed-tensors config group '{name}' with {kind} {bits}-bit weights")
    strategy = weights.get("strategy")
    if strategy not in STRATEGIES:
        raise refuse(f"compressed-tensors config group '{name}' with strategy '{strategy}'")
    if weights.get("dynamic") not in (None, False):
        raise refuse(f"compressed-tensors config group '{name}' with dynamic weights")
    symmetric = weights.get("symmetric", True)
    if not isinstance(symmetric, bool):
        raise InputRefused(f"{source}: config group '{name}' symmetric must be true or false, got {symmetric!r}")
    group_size = weights.get("group_size")
    if strategy == "group" and (not isinstance(group_size, int) or isinstance(group_size, bool) or group_size <= 0):
        raise InputRefused(f"{source}: config group '{name}' has strategy group but group_size {group_size!r}")
    return WeightArgs(symmetric, strategy, group_size if strategy == "group" else None)


def parse_ct_config(qc: dict[str, Any], source: str, refuse: Callable[[str], InputRefused]) -> CtConfig:
    """The config groups and ignore list of a pack-quantized quantization_config; refuse(found)
    builds the refusal for anything w4 does not read."""
    status = qc.get("quantization_status", "compressed")
    if status != "compressed":
        raise refuse(f"compressed-tensors with quantization_status '{status}' (the weights are not packed)")
    for key, what in (("kv_cache_scheme", "a quantized KV cache"), ("transform_config", "transforms (rotations) of the weights")):
        if qc.get(key):
            raise refuse(f"compressed-tensors with {key} ({what})")
    sparsity = qc.get("sparsity_config")
    if isinstance(sparsity, dict) and sparsity.get("format", "dense") != "dense":
        raise refuse(f"compressed-tensors with sparsity format '{sparsity.get('format')}'")
    config_groups = qc.get("config_groups")
    if not isinstance(config_groups, dict) or not config_groups:
        raise InputRefused(f"{source}: compressed-tensors quantization_config has no config_groups")
    groups = {}
    for name, group in config_groups.items():
        if not isinstance(group, dict):
            raise InputRefused(f"{source}: config group '{name}' must be a JSON object")
        fmt = group.get("format")
        if fmt not in (None, "pack-quantized"):
            raise refuse(f"compressed-tensors config group '{name}' with format '{fmt}'")
        for key in ("input_activations", "output_activations"):
            if group.get(key):
                raise refuse(f"compressed-tensors config group '{name}' with {key} (w4 reads weight-only W4A16)")
        targets = _strings(group.get("targets"), f"config group '{name}' targets", source)
        for target in targets:
            if not target.startswith("re:") and target[:1].isupper() and target != LINEAR:
                raise refuse(f"compressed-tensors target class '{target}' (w4 matches Linear, module names and re: patterns)")
        groups[name] = (targets, _weights(name, group.get("weights"), source, refuse))
    return CtConfig(groups, _strings(qc.get("ignore"), "ignore", source))
