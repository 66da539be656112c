"""Tokenizers (engine/formats/tokenizer.py): tokenizer.json through the tokenizers package, byte-level display, WordPiece, vocabularies and token ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from headscope.engine.core.errors import (
    CorruptFileError,
    PromptError,
)
from headscope.engine.formats.tokenizer import HFTokenizer, IdTokenizer, VocabTokenizer, rust_guard
from headscope.engine.model.loading import load_model
from tests.engine.test_hostile_io import _panic_exception


def test_hf_tokenizer_from_tokenizer_json(gpt2_dir: tuple[Path, Any]) -> None:
    tok = load_model(gpt2_dir[0]).tokenizer
    assert isinstance(tok, HFTokenizer) and tok.vocab_size == 96
    assert tok.encode("the cat sat on zebra") == [1, 2, 3, 4, 0]
    assert (
        tok.decode_token(2) == "cat"
        and tok.token_to_id("dog") == 7
        and tok.token_to_id("zebra") is None
    )


def test_byte_level_display_and_wordpiece(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({"Ġthe": 0, "ĊĊ": 1, "x": 2}, unk_token="x")).save(
        str(tmp_path / "t.json")
    )
    tok = HFTokenizer.from_file(tmp_path / "t.json")
    assert [tok.decode_token(i) for i in range(3)] == [" the", "\n\n", "x"]
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\nplay\n##ing\n")
    wp = HFTokenizer.from_wordpiece_vocab(tmp_path / "vocab.txt")
    assert wp.encode("playing") == [2, 3] and wp.decode_token(3) == "ing"


def test_vocab_and_id_tokenizers() -> None:

    v = VocabTokenizer(["<unk>", "a", "b"])
    assert v.encode("a b c") == [1, 2, 0]
    with pytest.raises(PromptError, match="not in the vocabulary"):
        VocabTokenizer(["a", "b"]).encode("a c")
    with pytest.raises(PromptError, match="empty"):
        v.encode("   ")
    ids = IdTokenizer(100)
    assert ids.encode("3, 14 15,92") == [3, 14, 15, 92] and ids.decode_token(7) == "7"
    with pytest.raises(PromptError, match="out of range"):
        ids.encode("100")
    with pytest.raises(PromptError, match="not a token id"):
        ids.encode("3 x")


def test_wordpiece_vocabulary_reads_like_the_tokenizers_package(tmp_path: Path) -> None:
    from tokenizers import models

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\nthe \ncat\r\nthe\n##s\n\n")
    ours = HFTokenizer.from_wordpiece_vocab(vocab)._tok.get_vocab()
    assert ours == models.WordPiece.read_file(str(vocab))


def test_rust_panic_is_a_typed_error() -> None:
    panic = _panic_exception()
    expected = r"^x\.json: cannot read tokenizer: tokenizers panicked: boom$"
    with pytest.raises(CorruptFileError, match=expected), rust_guard("x.json", "cannot read tokenizer"):
        raise panic("boom\nstack backtrace: ...")
    with pytest.raises(KeyboardInterrupt), rust_guard("x.json", "cannot read tokenizer"):
        raise KeyboardInterrupt
