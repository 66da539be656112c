"""``FactoredMatrix``: a matrix kept as the product ``A @ B`` of two thin factors, in numpy
(docs/math.md, "Circuits"). The numeric guards it shares with every weight-only computation
(non-finite checks, taming) are ``engine.core.numeric``; the LAPACK thread control is
``engine.core.threads``.

A head's circuits are low rank: ``QK = W_Q W_Kᵀ`` is ``d_model × d_model`` but has rank at most
``d_head``, and the full OV circuit ``W_E W_V W_O W_U`` is ``d_vocab × d_vocab`` of rank
``d_head``. Everything headscope needs from such a matrix (shape, Frobenius norm, SVD,
eigenvalues, a few rows and columns) comes from the factors without forming the product.

Names follow TransformerLens' ``FactoredMatrix`` (``A``, ``B``, ``AB``, ``BA``, ``T``,
``svd``, ``U``, ``S``, ``Vh``, ``eigenvalues``, ``norm``, ``ldim``/``mdim``/``rdim``) where the
meaning is the same. Differences, on purpose:

- ``svd()`` returns a true ``Vh`` (``U @ diag(S) @ Vh == AB``; TransformerLens returns ``V``
  under that name) and ``min(ldim, mdim, rdim)`` singular triplets, not ``mdim``. As in
  TransformerLens it is computed once per instance and cached (``U``, ``S``, ``Vh``,
  ``make_even`` and ``collapse_*`` share it).
- ``eigenvalues`` are the ``min(ldim, mdim)`` eigenvalues of ``AB`` that can be non-zero
  (computed from the small ``BA`` when ``mdim < ldim``); ``eigenvalues_full()`` pads them with
  the zeros that complete the spectrum of ``AB``.
- 16-bit factors are computed on in float32. The matrices handed to ``eigvals``/``svd`` (the
  small ``BA``, the SVD's middle factor) and the norm's Gram matrices are formed in float64,
  so finite float32 factors never overflow there (heads with weights near 1e19 do overflow
  float32 products). Whatever is handed to an eigen- or singular-value routine is checked
  first: a non-finite factor or product raises :class:`~engine.errors.NonFiniteError`
  (LAPACK on a NaN matrix misbehaves; docs/math.md, "Scores").
- ``block(rows, cols)`` materialises only the requested rows and columns.

The same as TransformerLens: ``fm @ v`` and ``v @ fm`` with a vector ``v`` return
``[..., ldim]`` / ``[..., rdim]`` for every leading (batch) index; ``fm * s`` takes a scalar
only (an array with more than one element raises ``ValueError``); ``fm[idx]`` indexes the
leading dims, then rows, then columns (an integer row or column keeps its dim, as
TransformerLens' slices do).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from headscope.engine.core.numeric import check_finite, is_finite
from headscope.engine.core.threads import one_lapack_thread

Index = Sequence[int] | np.ndarray | slice | None

__all__ = ["FactoredMatrix"]


# -- indexing ----------------------------------------------------------------------------------


def _compute(x: np.ndarray) -> np.ndarray:
    """The array in a dtype linear algebra works in: 16-bit floats go to float32."""
    return x.astype(np.float32) if x.dtype == np.float16 else x


def _as_index(idx: Index) -> np.ndarray | slice:
    if idx is None:
        return slice(None)
    if isinstance(idx, slice):
        return idx
    return np.asarray(idx, dtype=np.intp)


def _keep_dim(item: object) -> object:
    """A row/column index that keeps its dim: an integer ``i`` becomes ``slice(i, i + 1)``."""
    if isinstance(item, np.ndarray):
        if item.ndim != 0 or item.dtype.kind not in "iu":
            return item
    elif isinstance(item, bool) or not hasattr(item, "__index__"):
        return item
    i = operator.index(item)  # type: ignore[arg-type]
    return slice(i, i + 1 if i != -1 else None)


def _index_ndim(item: object) -> int:
    """How many dims an index item consumes: a boolean mask one per mask dim, else one."""
    if item is Ellipsis:
        return 0
    if isinstance(item, (list, tuple)):
        mask = np.asarray(item)
        return mask.ndim if mask.dtype == np.bool_ else 1
    if isinstance(item, np.ndarray) and item.dtype == np.bool_:
        return item.ndim
    return 1


def _expand_ellipsis(items: list[object], ndim: int) -> list[object]:
    """Replace one ``...`` by as many full slices as the dims the other items do not index."""
    where = [i for i, item in enumerate(items) if item is Ellipsis]
    if not where:
        return items
    if len(where) > 1:
        raise IndexError("an index can only have a single ellipsis")
    i = where[0]
    fill = max(0, ndim - sum(_index_ndim(item) for item in items))
    return items[:i] + [slice(None)] * fill + items[i + 1 :]


def _split_index(items: list[object], n_lead: int) -> tuple[tuple[object, ...], object, object]:
    """``(leading index, row index, column index)`` of an index over ``n_lead + 2`` dims."""
    lead: list[object] = []
    rows: object = slice(None)
    cols: object = slice(None)
    pos = 0
    for item in items:
        nd = _index_ndim(item)
        if pos + nd <= n_lead:
            lead.append(item)
        elif pos == n_lead and nd == 1:
            rows = _keep_dim(item)
        elif pos == n_lead + 1 and nd == 1:
            cols = _keep_dim(item)
        elif pos + nd > n_lead + 2:
            raise ValueError(f"{tuple(items)} is too long an index for {n_lead + 2} dims")
        else:
            raise IndexError("a boolean mask may not span the leading and the matrix dims")
        pos += nd
    return tuple(lead), rows, cols


def _qr(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reduced QR; in float64 if float32's (scaled) norms still overflow on huge entries."""
    with np.errstate(all="ignore"):
        q, r = np.linalg.qr(x)
    if not (is_finite(q) and is_finite(r)):
        q, r = np.linalg.qr(x.astype(np.float64))
        check_finite(q, r, what="QR factors of the matrix (svd)")
        q = q.astype(x.dtype)
    return q, r


# -- the factored matrix -----------------------------------------------------------------------


class FactoredMatrix:
    """The matrix ``A @ B`` with ``A: [..., ldim, mdim]`` and ``B: [..., mdim, rdim]``.

    Leading (batch) dimensions broadcast, e.g. ``FactoredMatrix(W_V, W_O)`` on
    ``[n_heads, d_model, d_head]`` and ``[n_heads, d_head, d_model]`` is every head's OV
    circuit at once.
    """

    def __init__(self, A: Any, B: Any) -> None:
        A, B = np.asarray(A), np.asarray(B)
        if A.ndim < 2 or B.ndim < 2:
            raise ValueError(f"factors must be at least 2-D, got {tuple(A.shape)} and {tuple(B.shape)}")
        if A.shape[-1] != B.shape[-2]:
            raise ValueError(f"inner dimensions differ: A {tuple(A.shape)} @ B {tuple(B.shape)}")
        lead = np.broadcast_shapes(A.shape[:-2], B.shape[:-2])
        # broadcast_to is a view: no copy, so stacked weights do not double memory.
        self.A = np.broadcast_to(A, (*lead, *A.shape[-2:]))
        self.B = np.broadcast_to(B, (*lead, *B.shape[-2:]))
        self.ldim = A.shape[-2]
        self.mdim = A.shape[-1]
        self.rdim = B.shape[-1]
        self.shape = (*lead, self.ldim, self.rdim)
        # svd() is computed once (a plain attribute: functools.cached_property serialises
        # every instance on one lock in Python 3.11, and worker threads share this class).
        self._svd: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    # -- basic shape -----------------------------------------------------------------------

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.promote_types(self.A.dtype, self.B.dtype)

    @property
    def pair(self) -> tuple[np.ndarray, np.ndarray]:
        return self.A, self.B

    def __repr__(self) -> str:
        return f"FactoredMatrix(shape={tuple(self.shape)}, inner={self.mdim}, dtype={self.dtype})"

    @property
    def T(self) -> FactoredMatrix:
        """The transpose ``(AB)ᵀ = Bᵀ Aᵀ``."""
        return FactoredMatrix(self.B.swapaxes(-2, -1), self.A.swapaxes(-2, -1))

    def to(self, dtype: Any) -> FactoredMatrix:
        """Both factors in ``dtype``; eig/svd/norm still compute in float32 for 16-bit."""
        return FactoredMatrix(self.A.astype(dtype), self.B.astype(dtype))

    def __getitem__(self, idx: object) -> FactoredMatrix:
        """Index the leading dims, then rows, then columns, without forming ``AB``.

        ``fm[3]`` is the fourth matrix of a stack; on a 2-D matrix ``fm[rows]`` keeps those
        rows (``A[rows]``, ``B``) and ``fm[rows, cols]`` those rows and columns (``A[rows]``,
        ``B[:, cols]``). An integer row or column index keeps its dim (TransformerLens turns
        it into a one-element slice), so the result is always a matrix. ``...`` expands to
        the dims not indexed.
        """
        items = list(idx) if isinstance(idx, tuple) else [idx]
        if any(item is None for item in items):
            raise IndexError("FactoredMatrix indexing does not insert new axes (None)")
        lead, rows, cols = _split_index(_expand_ellipsis(items, self.ndim), self.ndim - 2)
        # the leading index first, then rows and columns one at a time: numpy moves advanced
        # indices separated by a slice to the front
        a, b = (self.A[lead], self.B[lead]) if lead else (self.A, self.B)
        return FactoredMatrix(a[..., rows, :], b[..., :, cols])

    def unsqueeze(self, dim: int) -> FactoredMatrix:
        if dim < 0:
            dim += self.ndim + 1
        if dim > self.ndim - 2:
            raise IndexError("unsqueeze applies to the leading dims only")
        return FactoredMatrix(np.expand_dims(self.A, dim), np.expand_dims(self.B, dim))

    # -- products --------------------------------------------------------------------------

    @property
    def AB(self) -> np.ndarray:
        """The dense product ``[..., ldim, rdim]``: potentially huge, prefer ``block``."""
        return self.A @ self.B

    @property
    def BA(self) -> np.ndarray:
        """The small reverse product ``[..., mdim, mdim]`` (square matrices only)."""
        if self.ldim != self.rdim:
            raise ValueError(f"BA needs a square matrix, shape is {tuple(self.shape)}")
        return self.B @ self.A

    def __matmul__(self, other: Any) -> np.ndarray | FactoredMatrix:
        if isinstance(other, FactoredMatrix):
            # (A1 B1)(A2 B2): contract the small B1 A2 first, keep the smaller inner dim.
            middle = self.B @ other.A  # [..., m1, m2]
            if self.mdim <= other.mdim:
                return FactoredMatrix(self.A, middle @ other.B)
            return FactoredMatrix(self.A @ middle, other.B)
        other = np.asarray(other)
        if other.ndim == 1:  # [..., ldim]: one vector per leading index
            if other.shape[0] != self.rdim:
                raise ValueError(f"cannot multiply {tuple(self.shape)} @ {tuple(other.shape)}")
            return (self.A @ (self.B @ other[:, None]))[..., 0]
        if other.shape[-2] != self.rdim:
            raise ValueError(f"cannot multiply {tuple(self.shape)} @ {tuple(other.shape)}")
        if self.mdim <= self.rdim:
            return FactoredMatrix(self.A, self.B @ other)
        return FactoredMatrix(self.A @ self.B, other)

    def __rmatmul__(self, other: Any) -> np.ndarray | FactoredMatrix:
        other = np.asarray(other)
        if other.ndim == 1:  # [..., rdim]: one vector per leading index
            if other.shape[0] != self.ldim:
                raise ValueError(f"cannot multiply {tuple(other.shape)} @ {tuple(self.shape)}")
            return ((other[None, :] @ self.A) @ self.B)[..., 0, :]
        if other.shape[-1] != self.ldim:
            raise ValueError(f"cannot multiply {tuple(other.shape)} @ {tuple(self.shape)}")
        if self.mdim <= self.ldim:
            return FactoredMatrix(other @ self.A, self.B)
        return FactoredMatrix(other, self.A @ self.B)

    # ``array @ fm`` and ``array * fm``: numpy defers to __rmatmul__ / __rmul__
    __array_ufunc__ = None

    def __mul__(self, scalar: Any) -> FactoredMatrix:
        """``s · AB`` for a scalar ``s`` (a number or a one-element array)."""
        if isinstance(scalar, np.ndarray):
            if scalar.size != 1:
                raise ValueError(
                    f"FactoredMatrix * array needs a scalar, got shape {tuple(scalar.shape)}; "
                    "use @ for matrix products"
                )
            scalar = scalar.reshape(())
        elif not isinstance(scalar, (int, float, np.number)):
            return NotImplemented
        return FactoredMatrix(self.A * scalar, self.B)

    __rmul__ = __mul__

    def __neg__(self) -> FactoredMatrix:
        return FactoredMatrix(-self.A, self.B)

    def block(self, rows: Index = None, cols: Index = None) -> np.ndarray:
        """Materialise only ``AB[..., rows, :][..., :, cols]``: ``A[rows] @ B[:, cols]``."""
        a = _compute(self.A)[..., _as_index(rows), :]
        b = _compute(self.B)[..., :, _as_index(cols)]
        with np.errstate(all="ignore"):
            return a @ b

    # -- norms, SVD and spectrum -------------------------------------------------------------

    def norm(self) -> np.ndarray:
        """Frobenius norm ``sqrt(trace((AᵀA)(BBᵀ)))`` from two ``mdim × mdim`` Gram matrices."""
        dtype = _compute(self.A).dtype
        # float64 throughout: the Grams of finite float32 factors can overflow float32 (and
        # be large while AB is small). A norm beyond float32's range comes back as inf.
        a, b = self.A.astype(np.float64), self.B.astype(np.float64)
        with np.errstate(all="ignore"):
            gram_a = a.swapaxes(-2, -1) @ a  # [..., m, m]
            gram_b = b @ b.swapaxes(-2, -1)  # [..., m, m], symmetric: trace(XY) = sum(X * Y)
            sq = (gram_a * gram_b).sum((-2, -1))
            return np.sqrt(np.maximum(sq, 0)).astype(dtype)

    def _check_finite(self, what: str) -> None:
        check_finite(self.A, self.B, what=f"factors of the matrix ({what})")

    def svd(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(U, S, Vh)`` with ``U @ diag(S) @ Vh == AB`` (computed once, then cached).

        ``A = Qa Ra`` and ``Bᵀ = Qb Rb`` (reduced QR), so ``AB = Qa (Ra Rbᵀ) Qbᵀ``; the SVD
        of the small middle matrix ``Ra Rbᵀ = Um S Vhm`` gives ``U = Qa Um`` and
        ``Vh = Vhm Qbᵀ``. Shapes: ``U [..., ldim, r]``, ``S [..., r]``, ``Vh [..., r, rdim]``
        with ``r = min(ldim, mdim, rdim)``, singular values in descending order. The middle
        matrix is formed and decomposed in float64; singular values beyond float32's range
        come back as inf.
        """
        if self._svd is None:
            self._svd = self._compute_svd()
        return self._svd

    def _compute_svd(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        self._check_finite("svd")
        a, b = _compute(self.A), _compute(self.B)
        qa, ra = _qr(a)  # qa [.., l, p], ra [.., p, m], p = min(l, m)
        qb, rb = _qr(b.swapaxes(-2, -1))  # qb [.., r, s], rb [.., s, m]
        with np.errstate(all="ignore"):
            middle = ra.astype(np.float64) @ rb.astype(np.float64).swapaxes(-2, -1)
        check_finite(middle, what="middle factor of the SVD")
        um, s, vhm = np.linalg.svd(middle, full_matrices=False)
        with np.errstate(over="ignore"):
            return (qa @ um.astype(qa.dtype), s.astype(a.dtype),
                    vhm.astype(qb.dtype) @ qb.swapaxes(-2, -1))

    @property
    def U(self) -> np.ndarray:
        return self.svd()[0]

    @property
    def S(self) -> np.ndarray:
        return self.svd()[1]

    @property
    def Vh(self) -> np.ndarray:
        return self.svd()[2]

    def make_even(self) -> FactoredMatrix:
        """The same matrix as ``(U √S, √S Vh)``: balanced factors with orthogonal columns/rows."""
        u, s, vh = self.svd()
        root = np.sqrt(s)
        return FactoredMatrix(u * root[..., None, :], root[..., :, None] * vh)

    @property
    def eigenvalues(self) -> np.ndarray:
        """The ``min(ldim, mdim)`` eigenvalues of ``AB`` that can be non-zero (complex).

        If ``BAv = λv`` then ``AB(Av) = λ(Av)``: the non-zero eigenvalues of ``AB`` are those
        of the ``mdim × mdim`` matrix ``BA``. When ``ldim <= mdim``, ``AB`` itself is the
        smaller matrix and is used directly.
        """
        complex_dtype = np.complex128 if _compute(self.A).dtype == np.float64 else np.complex64
        with np.errstate(over="ignore"):
            return self.eigenvalues_double().astype(complex_dtype)

    def eigenvalues_double(self) -> np.ndarray:
        """``eigenvalues`` in complex128, whatever the factors' dtype.

        The small matrix is formed in float64: a product of finite float32 factors cannot
        overflow there (in float32 factors near 1e19 give inf/NaN), and dgeev is more
        accurate. Statistics over the spectrum (the copying score) use this; ``eigenvalues``
        casts it to the compute dtype, where eigenvalues beyond float32's range become inf.
        """
        if self.ldim != self.rdim:
            raise ValueError(f"eigenvalues need a square matrix, shape is {tuple(self.shape)}")
        self._check_finite("eigenvalues")
        a, b = self.A.astype(np.float64), self.B.astype(np.float64)
        with np.errstate(all="ignore"):
            small = a @ b if self.ldim <= self.mdim else b @ a
        check_finite(small, what="product of the factors (eigenvalues)")
        with one_lapack_thread():
            return np.linalg.eigvals(small).astype(np.complex128)

    def eigenvalues_full(self) -> np.ndarray:
        """All ``ldim`` eigenvalues of ``AB``: ``eigenvalues`` padded with exact zeros."""
        ev = self.eigenvalues
        pad = self.ldim - ev.shape[-1]
        if pad == 0:
            return ev
        return np.concatenate((ev, np.zeros((*ev.shape[:-1], pad), ev.dtype)), axis=-1)

    def collapse_l(self) -> np.ndarray:
        """``diag(S) @ Vh`` ``[..., r, rdim]``: the matrix with its left orthogonal factor removed."""
        _, s, vh = self.svd()
        return s[..., :, None] * vh

    def collapse_r(self) -> np.ndarray:
        """``U @ diag(S)`` ``[..., ldim, r]``: the matrix with its right orthogonal factor removed."""
        u, s, _ = self.svd()
        return u * s[..., None, :]
