"""Typed errors of the engine (engine/core/errors.py): one line, `path: reason`, safe to print; out of memory says how much."""

from __future__ import annotations

import pytest

from headscope.engine.core.errors import (
    CancelledError,
    ConfigError,
    CorruptFileError,
    HeadscopeError,
    InvalidRequestError,
    NonFiniteError,
    OutputError,
    ResourceLimitError,
    escape_line,
    format_bytes,
    out_of_memory,
)
from tests.engine.test_hostile_io import ALLOCATOR_ERROR


def test_out_of_memory_errors_say_how_much() -> None:
    err = out_of_memory(RuntimeError(ALLOCATOR_ERROR), "m", "reading tensor 'wte'")
    assert isinstance(err, ResourceLimitError)
    assert str(err) == "m: out of memory: reading tensor 'wte' does not fit in memory: one allocation of 80.0 GiB failed"
    assert "out of memory" in str(out_of_memory(MemoryError(), "m"))
    assert out_of_memory(RuntimeError("shape mismatch"), "m") is None
    assert out_of_memory(ValueError("can't allocate memory"), "m") is None


def test_an_error_is_one_line_naming_its_file() -> None:
    err = ConfigError("models/x/config.json", "n_head must divide\n  d_model   (got 5)")
    assert str(err) == "models/x/config.json: n_head must divide d_model (got 5)"
    assert (err.path, err.reason) == ("models/x/config.json", "n_head must divide d_model (got 5)")
    assert str(InvalidRequestError(None, "k must be positive")) == "k must be positive"
    assert str(CancelledError()) == "cancelled" and CancelledError().path is None


def test_control_characters_in_a_path_are_escaped_not_printed() -> None:
    err = CorruptFileError("evil\x1b[2J\u202e.safetensors", "truncated")
    assert str(err) == "evil\\x1b[2J\\u202e.safetensors: truncated"
    assert str(err).isprintable()
    assert escape_line("plain line") == "plain line"


def test_every_error_is_a_headscope_error_and_output_errors_are_os_errors() -> None:
    for cls in (ConfigError, CorruptFileError, InvalidRequestError, NonFiniteError, OutputError):
        assert issubclass(cls, HeadscopeError)
    assert issubclass(OutputError, OSError)
    with pytest.raises(OSError):
        raise OutputError("out/", "read-only file system")


@pytest.mark.parametrize(("n", "shown"), [
    (0, "0 bytes"), (1023, "1023 bytes"), (1536, "1.5 KiB"), (5 * 2**20, "5.0 MiB"),
    (80 * 2**30, "80.0 GiB"), (3 * 2**50, "3072.0 TiB")])
def test_format_bytes_uses_binary_units(n: int, shown: str) -> None:
    assert format_bytes(n) == shown
