"""MODEL -> a validated QuantModel: resolve (local or Hub), open, check the scheme, find the
layers, check the values. Every command that reads a quantized checkpoint starts here, and nothing
is written before all of it has passed.
"""

from __future__ import annotations

from pathlib import Path

import typer

from w4cli import hub
from w4cli.checkpoint import Checkpoint, open_checkpoint, read_json
from w4cli.layers import QuantModel, check_values, find_layers
from w4cli.output_dir import OutputDirectory, check_output_dir
from w4cli.quant_config import parse_scheme, read_quantization_config

# files a conversion never copies: weights and index are rewritten, config is rewritten, and the
# legacy quantization configs describe weights that are no longer there
NOT_COPIED = {"config.json", "model.safetensors.index.json", "quant_config.json", "quantize_config.json"}


def _check_config_file(path: Path) -> None:
    config = read_json(path)
    qc, source = read_quantization_config(path.parent, config)
    parse_scheme(qc, source)


def resolve(model: str, revision: str | None, token: str | None, cache_dir: Path | None) -> hub.Snapshot:
    # the legacy quant_config.json sits beside config.json, so the early check only runs when
    # config.json itself declares the quantization
    def early_check(path: Path) -> None:
        if "quantization_config" in read_json(path):
            _check_config_file(path)

    return hub.resolve(model, revision=revision, token=token, cache_dir=cache_dir, check_config=early_check)


def open_quantized(root: Path) -> QuantModel:
    checkpoint = open_checkpoint(root)
    qc, source = read_quantization_config(root, checkpoint.config)
    model = find_layers(checkpoint, parse_scheme(qc, source))
    check_values(model)
    return model


def open_for_conversion(
    ctx: typer.Context,
    model: str,
    output_dir: Path,
    force: bool,
    revision: str | None,
    token: str | None,
    cache_dir: Path | None,
) -> tuple[QuantModel, OutputDirectory]:
    """The front half of every command that writes a checkpoint: claim OUTPUT_DIR before any
    download (refusals, the lock, the temporary sibling), resolve MODEL, refuse an OUTPUT_DIR
    inside the snapshot, open and validate. OUTPUT_DIR stays claimed until the command `ctx`
    runs ends, whatever ends it: the context releases its resources then."""
    check_output_dir(output_dir, [Path(model)] if Path(model).is_dir() else [])
    output = ctx.with_resource(OutputDirectory(output_dir, force))
    snapshot = resolve(model, revision, token, cache_dir)
    check_output_dir(output_dir, [snapshot.path])
    return open_quantized(snapshot.path), output


def aux_files(checkpoint: Checkpoint) -> list[str]:
    """Tokenizer, generation config, chat templates...: copied unchanged. Only names a Hub
    download would fetch, so a local directory and its Hub copy give the same output."""
    from fnmatch import fnmatch

    names = []
    for path in sorted(checkpoint.root.iterdir()):
        name = path.name
        if not path.is_file() or name.startswith(".") or name in NOT_COPIED or name.endswith(".safetensors"):
            continue
        if any(fnmatch(name, pattern) for pattern in hub.CHECKPOINT_PATTERNS):
            names.append(name)
    return names
