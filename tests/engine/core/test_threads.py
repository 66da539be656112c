"""BLAS/LAPACK thread control (engine/core/threads.py)."""

from __future__ import annotations

import pytest

from headscope.engine.core import threads


def test_lapack_runs_on_one_thread_and_the_setting_is_restored():
    calls = threads._openblas_threads()
    if calls is None:
        pytest.skip("numpy does not use OpenBLAS here")
    setter, getter = calls
    before = getter()
    setter(2)
    try:
        with threads.one_lapack_thread():
            assert getter() == 1
            with threads.one_lapack_thread():
                assert getter() == 1
            assert getter() == 1
        assert getter() == 2
    finally:
        setter(before)
