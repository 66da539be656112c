"""The QK/OV token set shown when the user names none: tokens a reader recognises, picked from
a vocabulary's token table alone (no tokenizer built), for GGUF metadata
(``formats.gguf_tokenizer.readable_ids``) and a Hugging Face ``tokenizer.json``
(``tokenizer_json_ids``) alike; computed when the structure is built (``LazyIds``), not when the header is read.

The first ids of a SentencePiece or byte-level vocabulary are ``<unk>``, ``<s>`` and the 256
byte tokens; the frequent whole words come after them.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np

# What starts a word in a vocabulary: SentencePiece's space, byte-level BPE's space.
WORD_START = ("▁", "Ġ")
WORD_LETTERS = 3  # "▁th" and "▁st" are pieces of words, "▁the" and "▁and" words
NORMAL = 1  # llama.cpp's token type of an ordinary piece (tokenizer.ggml.token_type)
CONTROL = 3


def readable_words(tokens: Sequence[str], n: int, *, types: np.ndarray | None = None,
                   scores: np.ndarray | None = None) -> tuple[int, ...]:
    """``n`` ids of ``tokens`` a reader recognises: normal tokens (type ``NORMAL`` where
    ``types`` are given; never ``<...>`` pieces) that are a word start followed by at least
    three ASCII letters (a byte-level vocabulary spells other scripts as mapped bytes, which
    would be shown as noise), the most frequent first: highest score where there are
    ``scores`` (SentencePiece), else lowest id (a BPE vocabulary is in merge order, a
    converted SentencePiece one in score order). Fewer than ``n`` words: the other normal
    tokens fill up, in id order. No such word at all (a character-level or made-up
    vocabulary): ``()``, and the caller keeps the first ids."""
    if n <= 0:
        return ()
    order: Iterable[int] = range(len(tokens))
    if scores is not None:
        scores = np.where(np.isfinite(scores), scores, -np.inf)
        order = np.argsort(-scores, kind="stable").tolist()  # equal scores in id order

    def normal(i: int) -> bool:
        t = tokens[i]
        if not t.isprintable() or (t.startswith("<") and t.endswith(">")):
            return False
        return types is None or types[i] == NORMAL

    def word(i: int) -> bool:
        t = tokens[i]
        rest = t[1:]
        return (t[:1] in WORD_START and len(rest) >= WORD_LETTERS and rest.isascii()
                and rest.isalpha() and normal(i))

    # The first n in that order: a 128k table is walked only as far as its n-th word.
    chosen = list(itertools.islice((i for i in order if word(i)), n))
    if not chosen:
        return ()
    if len(chosen) < n:
        taken = set(chosen)
        chosen += itertools.islice((i for i in range(len(tokens)) if i not in taken and normal(i)),
                                   n - len(chosen))
    return tuple(chosen)


def tokenizer_json_ids(path: str | os.PathLike[str], n: int, d_vocab: int) -> tuple[int, ...]:
    """``readable_words`` of a Hugging Face ``tokenizer.json``: its model's vocabulary (BPE and
    WordPiece: piece → id; Unigram: ``[piece, score]`` in id order, the scores used), its
    special added tokens as control tokens. Anything unreadable gives ``()`` (the first ids):
    the default token set never fails a model."""
    try:
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
        return _json_ids(spec, n, d_vocab)
    except (OSError, ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError):
        return ()


def _json_ids(spec: dict[str, Any], n: int, d_vocab: int) -> tuple[int, ...]:
    vocab = spec["model"]["vocab"]
    scores = None
    if isinstance(vocab, dict):  # BPE, WordPiece, WordLevel: piece -> id
        size = max((int(i) for i in vocab.values()), default=-1) + 1
        tokens = [""] * min(size, d_vocab)
        for piece, i in vocab.items():
            if 0 <= int(i) < len(tokens) and isinstance(piece, str):
                tokens[int(i)] = piece
    else:  # Unigram: [[piece, score], ...], the id is the position
        pairs = list(vocab)[:d_vocab]
        tokens = [str(p[0]) for p in pairs]
        scores = np.array([float(p[1]) for p in pairs], dtype=np.float64)
    types = np.full(len(tokens), NORMAL)
    for added in spec.get("added_tokens") or ():
        i = int(added["id"])
        if added.get("special") and 0 <= i < len(tokens):
            types[i] = CONTROL
    return readable_words(tokens, n, types=types, scores=scores)


class LazyIds(Sequence[int]):
    """Token ids computed on their first use (``len``, iteration, indexing, ``==``, ``tolist``):
    reading a checkpoint's header (``inspect_checkpoint``) never picks them; building the
    model's structure does (``structure_of`` stores them as a plain list: the structure is
    plain data for JSON, the results store and a cluster's workers). Equal to any sequence of
    the same ids."""

    def __init__(self, compute: Callable[[], Iterable[int]]) -> None:
        self._compute: Callable[[], Iterable[int]] | None = compute
        self._ids: tuple[int, ...] = ()

    @property
    def ids(self) -> tuple[int, ...]:
        compute = self._compute
        if compute is not None:  # two threads may both compute it: the same ids
            self._ids = tuple(int(i) for i in compute())
            self._compute = None
        return self._ids

    @property
    def computed(self) -> bool:
        return self._compute is None

    def __len__(self) -> int:
        return len(self.ids)

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[int, ...]: ...
    def __getitem__(self, index: int | slice) -> int | tuple[int, ...]:
        return self.ids[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return list(self.ids) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def tolist(self) -> list[int]:  # engine.core.export.jsonable writes it as a list
        return list(self.ids)

    def __repr__(self) -> str:  # printing a structure is a use
        return repr(list(self.ids))
