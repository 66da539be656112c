"""``FactoredMatrix``: a matrix kept as the product ``A @ B`` of two thin factors.

A head's circuits are low rank: ``QK = W_Q W_Kᵀ`` is ``d_model × d_model`` but has rank at most
``d_head``, and the full OV circuit ``W_E W_V W_O W_U`` is ``d_vocab × d_vocab`` of rank
``d_head``. Everything headscope needs from such a matrix (shape, Frobenius norm, SVD,
eigenvalues, a few rows and columns) comes from the factors without forming the product.

Names follow TransformerLens' ``FactoredMatrix`` (``A``, ``B``, ``AB``, ``BA``, ``T``,
``svd``, ``U``, ``S``, ``Vh``, ``eigenvalues``, ``norm``, ``ldim``/``mdim``/``rdim``) where the
meaning is the same. Differences, on purpose:

- ``svd()`` returns a true ``Vh`` (``U @ diag(S) @ Vh == AB``; TransformerLens returns ``V``
  under that name) and ``min(ldim, mdim, rdim)`` singular triplets, not ``mdim``.
- ``eigenvalues`` are the ``min(ldim, mdim)`` eigenvalues of ``AB`` that can be non-zero
  (computed from the small ``BA`` when ``mdim < ldim``); ``eigenvalues_full()`` pads them with
  the zeros that complete the spectrum of ``AB``.
- 16-bit factors are computed on in float32 (eig/svd are not implemented for bf16), and a
  non-finite factor raises :class:`~engine.errors.NonFiniteError` before any eig/svd call:
  ``torch.linalg.eigvals`` on a NaN matrix kills the process in current CPU builds.
- ``block(rows, cols)`` materialises only the requested rows and columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Union

import torch

from .errors import NonFiniteError

if TYPE_CHECKING:
    from torch import Tensor

Index = Union[Sequence[int], "Tensor", slice, None]

_SIXTEEN_BIT = (torch.float16, torch.bfloat16)

__all__ = ["FactoredMatrix", "broadcast_shapes", "check_finite", "is_finite"]


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    """NumPy broadcasting of shapes. ``torch.broadcast_shapes`` imports torch.fx's symbolic
    shapes on first use (~0.4 s), which would land on the first head the user opens."""
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for dims in zip(*((1,) * (ndim - len(s)) + tuple(s) for s in shapes), strict=True):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            raise ValueError(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _compute(t: Tensor) -> Tensor:
    """The tensor in a dtype linear algebra works in: 16-bit floats go to float32."""
    return t.float() if t.dtype in _SIXTEEN_BIT else t


def is_finite(t: Tensor) -> bool:
    """True unless ``t`` holds a NaN or an infinity."""
    # max/min propagate NaN and keep ±inf: much faster than isfinite(t).all().
    return t.numel() == 0 or (bool(torch.isfinite(t.amax())) and bool(torch.isfinite(t.amin())))


def check_finite(*tensors: Tensor, what: str = "matrix", path: str | None = None) -> None:
    """Raise NonFiniteError if any tensor holds a NaN or an infinity."""
    for t in tensors:
        if not is_finite(t):
            raise NonFiniteError(path, f"{what} has NaN or infinite entries")


def _as_index(idx: Index) -> Tensor | slice:
    if idx is None:
        return slice(None)
    if isinstance(idx, slice):
        return idx
    return torch.as_tensor(idx, dtype=torch.long)


class FactoredMatrix:
    """The matrix ``A @ B`` with ``A: [..., ldim, mdim]`` and ``B: [..., mdim, rdim]``.

    Leading (batch) dimensions broadcast, e.g. ``FactoredMatrix(W_V, W_O)`` on
    ``[n_heads, d_model, d_head]`` and ``[n_heads, d_head, d_model]`` is every head's OV
    circuit at once.
    """

    def __init__(self, A: Tensor, B: Tensor) -> None:
        if A.ndim < 2 or B.ndim < 2:
            raise ValueError(f"factors must be at least 2-D, got {tuple(A.shape)} and {tuple(B.shape)}")
        if A.shape[-1] != B.shape[-2]:
            raise ValueError(
                f"inner dimensions differ: A {tuple(A.shape)} @ B {tuple(B.shape)}"
            )
        lead = broadcast_shapes(A.shape[:-2], B.shape[:-2])
        # broadcast_to is a view: no copy, so stacked weights do not double memory.
        self.A = A.broadcast_to((*lead, *A.shape[-2:]))
        self.B = B.broadcast_to((*lead, *B.shape[-2:]))
        self.ldim = A.shape[-2]
        self.mdim = A.shape[-1]
        self.rdim = B.shape[-1]
        self.shape = torch.Size((*lead, self.ldim, self.rdim))

    # -- basic shape -----------------------------------------------------------------------

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self) -> torch.dtype:
        return torch.promote_types(self.A.dtype, self.B.dtype)

    @property
    def pair(self) -> tuple[Tensor, Tensor]:
        return self.A, self.B

    def __repr__(self) -> str:
        return f"FactoredMatrix(shape={tuple(self.shape)}, inner={self.mdim}, dtype={self.dtype})"

    @property
    def T(self) -> FactoredMatrix:
        """The transpose ``(AB)ᵀ = Bᵀ Aᵀ``."""
        return FactoredMatrix(self.B.transpose(-2, -1), self.A.transpose(-2, -1))

    def to(self, dtype: torch.dtype) -> FactoredMatrix:
        """Both factors in ``dtype``; eig/svd/norm still compute in float32 for 16-bit."""
        return FactoredMatrix(self.A.to(dtype), self.B.to(dtype))

    def __getitem__(self, idx: int | slice | tuple) -> FactoredMatrix:
        """Index the leading (batch) dimensions only, e.g. ``ov_all_heads[3]``."""
        if not isinstance(idx, tuple):
            idx = (idx,)
        if len(idx) > self.ndim - 2:
            raise IndexError(
                f"FactoredMatrix indexing applies to the {self.ndim - 2} leading dims only; "
                "use block(rows, cols) for entries"
            )
        return FactoredMatrix(self.A[idx], self.B[idx])

    def unsqueeze(self, dim: int) -> FactoredMatrix:
        if dim < 0:
            dim += self.ndim + 1
        if dim > self.ndim - 2:
            raise IndexError("unsqueeze applies to the leading dims only")
        return FactoredMatrix(self.A.unsqueeze(dim), self.B.unsqueeze(dim))

    # -- products --------------------------------------------------------------------------

    @property
    def AB(self) -> Tensor:
        """The dense product ``[..., ldim, rdim]``: potentially huge, prefer ``block``."""
        return self.A @ self.B

    @property
    def BA(self) -> Tensor:
        """The small reverse product ``[..., mdim, mdim]`` (square matrices only)."""
        if self.ldim != self.rdim:
            raise ValueError(f"BA needs a square matrix, shape is {tuple(self.shape)}")
        return self.B @ self.A

    def __matmul__(self, other: Tensor | FactoredMatrix) -> Tensor | FactoredMatrix:
        if isinstance(other, FactoredMatrix):
            # (A1 B1)(A2 B2): contract the small B1 A2 first, keep the smaller inner dim.
            middle = self.B @ other.A  # [..., m1, m2]
            if self.mdim <= other.mdim:
                return FactoredMatrix(self.A, middle @ other.B)
            return FactoredMatrix(self.A @ middle, other.B)
        if other.ndim == 1:
            return self.A @ (self.B @ other)
        if other.shape[-2] != self.rdim:
            raise ValueError(f"cannot multiply {tuple(self.shape)} @ {tuple(other.shape)}")
        if self.mdim <= self.rdim:
            return FactoredMatrix(self.A, self.B @ other)
        return FactoredMatrix(self.A @ self.B, other)

    def __rmatmul__(self, other: Tensor) -> Tensor | FactoredMatrix:
        if other.ndim == 1:
            return (other @ self.A) @ self.B
        if other.shape[-1] != self.ldim:
            raise ValueError(f"cannot multiply {tuple(other.shape)} @ {tuple(self.shape)}")
        if self.mdim <= self.ldim:
            return FactoredMatrix(other @ self.A, self.B)
        return FactoredMatrix(other, self.A @ self.B)

    def __mul__(self, scalar: float | Tensor) -> FactoredMatrix:
        return FactoredMatrix(self.A * scalar, self.B)

    __rmul__ = __mul__

    def __neg__(self) -> FactoredMatrix:
        return FactoredMatrix(-self.A, self.B)

    def block(self, rows: Index = None, cols: Index = None) -> Tensor:
        """Materialise only ``AB[..., rows, :][..., :, cols]``: ``A[rows] @ B[:, cols]``."""
        a = _compute(self.A)[..., _as_index(rows), :]
        b = _compute(self.B)[..., :, _as_index(cols)]
        return a @ b

    # -- norms, SVD and spectrum -------------------------------------------------------------

    def norm(self) -> Tensor:
        """Frobenius norm ``sqrt(trace((AᵀA)(BBᵀ)))`` from two ``mdim × mdim`` Gram matrices."""
        a, b = _compute(self.A), _compute(self.B)
        gram_a = a.transpose(-2, -1) @ a  # [..., m, m]
        gram_b = b @ b.transpose(-2, -1)  # [..., m, m], symmetric: trace(XY) = sum(X * Y)
        # Accumulate the trace in float64: the two Grams can be large while AB is small.
        sq = (gram_a.double() * gram_b.double()).sum((-2, -1))
        return sq.clamp_min(0).sqrt().to(a.dtype)

    def _check_finite(self, what: str) -> None:
        check_finite(self.A, self.B, what=f"factors of the matrix ({what})")

    def svd(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(U, S, Vh)`` with ``U @ diag(S) @ Vh == AB``.

        ``A = Qa Ra`` and ``Bᵀ = Qb Rb`` (reduced QR), so ``AB = Qa (Ra Rbᵀ) Qbᵀ``; the SVD
        of the small middle matrix ``Ra Rbᵀ = Um S Vhm`` gives ``U = Qa Um`` and
        ``Vh = Vhm Qbᵀ``. Shapes: ``U [..., ldim, r]``, ``S [..., r]``, ``Vh [..., r, rdim]``
        with ``r = min(ldim, mdim, rdim)``, singular values in descending order.
        """
        self._check_finite("svd")
        a, b = _compute(self.A), _compute(self.B)
        qa, ra = torch.linalg.qr(a)  # qa [.., l, p], ra [.., p, m], p = min(l, m)
        qb, rb = torch.linalg.qr(b.transpose(-2, -1))  # qb [.., r, s], rb [.., s, m]
        um, s, vhm = torch.linalg.svd(ra @ rb.transpose(-2, -1), full_matrices=False)
        return qa @ um, s, vhm @ qb.transpose(-2, -1)

    @property
    def U(self) -> Tensor:
        return self.svd()[0]

    @property
    def S(self) -> Tensor:
        return self.svd()[1]

    @property
    def Vh(self) -> Tensor:
        return self.svd()[2]

    def make_even(self) -> FactoredMatrix:
        """The same matrix as ``(U √S, √S Vh)``: balanced factors with orthogonal columns/rows."""
        u, s, vh = self.svd()
        root = s.sqrt()
        return FactoredMatrix(u * root[..., None, :], root[..., :, None] * vh)

    @property
    def eigenvalues(self) -> Tensor:
        """The ``min(ldim, mdim)`` eigenvalues of ``AB`` that can be non-zero (complex).

        If ``BAv = λv`` then ``AB(Av) = λ(Av)``: the non-zero eigenvalues of ``AB`` are those
        of the ``mdim × mdim`` matrix ``BA``. When ``ldim <= mdim``, ``AB`` itself is the
        smaller matrix and is used directly.
        """
        if self.ldim != self.rdim:
            raise ValueError(f"eigenvalues need a square matrix, shape is {tuple(self.shape)}")
        self._check_finite("eigenvalues")
        a, b = _compute(self.A), _compute(self.B)
        small = a @ b if self.ldim <= self.mdim else b @ a
        # Solve in float64 (more accurate, and dgeev is faster than sgeev on CPU here), then
        # return the complex dtype that matches the compute dtype.
        complex_dtype = torch.complex128 if small.dtype == torch.float64 else torch.complex64
        return torch.linalg.eigvals(small.double()).to(complex_dtype)

    def eigenvalues_full(self) -> Tensor:
        """All ``ldim`` eigenvalues of ``AB``: ``eigenvalues`` padded with exact zeros."""
        ev = self.eigenvalues
        pad = self.ldim - ev.shape[-1]
        if pad == 0:
            return ev
        return torch.cat((ev, ev.new_zeros((*ev.shape[:-1], pad))), dim=-1)

    def collapse_l(self) -> Tensor:
        """``diag(S) @ Vh`` ``[..., r, rdim]``: the matrix with its left orthogonal factor removed."""
        _, s, vh = self.svd()
        return s[..., :, None] * vh

    def collapse_r(self) -> Tensor:
        """``U @ diag(S)`` ``[..., ldim, r]``: the matrix with its right orthogonal factor removed."""
        u, s, _ = self.svd()
        return u * s[..., None, :]
