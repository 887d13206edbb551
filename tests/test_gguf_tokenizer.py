"""The tokenizer keys of a GGUF: w4's reader of SentencePiece's tokenizer.model against the
sentencepiece library; malformed or unsupported tokenizers refused with one line."""

from __future__ import annotations

import io

import gguf
import pytest

from tests.gguf_models import CORPUS, build, train_sentencepiece
from w4cli.errors import InputRefused
from w4cli.gguf.sentencepiece import read_model


def test_pieces_scores_and_types_as_sentencepiece_reads_them():
    import sentencepiece

    data = train_sentencepiece()
    model = read_model(data)
    reference = sentencepiece.SentencePieceProcessor(model_proto=data)
    assert len(model.pieces) == reference.vocab_size()
    assert model.pieces == [reference.id_to_piece(i) for i in range(reference.vocab_size())]
    assert model.scores == [reference.get_score(i) for i in range(reference.vocab_size())]
    kinds = []
    for i in range(reference.vocab_size()):
        kind = gguf.TokenType.NORMAL
        if reference.is_unknown(i):
            kind = gguf.TokenType.UNKNOWN
        elif reference.is_control(i):
            kind = gguf.TokenType.CONTROL
        elif reference.is_byte(i):
            kind = gguf.TokenType.BYTE
        kinds.append(kind)
    assert model.types == kinds
    assert model.types.count(gguf.TokenType.BYTE) == 256 and model.add_dummy_prefix


@pytest.mark.parametrize("cut", [1, 7, 100, -3])
def test_a_truncated_model_is_refused(cut):
    data = train_sentencepiece()
    with pytest.raises(InputRefused, match="tokenizer.model is not a SentencePiece model w4 reads"):
        read_model(data[:cut] if cut > 0 else data[:cut] + b"\x0a\xff")


def test_a_unigram_model_is_refused():
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS * 20), model_writer=model, model_type="unigram",
                                             vocab_size=100, hard_vocab_limit=False, minloglevel=2)
    with pytest.raises(InputRefused, match="model type is 1, not BPE"):
        read_model(model.getvalue())


def test_sentencepiece_keys(w4, tmp_path):
    import sentencepiece

    source = build(tmp_path / "m", "llama2", layers=1)
    out = tmp_path / "out.gguf"
    assert w4("gguf", source, out).exit_code == 0
    value = {name: field.contents() for name, field in gguf.GGUFReader(out).fields.items()}
    reference = sentencepiece.SentencePieceProcessor(model_file=str(source / "tokenizer.model"))
    assert value["tokenizer.ggml.model"] == "llama" and value["tokenizer.ggml.pre"] == "default"
    assert value["tokenizer.ggml.tokens"][: reference.vocab_size()] == [reference.id_to_piece(i) for i in range(reference.vocab_size())]
    assert value["tokenizer.ggml.tokens"][-1] == f"[PAD{reference.vocab_size() + 2}]"
    assert value["tokenizer.ggml.add_space_prefix"] is True
    assert value["tokenizer.ggml.bos_token_id"] == 1 and value["tokenizer.ggml.eos_token_id"] == 2
    result = w4("verify", out, "--against", source)
    assert result.exit_code == 0, result.stdout
