"""Giving freed memory back to the operating system (no numpy, no torch)."""

from __future__ import annotations

import functools
from collections.abc import Callable

__all__ = ["release_free_heap"]


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (None elsewhere: musl, macOS)."""
    import ctypes

    try:
        return ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None


def release_free_heap() -> None:
    """Give the allocator's free pages back to the OS at the end of a sweep.

    torch allocates tensors under 32 MB from glibc's heap; a sweep's temporaries freed around
    longer-lived (cached) tensors leave free pages the heap cannot shrink past, which stay
    resident: ~0.5 GB after one sweep over a 1B model (measured with ``mallinfo2``).
    ``malloc_trim`` returns whole free pages from anywhere in the heap (a few ms). Values and
    the sweep's own peak are unchanged; the next sweep starts from the lower level.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
