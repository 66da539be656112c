"""Prompts and word-level vocabularies: the sample models know a few hundred words.

A word outside the vocabulary becomes ``<unk>`` silently in the tokenizer; the explorer and
``headscope forward`` say how many did and which (a word-level tokenizer encodes one token per
whitespace-separated word, so the words line up with the tokens).
"""

from __future__ import annotations

from pathlib import Path

# The README's repeated phrase: the second "When Mary and John went to the store" is where
# an induction head attends to the token after the first occurrence.
REPEATED_PHRASE = ("When Mary and John went to the store , John gave a drink to Mary . "
                   "When Mary and John went to the store")
UNKNOWN = ("<unk>", "[UNK]")
VOCAB_LIMIT = 1 << 20  # bytes of vocab.txt read to describe it


def word_vocabulary(model_path: str | Path) -> set[str] | None:
    """The words of a word-level model (its ``vocab.txt``), or None for other tokenizers."""
    path = Path(model_path)
    vocab = path / "vocab.txt" if path.is_dir() else path.with_name("vocab.txt")
    try:
        if not vocab.is_file() or vocab.stat().st_size > VOCAB_LIMIT:
            return None
        return set(vocab.read_text(encoding="utf-8").splitlines())
    except (OSError, UnicodeDecodeError):
        return None


def default_prompt(model_path: str | Path) -> str:
    """The repeated phrase when the model's vocabulary has every word of it, else ''."""
    words = word_vocabulary(model_path)
    if words and all(w in words for w in REPEATED_PHRASE.split()):
        return REPEATED_PHRASE
    return ""


def unknown_positions(token_strings: list[str]) -> list[int]:
    return [i for i, s in enumerate(token_strings) if s in UNKNOWN]


def unknown_note(prompt: str, token_strings: list[str]) -> str:
    """``"2 of 6 prompt tokens are unknown (<unk>): zebra, sat"``, or '' when none is."""
    where = unknown_positions(token_strings)
    if not where:
        return ""
    words = prompt.split()
    named = ""
    if len(words) == len(token_strings):  # word-level: the words line up with the tokens
        named = ": " + ", ".join(words[i] for i in where)
    return (f"{len(where)} of {len(token_strings)} prompt tokens are unknown "
            f"({token_strings[where[0]]}){named}")


def vocabulary_hint(model_path: str | Path, short: bool = False) -> str:
    """Where the prompt is typed: what a word-level model understands ('' otherwise)."""
    words = word_vocabulary(model_path)
    if not words:
        return ""
    if short:
        return f"{len(words)}-word vocabulary (vocab.txt); others become <unk>"
    return (f"word-level vocabulary of {len(words)} words (vocab.txt): separate words and "
            "punctuation by spaces; other words become <unk>")
