"""FactoredMatrix against the dense product it stands for (property-based), in numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headscope.engine.circuits.factored import FactoredMatrix
from headscope.engine.core.errors import NonFiniteError
from tests.leftovers import from_this_test

SETTINGS = settings(max_examples=40, deadline=None)

dims = st.integers(min_value=1, max_value=9)
seeds = st.integers(min_value=0, max_value=2**31 - 1)
leading = st.sampled_from([(), (3,), (2, 2)])


def randn(*shape: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


def factors(lead: tuple[int, ...], rows_n: int, m: int, r: int, seed: int) -> FactoredMatrix:
    return FactoredMatrix(randn(*lead, rows_n, m, seed=seed), randn(*lead, m, r, seed=seed + 1))


def close(x: np.ndarray, y: np.ndarray, tol: float = 1e-9) -> None:
    x, y = np.asarray(x), np.asarray(y)
    scale = max(1.0, float(np.abs(y).max())) if y.size else 1.0
    assert x.shape == y.shape, (x.shape, y.shape)
    np.testing.assert_allclose(x, y, atol=tol * scale, rtol=tol)


def fro(x: np.ndarray) -> np.ndarray:
    return np.linalg.norm(x, axis=(-2, -1))


@SETTINGS
@given(leading, dims, dims, dims, seeds)
def test_shape_transpose_and_norm_match_dense(lead, rows_n, m, r, seed):
    fm = factors(lead, rows_n, m, r, seed)
    dense = fm.AB
    assert fm.shape == dense.shape == (*lead, rows_n, r)
    close(fm.T.AB, dense.swapaxes(-2, -1))
    close(fm.norm(), fro(dense))


@SETTINGS
@given(leading, dims, dims, dims, seeds)
def test_svd_reconstructs_with_a_true_vh(lead, rows_n, m, r, seed):
    fm = factors(lead, rows_n, m, r, seed)
    u, s, vh = fm.svd()
    k = min(rows_n, m, r)
    assert u.shape == (*lead, rows_n, k) and s.shape == (*lead, k) and vh.shape == (*lead, k, r)
    close((u * s[..., None, :]) @ vh, fm.AB)
    dense_s = np.linalg.svd(fm.AB, compute_uv=False)
    close(s, dense_s[..., :k])
    # Orthonormal singular vectors: Vh has orthonormal rows (TransformerLens returns V here).
    eye = np.broadcast_to(np.eye(k, dtype=s.dtype), (*lead, k, k))
    close(u.swapaxes(-2, -1) @ u, eye, 1e-8)
    close(vh @ vh.swapaxes(-2, -1), eye, 1e-8)


def assert_same_multiset(x: np.ndarray, y: np.ndarray, tol: float = 1e-7) -> None:
    """Every value of y matched to a distinct nearest value of x (greedy, exact for small tol)."""
    assert x.shape == y.shape
    left = list(x.tolist())
    for v in y.tolist():
        i = min(range(len(left)), key=lambda j: abs(left[j] - v))
        assert abs(left[i] - v) <= tol * max(1.0, abs(v)), (x, y)
        left.pop(i)


@SETTINGS
@given(dims, dims, seeds)
def test_eigenvalues_agree_as_multisets_with_zeros(n, m, seed):
    fm = factors((), n, m, n, seed)
    dense = np.linalg.eigvals(fm.AB)
    full = fm.eigenvalues_full()
    assert fm.eigenvalues.shape == (min(n, m),)
    assert full.shape == (n,)
    assert_same_multiset(full, dense)


@SETTINGS
@given(leading, dims, dims, dims, seeds, st.data())
def test_block_materialises_the_requested_entries(lead, rows_n, m, r, seed, data):
    fm = factors(lead, rows_n, m, r, seed)
    rows = data.draw(st.lists(st.integers(0, rows_n - 1), min_size=1, max_size=5))
    cols = data.draw(st.lists(st.integers(0, r - 1), min_size=1, max_size=5))
    close(fm.block(rows, cols), fm.AB[..., rows, :][..., :, cols])
    close(fm.block(None, cols), fm.AB[..., :, cols])


@SETTINGS
@given(dims, dims, dims, dims, dims, seeds)
def test_compositions_keep_the_smallest_inner_dimension(rows_n, m1, n, m2, p, seed):
    left = factors((), rows_n, m1, n, seed)
    right = factors((), n, m2, p, seed + 7)
    prod = left @ right
    assert isinstance(prod, FactoredMatrix)
    assert prod.mdim == min(m1, m2)
    close(prod.AB, left.AB @ right.AB)

    dense_right = randn(n, p, seed=seed + 3)
    fm_t = left @ dense_right
    assert fm_t.mdim == min(m1, n)
    close(fm_t.AB, left.AB @ dense_right)

    dense_left = randn(p, rows_n, seed=seed + 5)
    t_fm = dense_left @ left
    assert isinstance(t_fm, FactoredMatrix) and t_fm.mdim == min(m1, rows_n)
    close(t_fm.AB, dense_left @ left.AB)

    vec = randn(n, seed=seed + 9)
    close(left @ vec, left.AB @ vec)


def test_leading_dims_broadcast_and_index():
    a = randn(4, 6, 3, seed=1)
    b = randn(3, 6, seed=2)  # one B for all four A
    fm = FactoredMatrix(a, b)
    assert fm.shape == (4, 6, 6)
    close(fm[2].AB, a[2] @ b)
    # Beyond the leading dims an index selects rows, then columns (TransformerLens).
    close(fm[0, 1].AB, (a[0] @ b)[1:2])
    with pytest.raises(ValueError, match="too long an index"):
        fm[0, 1, 2, 3]
    with pytest.raises(IndexError):
        fm[..., ...]
    mask = np.array([True, False, True, True])
    close(fm[mask, ..., 1].AB, fm.AB[mask][..., 1:2])  # a boolean mask over the leading dim
    stacked = FactoredMatrix(randn(2, 3, 5, 2, seed=3), randn(2, 3, 2, 7, seed=4))
    mask2 = np.array([[True, False, True], [False, True, False]])
    close(stacked[mask2, 2].AB, stacked.AB[mask2][..., 2:3, :])  # a 2-D mask consumes two dims


def test_float16_factors_compute_in_float32():
    fm = factors((), 8, 3, 8, 5).to(np.float16)
    ev = fm.eigenvalues
    assert ev.dtype == np.complex64
    ref = np.linalg.eigvals(fm.B.astype(np.float32) @ fm.A.astype(np.float32))
    assert_same_multiset(ev, ref, 1e-5)
    assert fm.svd()[1].dtype == np.float32
    assert fm.norm().dtype == np.float32


def test_non_finite_factors_raise_before_eig_or_svd():
    a = randn(5, 2, seed=3)
    a[1, 1] = float("nan")
    fm = FactoredMatrix(a, randn(2, 5, seed=4))
    with pytest.raises(NonFiniteError):
        _ = fm.eigenvalues
    with pytest.raises(NonFiniteError):
        fm.svd()
    assert np.isnan(fm.norm())  # the norm is plain arithmetic: NaN, no crash


def test_make_even_and_collapse_are_the_same_matrix():
    fm = factors((2,), 7, 3, 5, 11)
    close(fm.make_even().AB, fm.AB)
    u, _, vh = fm.svd()
    close(u @ fm.collapse_l(), fm.AB)
    close(fm.collapse_r() @ vh, fm.AB)


def test_mismatched_inner_dims_are_refused():
    with pytest.raises(ValueError):
        FactoredMatrix(np.zeros((3, 2)), np.zeros((3, 3)))


# -- TransformerLens semantics: vectors with batch dims, scalars, indexing, svd caching ------


@SETTINGS
@given(leading, dims, dims, dims, seeds)
def test_vector_products_broadcast_over_leading_dims(lead, rows_n, m, r, seed):
    fm = factors(lead, rows_n, m, r, seed)
    right, left = randn(r, seed=seed + 2), randn(rows_n, seed=seed + 3)
    out_r, out_l = fm @ right, left @ fm
    assert out_r.shape == (*lead, rows_n) and out_l.shape == (*lead, r)
    close(out_r, (fm.AB @ right[:, None])[..., 0])
    close(out_l, (left[None, :] @ fm.AB)[..., 0, :])


def test_vector_products_of_the_reported_shapes():
    fm = FactoredMatrix(randn(6, 2, 3, seed=1), randn(6, 3, 4, seed=2))
    assert (fm @ randn(4, seed=3)).shape == (6, 2)
    assert (randn(2, seed=4) @ fm).shape == (6, 4)
    with pytest.raises(ValueError):
        fm @ randn(3, seed=5)


def test_multiplication_takes_scalars_only():
    fm = factors((2,), 4, 3, 5, 1)
    close((fm * 2.5).AB, 2.5 * fm.AB)
    close((np.array(-3.0) * fm).AB, -3 * fm.AB)
    close((fm * np.array([2.0])).AB, 2 * fm.AB)
    for bad in (np.ones(3), np.ones((2, 1, 1))):
        with pytest.raises(ValueError, match="scalar"):
            fm * bad


@SETTINGS
@given(leading, dims, dims, dims, seeds, st.data())
def test_indexing_rows_and_columns_matches_the_dense_matrix(lead, rows_n, m, r, seed, data):
    fm = factors(lead, rows_n, m, r, seed)
    dense = fm.AB
    n_lead = len(lead)
    lead_idx = tuple(data.draw(st.integers(0, d - 1)) for d in lead)
    row = data.draw(st.integers(-rows_n, rows_n - 1))
    rows = data.draw(st.lists(st.integers(0, rows_n - 1), min_size=1, max_size=4))
    cols = data.draw(st.lists(st.integers(0, r - 1), min_size=1, max_size=4))
    col = data.draw(st.integers(-r, r - 1))
    sub = dense[lead_idx]
    close(fm[(*lead_idx, rows)].AB, sub[rows])
    close(fm[(*lead_idx, row)].AB, sub[row][None, :])  # an integer keeps its dim
    close(fm[(*lead_idx, rows, col)].AB, sub[rows][:, [col]])
    close(fm[(*lead_idx, slice(1, None), cols)].AB, sub[1:][:, cols])
    close(fm[..., rows, :].AB, dense[..., rows, :])
    close(fm[..., cols].AB, dense[..., cols])
    assert fm[(*lead_idx, rows, cols)].shape == (len(rows), len(cols))
    if n_lead:
        close(fm[lead_idx[0]].AB, dense[lead_idx[0]])


def test_svd_is_computed_once_per_matrix(monkeypatch: pytest.MonkeyPatch):
    fm = factors((3,), 6, 2, 5, 8)
    calls = []
    real = np.linalg.svd
    count = from_this_test(lambda: calls.append(1))
    monkeypatch.setattr(np.linalg, "svd", lambda *a, **k: count() or real(*a, **k))
    u, s, vh = fm.svd()
    assert fm.U is u and fm.S is s and fm.Vh is vh
    fm.make_even(), fm.collapse_l(), fm.collapse_r()
    assert len(calls) == 1
    assert fm.T.svd() is not fm.svd()  # a new matrix has its own


# -- finite factors whose float32 products overflow (weights near 1e19) -----------------------


def huge_factors(seed: int, scale: float = 1e19) -> FactoredMatrix:
    return FactoredMatrix((randn(40, 4, seed=seed) * scale).astype(np.float32),
                          (randn(4, 40, seed=seed + 1) * scale).astype(np.float32))


def test_eigenvalues_of_overflowing_products_are_computed_in_float64():
    fm = huge_factors(3)
    with np.errstate(over="ignore", invalid="ignore"):
        assert not np.isfinite(fm.B @ fm.A).all()  # the float32 product overflows
    ev = fm.eigenvalues_double()
    assert ev.dtype == np.complex128 and np.isfinite(ev.view(np.float64)).all()
    ref = np.linalg.eigvals(fm.B.astype(np.float64) @ fm.A.astype(np.float64))
    assert_same_multiset(ev / 1e38, ref / 1e38, 1e-9)
    # In complex64 they do not fit: inf, never NaN from an eig of an overflowed matrix.
    ev32 = fm.eigenvalues.view(np.float32)
    assert fm.eigenvalues.dtype == np.complex64 and not np.isnan(ev32).any()


def test_svd_and_norm_of_overflowing_products_do_not_crash():
    fm = huge_factors(5, scale=1e17)  # AB ~ 1e34·√m: finite in float32, its Grams are not
    u, s, vh = fm.svd()
    a64, b64 = fm.A.astype(np.float64), fm.B.astype(np.float64)
    ref = np.linalg.svd(a64 @ b64, compute_uv=False)[:4]
    np.testing.assert_allclose(s.astype(np.float64), ref, rtol=1e-4, atol=0)
    rebuilt = (u.astype(np.float64) * s.astype(np.float64)[None, :]) @ vh.astype(np.float64)
    np.testing.assert_allclose(rebuilt / 1e34, a64 @ b64 / 1e34, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(float(fm.norm()), np.linalg.norm(ref), rtol=1e-4, atol=0)
    s_big = huge_factors(7).svd()[1]  # beyond float32's range: inf, not a crash
    assert np.isinf(s_big).any() and not np.isnan(s_big).any()
