"""Typed errors of the engine (engine/core/errors.py): one line, `path: reason`, safe to print; out of memory says how much."""

from __future__ import annotations

from headscope.engine.core.errors import (
    ResourceLimitError,
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
