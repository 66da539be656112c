"""The tokenizer a llama.cpp GGUF file's metadata describes (``tokenizer.ggml.*``), built
lazily (docs/internals.md, "GGUF")."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from headscope.engine.formats.gguf import GGUFHeader, StringArray
from headscope.engine.formats.tokenizer import (
    TOKEN_DISPLAY,
    HFTokenizer,
    IdTokenizer,
    Tokenizer,
    display_token,
)
from headscope.engine.formats.vocabulary import readable_words


class GGUFVocabTokenizer(IdTokenizer):
    """Token strings from the metadata for display; prompts are token ids (no usable model)."""

    def __init__(self, tokens: list[str], vocab_size: int, path: str | None = None) -> None:
        super().__init__(vocab_size, path)
        self.tokens = tokens
        self._ids = {t: i for i, t in reversed(list(enumerate(tokens)))}

    def decode_token(self, token_id: int) -> str:
        if 0 <= token_id < len(self.tokens):
            return self.tokens[token_id].translate(TOKEN_DISPLAY)
        return f"<{token_id}>"

    def token_to_id(self, token: str) -> int | None:
        i = self._ids.get(token)
        return i if i is not None else super().token_to_id(token)


def gguf_tokenizer(header: GGUFHeader, d_vocab: int) -> Tokenizer:
    """The tokenizer the metadata describes, built with ``tokenizers`` as ``transformers``'
    converters build fast tokenizers:

    - ``tokenizer.ggml.model == "gpt2"`` (byte-level BPE: Llama 3, Qwen2): BPE over ``tokens``
      and ``merges``; the split regex of ``tokenizer.ggml.pre`` when it is one headscope knows
      (``llama-bpe``, ``qwen2``; ``_PRE_TOKENIZER_REGEX``), GPT-2's otherwise;
    - ``"llama"`` (SentencePiece BPE: Llama 1/2, Gemma, Phi-3): BPE whose merges come from the
      pieces' ``scores`` (``transformers``' ``SentencePieceExtractor``), byte fallback, spaces as
      ``▁`` and one prepended (the "legacy" Llama behaviour);
    - anything else, or a table that does not build: the token strings for display, prompts as
      token ids. No tokens at all: ``IdTokenizer``.

    Either is built on the first prompt, not at open (``LazyTokenizer``).
    """
    tokens = header.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        return IdTokenizer(d_vocab, header.path)
    kind = header.get("tokenizer.ggml.model")
    if kind == "gpt2":
        merges = header.get("tokenizer.ggml.merges") or []
        pre = header.get("tokenizer.ggml.pre")
        return LazyTokenizer(tokens, lambda: _bpe(tokens, merges, pre), d_vocab, header.path)
    if kind == "llama":
        scores = header.get("tokenizer.ggml.scores")
        return LazyTokenizer(tokens, lambda: _spm(tokens, scores), d_vocab, header.path)
    return GGUFVocabTokenizer(tokens, d_vocab, header.path)


def readable_ids(header: GGUFHeader, n: int) -> tuple[int, ...]:
    """The QK/OV token set shown when the user names none (``vocabulary.readable_words``),
    from the metadata's token table, token types (llama.cpp's: 1 normal, 2 unknown, 3 control,
    4 user-defined, 5 unused, 6 byte) and SentencePiece scores."""
    # Metadata of any declared type reaches here (a hostile file's too): what is not a list of
    # strings, or numbers, is left out rather than failing the model's open.
    # The table as read (a StringArray: only the strings looked at are decoded, not 32k+).
    tokens = getattr(header, "metadata", header).get("tokenizer.ggml.tokens")
    if n <= 0 or not (isinstance(tokens, StringArray)
                      or (isinstance(tokens, list) and all(isinstance(t, str) for t in tokens))):
        return ()
    return readable_words(tokens, n, types=_numbers(header.get("tokenizer.ggml.token_type"), len(tokens)),
                          scores=_numbers(header.get("tokenizer.ggml.scores"), len(tokens)))


def _numbers(values: Any, n: int) -> np.ndarray | None:
    """``values`` as ``n`` float64 numbers (a copy), or None if it is not that."""
    if values is None or isinstance(values, str | bytes):
        return None
    try:
        out = np.array(values, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return out if out.shape == (n,) else None


class LazyTokenizer:
    """A metadata tokenizer that is built (``tokenizers``' BPE from the token table) on the
    first prompt. Building a 32k-piece SentencePiece table is about 0.5-1 s of Python (every
    split of every piece is ranked), and opening a model only needs token strings and ids,
    which come from the table itself: the first head view of a 7B GGUF file must take less
    than 1 s (bench/README.md, "GGUF"). A table ``tokenizers`` refuses leaves the token
    strings for display and prompts as token ids (``GGUFVocabTokenizer``), as before."""

    def __init__(self, tokens: list[str], build: Callable[[], Any], d_vocab: int,
                 path: str | None = None) -> None:
        self.tokens = tokens
        self.path = path
        # As the built BPE's vocabulary: a repeated piece keeps its first id, later copies
        # have none (``id_to_token`` gives None for them).
        self._ids = {t: i for i, t in reversed(list(enumerate(tokens)))}
        self.vocab_size: int = len(self._ids)
        self._build = build
        self._d_vocab = d_vocab
        self._lock = threading.Lock()
        self._built: Tokenizer | None = None

    def _tokenizer(self) -> Tokenizer:
        with self._lock:
            if self._built is None:
                try:
                    self._built = HFTokenizer(self._build(), self.path)
                except Exception:  # a table tokenizers refuses: fall back to display only
                    self._built = GGUFVocabTokenizer(self.tokens, self._d_vocab, self.path)
            return self._built

    def reads_text(self) -> bool:
        return not isinstance(self._tokenizer(), IdTokenizer)

    def encode(self, text: str) -> list[int]:
        return self._tokenizer().encode(text)

    def decode_token(self, token_id: int) -> str:
        token = self.tokens[token_id] if 0 <= token_id < len(self.tokens) else None
        return display_token(token if token is not None and self._ids[token] == token_id
                             else None, token_id)

    def token_to_id(self, token: str) -> int | None:
        return self._ids.get(token)


# The split regexes of the byte-level BPE tokenizers (their tokenizer.json pre_tokenizer), by
# llama.cpp's ``tokenizer.ggml.pre`` name.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_TOKENIZER_REGEX = {"llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT}


def _bpe(tokens: list[str], merges: list[Any], pre: Any = None) -> Any:
    from tokenizers import Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as RustTokenizer

    vocab = {t: i for i, t in reversed(list(enumerate(tokens)))}
    pairs = []
    for m in merges:
        a, sep, b = str(m).partition(" ")
        if sep and a in vocab and b in vocab and a + b in vocab:
            pairs.append((a, b))
    tok = RustTokenizer(models.BPE(vocab, pairs, ignore_merges=pre in _PRE_TOKENIZER_REGEX))
    regex = _PRE_TOKENIZER_REGEX.get(pre) if isinstance(pre, str) else None
    if regex is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    tok.decoder = decoders.ByteLevel()
    return tok


def _spm(tokens: list[str], scores: Any) -> Any:
    """SentencePiece BPE as ``transformers``' LlamaConverter builds it: a merge for every split
    of a piece into two pieces, ranked by the merged piece's score."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, normalizers

    if not isinstance(scores, list) or len(scores) != len(tokens):
        scores = [0.0] * len(tokens)
    vocab = {t: i for i, t in reversed(list(enumerate(tokens)))}
    ranked = []
    for piece, score in zip(tokens, scores, strict=True):
        value = float(score) if isinstance(score, int | float) and math.isfinite(score) else 0.0
        local = [(piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab]
        local.sort(key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))
        ranked += [(value, i, pair) for i, pair in enumerate(local)]
    ranked.sort(key=lambda r: -r[0])  # stable: equal scores keep the order above
    unk = tokens[0] if tokens[0] == "<unk>" else ("<unk>" if "<unk>" in vocab else None)
    tok = RustTokenizer(models.BPE(vocab, [pair for _, _, pair in ranked], unk_token=unk, fuse_unk=True,
                                   byte_fallback=any(t.startswith("<0x") for t in tokens)))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return tok
