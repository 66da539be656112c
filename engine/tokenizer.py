"""Tokenizers: text -> token ids, and a display string for each token id.

- ``HFTokenizer``: ``tokenizer.json`` through the ``tokenizers`` package (Rust, no torch,
  no ``transformers``); BERT directories with only a WordPiece ``vocab.txt`` use its
  ``BertWordPieceTokenizer``.
- ``VocabTokenizer``: the native ``vocab.txt`` (line ``i`` is token ``i``), word-level.
- ``IdTokenizer``: no tokenizer at all; the prompt is a list of ids, tokens show as ids.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .errors import CorruptFileError, PromptError

# Byte-level BPE (GPT-2, NeoX, Llama 3, Qwen2) spells bytes as printable characters; the
# ones that matter for reading tokens are the space and newline markers.
_DISPLAY = str.maketrans({"Ġ": " ", "Ċ": "\n", "ĉ": "\t", "▁": " "})
MAX_TOKENIZER_BYTES = 200_000_000
_BERT_SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


@runtime_checkable
class Tokenizer(Protocol):
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode_token(self, token_id: int) -> str: ...

    def token_to_id(self, token: str) -> int | None: ...


class HFTokenizer:
    """A ``tokenizers.Tokenizer``; ``encode`` gives exactly the prompt's tokens.

    No special tokens are added (type ``[CLS] ... [SEP]`` to run an encoder the way it was
    trained; special tokens typed in the prompt are recognised), and the padding and
    truncation a ``tokenizer.json`` may enable (sentence-transformers checkpoints pad every
    input to a fixed 128 tokens and cut there) are switched off: padding without an attention
    mask would let every position attend to ``[PAD]``, and truncation is headscope's own, at
    the model's context length, with its own warning (docs/math.md, "Prompts").
    """

    def __init__(self, tok: Any, path: str | None = None) -> None:
        tok.no_padding()
        tok.no_truncation()
        self._tok = tok
        self.path = path
        self.vocab_size: int = tok.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> HFTokenizer:
        from tokenizers import Tokenizer as RustTokenizer

        _check_size(path)
        try:
            return cls(RustTokenizer.from_file(str(path)), str(path))
        except Exception as e:  # the Rust side raises plain Exception on bad JSON
            raise CorruptFileError(path, f"cannot read tokenizer: {str(e)[:160]}") from None

    @classmethod
    def from_wordpiece_vocab(
        cls, path: str | os.PathLike[str], lowercase: bool = True
    ) -> HFTokenizer:
        """BERT's WordPiece ``vocab.txt`` (no special tokens are added to prompts; typed
        ``[CLS]``, ``[SEP]``, ``[MASK]`` ... are recognised as one token each)."""
        from tokenizers import Tokenizer as RustTokenizer
        from tokenizers import models, normalizers, pre_tokenizers

        _check_size(path)
        try:
            vocab = models.WordPiece.read_file(str(path))
            unk = "[UNK]" if "[UNK]" in vocab else next(iter(vocab), "[UNK]")
            tok = RustTokenizer(models.WordPiece(vocab, unk_token=unk))
        except Exception as e:
            raise CorruptFileError(
                path, f"cannot read WordPiece vocabulary: {str(e)[:160]}"
            ) from None
        tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        # Typed special tokens are one token each, as with a tokenizer.json (not "[", "cls", "]").
        tok.add_special_tokens([t for t in _BERT_SPECIAL if t in vocab])
        return cls(tok, str(path))

    def encode(self, text: str) -> list[int]:
        if not text.strip():
            raise PromptError(self.path, "empty prompt")
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode_token(self, token_id: int) -> str:
        token = self._tok.id_to_token(token_id)
        if token is None:
            return f"<{token_id}>"
        if token.startswith("##"):  # WordPiece continuation
            return token[2:]
        if re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", token):  # SentencePiece byte fallback
            return token
        return token.translate(_DISPLAY)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)


class VocabTokenizer:
    """Word-level: whitespace-split words looked up in ``vocab.txt`` (one token per line)."""

    def __init__(self, tokens: list[str], path: str | None = None) -> None:
        self.path = path
        self.tokens = tokens
        self._ids: dict[str, int] = {}
        for i, t in enumerate(tokens):
            self._ids.setdefault(t, i)
        self.vocab_size = len(tokens)
        self._unk = self._ids.get("<unk>")

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> VocabTokenizer:
        _check_size(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise CorruptFileError(path, f"cannot read vocabulary: {e}") from None
        return cls(text.split("\n")[:-1] if text.endswith("\n") else text.split("\n"), str(path))

    def encode(self, text: str) -> list[int]:
        words = text.split()
        if not words:
            raise PromptError(self.path, "empty prompt")
        ids = []
        for w in words:
            i = self._ids.get(w, self._unk)
            if i is None:
                raise PromptError(
                    self.path, f"word {w!r} is not in the vocabulary (and it has no <unk>)"
                )
            ids.append(i)
        return ids

    def decode_token(self, token_id: int) -> str:
        return self.tokens[token_id] if 0 <= token_id < len(self.tokens) else f"<{token_id}>"

    def token_to_id(self, token: str) -> int | None:
        return self._ids.get(token)


class IdTokenizer:
    """No tokenizer: the prompt is token ids separated by commas and/or spaces."""

    def __init__(self, vocab_size: int, path: str | None = None) -> None:
        self.vocab_size = vocab_size
        self.path = path

    def encode(self, text: str) -> list[int]:
        parts = [p for p in re.split(r"[,\s]+", text.strip()) if p]
        if not parts:
            raise PromptError(
                self.path,
                "empty prompt (this model has no tokenizer: type token ids, e.g. 3,14,15)",
            )
        ids = []
        for p in parts:
            if not re.fullmatch(r"\d+", p):
                raise PromptError(
                    self.path,
                    f"{p!r} is not a token id (this model has no tokenizer: type ids, e.g. 3,14,15)",
                )
            i = int(p)
            if i >= self.vocab_size:
                raise PromptError(self.path, f"token id {i} out of range 0..{self.vocab_size - 1}")
            ids.append(i)
        return ids

    def decode_token(self, token_id: int) -> str:
        return str(token_id)

    def token_to_id(self, token: str) -> int | None:
        t = token.strip()
        return int(t) if t.isdigit() and int(t) < self.vocab_size else None


def _check_size(path: str | os.PathLike[str]) -> None:
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise CorruptFileError(path, f"cannot read tokenizer: {e.strerror or e}") from None
    if size > MAX_TOKENIZER_BYTES:
        raise CorruptFileError(
            path, f"tokenizer file is {size} bytes, over the {MAX_TOKENIZER_BYTES}-byte limit"
        )


def load_tokenizer(directory: Path, d_vocab: int, family: str) -> Tokenizer:
    """The best tokenizer a checkpoint directory offers; ``IdTokenizer`` if none."""
    if (directory / "tokenizer.json").is_file():
        return HFTokenizer.from_file(directory / "tokenizer.json")
    vocab = directory / "vocab.txt"
    if vocab.is_file():
        if family == "bert":
            return HFTokenizer.from_wordpiece_vocab(vocab, lowercase=_lowercase(directory))
        return VocabTokenizer.from_file(vocab)
    return IdTokenizer(d_vocab, str(directory))


def _lowercase(directory: Path) -> bool:
    """``do_lower_case`` from ``tokenizer_config.json`` (uncased BERT, the common case, if absent)."""
    import json

    try:
        cfg = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return True
    value = cfg.get("do_lower_case", True) if isinstance(cfg, dict) else True
    return value if isinstance(value, bool) else True
