"""Typed errors of the engine.

Every error carries the file it is about (``path``, may be ``None`` when no file is
involved) and a one-line ``reason``. ``str(err)`` is the one line the CLI prints and the
TUI shows as a notification: ``"<path>: <reason>"``.
"""

from __future__ import annotations

from os import PathLike


class HeadscopeError(Exception):
    """Base class: a problem headscope can explain in one line."""

    def __init__(self, path: str | PathLike[str] | None, reason: str) -> None:
        self.path = None if path is None else str(path)
        self.reason = " ".join(str(reason).split())  # always one line
        super().__init__(self.one_line())

    def one_line(self) -> str:
        return f"{self.path}: {self.reason}" if self.path else self.reason


class UnsafeFormatError(HeadscopeError):
    """Pickle-based checkpoints (.bin/.pt/.pth/.ckpt), remote code, hub names."""


class UnsupportedFormatError(HeadscopeError):
    """A directory or file headscope does not know how to read."""


class UnknownArchitectureError(HeadscopeError):
    """config.json names an architecture no adapter supports."""


class CorruptFileError(HeadscopeError):
    """Truncated files, malformed safetensors headers, overlapping offsets, bad dtypes."""


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
    """A request would materialise more bytes than the configured limit."""


class NonFiniteError(HeadscopeError):
    """NaN/inf weights where a finite matrix is required (e.g. before eigvals)."""


class CancelledError(HeadscopeError):
    """A request was cancelled because the user moved on, or a sweep was stopped."""

    def __init__(self, reason: str = "cancelled") -> None:
        super().__init__(None, reason)


class ComputeError(HeadscopeError):
    """An unexpected failure inside a computation, wrapped so callers see a typed error."""


class InvalidRequestError(HeadscopeError):
    """A request that does not make sense for this model (e.g. OV in the position basis)."""
