"""Values → RGB cells, and matrices → the grid of cells a pane can show.

Pure numpy, no Textual: these run in worker threads and are tested on their own.

- ``diverging_rgb`` maps zero to the middle stop and ±``vmax`` to the end stops, so the
  sign of a circuit entry is its hue and its size is its saturation.
- ``fit_shape`` chooses how many terminal cells a matrix gets: terminal cells are about
  twice as tall as wide, so an entry is drawn 2k cells wide and k tall (up to twice as wide
  when the height bounds it and the pane has width to spare); a matrix that does not fit is
  pooled, never silently overwritten (plotext's ``matrix_plot`` would drop cells).
- ``resample`` pools (block means) or repeats rows/columns to exactly that many cells;
  ``pool_extreme`` keeps each block's signed extreme instead (what heatmaps draw).
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


STRETCH = 2  # entries at most twice as wide as square (fit_shape)


def fit_shape(n_rows: int, n_cols: int, max_h: int, max_w: int,
              stretch: int = STRETCH) -> tuple[int, int]:
    """Cells ``(height, width)`` for an ``n_rows × n_cols`` matrix in a ``max_h × max_w`` area.

    Each entry is ``k`` rows by ``2k`` columns (square) for the largest ``k ≥ 1`` that fits;
    when even ``k = 1`` does not fit, one row by one or two columns if that fits, else both
    axes are pooled by the same factor. A grid bound
    by the height leaves width over (the 80×24 OV tab with the directions panel hidden: a
    6×12 grid in a 31-column canvas), so the entries are then widened into it, up to
    ``stretch`` times square: every entry the same whole number of cells wide when all the
    columns are shown, more of the columns shown (pooled less) when they are not."""
    if n_rows <= 0 or n_cols <= 0 or max_h <= 0 or max_w <= 0:
        return (0, 0)
    if n_rows <= max_h and 2 * n_cols <= max_w:
        k = min(max_h // n_rows, max_w // (2 * n_cols))
        ch, cw = n_rows * k, 2 * n_cols * k
    elif n_rows <= max_h and n_cols <= max_w:
        # one cell per entry fits, two columns per entry do not: every entry is shown, some
        # one column wide, the others two (a 24×24 circuit in 25×47 was pooled to 23×47,
        # its last two rows merged, for one missing column)
        ch, cw = n_rows, max_w
    else:  # pool both axes by the same factor, so a square matrix still looks square
        s = min(max_h / n_rows, max_w / (2 * n_cols))
        ch, cw = max(1, min(max_h, int(n_rows * s))), max(1, min(max_w, int(2 * n_cols * s)))
    wide = min(max_w, stretch * cw)
    if wide >= n_cols:  # equal widths: a whole number of cells per column
        return ch, max(cw, n_cols * (wide // n_cols))
    return ch, wide


def bins(n: int, out: int) -> tuple[np.ndarray, np.ndarray]:
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
    r0, r1 = bins(n_rows, out_rows)
    c0, c1 = bins(n_cols, out_cols)

    def block(p: np.ndarray) -> np.ndarray:
        return (
            p[np.ix_(r1, c1)] - p[np.ix_(r0, c1)] - p[np.ix_(r1, c0)] + p[np.ix_(r0, c0)]
        )

    total, count = block(s), block(c)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def pool_extreme(values: np.ndarray, out_rows: int, out_cols: int) -> np.ndarray:
    """``[out_rows, out_cols]``: each cell the signed value of largest magnitude in its block
    (the blocks of ``bins``); repetition when growing; non-finite entries ignored (a block of
    only NaNs stays NaN).

    What a pooled heatmap draws: a block mean dilutes a one-entry-wide structure (the bright
    diagonal of a copying head's OV circuit, an attention stripe) by the block's size, and at
    80×24 a 24×24 OV circuit pooled to 7 rows came out all grey. The extreme keeps it at its
    own brightness, and its sign."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0 or out_rows <= 0 or out_cols <= 0:
        return np.full((max(out_rows, 0), max(out_cols, 0)), np.nan)
    finite = np.isfinite(v)
    r0, _ = bins(v.shape[0], out_rows)
    c0, _ = bins(v.shape[1], out_cols)

    def reduce(ufunc: np.ufunc, fill: float) -> np.ndarray:
        # reduceat over the blocks' starts: a block runs to the next start (they are
        # contiguous when shrinking); a repeated start is that one row (growing)
        x = np.where(finite, v, fill)
        return ufunc.reduceat(ufunc.reduceat(x, r0, axis=0), c0, axis=1)

    hi, lo = reduce(np.maximum, -np.inf), reduce(np.minimum, np.inf)
    out = np.where(np.abs(hi) >= np.abs(lo), hi, lo)
    return np.where(np.isfinite(out), out, np.nan)


def source_index(cell: int, n: int, out: int) -> int:
    """Which source row/column (the first of its block) a resampled cell shows."""
    return int((cell * n) // out)


def cell_of(index: int, n: int, out: int) -> float:
    """The centre (in cells) of source row/column ``index`` after resampling ``n`` → ``out``."""
    return (index + 0.5) * out / n - 0.5


# -- terminals without truecolor (docs/internals.md: colour modes) -----------------------------
# In 256 colours a truecolor ramp is quantised by the terminal (or Rich) to the nearest xterm
# entry, and the nearest entries of a smooth ramp jump between hues and lightnesses. Instead the
# ramp is built from palette entries whose CIE L* is monotone from the zero stop to each end.
# In 16 colours or without colour, magnitude is a shade character and sign a colour or glyph.

XTERM_LEVELS = (0, 95, 135, 175, 215, 255)
RAMP_STEPS = 8  # palette entries per half of a 256-colour ramp (plus the zero entry)
SHADES = " ░▒▓█"  # magnitude 0 … 4 (positive, or either sign in 16 colours)
NEG_GLYPHS = " ·∙•●"  # magnitude 0 … 4 of negative entries without colour


def xterm_rgb(index: int) -> RGB:
    """The RGB of xterm palette entry ``16 ≤ index ≤ 255`` (the 6×6×6 cube, then 24 greys);
    entries 0–15 are left to the terminal's own theme and never used here."""
    if not 16 <= index <= 255:
        raise ValueError(f"xterm entry {index} is not in the cube or the grey ramp")
    if index >= 232:
        g = 8 + 10 * (index - 232)
        return (g, g, g)
    i = index - 16
    return (XTERM_LEVELS[i // 36], XTERM_LEVELS[(i // 6) % 6], XTERM_LEVELS[i % 6])


def srgb_to_lab(rgb: np.ndarray) -> np.ndarray:
    """``[..., 3]`` sRGB (0–255) → CIE L*a*b* (D65)."""
    c = np.asarray(rgb, dtype=np.float64) / 255.0
    lin = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    m = np.array([[0.4124564, 0.3575761, 0.1804375],
                  [0.2126729, 0.7151522, 0.0721750],
                  [0.0193339, 0.1191920, 0.9503041]])
    xyz = lin @ m.T / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.stack([116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]),
                     200 * (f[..., 1] - f[..., 2])], axis=-1)


def lightness(rgb: RGB | np.ndarray) -> float | np.ndarray:
    """CIE L* (0 black … 100 white) of one colour or an array of them."""
    lab = srgb_to_lab(np.asarray(rgb))
    return float(lab[..., 0]) if lab.ndim == 1 else lab[..., 0]


_WEIGHT = np.array([2.0, 1.0, 1.0])  # lightness counts double: it carries the magnitude
_PALETTE = np.arange(16, 256)
_PALETTE_LAB = srgb_to_lab(np.array([xterm_rgb(int(i)) for i in _PALETTE]))


def _nearest(target: np.ndarray, allowed: np.ndarray) -> int:
    d = np.where(allowed, (((_PALETTE_LAB - srgb_to_lab(target)) * _WEIGHT) ** 2).sum(-1), np.inf)
    return int(np.argmin(d))


def nearest_entry(rgb: RGB) -> int:
    """The xterm entry (16–255) nearest to ``rgb`` in L*a*b* (lightness weighted): a single
    theme colour pinned to the palette, instead of Rich's quantisation by its own metric."""
    everything = np.ones(len(_PALETTE), dtype=bool)
    return int(_PALETTE[_nearest(np.asarray(rgb, dtype=np.float64), everything)])


def palette_ramp(stops: tuple[RGB, RGB, RGB], steps: int = RAMP_STEPS) -> tuple[int, ...]:
    """``2·steps + 1`` xterm entries for −vmax … 0 … +vmax.

    Each entry is the palette colour nearest (in L*a*b*) to the truecolor ramp at that step,
    among the entries whose L* continues the previous step's direction away from zero, so
    lightness is monotone from the zero entry to each end (it may repeat, never reverse)."""
    neg, mid, pos = (np.asarray(s, dtype=np.float64) for s in stops)
    everything = np.ones(len(_PALETTE), dtype=bool)
    zero = _nearest(mid, everything)
    halves: list[list[int]] = []
    for end in (neg, pos):
        direction = 1.0 if lightness(end) >= lightness(mid) else -1.0
        prev, half = zero, []
        for k in range(1, steps + 1):
            w = k / steps
            ok = direction * (_PALETTE_LAB[:, 0] - _PALETTE_LAB[prev, 0]) >= 0
            prev = _nearest(mid * (1 - w) + end * w, ok)
            half.append(prev)
        halves.append(half)
    order = [*halves[0][::-1], zero, *halves[1]]
    return tuple(int(_PALETTE[i]) for i in order)


def ramp_index(values: np.ndarray, vmax: float, steps: int = RAMP_STEPS) -> np.ndarray:
    """Which of the ``2·steps + 1`` ramp entries each value takes (NaN → the zero entry)."""
    t = np.clip(np.nan_to_num(np.asarray(values, dtype=np.float64) / vmax, nan=0.0,
                              posinf=1.0, neginf=-1.0), -1.0, 1.0)
    return (np.rint(t * steps) + steps).astype(np.int64)


def shade_level(values: np.ndarray, vmax: float) -> np.ndarray:
    """Signed magnitude level −4 … 4 (an index into ``SHADES`` / ``NEG_GLYPHS`` by its size)."""
    return ramp_index(values, vmax, len(SHADES) - 1) - (len(SHADES) - 1)
