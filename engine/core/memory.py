"""The process's use of freed memory (no numpy, no torch): kept for reuse during a pass,
given back to the operating system at the end of a sweep."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterator

__all__ = ["KEEP_ENV", "keep_freed_memory", "release_free_heap", "returned_when_freed"]

KEEP_ENV = "HEADSCOPE_KEEP_FREED_MEMORY"  # "0": glibc's own policy (every large block mmapped)
# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
_INT_MAX = 2**31 - 1  # mallopt takes a C int: the largest trim threshold (2 GiB of free top)
_MMAP_MAX_DEFAULT = 65536  # glibc's DEFAULT_MMAP_MAX
_kept = False  # keep_freed_memory applied
_returning = 0  # callers inside ``returned_when_freed``
_lock = threading.Lock()


@functools.cache
def _libc_function(name: str) -> Callable[..., int] | None:
    """One of glibc's malloc functions (None elsewhere: musl, macOS)."""
    import ctypes

    try:
        return getattr(ctypes.CDLL(None), name)
    except (AttributeError, OSError):
        return None


def keep_freed_memory() -> bool:
    """Serve every allocation from one heap and keep what is freed there for the next one
    (glibc; nothing elsewhere, nor with ``HEADSCOPE_KEEP_FREED_MEMORY=0``). The console
    script sets it once, before any thread starts; returns whether it applied.

    By default glibc maps each block over 32 MB on its own and unmaps it when freed, so a
    pass that reads a layer's weights into fresh blocks, multiplies and frees them touches
    new pages for every layer. On a virtual machine that hands freed pages back to its host
    (virtio-balloon free page reporting, as this project's development boxes do) a new page
    costs a fault in the host as well: the same 268 MB read took 0.06 s or 0.9 s, all of the
    difference system time (bench/README.md, "Freed memory kept"). Here the blocks come from
    the heap (``M_MMAP_MAX`` 0) of every thread (``M_ARENA_MAX`` 1: another thread's arena
    would map a large block anyway), and the heap is not trimmed as blocks are freed
    (``M_TRIM_THRESHOLD``): the next layer reuses the last one's pages. A sweep still ends
    with ``release_free_heap``, so an idle explorer gives the pages back. PyTorch's CPU
    tuning guide makes the same point for its own allocations (a caching allocator,
    jemalloc or tcmalloc, instead of glibc's defaults).
    """
    global _kept
    if os.environ.get(KEEP_ENV, "1") == "0":
        return False
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    _kept = all(mallopt(param, value) == 1 for param, value in (
        (_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _INT_MAX)))
    return _kept


@contextlib.contextmanager
def returned_when_freed() -> Iterator[None]:
    """Within: large blocks mapped on their own and unmapped when freed (glibc's default),
    then the heap trimmed. For once-per-model work with vocabulary-sized temporaries (the
    spectral middles at 70B widths: a 1 GB read of ``W_U`` for its mean, [d, d] products),
    which ``keep_freed_memory`` would leave in the heap as holes the layers' blocks do not
    fill: the slice's `heads` peaked 0.4 GB higher. Nothing outside ``keep_freed_memory``."""
    global _returning
    mallopt = _libc_function("mallopt") if _kept else None
    if mallopt is None:
        yield
        return
    with _lock:
        _returning += 1
        mallopt(_M_MMAP_MAX, _MMAP_MAX_DEFAULT)
    try:
        yield
    finally:
        with _lock:
            _returning -= 1
            if _returning == 0:
                mallopt(_M_MMAP_MAX, 0)
        release_free_heap()


def release_free_heap() -> None:
    """Give the allocator's free pages back to the OS at the end of a sweep.

    torch allocates tensors under 32 MB from glibc's heap (every tensor, under
    ``keep_freed_memory``); a sweep's temporaries freed around longer-lived (cached) tensors
    leave free pages the heap cannot shrink past, which stay resident: ~0.5 GB after one
    sweep over a 1B model (measured with ``mallinfo2``). ``malloc_trim`` returns whole free
    pages from anywhere in the heap (a few ms). Values and the sweep's own peak are
    unchanged; the next sweep starts from the lower level.
    """
    trim = _libc_function("malloc_trim")
    if trim is not None:
        trim(0)
