"""The numeric guards of the weight-only computations (engine/core/numeric.py): finiteness of
arrays and of each matrix of a stack, each matrix's largest entry, and taming (an exact
power-of-two rescale of huge heads that keeps float32 products finite)."""

from __future__ import annotations

import numpy as np
import pytest

from headscope.engine.core.errors import NonFiniteError
from headscope.engine.core.numeric import (
    TAME_ABOVE,
    check_finite,
    finite_matrices,
    is_finite,
    max_abs,
    tame,
)


def test_is_finite_sees_nan_and_both_infinities() -> None:
    assert is_finite(np.zeros((0, 3), np.float32))
    assert is_finite(np.array([[1.0, -2.0], [3.0, 1e38]], np.float32))
    for bad in (np.nan, np.inf, -np.inf):
        x = np.ones((4, 4), np.float32)
        x[2, 1] = bad
        assert not is_finite(x)


def test_check_finite_names_what_and_the_file() -> None:
    check_finite(np.ones(3), np.zeros((2, 2)))
    x = np.ones((2, 2))
    x[0, 0] = np.nan
    with pytest.raises(NonFiniteError, match=r"W_QK of L1\.H2 has NaN or infinite entries") as e:
        check_finite(np.ones(3), x, what="W_QK of L1.H2", path="model.safetensors")
    assert "model.safetensors" in str(e.value)


def test_finite_matrices_flags_each_matrix_with_a_non_finite_entry() -> None:
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    x[0, 1, 3, 4] = np.nan
    x[1, 2, 0, 0] = -np.inf
    expected = np.array([[True, False, True], [True, True, False]])
    np.testing.assert_array_equal(finite_matrices(x), expected)


def test_max_abs_is_the_largest_magnitude_of_each_matrix() -> None:
    x = np.random.default_rng(1).standard_normal((3, 5, 6))
    x[1, 2, 3] = -40.0  # the extreme is negative in one matrix
    np.testing.assert_array_equal(max_abs(x), np.abs(x).max(axis=(-2, -1)))
    assert max_abs(x)[1] == 40.0


def test_taming_rescales_only_huge_matrices_by_an_exact_power_of_two() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 8, 8)).astype(np.float32)
    x[1] *= np.float32(1e19)  # a head near 1e19: its float32 gram overflows
    with np.errstate(over="ignore", invalid="ignore"):
        assert not np.isfinite(x[1] @ x[1].T).all()
    tamed = tame(x)
    np.testing.assert_array_equal(tamed[[0, 2]], x[[0, 2]])  # the others untouched, bit for bit
    ratio = tamed[1] / x[1]
    assert np.all(ratio == ratio.flat[0])  # one scale per matrix
    assert np.log2(ratio.flat[0]) == np.round(np.log2(ratio.flat[0]))  # a power of two: exact
    assert 0.5 < max_abs(tamed)[1] <= 1.0
    assert np.isfinite(tamed[1] @ tamed[1].T).all()


def test_nothing_to_tame_returns_the_array_itself() -> None:
    x = np.full((2, 3, 3), TAME_ABOVE, np.float32)  # at the threshold, not above it
    assert tame(x) is x
    x[0, 0, 0] = np.nan  # a non-finite matrix is not rescaled (it is flagged elsewhere)
    assert tame(x) is x
