"""Prompts and word-level vocabularies (tui/base/prompt_words.py): the default prompt when the
vocabulary has every word of it, and which prompt words became unknown tokens."""

from __future__ import annotations

from pathlib import Path

from headscope.tui.base.prompt_words import (
    REPEATED_PHRASE,
    VOCAB_LIMIT,
    default_prompt,
    unknown_note,
    unknown_positions,
    vocabulary_hint,
    word_vocabulary,
)
from tests.conftest import sample_model


def write_vocab(folder: Path, words: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    return folder


def test_the_vocabulary_is_read_beside_the_model_file_or_in_its_folder(tmp_path: Path) -> None:
    folder = write_vocab(tmp_path / "m", ["<unk>", "the", "cat"])
    assert word_vocabulary(folder) == {"<unk>", "the", "cat"}
    assert word_vocabulary(folder / "model.safetensors") == {"<unk>", "the", "cat"}
    assert word_vocabulary(tmp_path / "none") is None


def test_a_vocabulary_too_big_to_describe_is_not_read(tmp_path: Path) -> None:
    folder = tmp_path / "big"
    folder.mkdir()
    (folder / "vocab.txt").write_bytes(b"w\n" * (VOCAB_LIMIT // 2 + 1))
    assert word_vocabulary(folder) is None
    assert vocabulary_hint(folder) == ""


def test_the_default_prompt_is_the_repeated_phrase_only_when_every_word_is_known(
        tmp_path: Path) -> None:
    words = sorted(set(REPEATED_PHRASE.split()))
    assert default_prompt(write_vocab(tmp_path / "all", words)) == REPEATED_PHRASE
    assert default_prompt(write_vocab(tmp_path / "most", words[1:])) == ""
    assert default_prompt(tmp_path / "no-vocab") == ""


def test_the_bundled_model_knows_the_repeated_phrase() -> None:
    assert default_prompt(sample_model("attn-only-2l")) == REPEATED_PHRASE


def test_unknown_tokens_are_counted_and_named_when_words_line_up() -> None:
    tokens = ["the", "<unk>", "sat", "[UNK]"]
    assert unknown_positions(tokens) == [1, 3]
    assert unknown_note("the zebra sat quietly", tokens) == \
        "2 of 4 prompt tokens are unknown (<unk>): zebra, quietly"
    # not word-level (the words do not line up with the tokens): counted, not named
    assert unknown_note("the zebra", tokens) == "2 of 4 prompt tokens are unknown (<unk>)"
    assert unknown_note("the cat", ["the", "cat"]) == ""


def test_the_hint_says_how_many_words_the_model_knows(tmp_path: Path) -> None:
    folder = write_vocab(tmp_path / "m", ["<unk>", "the", "cat"])
    assert vocabulary_hint(folder, short=True) == "3-word vocabulary (vocab.txt); others become <unk>"
    assert vocabulary_hint(folder).startswith("word-level vocabulary of 3 words (vocab.txt)")
    assert vocabulary_hint(tmp_path / "none") == ""
