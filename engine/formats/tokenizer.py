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
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from headscope.engine.core.errors import CorruptFileError, HeadscopeError, PromptError
from headscope.engine.core.files import MAX_CONFIG_BYTES, loads_json, read_bytes, read_text

# Byte-level BPE (GPT-2, NeoX, Llama 3, Qwen2) spells bytes as printable characters; the
# ones that matter for reading tokens are the space and newline markers.
TOKEN_DISPLAY = str.maketrans({"Ġ": " ", "Ċ": "\n", "ĉ": "\t", "▁": " "})
MAX_TOKENIZER_BYTES = 200_000_000
_BERT_SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# What a tokenizer is built from, in the order ``load_tokenizer`` prefers them, and the
# config it reads beside a WordPiece vocabulary.
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


@runtime_checkable
class Tokenizer(Protocol):
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode_token(self, token_id: int) -> str: ...

    def token_to_id(self, token: str) -> int | None: ...


def display_token(token: str | None, token_id: int) -> str:
    """How a vocabulary entry is shown: ``<id>`` for an id without one, WordPiece's ``##``
    dropped, SentencePiece byte tokens (``<0x0A>``) as they are, space and newline markers as
    the characters they stand for (``TOKEN_DISPLAY``)."""
    if token is None:
        return f"<{token_id}>"
    if token.startswith("##"):  # WordPiece continuation
        return token[2:]
    if re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", token):  # SentencePiece byte fallback
        return token
    return token.translate(TOKEN_DISPLAY)


def reads_text(tokenizer: Tokenizer) -> bool:
    """Whether prompts are text: not for ``IdTokenizer`` (token ids), nor for a tokenizer
    built on first use that could not be built (``reads_text()`` of its own)."""
    probe = getattr(tokenizer, "reads_text", None)
    return bool(probe()) if callable(probe) else not isinstance(tokenizer, IdTokenizer)


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

        text = read_text(path, MAX_TOKENIZER_BYTES, CorruptFileError, "tokenizer file")
        with rust_guard(path, "cannot read tokenizer", quiet=True):
            tok = RustTokenizer.from_str(text)
            # Prompts are encoded as typed: the file's truncation and padding do not apply
            # (and a stride >= max_length, or a huge fixed padding, panics in Rust).
            tok.no_truncation()
            tok.no_padding()
            tokenizer = cls(tok, str(path))
        with rust_guard(path, "tokenizer fails on a test prompt", quiet=True):
            tok.encode("a b", add_special_tokens=False)  # fail at open, not at every prompt
        return tokenizer

    @classmethod
    def from_wordpiece_vocab(
        cls, path: str | os.PathLike[str], lowercase: bool = True
    ) -> HFTokenizer:
        """BERT's WordPiece ``vocab.txt`` (no special tokens are added to prompts; typed
        ``[CLS]``, ``[SEP]``, ``[MASK]`` ... are recognised as one token each)."""
        from tokenizers import Tokenizer as RustTokenizer
        from tokenizers import models, normalizers, pre_tokenizers

        text = read_text(path, MAX_TOKENIZER_BYTES, CorruptFileError, "WordPiece vocabulary")
        lines = text.split("\n")
        if lines and not lines[-1]:
            lines.pop()
        # As tokenizers' WordPiece.read_file: line i is token i, trailing whitespace trimmed.
        vocab = {line.rstrip(): i for i, line in enumerate(lines)}
        unk = "[UNK]" if "[UNK]" in vocab else next(iter(vocab), "[UNK]")
        with rust_guard(path, "cannot read WordPiece vocabulary", quiet=True):
            tok = RustTokenizer(models.WordPiece(vocab, unk_token=unk))
        tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        # Typed special tokens are one token each, as with a tokenizer.json (not "[", "cls", "]").
        tok.add_special_tokens([t for t in _BERT_SPECIAL if t in vocab])
        return cls(tok, str(path))

    def encode(self, text: str) -> list[int]:
        if not text.strip():
            raise PromptError(self.path, "empty prompt")
        with rust_guard(self.path, "the tokenizer failed on this prompt", PromptError, quiet=True):
            return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode_token(self, token_id: int) -> str:
        with rust_guard(self.path, f"cannot decode token {token_id}"):
            return display_token(self._tok.id_to_token(token_id), token_id)

    def token_to_id(self, token: str) -> int | None:
        with rust_guard(self.path, f"cannot look up token {token!r}"):
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
        text = read_text(path, MAX_TOKENIZER_BYTES, CorruptFileError, "vocabulary")
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
    """No tokenizer: the prompt is token ids separated by commas and/or spaces.

    ``reason``: why the checkpoint's own tokenizer is not used (it could not be read);
    prompt errors repeat it, since that is where the user meets the missing tokenizer."""

    def __init__(self, vocab_size: int, path: str | None = None, reason: str | None = None) -> None:
        self.vocab_size = vocab_size
        self.path = path
        self.reason = reason

    def why(self) -> str:
        """Why there is no tokenizer, and what to type instead (a lookup error repeats it)."""
        if self.reason:
            return f"this model's tokenizer is unusable ({self.reason}): type token ids, e.g. 3,14,15"
        return "this model has no tokenizer: type token ids, e.g. 3,14,15"

    def encode(self, text: str) -> list[int]:
        parts = [p for p in re.split(r"[,\s]+", text.strip()) if p]
        if not parts:
            raise PromptError(self.path, f"empty prompt ({self.why()})")
        ids = []
        for p in parts:
            if not (p.isascii() and p.isdigit()):
                raise PromptError(self.path, f"{p!r} is not a token id ({self.why()})")
            i = int(p)
            if i >= self.vocab_size:
                raise PromptError(self.path, f"token id {i} out of range 0..{self.vocab_size - 1}")
            ids.append(i)
        return ids

    def decode_token(self, token_id: int) -> str:
        return str(token_id)

    def token_to_id(self, token: str) -> int | None:
        t = token.strip()
        return int(t) if t.isascii() and t.isdigit() and int(t) < self.vocab_size else None


_NOT_PANICS = (KeyboardInterrupt, SystemExit, GeneratorExit)


@contextmanager
def rust_guard(
    path: str | os.PathLike[str] | None, what: str, error: type[HeadscopeError] = CorruptFileError,
    *, quiet: bool = False,
) -> Iterator[None]:
    """Errors of the Rust ``tokenizers`` as one typed line. A Rust panic surfaces as
    ``pyo3_runtime.PanicException``, a ``BaseException``: ``except Exception`` misses it.

    ``quiet``: around the calls that run the file's regexes (building, encoding), where a
    pathological pattern panics; the text Rust's panic hook writes to fd 2 is kept off the
    terminal (``_panic_text_kept_off_stderr``); the one line says what happened."""
    try:
        if quiet:
            with _panic_text_kept_off_stderr():
                yield
        else:
            yield
    except HeadscopeError:
        raise
    except _NOT_PANICS:
        raise
    except BaseException as e:  # Exception, and Rust panics
        kind = "panicked" if _is_panic(e) else "failed"
        first = (str(e) or type(e).__name__).splitlines()[0]
        raise error(path, f"{what}: tokenizers {kind}: {first[:160]}") from None


def _is_panic(e: BaseException) -> bool:
    return type(e).__name__ == "PanicException"


# One redirection of fd 2 at a time (the engine encodes on several worker threads).
_STDERR_LOCK = threading.Lock()


@contextmanager
def _panic_text_kept_off_stderr() -> Iterator[None]:
    """fd 2 points at a scratch file while the body runs. Rust's default panic hook writes
    ``thread '…' panicked at …`` and a ``RUST_BACKTRACE`` note straight to fd 2 (no Python
    stream sees it; in the explorer it lands on the screen): on a panic the scratch file is
    dropped; otherwise what was written meanwhile (another thread's line) is passed on."""
    with _STDERR_LOCK:
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError, AttributeError):  # no fd 2 to protect
            yield
            return
        panicked = False
        try:
            with tempfile.TemporaryFile() as scratch:
                os.dup2(scratch.fileno(), 2)
                try:
                    yield
                except BaseException as e:
                    panicked = _is_panic(e)
                    raise
                finally:
                    os.dup2(saved, 2)
                    if not panicked:
                        _pass_on(scratch.fileno(), saved)
        finally:
            os.close(saved)


def _pass_on(scratch: int, fd: int) -> None:
    """Copy what the scratch file received to ``fd`` (best effort: stderr may be gone)."""
    try:
        size = os.fstat(scratch).st_size
        if size:
            os.lseek(scratch, 0, os.SEEK_SET)
            data = os.read(scratch, size)
            while data:
                data = data[os.write(fd, data):]
    except OSError:
        pass


def load_tokenizer(directory: Path, d_vocab: int, family: str) -> Tokenizer:
    """The best tokenizer a checkpoint directory offers; ``IdTokenizer`` if none."""
    # exists(), not is_file(): a FIFO or device is refused with its reason (engine.core.files).
    if (directory / "tokenizer.json").exists():
        return HFTokenizer.from_file(directory / "tokenizer.json")
    vocab = directory / "vocab.txt"
    if vocab.exists():
        if family == "bert":
            return HFTokenizer.from_wordpiece_vocab(vocab, lowercase=_lowercase(directory))
        return VocabTokenizer.from_file(vocab)
    return IdTokenizer(d_vocab, str(directory))


def _lowercase(directory: Path) -> bool:
    """``do_lower_case`` from ``tokenizer_config.json`` (uncased BERT, the common case, if absent)."""
    path = directory / TOKENIZER_CONFIG_FILE
    if not path.exists():
        return True
    try:
        cfg = loads_json(read_bytes(path, MAX_CONFIG_BYTES, CorruptFileError, path.name),
                         path, CorruptFileError, path.name)
    except CorruptFileError:
        return True
    value = cfg.get("do_lower_case", True) if isinstance(cfg, dict) else True
    return value if isinstance(value, bool) else True
