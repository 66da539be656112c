"""BLAS/LAPACK thread control: numpy's OpenBLAS held to one thread while ``d_head``-sized
decompositions run (docs/internals.md, "Sweeps in pieces"). Process-wide, reference-counted.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

__all__ = ["core_pool", "one_lapack_thread"]


@functools.cache
def _openblas_threads() -> tuple[Callable[[int], None], Callable[[], int]] | None:
    """numpy's OpenBLAS thread setters (None if numpy uses another BLAS)."""
    try:
        with open("/proc/self/maps") as maps:
            libs = sorted({line.split()[-1] for line in maps if "openblas" in line and ".so" in line})
    except OSError:
        return None
    for path in libs:
        lib = ctypes.CDLL(path)
        for suffix in ("64_", ""):
            for prefix in ("scipy_openblas_", "openblas_"):
                setter = getattr(lib, f"{prefix}set_num_threads{suffix}", None)
                getter = getattr(lib, f"{prefix}get_num_threads{suffix}", None)
                if setter is not None and getter is not None:
                    return setter, getter
    return None


_LOCK = threading.Lock()
_USERS = 0
_SAVED = 1


@contextlib.contextmanager
def one_lapack_thread() -> Iterator[None]:
    """numpy's LAPACK on one thread for ``d_head``-sized ``eigvals``/``cholesky``/``eigh``.

    Threaded ``geev`` on 128 × 128 matrices is 5-15× *slower* with 2 threads than with one on
    a busy 2-core box: the threads spin waiting on each other (docs/internals.md, "Sweeps in
    pieces"). The setting is process-wide, so it is restored when the last user leaves; other
    threads' products run single-threaded meanwhile (same numbers, briefly slower).
    """
    global _USERS, _SAVED
    calls = _openblas_threads()
    if calls is None:
        yield
        return
    setter, getter = calls
    with _LOCK:
        if _USERS == 0:
            _SAVED = int(getter())
            setter(1)
        _USERS += 1
    try:
        yield
    finally:
        with _LOCK:
            _USERS -= 1
            if _USERS == 0:
                setter(_SAVED)




@functools.cache
def core_pool() -> ThreadPoolExecutor:
    """One worker per usable core, for independent single-threaded BLAS/LAPACK pieces run side
    by side (each under ``one_lapack_thread``): on a busy 2-core box two one-thread calls beat
    one two-thread call whose threads wait on each other. Idle workers hold no memory."""
    return ThreadPoolExecutor(max(1, len(os.sched_getaffinity(0))), thread_name_prefix="headscope-core")


def _after_fork_in_child() -> None:
    """In a forked child (a ``multiprocessing`` worker, a test runner's): none of the parent's
    threads are there. The core pool is made anew when first asked for (the parent's executor
    would take work and never run it: its workers are gone), and a BLAS hold taken by a parent
    thread is dropped, numpy's BLAS getting back the thread count it had before it (no thread
    of the child would ever release it); the lock is new (a parent thread may have held it)."""
    global _LOCK, _USERS
    _LOCK = threading.Lock()
    if _USERS:
        _USERS = 0
        calls = _openblas_threads()
        if calls is not None:
            calls[0](_SAVED)
    core_pool.cache_clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
