"""The "why" view's pictures (issue 38, docs/math.md "QK attribution"): one (query, key) cell
of a head's score split into (query source × key source) terms.

Pure numpy and Rich, no Textual: the widget (tui/widgets/why.py) re-slices a whole query row
(``QKAttribution``, every key at once) with these at every key move, so each is a top-k
selection (``argpartition``), never a sort of all n² terms (at 7B, n ≈ 1056 components).

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
from dataclasses import dataclass

import numpy as np
from rich.style import Style
from rich.text import Text

from headscope.engine.core.attribution import QKAttribution
from headscope.tui.plots.colormap import RGB, palette_ramp, symmetric_range
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
    """Indices of the ``top`` largest entries, largest first (ties: lower index first);
    NaN counts as the largest (a non-finite term is news, never hidden)."""
    m = np.nan_to_num(np.asarray(magnitude, dtype=np.float64), nan=np.inf)
    top = max(0, min(int(top), m.size))
    if top == 0:
        return np.zeros(0, dtype=np.int64)
    part = np.argpartition(-m, top - 1)[:top] if top < m.size else np.arange(m.size)
    return part[np.lexsort((part, -m[part]))]


def cell(attr: QKAttribution, key: int) -> np.ndarray:
    """``[n, n]`` term(query source, key source) at key position ``key`` (a view)."""
    return attr.terms[:, :, attr.column(key)]


def strongest_sources(terms: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``top`` query sources and key sources carrying the most of the terms, by
    Σ |term| along their row / column (a source whose terms cancel still shows), strongest
    first."""
    a = np.abs(np.asarray(terms, dtype=np.float64))
    return _top(a.sum(1), top), _top(a.sum(0), top)


def top_terms(attr: QKAttribution, key: int, top: int) -> tuple[list[tuple[str, str, float]], int, float]:
    """The ``top`` terms at ``key`` by |value| as ``(query source, key source, value)``, how
    many terms are left out and what they add up to (score − the listed terms)."""
    c = cell(attr, key)
    n = len(attr.names)
    order = _top(np.abs(c).ravel(), top)
    rows = [(attr.names[i // n], attr.names[i % n], float(c.flat[i])) for i in order]
    rest = c.size - len(rows)
    shown = float(np.sum([v for _, _, v in rows], dtype=np.float64)) if rows else 0.0
    return rows, rest, float(np.sum(c, dtype=np.float64)) - shown


def top_totals(attr: QKAttribution, key: int, side: str, top: int
               ) -> tuple[list[tuple[str, float]], int, float]:
    """The ``top`` sources of one side (``"query"`` / ``"key"``) at ``key`` by |total|, as
    ``(source, total)``, how many are left out and their sum."""
    totals = (attr.query_totals if side == "query" else attr.key_totals)[:, attr.column(key)]
    order = _top(np.abs(totals), top)
    rows = [(attr.names[i], float(totals[i])) for i in order]
    rest = float(np.sum(totals, dtype=np.float64)) - float(np.sum([v for _, v in rows]))
    return rows, len(attr.names) - len(rows), rest


@functools.lru_cache(maxsize=16)
def _ramp_ends(stops: tuple[RGB, RGB, RGB]) -> tuple[int, int]:
    ramp = palette_ramp(stops)  # a nearest-colour search: once per theme
    return ramp[0], ramp[-1]


def bar_styles(colours: Colours) -> tuple[str, str]:
    """Negative / positive bar styles: the colour map's ends as the heatmap cells draw them
    (truecolor RGB; in 256 colours the palette ramp's end entries, never RGB for the terminal
    to quantise; the bright ANSI pair in 16; none without colour)."""
    neg, _, pos = colours.stops
    if colours.mode == "256":
        lo, hi = _ramp_ends(colours.stops)
        return f"color({lo})", f"color({hi})"
    if colours.mode == "16":
        return ansi16_pair(colours.stops)
    if colours.mode == "none":
        return "", ""
    return (f"rgb({neg[0]},{neg[1]},{neg[2]})", f"rgb({pos[0]},{pos[1]},{pos[2]})")


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
        # lines: title, column labels, the rows, the key (one line, wrapped if it must)
        shown_rows = max(0, min(rows, height - 3))
        shown_cols = max(0, min(cols, (width - lw - 1) // cw))
        if shown_rows < 1 or shown_cols < 1:
            return Text("(pane too small)", style="dim")
        grid = np.asarray(self.values, dtype=np.float64)[:shown_rows, :shown_cols]
        more = self.total > min(shown_rows, shown_cols)
        shown = f" ({shown_rows}×{shown_cols} of {self.total})" if more else " terms"
        text = _fit(self.title + shown, width, "bold")
        text.append("\n")
        text.append(" " * (lw + 1))
        for name in heads[:shown_cols]:
            text.append(name.rjust(cw), style=_fg(colours.foreground))
        rgb, recolour = cell_colours(grid, self.vmax, colours)
        for i in range(shown_rows):
            text.append("\n")
            text.append(labels[i].rjust(lw) + " ", style=_fg(colours.foreground))
            for j in range(shown_cols):
                text.append(" ")  # a gap: neighbouring cells of one colour stay apart
                text.append_text(_cell_text(grid[i, j], tuple(int(x) for x in rgb[i, j]),
                                            recolour, cw - 1, colours))
        text.append("\n")
        key = Heatmap(grid, tuple(labels[:shown_rows]), tuple(heads[:shown_cols]),
                      vmax=self.vmax).key(colours, grid.shape, width)
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


def term_grid(attr: QKAttribution, key: int, top: int = GRID_TOP) -> TermGrid:
    """The ``top`` × ``top`` strongest block of the cell at ``key``."""
    c = np.asarray(cell(attr, key), dtype=np.float64)
    q, k = strongest_sources(c, top)
    return TermGrid(values=c[np.ix_(q, k)], row_labels=tuple(attr.names[i] for i in q),
                    col_labels=tuple(attr.names[i] for i in k), vmax=symmetric_range(c),
                    total=len(attr.names))


def _fg(c: tuple[int, ...]) -> str:
    return f"rgb({c[0]},{c[1]},{c[2]})"


def _fit(line: str, width: int, style: str = "") -> Text:
    text = Text()  # the style on a span: a base style would leak into what is appended
    text.append(line if len(line) <= width else line[: max(width - 1, 0)] + "…", style=style)
    return text
