"""FactoredMatrix against the dense product it stands for (property-based)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from headscope.engine.errors import NonFiniteError
from headscope.engine.factored import FactoredMatrix

SETTINGS = settings(max_examples=40, deadline=None)

dims = st.integers(min_value=1, max_value=9)
seeds = st.integers(min_value=0, max_value=2**31 - 1)
leading = st.sampled_from([(), (3,), (2, 2)])


def randn(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def factors(lead: tuple[int, ...], rows_n: int, m: int, r: int, seed: int) -> FactoredMatrix:
    return FactoredMatrix(randn(*lead, rows_n, m, seed=seed), randn(*lead, m, r, seed=seed + 1))


def close(x: torch.Tensor, y: torch.Tensor, tol: float = 1e-9) -> None:
    scale = max(1.0, float(y.abs().max())) if y.numel() else 1.0
    torch.testing.assert_close(x, y, atol=tol * scale, rtol=tol)


@SETTINGS
@given(leading, dims, dims, dims, seeds)
def test_shape_transpose_and_norm_match_dense(lead, rows_n, m, r, seed):
    fm = factors(lead, rows_n, m, r, seed)
    dense = fm.AB
    assert fm.shape == dense.shape == torch.Size((*lead, rows_n, r))
    close(fm.T.AB, dense.transpose(-2, -1))
    close(fm.norm(), torch.linalg.matrix_norm(dense, "fro"))


@SETTINGS
@given(leading, dims, dims, dims, seeds)
def test_svd_reconstructs_with_a_true_vh(lead, rows_n, m, r, seed):
    fm = factors(lead, rows_n, m, r, seed)
    u, s, vh = fm.svd()
    k = min(rows_n, m, r)
    assert u.shape == (*lead, rows_n, k) and s.shape == (*lead, k) and vh.shape == (*lead, k, r)
    close(u @ torch.diag_embed(s) @ vh, fm.AB)
    dense_s = torch.linalg.svdvals(fm.AB)
    close(s, dense_s[..., :k])
    # Orthonormal singular vectors: Vh has orthonormal rows (TransformerLens returns V here).
    eye = torch.eye(k, dtype=s.dtype).expand(*lead, k, k)
    close(u.transpose(-2, -1) @ u, eye, 1e-8)
    close(vh @ vh.transpose(-2, -1), eye, 1e-8)


def assert_same_multiset(x: torch.Tensor, y: torch.Tensor, tol: float = 1e-7) -> None:
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
    dense = torch.linalg.eigvals(fm.AB)
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
    with pytest.raises(IndexError):
        fm[0, 1]


def test_bf16_factors_compute_in_float32():
    fm = factors((), 8, 3, 8, 5).to(torch.bfloat16)
    ev = fm.eigenvalues
    assert ev.dtype == torch.complex64
    ref = torch.linalg.eigvals(fm.B.float() @ fm.A.float())
    assert_same_multiset(ev, ref, 1e-5)
    assert fm.svd()[1].dtype == torch.float32
    assert fm.norm().dtype == torch.float32


def test_non_finite_factors_raise_before_eig_or_svd():
    a = randn(5, 2, seed=3)
    a[1, 1] = float("nan")
    fm = FactoredMatrix(a, randn(2, 5, seed=4))
    with pytest.raises(NonFiniteError):
        _ = fm.eigenvalues
    with pytest.raises(NonFiniteError):
        fm.svd()
    assert torch.isnan(fm.norm())  # the norm is plain arithmetic: NaN, no crash


def test_make_even_and_collapse_are_the_same_matrix():
    fm = factors((2,), 7, 3, 5, 11)
    close(fm.make_even().AB, fm.AB)
    u, _, vh = fm.svd()
    close(u @ fm.collapse_l(), fm.AB)
    close(fm.collapse_r() @ vh, fm.AB)


def test_mismatched_inner_dims_are_refused():
    with pytest.raises(ValueError):
        FactoredMatrix(torch.zeros(3, 2), torch.zeros(3, 3))


@given(st.lists(st.lists(st.integers(1, 4), max_size=4), min_size=1, max_size=3))
def test_broadcast_shapes_matches_numpy(shapes: list[list[int]]) -> None:
    import numpy as np

    from headscope.engine.factored import broadcast_shapes

    try:
        expected = np.broadcast_shapes(*map(tuple, shapes))
    except ValueError:
        with pytest.raises(ValueError):
            broadcast_shapes(*shapes)
    else:
        assert broadcast_shapes(*shapes) == expected
