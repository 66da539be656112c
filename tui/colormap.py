"""Values → RGB cells, and matrices → the grid of cells a pane can show.

Pure numpy, no Textual: these run in worker threads and are tested on their own.

- ``diverging_rgb`` maps zero to the middle stop and ±``vmax`` to the end stops, so the
  sign of a circuit entry is its hue and its size is its saturation.
- ``fit_shape`` chooses how many terminal cells a matrix gets: terminal cells are about
  twice as tall as wide, so an entry is drawn 2k cells wide and k tall; a matrix that does
  not fit is pooled, never silently overwritten (plotext's ``matrix_plot`` would drop cells).
- ``resample`` pools (block means) or repeats rows/columns to exactly that many cells.
"""

from __future__ import annotations

import numpy as np

RGB = tuple[int, int, int]


def symmetric_range(values: np.ndarray) -> float:
    """The half-width of the colour scale: max |finite value| (1.0 for an all-zero matrix)."""
    finite = np.abs(values[np.isfinite(values)])
    vmax = float(finite.max()) if finite.size else 0.0
    return vmax if vmax > 0 else 1.0


def diverging_rgb(
    values: np.ndarray, stops: tuple[RGB, RGB, RGB], vmax: float | None = None
) -> np.ndarray:
    """``[..., 3]`` uint8 colours: linear from ``stops[0]`` (−vmax) via ``stops[1]`` (0) to
    ``stops[2]`` (+vmax). Values beyond the range clip; NaN/inf get the zero colour."""
    v = np.asarray(values, dtype=np.float64)
    vmax = symmetric_range(v) if vmax is None else float(vmax)
    t = np.clip(np.nan_to_num(v / vmax, nan=0.0, posinf=1.0, neginf=-1.0), -1.0, 1.0)
    neg, mid, pos = (np.asarray(s, dtype=np.float64) for s in stops)
    w = np.abs(t)[..., None]
    end = np.where((t < 0)[..., None], neg, pos)
    rgb = mid * (1.0 - w) + end * w
    return np.clip(np.rint(rgb), 0, 255).astype(np.uint8)


def fit_shape(n_rows: int, n_cols: int, max_h: int, max_w: int) -> tuple[int, int]:
    """Cells ``(height, width)`` for an ``n_rows × n_cols`` matrix in a ``max_h × max_w`` area.

    Each entry is ``k`` rows by ``2k`` columns for the largest ``k ≥ 1`` that fits; when even
    ``k = 1`` does not fit, both axes are pooled by the same factor (aspect kept)."""
    if n_rows <= 0 or n_cols <= 0 or max_h <= 0 or max_w <= 0:
        return (0, 0)
    if n_rows <= max_h and 2 * n_cols <= max_w:
        k = min(max_h // n_rows, max_w // (2 * n_cols))
        return (n_rows * k, 2 * n_cols * k)
    # Pool both axes by the same factor, so a square matrix still looks square.
    s = min(max_h / n_rows, max_w / (2 * n_cols))
    return (max(1, min(max_h, int(n_rows * s))), max(1, min(max_w, int(2 * n_cols * s))))


def _bins(n: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    """Start/stop source indices for each of ``out`` output cells over ``n`` inputs."""
    i = np.arange(out)
    start = (i * n) // out
    stop = np.maximum(start + 1, ((i + 1) * n) // out)
    return start, stop


def resample(values: np.ndarray, out_rows: int, out_cols: int) -> np.ndarray:
    """``[out_rows, out_cols]``: block means when shrinking, repetition when growing.

    Non-finite entries are ignored by the means (a cell of only NaNs stays NaN)."""
    v = np.asarray(values, dtype=np.float64)
    n_rows, n_cols = v.shape
    finite = np.isfinite(v)
    v0 = np.where(finite, v, 0.0)
    # Prefix sums make every block mean O(1): sum over [r0, r1) × [c0, c1).
    s = np.zeros((n_rows + 1, n_cols + 1))
    s[1:, 1:] = v0.cumsum(0).cumsum(1)
    c = np.zeros((n_rows + 1, n_cols + 1))
    c[1:, 1:] = finite.cumsum(0).cumsum(1)
    r0, r1 = _bins(n_rows, out_rows)
    c0, c1 = _bins(n_cols, out_cols)

    def block(p: np.ndarray) -> np.ndarray:
        return (
            p[np.ix_(r1, c1)] - p[np.ix_(r0, c1)] - p[np.ix_(r1, c0)] + p[np.ix_(r0, c0)]
        )

    total, count = block(s), block(c)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def source_index(cell: int, n: int, out: int) -> int:
    """Which source row/column (the first of its block) a resampled cell shows."""
    return int((cell * n) // out)


def cell_of(index: int, n: int, out: int) -> float:
    """The centre (in cells) of source row/column ``index`` after resampling ``n`` → ``out``."""
    return (index + 0.5) * out / n - 0.5
