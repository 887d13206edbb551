"""The GGUF file's general.* keys and provenance, and the private copy of the checkpoint's small
files that the gguf package's readers (SpecialVocab, Metadata) take: they open files by path, so
they get copies made through safe_files (regular files inside the checkpoint only), never the
checkpoint itself.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import gguf

from w4cli.read.safe_files import read_regular

# what SpecialVocab and Metadata read: tokenizer, special tokens, chat template, model card, config
STAGED_FILES = (
    "tokenizer.model",
    "added_tokens.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "config.json",
    "generation_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "README.md",
)
FILE_MAX_BYTES = 64 * 1024 * 1024
W4_PREFIX = "w4."  # w4's own keys: w4.source, w4.source_revision, w4.version, w4.command


@contextmanager
def staged(root: Path, name: str) -> Iterator[Path]:
    """A temporary directory named `name` (the model's name: Metadata reads it as a fallback)
    holding checked copies of the checkpoint's STAGED_FILES that exist."""
    with tempfile.TemporaryDirectory(prefix="w4-gguf-") as parent:
        directory = Path(parent) / (name.replace("/", "--") or "model")
        directory.mkdir()
        for file in STAGED_FILES:
            if os.path.lexists(root / file):  # a dangling link or a directory is refused, not skipped
                (directory / file).write_bytes(read_regular(root / file, root, FILE_MAX_BYTES))
        yield directory


def write_general(writer: gguf.GGUFWriter, staged_dir: Path, name: str, provenance: dict[str, str], repo_id: str | None) -> None:
    """general.* from the model card and config, as llama.cpp's converter derives them (the size
    label from the tensor infos already in `writer`); the source repository; w4's provenance keys
    (w4cli/write/provenance.py) under w4.*."""
    writer.add_type(gguf.GGUFType.MODEL)
    total, shared, expert, experts = writer.get_total_parameter_count()  # from the tensor infos
    metadata = gguf.Metadata.load(None, staged_dir, name, total)
    if metadata.size_label is None and total > 0:  # "7B", "8x7B", as llama.cpp's converter labels it
        metadata.size_label = gguf.size_label(total, shared, expert, experts)
    if repo_id:
        metadata.source_repo_url = f"https://huggingface.co/{repo_id}"
    metadata.set_gguf_meta_model(writer)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, value in provenance.items():
        writer.add_string(W4_PREFIX + key.removeprefix("w4_"), value)
