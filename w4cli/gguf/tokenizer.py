"""The checkpoint's tokenizer as GGUF metadata: vocabulary, merges or scores, token types, special
ids, chat template. w4 reads SentencePiece BPE models (tokenizer.model: Llama 2, Mistral 7B) and
byte-level BPE tokenizers (tokenizer.json with a BPE model and a ByteLevel decoder: Llama 3,
Qwen2/3); for the latter llama.cpp also needs to know the pre-tokenizer, which it names by the
regex the tokenizer splits text with.

The gguf package's SpecialVocab reads the special ids, merges and chat template from a private
copy of the checkpoint's files (w4cli/gguf/metadata.py), never from the checkpoint itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf

from w4cli.errors import InputRefused
from w4cli.gguf.sentencepiece import read_model
from w4cli.read.safe_files import parse_json

TOKENIZER = "tokenizer.json"
SENTENCEPIECE = "tokenizer.model"

LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# the split regex -> the name llama.cpp gives that pre-tokenizer (tokenizer.ggml.pre)
PRE_TOKENIZERS = {LLAMA3_SPLIT: "llama-bpe", QWEN2_SPLIT: "qwen2"}


@dataclass
class Vocabulary:
    tokens: list[str]
    types: list[int]  # gguf.TokenType
    pre: str


def _token_looks_special(text: str) -> bool:
    # added tokens written like <|im_start|> are control tokens even where the file forgets to say
    # so; llama.cpp's converter marks them the same way
    return text.startswith("<|") and text.endswith("|>")


def pre_tokenizer(document: dict[str, Any]) -> str:
    """llama.cpp's name for the tokenizer's pre-tokenizer: GPT-2's byte-level regex, or a Split
    by one of the regexes in PRE_TOKENIZERS followed by a byte-level step without its own regex."""
    pre = document.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    if len(steps) == 1 and steps[0].get("type") == "ByteLevel" and steps[0].get("use_regex", True):
        return "gpt-2"
    if len(steps) == 2 and steps[0].get("type") == "Split" and steps[1].get("type") == "ByteLevel" and not steps[1].get("use_regex", True):
        regex = (steps[0].get("pattern") or {}).get("Regex")
        if regex in PRE_TOKENIZERS:
            return PRE_TOKENIZERS[regex]
    raise InputRefused(
        "tokenizer.json's pre-tokenizer is not one w4 gguf recognizes (GPT-2, Llama 3, Qwen2 byte-level BPE): "
        "llama.cpp would split text differently from the model's own tokenizer"
    )


def vocabulary(document: dict[str, Any], vocab_size: int) -> Vocabulary:
    model = document.get("model") or {}
    decoder = document.get("decoder") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback") or decoder.get("type") != "ByteLevel":
        raise InputRefused(
            "tokenizer.json is not a byte-level BPE tokenizer (BPE model, ByteLevel decoder), the kind w4 gguf converts; "
            "convert with `w4 dequantize`, then with llama.cpp's convert_hf_to_gguf.py"
        )
    by_id: dict[int, str] = {}
    for text, token_id in model.get("vocab", {}).items():
        by_id[int(token_id)] = text
    added = {}
    for entry in document.get("added_tokens", []):
        by_id[int(entry["id"])] = entry["content"]
        added[int(entry["id"])] = entry
    if by_id and max(by_id) >= vocab_size:
        raise InputRefused(f"tokenizer.json has token id {max(by_id)}, beyond config.json vocab_size {vocab_size}")
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        tokens.append(by_id[i])
        if i not in added:
            types.append(gguf.TokenType.NORMAL)
        elif added[i].get("special") or _token_looks_special(by_id[i]):
            types.append(gguf.TokenType.CONTROL)
        else:
            types.append(gguf.TokenType.USER_DEFINED)
    return Vocabulary(tokens, types, pre_tokenizer(document))


def write_tokenizer(writer: gguf.GGUFWriter, staged: Path, vocab_size: int) -> Vocabulary:
    """Add the tokenizer keys to `writer` from the checkpoint's files copied into `staged`
    (w4cli/gguf/metadata.py): a SentencePiece tokenizer.model where there is one (as llama.cpp's
    converter prefers it), else a byte-level BPE tokenizer.json."""
    if (staged / SENTENCEPIECE).is_file():
        return _write_sentencepiece(writer, staged, vocab_size)
    path = staged / TOKENIZER
    if not path.is_file():
        raise InputRefused(f"the checkpoint has no {TOKENIZER} or {SENTENCEPIECE}; llama.cpp needs the tokenizer inside the GGUF")
    vocab = vocabulary(parse_json(path.read_bytes(), TOKENIZER), vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    special = gguf.SpecialVocab(staged, load_merges=True, n_vocab=vocab_size)
    if not special.merges:
        raise InputRefused(f"{TOKENIZER} holds no merges; a BPE tokenizer without them cannot tokenize")
    special.add_to_gguf(writer, quiet=True)
    return vocab


ADDED_SCORE = -1000.0  # the scores llama.cpp's converter gives added tokens
PAD_SCORE = -10000.0  # and ids the model has but the tokenizer does not use


def _write_sentencepiece(writer: gguf.GGUFWriter, staged: Path, vocab_size: int) -> Vocabulary:
    """llama.cpp's "llama" tokenizer: every piece with its score and type, then the tokens the
    checkpoint adds (added_tokens.json, tokenizer_config.json's added_tokens_decoder), ids up to
    config.json's vocab_size padded as unused."""
    model = read_model((staged / SENTENCEPIECE).read_bytes())
    if len(model.pieces) > vocab_size:
        raise InputRefused(f"{SENTENCEPIECE} has {len(model.pieces)} pieces, more than config.json vocab_size {vocab_size}")
    pad = vocab_size - len(model.pieces)
    tokens = model.pieces + [f"[PAD{i}]" for i in range(len(model.pieces), vocab_size)]
    scores = model.scores + [PAD_SCORE] * pad
    types = model.types + [int(gguf.TokenType.UNUSED)] * pad

    def add(token_id: int, text: str, kind: int) -> None:
        if not 0 <= token_id < vocab_size:
            raise InputRefused(f"added token {text!r} has id {token_id}, outside config.json vocab_size {vocab_size}")
        tokens[token_id], scores[token_id], types[token_id] = text, ADDED_SCORE, kind

    if (staged / "added_tokens.json").is_file():
        for text, token_id in parse_json((staged / "added_tokens.json").read_bytes(), "added_tokens.json").items():
            add(int(token_id), text, int(gguf.TokenType.USER_DEFINED))
    if (staged / "tokenizer_config.json").is_file():
        config = parse_json((staged / "tokenizer_config.json").read_bytes(), "tokenizer_config.json")
        for token_id, entry in (config.get("added_tokens_decoder") or {}).items():
            text = str(entry.get("content", ""))
            if entry.get("special") or _token_looks_special(text):
                add(int(token_id), text, int(gguf.TokenType.CONTROL))
            else:  # user-defined tokens are matched before normalization: spaces as spaces
                add(int(token_id), text.replace("\u2581", " "), int(gguf.TokenType.USER_DEFINED))
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_add_space_prefix(model.add_dummy_prefix)
    gguf.SpecialVocab(staged, n_vocab=vocab_size).add_to_gguf(writer, quiet=True)
    return Vocabulary(tokens, types, "default")
