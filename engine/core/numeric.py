"""The numeric guards every weight-only computation shares (docs/math.md, "Scores"): is an
array finite, which matrices of a stack are, each matrix's largest entry, and taming (an
exact power-of-two rescale of huge heads before the scale-free scores). Plain numpy.
"""

from __future__ import annotations

import numpy as np

from headscope.engine.core.errors import NonFiniteError

__all__ = ["TAME_ABOVE", "check_finite", "finite_matrices", "is_finite", "max_abs", "tame"]


def is_finite(x: np.ndarray) -> bool:
    """True unless ``x`` holds a NaN or an infinity (max/min propagate NaN and keep ±inf:
    no boolean array is formed)."""
    x = np.asarray(x)
    if x.size == 0:
        return True
    with np.errstate(invalid="ignore"):
        return bool(np.isfinite(x.max()) and np.isfinite(x.min()))


def check_finite(*arrays: np.ndarray, what: str = "matrix", path: str | None = None) -> None:
    """Raise NonFiniteError if any array holds a NaN or an infinity."""
    for x in arrays:
        if not is_finite(x):
            raise NonFiniteError(path, f"{what} has NaN or infinite entries")


def finite_matrices(x: np.ndarray) -> np.ndarray:
    """``[...]`` bool: which matrices of ``x [..., m, n]`` are entirely finite.

    One reduction pass: a sum is NaN or ±inf if any entry is (it could also overflow, but
    only for entries near 1e33, which no float32 computation survives anyway)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.isfinite(x.sum((-2, -1)))


def max_abs(x: np.ndarray) -> np.ndarray:
    """``[...]``: the largest ``|entry|`` of each matrix of ``x [..., m, n]`` (NaN/inf if any)."""
    # reduced over both axes in place: a reshape would copy a strided (per-head) view
    with np.errstate(invalid="ignore"):
        return np.maximum(x.max((-2, -1)), -x.min((-2, -1)))


# Heads whose largest weight exceeds this are rescaled before the scale-free scores (below).
TAME_ABOVE = 2.0**20


def tame(x: np.ndarray, peak: np.ndarray | None = None) -> np.ndarray:
    """``x [..., m, n]`` with each matrix whose largest entry exceeds ``2**20`` divided by a
    power of two (exact) that brings it to at most 1; ``x`` itself if there is none.

    Every weight-based score (copying, QK positivity, composition, the diff's similarities)
    is a ratio invariant to a positive scale of each head's factors (``Σ Re λ / Σ |λ|``,
    ``‖XY‖ / (‖X‖ ‖Y‖)``), but float32 products of weights near 1e19 overflow to inf/NaN.
    Taming changes no score and keeps the products finite (docs/math.md, "Scores").
    ``peak``: ``max_abs(x)`` if the caller has it.
    """
    peak = max_abs(x) if peak is None else peak
    with np.errstate(invalid="ignore"):
        big = np.isfinite(peak) & (peak > TAME_ABOVE)
    if not big.any():
        return x
    scale = np.ones_like(peak)
    scale[big] = np.exp2(-np.ceil(np.log2(peak[big])))
    return x * scale[..., None, None]
