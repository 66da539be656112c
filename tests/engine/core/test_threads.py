"""BLAS/LAPACK thread control (engine/core/threads.py)."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable, Iterator

import pytest

from headscope.engine.core import threads


@pytest.fixture
def two_blas_threads() -> Iterator[tuple[Callable[[int], None], Callable[[], int]]]:
    """numpy's OpenBLAS (setter, getter) at 2 threads, its count restored after the test."""
    calls = threads._openblas_threads()
    if calls is None:
        pytest.skip("numpy does not use OpenBLAS here")
    setter, getter = calls
    before = getter()
    setter(2)
    try:
        yield setter, getter
    finally:
        setter(before)


def test_lapack_runs_on_one_thread_and_the_setting_is_restored(two_blas_threads):
    _, getter = two_blas_threads
    with threads.one_lapack_thread():
        assert getter() == 1
        with threads.one_lapack_thread():
            assert getter() == 1
        assert getter() == 1
    assert getter() == 2


def _in_core_pool(x: int) -> int:
    return threads.core_pool().submit(int, x).result(timeout=30)


def test_a_forked_child_gets_a_core_pool_of_its_own():
    """A child forked after the parent's core pool started its workers (a multiprocessing
    worker) runs work on a pool of its own, instead of handing it to workers it does not have
    (the work never ran: this timed out before the fork handler)."""
    assert threads.core_pool().submit(int, 1).result() == 1  # the parent's workers exist
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply_async(_in_core_pool, (3,)).get(timeout=60) == 3


def _blas_state() -> tuple[int, int | None]:
    calls = threads._openblas_threads()
    return threads._USERS, None if calls is None else int(calls[1]())


def test_a_child_forked_under_another_threads_blas_hold_gets_the_threads_back(two_blas_threads):
    """A parent thread inside ``one_lapack_thread`` at the fork: the child has no such thread,
    so it drops the hold and numpy's BLAS gets its thread count back."""
    _, getter = two_blas_threads
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with threads.one_lapack_thread():
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(30) and getter() == 1
        with multiprocessing.get_context("fork").Pool(1) as pool:
            assert pool.apply_async(_blas_state).get(timeout=60) == (0, 2)
    finally:
        release.set()
        holder.join()
