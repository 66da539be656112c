"""Colour maps and grid fitting (tui/plots/colormap.py): the diverging map, fitting a grid to the chart, pooling and resampling."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headscope.tui.plots.colormap import (
    bins,
    cell_of,
    diverging_rgb,
    fit_shape,
    pool_extreme,
    resample,
    symmetric_range,
)
from tests.tui.plots.test_figures import STOPS


def test_diverging_map_is_centred_on_zero_and_symmetric() -> None:
    v = np.array([-2.0, -1.0, 0.0, 1.0, 2.0])
    rgb = diverging_rgb(v, STOPS)
    assert tuple(rgb[2]) == STOPS[1]  # zero is the middle stop
    assert tuple(rgb[0]) == STOPS[0] and tuple(rgb[4]) == STOPS[2]  # ±max are the ends
    # Same |value| → same distance from the middle colour, on opposite sides.
    mid = np.array(STOPS[1], float)
    d_neg = np.abs(rgb[1] - mid) / np.maximum(np.abs(np.array(STOPS[0]) - mid), 1)
    d_pos = np.abs(rgb[3] - mid) / np.maximum(np.abs(np.array(STOPS[2]) - mid), 1)
    assert np.allclose(d_neg.max(), d_pos.max(), atol=0.01)


def test_nonfinite_values_get_the_zero_colour_and_do_not_set_the_range() -> None:
    v = np.array([np.nan, np.inf, 1.0, -0.5])
    assert symmetric_range(v) == 1.0
    rgb = diverging_rgb(v, STOPS)
    assert tuple(rgb[0]) == STOPS[1]


@given(st.integers(1, 60), st.integers(1, 60), st.integers(1, 50), st.integers(2, 120))
@settings(max_examples=300, deadline=None)
def test_fit_shape_fits_and_widens_cells_at_most_twofold(rows: int, cols: int, h: int,
                                                         w: int) -> None:
    ch, cw = fit_shape(rows, cols, h, w)
    assert 1 <= ch <= h and 1 <= cw <= w
    if rows <= h and 2 * cols <= w:  # fits unpooled: k rows × 2k…4k columns per entry
        k = ch // rows
        assert ch == rows * k and cw % cols == 0
        assert 2 * k <= cw // cols <= 4 * k
        # as wide as allowed: twice square, or no whole column more fits
        assert cw // cols == 4 * k or cw + cols > w
    elif rows <= h and cols <= w:  # one row per entry, one or two columns: nothing pooled
        assert (ch, cw) == (rows, w)
    else:  # pooled: never more than twice as wide as square (one row of rounding, one cell)
        assert cw <= 2 * max(1, 2 * cols * (ch + 1) / rows)
        assert ch < rows or cw < cols


def test_fit_shape_widens_a_height_bound_grid_into_the_width() -> None:
    """The 80×24 OV tab with the directions panel hidden: 24×24 in 6 rows was a square
    6×12 grid in a 31-column canvas; the columns now use the width (all 24 shown), and
    shown in 19 columns they are pooled less than the rows."""
    assert fit_shape(24, 24, 6, 31) == (6, 24)
    assert fit_shape(24, 24, 6, 19) == (6, 19)
    assert fit_shape(24, 24, 6, 200) == (6, 24)  # at most twice square (6×12)
    assert fit_shape(6, 9, 12, 100) == (12, 72)  # 2 rows × 8 columns per entry (2× square)
    assert fit_shape(24, 24, 25, 47) == (24, 47)  # not pooled to 23×47 for one column


@given(st.integers(1, 40), st.integers(1, 40), st.integers(1, 40), st.integers(1, 40))
@settings(max_examples=100, deadline=None)
def test_resample_preserves_the_mean_when_pooling_evenly(r: int, c: int, fr: int, fc: int) -> None:
    rng = np.random.default_rng(r * 97 + c)
    v = rng.normal(size=(r * fr, c * fc))
    pooled = resample(v, r, c)
    assert pooled.shape == (r, c)
    expected = v.reshape(r, fr, c, fc).mean(axis=(1, 3))  # reference: block means
    assert np.allclose(pooled, expected)


def test_resample_repeats_when_growing_and_ignores_nans() -> None:
    v = np.array([[1.0, 2.0], [3.0, np.nan]])
    grown = resample(v, 4, 4)
    assert np.array_equal(grown[:2, :2], np.ones((2, 2)))
    assert np.isnan(grown[3, 3])
    pooled = resample(v, 1, 1)
    assert pooled[0, 0] == pytest.approx(2.0)  # mean of the finite entries


@given(st.integers(1, 30), st.integers(1, 30), st.integers(1, 40), st.integers(1, 40))
@settings(max_examples=100, deadline=None)
def test_pool_extreme_keeps_each_blocks_signed_extreme(n_r: int, n_c: int, o_r: int, o_c: int) -> None:
    rng = np.random.default_rng(n_r * 131 + n_c)
    v = rng.normal(size=(n_r, n_c))
    v[rng.random(v.shape) < 0.1] = np.nan
    pooled = pool_extreme(v, o_r, o_c)
    assert pooled.shape == (o_r, o_c)
    r0, r1 = bins(n_r, o_r)
    c0, c1 = bins(n_c, o_c)
    for i in range(o_r):
        for j in range(o_c):
            block = v[r0[i]:r1[i], c0[j]:c1[j]]
            finite = block[np.isfinite(block)]
            if finite.size == 0:
                assert np.isnan(pooled[i, j])
            else:  # the entry of largest magnitude, sign kept (reference: a plain loop)
                assert pooled[i, j] == finite[np.argmax(np.abs(finite))] or \
                    abs(pooled[i, j]) == np.abs(finite).max()


def test_cell_of_is_the_centre_of_the_block() -> None:
    assert cell_of(0, 4, 8) == pytest.approx(0.5)
    assert cell_of(3, 4, 8) == pytest.approx(6.5)
