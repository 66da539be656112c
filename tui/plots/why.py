"""The "why" view's pictures (issue 38, docs/math.md "QK attribution"): one (query, key) cell
of a head's score split into (query source × key source) terms.

Pure numpy and Rich, no Textual: the widget (tui/widgets/why.py) re-slices a whole query row
(``QKAttribution``, every key at once) at every key move: ``cell_at`` slices one key once
(``Cell``), and each picture is a top-k selection from it (``argpartition``), never a sort of
all n² terms (at 7B, n ≈ 1056 components: 1.1 M terms per key).

- ``TermGrid``: the strongest query sources × the strongest key sources as a small heatmap,
  drawn with the cells of every other heatmap (``figures.cell_colours``: the same diverging
  map, pinned to palette entries in 256 colours, shade characters in 16 / none) and the same
  key (``Heatmap.key``). Sources are *chosen*, not pooled: a pooled cell would mix heads.
- ``top_terms``: the ranked list, with what the rest adds up to (so the list sums to the score).
- ``top_totals`` / ``bar_styles``: the per-side totals as signed bars (``widgets/bars.py``'s
  ``signed_bar``), in the colour map's end colours of the current colour mode.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from rich.style import Style
from rich.text import Text

from headscope.engine.core.attribution import QKAttribution
from headscope.tui.base.contrast import readable
from headscope.tui.plots.colormap import RGB, palette_ramp, symmetric_range, xterm_rgb
from headscope.tui.plots.figures import Colours, Heatmap, ansi16_pair, cell_colours

GRID_TOP = 6  # sources per side in the heatmap
NAME_WIDTH = 8  # "a10.bias"; longer names are cut with "…"
_HEAD = re.compile(r"a(\d+)\.h(\d+)")


def source_head(name: str) -> tuple[int, int] | None:
    """``(layer, head)`` of a head component ``a{l}.h{h}``; None for ``embed``, ``pos``,
    ``a{l}.bias``, ``m{l}``, ``bias`` (not heads: nothing to jump to)."""
    m = _HEAD.fullmatch(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def num(value: float) -> str:
    """A score or term as the view prints it: signed, three significant digits (``+12.3``,
    ``-0.0412``), whole numbers from 1000 on; ``nan`` / ``+inf`` as such."""
    if not np.isfinite(value):
        return "nan" if value != value else ("+inf" if value > 0 else "-inf")
    return f"{value:+.0f}" if abs(value) >= 1000 else f"{value:+.3g}"


def _top(magnitude: np.ndarray, top: int) -> np.ndarray:
    """Indices of the ``top`` largest entries, largest first (ties: lower index first, also
    at the cut: a tie there keeps the lower indices, as a stable sort would); NaN counts as
    the largest (a non-finite term is news, never hidden)."""
    m = np.nan_to_num(np.asarray(magnitude, dtype=np.float64), nan=np.inf)
    top = max(0, min(int(top), m.size))
    if top == 0:
        return np.zeros(0, dtype=np.int64)
    kth = -np.partition(-m, top - 1)[top - 1]  # the top-th largest value
    above = np.flatnonzero(m > kth)
    part = np.concatenate([above, np.flatnonzero(m == kth)[: top - above.size]])
    return part[np.lexsort((part, -m[part]))]


@dataclass(frozen=True)
class Cell:
    """One key of a query row, sliced once: what every picture of that key reads.

    ``magnitude`` is the one O(n²) copy (``|term|``, contiguous float32); the terms stay a
    view of the row's array."""

    names: tuple[str, ...]
    key: int
    score: float  # the model's score at (query, key)
    terms: np.ndarray  # [n, n] view: term(query source, key source)
    magnitude: np.ndarray  # [n, n] float32, |terms|
    row_max: np.ndarray  # [n] the largest |term| of each query source
    query_totals: np.ndarray  # [n] float64
    key_totals: np.ndarray  # [n] float64

    @property
    def vmax(self) -> float:
        """The colour scale's half-width: the largest finite |term| (``symmetric_range``)."""
        if np.isfinite(self.row_max).all():
            return float(self.row_max.max()) or 1.0
        return symmetric_range(self.magnitude)


def cell_at(attr: QKAttribution, key: int) -> Cell:
    """Key position ``key`` of the row ``attr`` (IndexOutOfRangeError for a key not in it)."""
    j = attr.column(key)
    terms = attr.terms[:, :, j]
    magnitude = np.abs(terms)
    return Cell(names=attr.names, key=key, score=float(attr.score[j]), terms=terms,
                magnitude=magnitude, row_max=magnitude.max(1),
                query_totals=np.asarray(attr.query_totals[:, j], dtype=np.float64),
                key_totals=np.asarray(attr.key_totals[:, j], dtype=np.float64))


def _top_entries(cell: Cell, top: int) -> np.ndarray:
    """Flat indices of the ``top`` largest |terms|, largest first (ties: lower index first).

    Only the rows that can hold one are searched: the ``top`` largest row maxima each have an
    entry at least as large, so the ``top``-th largest entry is ≥ the ``top``-th largest row
    maximum, and every entry of the top lies in a row whose maximum reaches it."""
    n_rows, n_cols = cell.magnitude.shape
    if np.isnan(cell.row_max).any():  # a non-finite term: the plain way (NaN first)
        return _top(cell.magnitude.ravel(), top)
    k = max(1, min(int(top), n_rows))
    bound = np.partition(cell.row_max, n_rows - k)[n_rows - k]
    rows = np.flatnonzero(cell.row_max >= bound)  # ascending: flat order is kept
    order = _top(cell.magnitude[rows].ravel(), top)
    return rows[order // n_cols] * n_cols + order % n_cols


def strongest_sources(cell: Cell, top: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``top`` query sources and key sources carrying the most of the terms, by
    Σ |term| along their row / column (a source whose terms cancel still shows), strongest
    first."""
    m = cell.magnitude
    return _top(m.sum(1, dtype=np.float64), top), _top(m.sum(0, dtype=np.float64), top)


def top_terms(cell: Cell, top: int) -> tuple[list[tuple[str, str, float]], int, float]:
    """The ``top`` terms by |value| as ``(query source, key source, value)``, how many terms
    are left out and what they add up to (Σ terms − the listed ones)."""
    n = len(cell.names)
    rows = [(cell.names[i // n], cell.names[i % n], float(cell.terms[i // n, i % n]))
            for i in _top_entries(cell, top).tolist()]
    shown = float(np.sum([v for _, _, v in rows], dtype=np.float64)) if rows else 0.0
    return rows, n * n - len(rows), float(cell.query_totals.sum()) - shown


def top_totals(cell: Cell, side: str, top: int) -> tuple[list[tuple[str, float]], int, float]:
    """The ``top`` sources of one side (``"query"`` / ``"key"``) by |total|, as ``(source,
    total)``, how many are left out and their sum."""
    totals = cell.query_totals if side == "query" else cell.key_totals
    rows = [(cell.names[i], float(totals[i])) for i in _top(np.abs(totals), top).tolist()]
    rest = float(totals.sum()) - float(np.sum([v for _, v in rows], dtype=np.float64))
    return rows, len(cell.names) - len(rows), rest


@functools.lru_cache(maxsize=16)
def _ramp_ends(stops: tuple[RGB, RGB, RGB]) -> tuple[int, int]:
    ramp = palette_ramp(stops)  # a nearest-colour search: once per theme
    return ramp[0], ramp[-1]


def bar_styles(colours: Colours, readable_on: Sequence[RGB] = ()) -> tuple[str, str]:
    """Negative / positive bar styles: the colour map's ends as the heatmap cells draw them
    (truecolor RGB; in 256 colours the palette ramp's end entries, never RGB for the terminal
    to quantise; the bright ANSI pair in 16; none without colour).

    ``readable_on``: backgrounds the bars must read on (WCAG AA, as text: a table's cursor
    row keeps the bar's colour on its own background): an end that does not is blended
    towards the theme's text colour until it does (``contrast.readable``: the hue stays)."""
    neg, _, pos = colours.stops
    if colours.mode == "16":
        return ansi16_pair(colours.stops)
    if colours.mode == "none":
        return "", ""
    if colours.mode == "256":
        lo, hi = _ramp_ends(colours.stops)
        ends, styles = (xterm_rgb(lo), xterm_rgb(hi)), [f"color({lo})", f"color({hi})"]
    else:
        ends, styles = (neg, pos), [f"rgb({c[0]},{c[1]},{c[2]})" for c in (neg, pos)]
    if readable_on:
        for i, end in enumerate(ends):
            shown = readable(end, colours.foreground, readable_on)
            if shown != end:  # in 256 colours Rich picks the entry, which readable() checked
                styles[i] = f"rgb({shown[0]},{shown[1]},{shown[2]})"
    return styles[0], styles[1]


def short_name(name: str, width: int = NAME_WIDTH) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


@dataclass(frozen=True)
class TermGrid:
    """Query sources (rows) × key sources (columns) of one cell's terms, strongest first.

    ``values`` are the chosen terms; ``vmax`` is the largest |term| of the whole cell, so a
    colour means the same size whichever sources are shown. ``total`` is how many sources
    each side has (the title says how many are shown)."""

    values: np.ndarray  # [rows, cols]
    row_labels: tuple[str, ...]
    col_labels: tuple[str, ...]
    vmax: float
    total: int
    title: str = "query ↓ × key →"

    def draw(self, width: int, height: int, colours: Colours) -> Text:
        rows, cols = self.values.shape
        labels = [short_name(s) for s in self.row_labels]
        lw = max((len(s) for s in labels), default=0)
        heads = [short_name(s) for s in self.col_labels]
        cw = max([4, *(len(s) + 1 for s in heads)])  # every column as wide as its label
        # lines: title, column labels, the rows, the key (the colour ramp: it names no
        # source, so the same whichever are shown; wrapped if it must)
        key = Heatmap(self.values, tuple(labels), tuple(heads), vmax=self.vmax).key(
            colours, self.values.shape, width)
        key_lines = key.plain.count("\n") + 1
        shown_rows = max(0, min(rows, height - 2 - key_lines))
        shown_cols = max(0, min(cols, (width - lw - 1) // cw))
        if shown_rows < 1 or shown_cols < 1:
            return Text("(pane too small)", style="dim")
        grid = np.asarray(self.values, dtype=np.float64)[:shown_rows, :shown_cols]
        # room to spare: entries two lines tall and wider, up to twice (about square: a
        # terminal cell is twice as tall as wide)
        rh = max(1, min(2, (height - 2 - key_lines) // shown_rows))
        cw = max(cw, min(2 * cw, (width - lw - 1) // shown_cols))
        more = self.total > min(shown_rows, shown_cols)
        shown = f" ({shown_rows}×{shown_cols} of {self.total})" if more else " terms"
        text = _fit(self.title + shown, width, "bold")
        text.append("\n")
        text.append(" " * (lw + 1))
        for name in heads[:shown_cols]:
            text.append(name.rjust(cw), style=_fg(colours.foreground))
        rgb, recolour = cell_colours(grid, self.vmax, colours)
        for i in range(shown_rows):
            for line in range(rh):
                text.append("\n")
                label = labels[i] if line == 0 else ""
                text.append(label.rjust(lw) + " ", style=_fg(colours.foreground))
                for j in range(shown_cols):
                    text.append(" ")  # a gap: neighbouring cells of one colour stay apart
                    text.append_text(_cell_text(grid[i, j], tuple(int(x) for x in rgb[i, j]),
                                                recolour, cw - 1, colours))
        text.append("\n")
        text.append_text(key)
        return text


def _cell_text(value: float, rgb: tuple[int, int, int], recolour: dict, width: int,
               colours: Colours) -> Text:
    """One cell ``width`` characters wide, as ``figures.cell_colours`` says heatmap cells are
    drawn (plotext's █ in the map's colour; the recoloured character and style otherwise)."""
    if not np.isfinite(value):  # non-finite: flagged, never drawn as a zero
        return Text("?" * width, style=_fg(colours.muted))
    char, style = recolour.get(rgb, (None, None))
    if style is None:  # truecolor
        style = Style.parse(_fg(rgb))
    return Text((char or "█") * width, style=style)


def term_grid(cell: Cell, top: int = GRID_TOP) -> TermGrid:
    """The ``top`` × ``top`` strongest block of the cell."""
    q, k = strongest_sources(cell, top)
    return TermGrid(values=np.asarray(cell.terms[np.ix_(q, k)], dtype=np.float64),
                    row_labels=tuple(cell.names[i] for i in q),
                    col_labels=tuple(cell.names[i] for i in k), vmax=cell.vmax,
                    total=len(cell.names))


def _fg(c: tuple[int, ...]) -> str:
    return f"rgb({c[0]},{c[1]},{c[2]})"


def _fit(line: str, width: int, style: str = "") -> Text:
    text = Text()  # the style on a span: a base style would leak into what is appended
    text.append(line if len(line) <= width else line[: max(width - 1, 0)] + "…", style=style)
    return text
