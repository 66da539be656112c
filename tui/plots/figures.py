"""Figures: frozen descriptions of a plot, turned into Rich ``Text`` through plotext.

``build(figure, width, height, colours)`` is what the chart widget runs in a worker thread:
every figure gets a fresh ``Plot`` (plotext figures are not shared between threads), draws
itself at exactly the given size and returns the rendered text. No Textual widgets here.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from rich.color import Color
from rich.style import Style
from rich.text import Span, Text
from textual_plotext.plot import Plot

from headscope.tui.base.datatext import printable
from headscope.tui.plots.colormap import (
    NEG_GLYPHS,
    RGB,
    SHADES,
    bins,
    cell_of,
    diverging_rgb,
    fit_shape,
    nearest_entry,
    palette_ramp,
    pool_extreme,
    ramp_index,
    shade_level,
    symmetric_range,
    xterm_rgb,
)

LABEL_WIDTH = 8  # longest tick label kept on the y axis (token strings are cut)


@dataclass(frozen=True)
class Colours:
    """What a figure needs from the theme, captured on the UI thread."""

    foreground: RGB
    muted: RGB
    accent: RGB
    primary: RGB
    stops: tuple[RGB, RGB, RGB]
    mode: str = "truecolor"  # the terminal's colours: truecolor | 256 | 16 | none (colormap.py)


def short(label: str, width: int = LABEL_WIDTH) -> str:
    """A token string fit for a tick: whitespace made visible, cut to ``width``."""
    s = printable(label).replace(" ", "·") or "∅"  # no control character reaches plotext
    return s if len(s) <= width else s[: width - 1] + "…"


def _ticks(n: int, cells: int, labels: Sequence[str], room: int) -> tuple[list[int], list[str]]:
    """Indices of the labels to draw: as many as fit, ``room`` cells per label, evenly spread."""
    if n == 0 or cells == 0:
        return [], []
    step = max(1, math.ceil(n * room / max(cells, 1)))
    idx = list(range(0, n, step))
    return idx, [labels[i] for i in idx]


@dataclass(frozen=True)
class Heatmap:
    values: np.ndarray  # [rows, cols]
    row_labels: tuple[str, ...]
    col_labels: tuple[str, ...]
    title: str = ""
    xlabel: str = ""
    # shorter forms of the x label, longest first: the first that fits the chart's width is
    # drawn instead of a cut ``xlabel`` (at 80×24, "(rows: so…" lost what the rows are)
    xlabel_short: tuple[str, ...] = ()
    ylabel: str = ""
    sequential: bool = False  # attention patterns: 0 … max on the positive half of the map
    vmax: float | None = None
    diagonal: bool = False  # rows and cols are the same token set: report the diagonal
    # drawn (muted) in the cells with no finite value, and named in the key, instead of the
    # zero colour: where NaN means "no number" (a non-finite patched head), not "nothing there"
    missing: str | None = None
    # (row, col) of an entry drawn as a cursor: ``MARK_GLYPH`` in a contrasting colour on the
    # cell's own (inverted in 16 colours / none); pooled, the cell that holds the entry
    mark: tuple[int, int] | None = None

    def key(self, colours: Colours, shape: tuple[int, int], width: int = 0) -> Text:
        """The value-range key: a gradient from −vmax (or 0) to +vmax, and the pooling.

        With ``width``, a part that does not fit on the line starts a new one (the chart's
        lines are never wider than the chart)."""
        vmax = self.vmax if self.vmax is not None else symmetric_range(self.values)
        lo = 0.0 if self.sequential else -vmax
        text = Text(f"{lo:+.3g} ", style=_rgb(colours.muted))
        # 16 steps, fewer in a narrow chart (half of 80 columns) so both ends stay on one line
        room = width - len(f"{lo:+.3g}  {vmax:+.3g}") if width else 16
        text.append_text(_key_ramp(np.linspace(lo, vmax, max(6, min(16, room))), vmax, colours))
        text.append(f" {vmax:+.3g}", style=_rgb(colours.muted))
        n_rows, n_cols = self.values.shape
        parts: list[tuple[str, tuple[int, ...]]] = []
        if shape[0] < n_rows or shape[1] < n_cols:
            parts.append((f"pooled {n_rows}×{n_cols}→{shape[0]}×{shape[1]}", colours.muted))
            if shape[0] < n_rows:
                parts.append((merged(n_rows, shape[0]).strip(), colours.muted))
        if self.diagonal and n_rows == n_cols and n_rows > 1:
            parts.append((diagonal_summary(self.values), colours.foreground))
        if self.missing is not None and not np.isfinite(self.values).all():
            parts.append((f"{self.missing} no finite value", colours.muted))
        if width:  # a part wider than the chart is wrapped at its spaces, never drawn past
            # the chart's edge (the virtual-heads pop-up: "24/24 rows peakIm λ")
            parts = [(piece.plain, colour) for part, colour in parts
                     for piece in (_wrap(part, width, max_lines=3) if len(part) > width
                                   else [Text(part)])]
        line = len(text.plain)
        for part, colour in parts:
            if width and line + 2 + len(part) > width:
                text.append("\n")
                line = 0
            elif line:
                text.append("  ")
                line += 2
            text.append(part, style=_rgb(colour))
            line += len(part)
        return text

    def draw(self, width: int, height: int, colours: Colours) -> Text:
        n_rows, n_cols = self.values.shape
        rows = [short(s) for s in self.row_labels] or [""]
        lw = max(len(s) for s in rows)
        # Lines around the canvas: title, two frame lines, x tick labels, x label, our key.
        overhead = 4 + (1 if self.xlabel else 0) + 1
        ch, cw = fit_shape(n_rows, n_cols, height - overhead, width - lw - 2)
        # A key that wraps (pooling details) takes more lines: shrink the canvas if it would
        # otherwise push the key out of the pane.
        key_lines = self.key(colours, (ch, cw), width).plain.count("\n") + 1
        if overhead - 1 + ch + key_lines > height:
            ch, cw = fit_shape(n_rows, n_cols, height - overhead - key_lines + 1, width - lw - 2)
        if ch < 1 or cw < 1:
            return Text("(pane too small)")
        grid = pool_extreme(self.values, ch, cw)
        vmax = self.vmax if self.vmax is not None else symmetric_range(self.values)
        colour, recolour = cell_colours(grid, vmax, colours)
        if self.missing is not None:
            colour, recolour = _mark_missing(grid, colour, recolour, self.missing, colours)
        cursor = None
        if self.mark is not None:
            at = (_pooled_cells(self.mark[0], n_rows, ch), _pooled_cells(self.mark[1], n_cols, cw))
            colour, cursor = _mark_cursor(colour, recolour, at, colours)
        plt = _plot(lw + 2 + cw, ch + 3, colours)  # frame top/bottom + x tick labels
        plt.matrix_plot([[tuple(int(x) for x in c) for c in row] for row in colour])
        plt.xlim(0, max(cw - 1, 1))
        plt.ylim(0, max(ch - 1, 1))
        xi, xl = _ticks(n_cols, cw, [short(s, 6) for s in self.col_labels], 7)
        plt.xticks([cell_of(i, n_cols, cw) for i in xi], xl)
        yi, yl = _ticks(n_rows, ch, rows, 1)
        # padded to the widest label of all rows, which the plot's width counts: plotext
        # makes its label column as wide as the labels drawn, and a canvas one column wider
        # than the grid drew a blank column through the middle of the heatmap
        plt.yticks([ch - 1 - cell_of(i, n_rows, ch) for i in yi], [s.rjust(lw) for s in yl])
        plt.xlabel("")  # matrix_plot sets "column"/"row"
        plt.ylabel("")
        plt.ticks_color(colours.foreground)
        # Title and x label are ours, not plotext's: it drops labels wider than the figure,
        # and a pooled heatmap is often narrower than its title.
        text = _fit_line(self.title, width, "bold")
        text.append("\n")
        canvas = _recolour(_text(plt), recolour)
        text.append_text(canvas if cursor is None else _draw_cursor(canvas, cursor))
        if self.xlabel:
            text.append("\n")
            text.append_text(_fit_line(_first_fitting((self.xlabel, *self.xlabel_short), width), width))
        text.append("\n")
        text.append_text(self.key(colours, (ch, cw), width))
        return text


Recolour = dict[tuple[int, int, int], tuple[str | None, Style]]


def cell_colours(grid: np.ndarray, vmax: float, colours: Colours) -> tuple[np.ndarray, Recolour]:
    """The RGB each heatmap cell is drawn with by plotext, and how to restyle those cells.

    Truecolor: the diverging map, nothing to restyle. 256 colours: the palette ramp's RGB,
    restyled to the xterm entry itself (so nothing quantises it again). 16 colours / none:
    a placeholder colour per magnitude level, replaced by a shade character (and a sign
    colour in 16 colours, a glyph for negative values without colour)."""
    if colours.mode == "256":
        ramp = palette_ramp(colours.stops)
        idx = np.asarray(ramp)[ramp_index(grid, vmax)]
        rgb = np.array([xterm_rgb(int(i)) for i in ramp], dtype=np.uint8)[ramp_index(grid, vmax)]
        table = {xterm_rgb(i): (None, Style(color=Color.from_ansi(i))) for i in set(idx.flat)}
        return rgb, table
    if colours.mode in ("16", "none"):
        level = shade_level(grid, vmax)
        rgb = np.zeros((*level.shape, 3), dtype=np.uint8)
        rgb[..., 0], rgb[..., 1], rgb[..., 2] = 1, 2, level + 10  # placeholders, never shown
        return rgb, {(1, 2, k + 10): _shade(k, colours) for k in range(-4, 5)}
    return diverging_rgb(grid, colours.stops, vmax), {}


MISSING_RGB = (3, 1, 4)  # the placeholder of a cell with no finite value (never shown)


def _mark_missing(grid: np.ndarray, colour: np.ndarray, recolour: Recolour, mark: str,
                  colours: Colours) -> tuple[np.ndarray, Recolour]:
    """The cells of ``grid`` with no finite value drawn as ``mark`` in the muted colour, not in
    the zero colour ``cell_colours`` gives NaN (which reads as "no effect")."""
    missing = ~np.isfinite(grid)
    if not missing.any():
        return colour, recolour
    colour = np.array(colour, copy=True)
    colour[missing] = MISSING_RGB
    return colour, {**recolour, MISSING_RGB: (mark, Style(color=Color.from_rgb(*colours.muted)))}


MARK_RGB = (5, 1, 4)  # the placeholder of the cursor's cell (never shown)
MARK_GLYPH = "◆"


def _pooled_cells(index: int, n: int, cells: int) -> slice:
    """The cells (of ``cells``) that draw entry ``index`` of ``n`` (``pool_extreme``'s blocks:
    shrinking, the one whose block holds it; growing, all its copies)."""
    start, _ = bins(n, cells)
    end = np.maximum(start + 1, np.append(start[1:], n))
    hits = np.nonzero((start <= index) & (index < end))[0]
    if not hits.size:
        return slice(0, 0)
    return slice(int(hits[0]), int(hits[-1]) + 1)


def _mark_cursor(colour: np.ndarray, recolour: Recolour, at: tuple[slice, slice], colours: Colours
                 ) -> tuple[np.ndarray, Style | None]:
    """The colours with the cursor's cells ``at`` in the placeholder ``MARK_RGB``, and the style
    ``_draw_cursor`` gives it: a contrasting glyph on the cell's own colour (the 256-colour
    entry in 256 colours, no truecolor code), or inverted in 16 colours / none."""
    if colour[at].size == 0:
        return colour, None
    rgb = tuple(int(x) for x in colour[at][0, 0])
    char, style = recolour.get(rgb, (None, None))  # type: ignore[arg-type]
    light = 0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2] > 140
    if style is None:  # truecolor
        mark = Style(color=Color.from_rgb(*((0, 0, 0) if light else (255, 255, 255))),
                     bgcolor=Color.from_rgb(*rgb), bold=True)
    elif char is None:  # 256 colours: the cell's palette entry; black (16) or white (231) on it
        mark = Style(color=Color.from_ansi(16 if light else 231), bgcolor=style.color, bold=True)
    else:  # 16 colours / none: the shade's colour inverted
        mark = Style(color=style.color, reverse=True, bold=True)
    colour = np.array(colour, copy=True)
    colour[at] = MARK_RGB
    return colour, mark


def _draw_cursor(text: Text, mark: Style) -> Text:
    """The span drawn in ``MARK_RGB`` (the cursor's cell, one or more characters wide) as
    ``MARK_GLYPH`` at its middle, blanks around it, in ``mark``."""
    chars = list(text.plain)
    spans: list[Span] = []
    for span in text.spans:
        colour = span.style.color if isinstance(span.style, Style) else None
        if colour is None or colour.triplet is None or tuple(colour.triplet) != MARK_RGB:
            spans.append(span)
            continue
        width = span.end - span.start
        chars[span.start:span.end] = MARK_GLYPH.center(width) if width > 1 else MARK_GLYPH
        spans.append(Span(span.start, span.end, mark))
    return Text("".join(chars), spans=spans)


def _shade(level: int, colours: Colours) -> tuple[str, Style]:
    """The character and style of a magnitude level in 16 colours / without colour."""
    if colours.mode == "none":
        return (NEG_GLYPHS[-level] if level < 0 else SHADES[level]), Style()
    neg, pos = ansi16_pair(colours.stops)
    return SHADES[abs(level)], Style(color=neg if level < 0 else pos)


_ANSI_HUES = {"red": 0.0, "yellow": 60.0, "green": 120.0, "cyan": 180.0, "blue": 240.0,
              "magenta": 300.0}


def ansi16_pair(stops: tuple[RGB, RGB, RGB]) -> tuple[str, str]:
    """Two of the terminal's bright colours for negative and positive, by the stops' hues."""
    import colorsys

    def nearest(rgb: RGB) -> str:
        h = colorsys.rgb_to_hsv(*(c / 255 for c in rgb))[0] * 360
        return min(_ANSI_HUES, key=lambda n: min(abs(h - _ANSI_HUES[n]),
                                                 360 - abs(h - _ANSI_HUES[n])))

    neg, pos = nearest(stops[0]), nearest(stops[2])
    if neg == pos:
        neg, pos = "blue", "red"
    return f"bright_{neg}", f"bright_{pos}"


def _key_ramp(steps: np.ndarray, vmax: float, colours: Colours) -> Text:
    """The key's gradient, drawn the way the cells are."""
    text = Text()
    colour, recolour = cell_colours(steps[None, :], vmax, colours)
    for c in colour[0]:
        char, style = recolour.get(tuple(int(x) for x in c), (None, None))
        if style is None:
            style = Style(bgcolor=Color.from_rgb(*(int(x) for x in c)))
        elif char is None:  # 256 colours: the palette entry as background
            style = Style(bgcolor=style.color)
        text.append(char or " ", style=style)
    return text


def _recolour(text: Text, table: Recolour) -> Text:
    """Restyle the spans drawn in a placeholder colour (see ``cell_colours``)."""
    if not table:
        return text
    chars = list(text.plain)
    spans: list[Span] = []
    for span in text.spans:
        style = span.style
        colour = style.color if isinstance(style, Style) else None
        hit = table.get(tuple(colour.triplet)) if colour is not None and colour.triplet else None
        if hit is None:
            spans.append(span)
            continue
        char, new = hit
        if char is not None:
            chars[span.start:span.end] = char * (span.end - span.start)
        spans.append(Span(span.start, span.end, new))
    out = Text("".join(chars), spans=spans)
    return out


def merged(n: int, cells: int) -> str:
    """Which rows share a cell when ``n`` rows are pooled into ``cells``, and what the cell
    shows (``pool_extreme``: the block's entry of largest magnitude, with its sign)."""
    if cells >= n or cells <= 0:
        return ""
    start, stop = bins(n, cells)  # the blocks pool_extreme() reduces
    blocks = [f"{a}–{b - 1}" for a, b in zip(start.tolist(), stop.tolist(), strict=True)
              if b - a > 1]
    more = ", …" if len(blocks) > 2 else ""
    return f" (rows {', '.join(blocks[:2])}{more}: largest |value|)"


def diagonal_summary(values: np.ndarray) -> str:
    """How strongly the diagonal stands out: mean diag vs off-diag, rows peaking on it."""
    v = np.asarray(values, dtype=np.float64)
    n = v.shape[0]
    diag = np.diag(v)
    off = (v.sum() - diag.sum()) / max(n * n - n, 1)
    peaks = int((np.argmax(np.nan_to_num(v, nan=-np.inf), axis=1) == np.arange(n)).sum())
    return f"diag {np.nanmean(diag):+.3g} vs off {off:+.3g}; {peaks}/{n} rows peak on diag"


@dataclass(frozen=True)
class Scatter:
    """Eigenvalues in the complex plane (or any x/y points), with the axes through 0."""

    x: np.ndarray
    y: np.ndarray
    title: str = ""
    xlabel: str = "Re λ"
    ylabel: str = "Im λ"
    # Compare mode: model B's points, drawn as crosses over A's dots on the same axes.
    bx: np.ndarray | None = None
    by: np.ndarray | None = None

    def draw(self, width: int, height: int, colours: Colours) -> Text:
        # The title is ours, wrapped on up to two lines: plotext's, cut to the canvas, lost
        # the copying score at 80 columns ("full OV λ · copyin…").
        titles = _wrap(self.title, width, "bold", 2) if self.title else []
        plt = _plot(width, max(height - len(titles), 1), colours)
        x, y = _finite_xy(self.x, self.y)
        bx, by = _finite_xy(self.bx, self.by)
        r = float(np.abs(np.concatenate([x, y, bx, by])).max(initial=0.0)) or 1.0
        lim = r * 1.05
        plt.xlim(-lim, lim)
        plt.ylim(-lim, lim)
        # Our own symmetric ticks: plotext's sometimes computes the middle one as -1e-14 and
        # prints "-0.0", which depends on the platform's rounding.
        plt.xticks(*_symmetric_ticks(lim, 5))
        plt.yticks(*_symmetric_ticks(lim, 7 if height >= 20 else 5 if height >= 10 else 3))
        plt.horizontal_line(0, color=colours.muted)
        plt.vertical_line(0, color=colours.muted)
        if bx.size:
            plt.scatter(bx.tolist(), by.tolist(), marker="x", color=colours.foreground,
                        label="B")
        neg, pos_colour = sign_colours(colours)
        if x.size:
            pos = x >= 0
            # Real-positive eigenvalues are what copying looks like: colour them apart.
            plt.scatter(x[pos].tolist(), y[pos].tolist(), marker="dot", color=pos_colour,
                        label="A" if self.bx is not None else None)
            plt.scatter(x[~pos].tolist(), y[~pos].tolist(), marker="dot", color=neg)
        plt.xlabel(self.xlabel)
        plt.ylabel(self.ylabel)
        plt.ticks_color(colours.foreground)
        return Text("\n").join([*titles, _pinned(_text(plt), colours)])


def _symmetric_ticks(lim: float, n: int) -> tuple[list[float], list[str]]:
    """``n`` ticks from -lim to lim with an exact 0 in the middle, labelled like plotext."""
    half = n // 2
    values = [lim * k / half for k in range(-half, half + 1)]
    return values, [f"{v:.1f}" if v else "0.0" for v in values]


def _finite_xy(x: np.ndarray | None, y: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    if x is None or y is None:
        return np.empty(0), np.empty(0)
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    finite = np.isfinite(x) & np.isfinite(y)
    return x[finite], y[finite]


@dataclass(frozen=True)
class Line:
    """A curve, e.g. the rotary QK score against the offset Δ."""

    x: np.ndarray
    y: np.ndarray
    title: str = ""
    xlabel: str = ""
    ylabel: str = ""
    mark_x: float | None = None
    log_x: bool = False  # e.g. the faithfulness curve over 1 % … 100 % of the edges

    def draw(self, width: int, height: int, colours: Colours) -> Text:
        plt = _plot(width, height, colours)
        plt.plot(self.x.tolist(), self.y.tolist(), marker="braille", color=colours.primary)
        if self.log_x:
            plt.xscale("log")
        plt.horizontal_line(0, color=colours.muted)
        if self.mark_x is not None:
            plt.vertical_line(self.mark_x, color=colours.accent)
        _title(plt, self.title, width)
        plt.xlabel(self.xlabel)
        plt.ticks_color(colours.foreground)
        return _text(plt)


@dataclass(frozen=True)
class Graph:
    """Layered composition graph: layers are columns, heads are nodes, edges above threshold.

    ``edges`` are ``(l1, h1, l2, h2, strength)`` with strength = score − baseline, already
    filtered by the caller's threshold. Strength is visible three ways: the edge colour runs
    from the zero stop to the positive stop over ``[vmin, vmax]`` (the key under the graph),
    weaker edges are drawn first so strong ones stay on top, and the ``labels`` strongest
    edges carry their value at the midpoint. The selected edge is drawn last in the accent
    colour. The title is ours (wrapped to the width, never cut): plotext drops long titles.
    """

    n_layers: int
    n_heads: int
    edges: tuple[tuple[int, int, int, int, float], ...]
    title: str = ""
    selected: tuple[int, int, int, int] | None = None
    vmax: float = 1.0
    nodes: tuple[tuple[int, int], ...] = field(default_factory=tuple)  # highlighted heads
    vmin: float = 0.0  # strength of the weakest edge that could be drawn (the threshold)
    labels: int = 3

    def edge_colour(self, strength: float, colours: Colours) -> tuple[int, int, int]:
        """The positive half of the colour map over ``[vmin, vmax]``; in 256 colours the
        palette ramp's entry (``colormap.palette_ramp``: lightness monotone in strength),
        given as that entry's exact RGB so ``draw`` can pin it to the entry."""
        span = self.vmax - self.vmin
        t = (strength - self.vmin) / span if span > 0 else 1.0
        t = 0.3 + 0.7 * float(np.clip(t, 0.0, 1.0))  # never as dark as the background
        if colours.mode == "256":
            ramp = _palette_ramp(colours.stops)
            return xterm_rgb(ramp[int(ramp_index(np.array([t]), 1.0)[0])])
        return tuple(int(c) for c in diverging_rgb(np.array([t]), colours.stops, 1.0)[0])

    def key(self, colours: Colours, width: int = 80) -> Text:
        """``weak +0.044 ━━━━ +0.087 strong`` in ``width`` columns: narrower, without the two
        words, then with a shorter ramp (at 80×24 the key lost its strong end)."""
        lo, hi = f"{self.vmin:+.3f}", f"{self.vmax:+.3f}"
        words = len("weak ") + len(" strong")
        wordy = width >= len(lo) + len(hi) + 2 + 12 + words
        bars = max(min(12, width - len(lo) - len(hi) - 2 - (words if wordy else 0)), 3)
        muted = _rgb(colours.muted)
        text = Text("weak " if wordy else "", style=muted)
        text.append(f"{lo} ", style=muted)
        for s in np.linspace(self.vmin, self.vmax, bars):
            text.append("━", style=_rgb(self.edge_colour(float(s), colours)))
        text.append(f" {hi}" + (" strong" if wordy else ""), style=muted)
        return text

    def draw(self, width: int, height: int, colours: Colours) -> Text:
        head = _wrap(self.title, width, "bold")
        plt = _plot(width, max(height - len(head) - 1, 3), colours)
        L, H = self.n_layers, self.n_heads

        def y(h: int) -> int:
            return H - 1 - h  # head 0 on top, like the tree

        plt.xlim(-0.3, L - 0.7)
        plt.ylim(-0.5, H - 0.5)
        ordered = sorted(self.edges, key=lambda e: e[4])
        for l1, h1, l2, h2, s in ordered:
            plt.plot([l1, l2], [y(h1), y(h2)], marker="braille",
                     color=self.edge_colour(s, colours))
        if self.selected is not None:
            l1, h1, l2, h2 = self.selected
            plt.plot([l1, l2], [y(h1), y(h2)], marker="braille", color=colours.accent)
        xs = [layer for layer in range(L) for _ in range(H)]
        ys = [y(h) for _ in range(L) for h in range(H)]
        plt.scatter(xs, ys, marker="●", color=colours.foreground)
        if self.nodes:
            plt.scatter(
                [n[0] for n in self.nodes], [y(n[1]) for n in self.nodes],
                marker="●", color=colours.accent,
            )
        for l1, h1, l2, h2, s in ordered[::-1][: self.labels]:
            plt.text(f"{s:+.2f}", (l1 + l2) / 2, (y(h1) + y(h2)) / 2, alignment="center",
                     color=colours.foreground)
        plt.xticks(list(range(L)), [f"L{i}" for i in range(L)])
        hi, hl = _ticks(H, max(height - 5, 1), [f"H{h}" for h in range(H)], 1)
        plt.yticks([y(h) for h in hi], hl)
        plt.ticks_color(colours.foreground)
        text = Text("\n").join([*head, _text(plt), self.key(colours, width)])
        if colours.mode == "256":
            text = _pin_to_palette(text, _palette_ramp(colours.stops))
        return text


@functools.lru_cache(maxsize=16)
def _palette_ramp(stops: tuple[RGB, RGB, RGB]) -> tuple[int, ...]:
    return palette_ramp(stops)  # a nearest-colour search: once per theme, not per edge


@functools.lru_cache(maxsize=64)
def _nearest_entry(rgb: RGB) -> int:
    return nearest_entry(rgb)


def sign_colours(colours: Colours) -> tuple[RGB, RGB]:
    """The negative and positive colours of single marks (eigenvalue dots, lost and gained
    edges): the colour map's end stops; in 256 colours the palette ramp's end entries (the
    heatmaps' strongest cells), as their exact RGB, which ``_pinned`` turns into the entries."""
    if colours.mode == "256":
        ramp = _palette_ramp(colours.stops)
        return xterm_rgb(ramp[0]), xterm_rgb(ramp[-1])
    return colours.stops[0], colours.stops[2]


def palette_colour(rgb: RGB, colours: Colours) -> RGB:
    """A single theme colour as drawn: itself, or in 256 colours its nearest palette entry's
    RGB (``_pinned`` turns it into the entry)."""
    return xterm_rgb(_nearest_entry(tuple(rgb))) if colours.mode == "256" else rgb


def _pinned(text: Text, colours: Colours, *singles: RGB) -> Text:
    """In 256 colours, the spans drawn in ``sign_colours`` or in one of ``singles`` (through
    ``palette_colour``) become those palette entries; other modes: ``text`` as it is."""
    if colours.mode != "256":
        return text
    ramp = _palette_ramp(colours.stops)
    return _pin_to_palette(text, (ramp[0], ramp[-1], *(_nearest_entry(tuple(c)) for c in singles)))


def _pin_to_palette(text: Text, entries: Sequence[int]) -> Text:
    """Foreground colours that are exactly a palette entry's RGB become that entry (Rich
    would otherwise quantise them again, by its own metric); background and bold stay."""
    table = {xterm_rgb(i): Color.from_ansi(i) for i in entries}
    spans = []
    for span in text.spans:
        style = span.style
        colour = style.color if isinstance(style, Style) else None
        entry = table.get(tuple(colour.triplet)) if colour is not None and colour.triplet else None
        spans.append(span if entry is None else Span(span.start, span.end, style + Style(color=entry)))
    return Text(text.plain, spans=spans)


@dataclass(frozen=True)
class EdgeDiff:
    """Composition-graph diff of two checkpoints on the layered layout of ``Graph``.

    ``edges`` are ``(status, l1, h1, l2, h2, a, b)`` with a, b = score − baseline in A and B;
    lost edges (above threshold in A only) take the negative end of the colour map, gained
    ones (B only) the positive end, changed ones the muted colour. The biggest ``labels``
    changes carry "a→b" at their midpoint."""

    n_layers: int
    n_heads: int
    edges: tuple[tuple[str, int, int, int, int, float, float], ...]
    title: str = ""
    labels: int = 3

    def colour(self, status: str, colours: Colours) -> tuple[int, int, int]:
        """Lost: the map's negative end, gained: its positive end, changed: muted (in 256
        colours, palette entries: ``sign_colours`` and ``palette_colour``)."""
        neg, pos = sign_colours(colours)
        return {"lost": neg, "gained": pos}.get(status) or palette_colour(colours.muted, colours)

    def draw(self, width: int, height: int, colours: Colours) -> Text:
        head = _wrap(self.title, width, "bold")
        plt = _plot(width, max(height - len(head) - 1, 3), colours)
        L, H = self.n_layers, self.n_heads

        def y(h: int) -> int:
            return H - 1 - h

        plt.xlim(-0.3, L - 0.7)
        plt.ylim(-0.5, H - 0.5)
        order = {"changed": 0, "gained": 1, "lost": 2}  # lost edges on top: the news
        ordered = sorted(self.edges, key=lambda e: (order.get(e[0], 0), abs(e[6] - e[5])))
        for status, l1, h1, l2, h2, _a, _b in ordered:
            plt.plot([l1, l2], [y(h1), y(h2)], marker="braille", color=self.colour(status, colours))
        ends = {(e[1], e[2]) for e in self.edges} | {(e[3], e[4]) for e in self.edges}
        xs = [layer for layer in range(L) for _ in range(H)]
        ys = [y(h) for _ in range(L) for h in range(H)]
        plt.scatter(xs, ys, marker="●", color=colours.foreground)
        if ends:
            plt.scatter([n[0] for n in ends], [y(n[1]) for n in ends], marker="●",
                        color=colours.accent)
        biggest = sorted(self.edges, key=lambda e: -abs(e[6] - e[5]))[: self.labels]
        for _s, l1, h1, l2, h2, a, b in biggest:
            plt.text(f"{a:+.2f}→{b:+.2f}", (l1 + l2) / 2, (y(h1) + y(h2)) / 2,
                     alignment="center", color=colours.foreground)
        plt.xticks(list(range(L)), [f"L{i}" for i in range(L)])
        hi, hl = _ticks(H, max(height - 5, 1), [f"H{h}" for h in range(H)], 1)
        plt.yticks([y(h) for h in hi], hl)
        plt.ticks_color(colours.foreground)
        key = Text("━ lost (A only)", style=_rgb(self.colour("lost", colours)))
        key.append("  ")
        key.append("━ gained (B only)", style=_rgb(self.colour("gained", colours)))
        key.append("  ")
        key.append("━ changed", style=_rgb(self.colour("changed", colours)))
        return _pinned(Text("\n").join([*head, _text(plt), key]), colours, colours.muted)


Figure = Heatmap | Scatter | Line | Graph | EdgeDiff


def _rgb(c: tuple[int, ...]) -> str:
    return f"rgb({c[0]},{c[1]},{c[2]})"


def _plot(width: int, height: int, colours: Colours) -> Plot:
    plt = Plot()
    # plotext caps figures at the size of the process's terminal; the pane decides here.
    plt._limit_size(False, False)
    plt.theme("clear")  # no background codes: the widget's own background shows through
    plt.plotsize(max(width, 4), max(height, 3))
    plt.axes_color("default")
    plt.canvas_color("default")
    return plt


def build(figure: Figure, width: int, height: int, colours: Colours) -> Text:
    """Render ``figure`` at ``width × height`` cells (runs in a worker thread)."""
    if width < 8 or height < 4:
        return Text("")
    return figure.draw(width, height, colours)


def _text(plt: Plot) -> Text:
    return Text.from_ansi(plt.build().rstrip("\n"))


def _first_fitting(lines: Sequence[str], width: int) -> str:
    """The first of ``lines`` (longest first) no wider than ``width``, else the last."""
    return next((line for line in lines if len(line) <= width), lines[-1])


def _fit_line(line: str, width: int, style: str = "") -> Text:
    text = Text()  # the style goes on a span: a base style would leak into appended text
    text.append(line if len(line) <= width else line[: max(width - 1, 0)] + "…", style=style)
    return text


def _wrap(line: str, width: int, style: str = "", max_lines: int = 3) -> list[Text]:
    """``line`` broken at its newlines, then each part at spaces, into at most ``max_lines``
    lines of ``width`` (the last cut; parts that do not fit join it)."""
    out: list[str] = []
    parts = line.split("\n")
    for i, rest in enumerate(parts):
        while rest and len(out) < max_lines - 1 and len(rest) > width:
            cut = rest.rfind(" ", 0, width + 1)
            cut = cut if cut > 0 else width
            out.append(rest[:cut].rstrip())
            rest = rest[cut:].lstrip()
        if len(out) == max_lines - 1:  # the last line: what is left of every part
            rest = " ".join(p for p in (rest, *parts[i + 1:]) if p)
            if rest:
                out.append(rest)
            break
        if rest or not out or i < len(parts) - 1:
            out.append(rest)
    return [_fit_line(x, width, style) for x in out]


def _title(plt: Plot, title: str, width: int) -> None:
    """plotext drops a title wider than the canvas: cut it to fit instead."""
    room = max(width - 10, 4)
    plt.title(title if len(title) <= room else title[: room - 1] + "…")
