"""MODEL -> a validated QuantModel: resolve (local or Hub), open, check the scheme, find the
layers, check the values. Every command that reads a quantized checkpoint starts here, and nothing
is written before all of it has passed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from w4cli.read import hub
from w4cli.read.checkpoint import Checkpoint, open_checkpoint
from w4cli.read.layers import QuantModel, check_values, find_layers
from w4cli.read.quant_config import read_scheme
from w4cli.read.safe_files import read_json

# files a conversion never copies: weights and index are rewritten, config is rewritten, and the
# legacy quantization configs describe weights that are no longer there
NOT_COPIED = {"config.json", "model.safetensors.index.json", "quant_config.json", "quantize_config.json"}


def resolve(
    model: str, revision: str | None, token: str | None, cache_dir: Path | None, include_code: bool = False,
    check_config: Callable[[dict[str, Any]], None] | None = None,
) -> hub.Snapshot:
    """MODEL's snapshot directory. config.json is checked before any weights are fetched: the
    quantization it declares and, where the command has more to ask of it (`w4 gguf`: the
    architecture), `check_config`."""
    # the legacy quant_config.json sits beside config.json, so the early check only runs when
    # config.json itself declares the quantization
    def early_check(path: Path) -> None:
        config = read_json(path)
        if "quantization_config" in config:
            read_scheme(path.parent, config)
        if check_config is not None:
            check_config(config)

    patterns = hub.CHECKPOINT_PATTERNS + (hub.CODE_PATTERNS if include_code else [])
    return hub.resolve(model, revision=revision, token=token, cache_dir=cache_dir, patterns=patterns, check_config=early_check)


def open_quantized(root: Path) -> QuantModel:
    """The one way a quantized checkpoint is read: its files and index (checkpoint.py), the scheme
    its config declares (quant_config.py), its quantized linears with every shape checked against
    the scheme, then every value check (layers.py). InputRefused (exit 4) at the first problem."""
    checkpoint = open_checkpoint(root)
    model = find_layers(checkpoint, read_scheme(root, checkpoint.config))
    check_values(model)
    return model


def aux_files(checkpoint: Checkpoint, include_code: bool = False) -> list[str]:
    """Tokenizer, generation config, chat templates, model card, license terms (and with
    include_code the *.py files) copied unchanged. Only names a Hub download would fetch, so a
    local directory and its Hub copy give the same output. Each is checked here, before any work,
    to be a regular file inside the checkpoint, and again when it is copied (writer.copy_files)."""
    import os
    from fnmatch import fnmatch

    from w4cli.read.safe_files import open_regular

    patterns = hub.CHECKPOINT_PATTERNS + (hub.CODE_PATTERNS if include_code else [])
    names = []
    for path in sorted(checkpoint.root.iterdir()):
        name = path.name
        if name.startswith(".") or name in NOT_COPIED or name.endswith(".safetensors"):
            continue
        if path.is_dir() and not path.is_symlink():
            continue
        if any(fnmatch(name, pattern) for pattern in patterns):
            os.close(open_regular(path, checkpoint.root))
            names.append(name)
    return names


def custom_code_files(config: dict) -> list[str]:
    """The Python files config.json's auto_map points transformers at ("modeling_x.Cls" ->
    modeling_x.py; "org/repo--modeling_x.Cls" lives in another repo and is not listed)."""
    auto_map = config.get("auto_map")
    if not isinstance(auto_map, dict):
        return []
    files = set()
    for value in auto_map.values():
        for reference in value if isinstance(value, list) else [value]:
            if isinstance(reference, str) and "--" not in reference and "." in reference:
                module = reference.rsplit(".", 1)[0]
                files.add(module.replace(".", "/") + ".py")
    return sorted(files)


def files_to_copy(checkpoint: Checkpoint, include_code: bool) -> list[str]:
    """aux_files, saying so on stderr when config.json's auto_map needs Python files that the
    output will lack: transformers cannot load the result without them, and w4 never copies code
    unless asked (and never imports it)."""
    from w4cli import console

    names = aux_files(checkpoint, include_code)
    needed = custom_code_files(checkpoint.config)
    if needed and not include_code:
        console.note(
            f"warning: config.json's auto_map loads custom code ({', '.join(needed)}), which w4 does not copy "
            "(w4 never copies or runs code): the output will not load without it; "
            "--include-code copies the checkpoint's *.py files verbatim (w4 never imports them)"
        )
    missing = [name for name in needed if include_code and name not in names]
    if missing:
        console.note(f"warning: config.json's auto_map names {', '.join(missing)}, which the checkpoint does not hold")
    return names
