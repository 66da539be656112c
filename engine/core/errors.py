"""Typed errors of the engine.

Every error carries the file it is about (``path``, may be ``None`` when no file is
involved) and a one-line ``reason``. ``str(err)`` is the one line the CLI prints and the
TUI shows as a notification: ``"<path>: <reason>"``.
"""

from __future__ import annotations

import re
import unicodedata
from os import PathLike


class HeadscopeError(Exception):
    """Base class: a problem headscope can explain in one line."""

    def __init__(self, path: str | PathLike[str] | None, reason: str) -> None:
        self.path = None if path is None else str(path)
        self.reason = " ".join(str(reason).split())  # always one line
        super().__init__(self.one_line())

    def one_line(self) -> str:
        """``path: reason``; control characters (in a path, a token) are escaped, so the line
        is safe to print to a terminal."""
        line = f"{self.path}: {self.reason}" if self.path else self.reason
        return escape_line(line)


def escape_line(line: str) -> str:
    """``line`` with control characters (an escape code in a path) shown as ``\\x1b``."""
    return line if line.isprintable() else "".join(map(_visible, line))


def _visible(ch: str) -> str:
    if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Cs"):
        return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"
    return ch


class UnsafeFormatError(HeadscopeError):
    """Pickle-based checkpoints (.bin/.pt/.pth/.ckpt), remote code, hub names."""


class UnsupportedFormatError(HeadscopeError):
    """A directory or file headscope does not know how to read."""


class UnknownArchitectureError(HeadscopeError):
    """config.json names an architecture no adapter supports."""


class CorruptFileError(HeadscopeError):
    """Truncated files, malformed safetensors headers, overlapping offsets, bad dtypes."""


class CheckpointChangedError(CorruptFileError):
    """A weights file was rewritten (in place or replaced) after the model was opened:
    reading on would mix old and new weights, so every read from then on refuses."""


class ConfigError(HeadscopeError):
    """config.json (or native metadata) is missing fields or inconsistent."""


class MissingTensorError(HeadscopeError):
    """A tensor the architecture needs is not in the checkpoint."""


class ShapeMismatchError(HeadscopeError):
    """A tensor has the wrong shape for the architecture."""


class UnsafePathError(HeadscopeError):
    """A shard path escapes the model directory (.., absolute path, symlink out)."""


class IndexOutOfRangeError(HeadscopeError):
    """Layer, head, token id or position out of range."""


class PromptError(HeadscopeError):
    """Empty prompt, or a prompt the tokenizer cannot encode."""


class ResourceLimitError(HeadscopeError):
    """A request would materialise more bytes than the configured limit (or than memory holds)."""


_ALLOCATION = re.compile(r"tried to allocate (\d+) bytes|allocate (\d+) bytes")


def out_of_memory(err: BaseException, path: str | PathLike[str] | None = None,
                  what: str = "this request") -> ResourceLimitError | None:
    """``MemoryError`` (numpy's says its size) or torch's allocator ``RuntimeError`` as a one-line
    ``ResourceLimitError`` saying how much was needed; ``None`` for other errors."""
    if isinstance(err, MemoryError):
        size = getattr(err, "_total_size", None)  # numpy's _ArrayMemoryError knows the request
        needed = f": one allocation of {format_bytes(int(size))} failed" if isinstance(size, int) else ""
    elif isinstance(err, RuntimeError) and any(
        s in str(err).lower() for s in ("allocate memory", "not enough memory", "out of memory")
    ):
        match = _ALLOCATION.search(str(err))
        needed = f": one allocation of {format_bytes(int(match.group(1) or match.group(2)))} " \
                 "failed" if match else ""
    else:
        return None
    return ResourceLimitError(path, f"out of memory: {what} does not fit in memory{needed}")


def format_bytes(n: int) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    size = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} bytes" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} bytes"


class NonFiniteError(HeadscopeError):
    """NaN/inf weights where a finite matrix is required (e.g. before eigvals)."""


class OutputError(HeadscopeError, OSError):
    """An output destination that cannot be written: not a directory, read-only, full.
    Also an ``OSError``, as the failed write it stands for (callers catching that keep working)."""


class CancelledError(HeadscopeError):
    """A request was cancelled because the user moved on, or a sweep was stopped."""

    def __init__(self, reason: str = "cancelled") -> None:
        super().__init__(None, reason)


class ComputeError(HeadscopeError):
    """An unexpected failure inside a computation, wrapped so callers see a typed error."""


class InvalidRequestError(HeadscopeError):
    """A request that does not make sense for this model (e.g. OV in the position basis)."""
