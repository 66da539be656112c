"""The "why" view (issue 38): why head L.H's query ``q`` scores key ``k`` on the prompt.

It shows one cell of a ``QKAttribution`` (engine/core/attribution.py; docs/math.md "QK
attribution"): the title with the score, the strongest query sources × key sources as a small
heatmap (``tui.plots.why.TermGrid``, the colour map of every heatmap), the terms ranked by
size, and each side's totals as signed bars, each beside its exact check ("exact": the score's
drop when the source alone leaves that side, the norm's scale recomputed; ``show_exact``,
filled when the explorer's second request arrives). The view is given the whole query row (every key
at once) and re-slices it as the key moves (``←``/``→``, ``home``/``end``): no engine call
per key. Every source head in the lists is a link: ``enter`` posts ``WhyHeadSelected``; a key
move posts ``WhyKeyMoved``. Who computes the row (the explorer, through the Engine) calls
``show_computing`` / ``show`` / ``show_exact`` / ``show_error`` / ``show_out_of_scope``; the view never reaches
the engine. Token strings are data: ``Text``, never markup.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.color import Color
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Static

from headscope.engine.core.attribution import QKAttribution
from headscope.tui.base.datatext import printable
from headscope.tui.base.messages import WhyHeadSelected, WhyKeyMoved
from headscope.tui.plots.colormap import RGB
from headscope.tui.plots.why import (
    Cell,
    bar_styles,
    cell_at,
    num,
    short_name,
    source_head,
    term_grid,
    top_terms,
    top_totals,
)
from headscope.tui.widgets.bars import bar_half, signed_bar
from headscope.tui.widgets.chart import Chart, _theme_variables

TERMS_TOP = 12  # rows of the ranked list (then one row: what the other terms add up to)
TOTALS_TOP = 8  # rows of each side's totals (likewise); each side's top sources confirmed exactly
CELLS_KEPT = 4  # keys kept sliced (each an n² float32 copy: 4.5 MB at 7B)
BAR_MOST = 10  # cells of each half of a totals bar, at most
IDLE = "not computed: choose a cell of the attention pattern"
HINT = "← → key · home/end first/last · enter on a head: go to it"
TOKEN_WIDTH = 16  # a token string in the status line, at most


def head_label(layer: int, head: int) -> str:
    return f"L{layer}.H{head}"


def _token(tokens: Sequence[str] | None, position: int) -> str:
    if tokens is None or not 0 <= position < len(tokens):
        return ""
    s = printable(str(tokens[position]))
    return " " + repr(s if len(s) <= TOKEN_WIDTH else s[: TOKEN_WIDTH - 1] + "…")


class WhyView(Vertical):
    """One (query, key) cell of one head, from a cached query row (module docstring).

    ``state``: ``"idle"`` (not computed), ``"computing"``, ``"error"``, ``"unsupported"`` (the
    model's scores are not a sum of terms: soft-capping, ALiBi, ...), ``"ready"``."""

    BINDINGS: ClassVar[list[BindingType]] = [
        # priority: the lists inside use ↑ ↓ only, and ← → move the key wherever the focus is
        Binding("left", "move_key(-1)", "Prev key", id="why-prev-key", priority=True,
                tooltip="Why view: the previous key position of the query row (the row is "
                        "cached: nothing is recomputed)"),
        Binding("right", "move_key(1)", "Next key", id="why-next-key", priority=True,
                tooltip="Why view: the next key position of the query row (up to the query "
                        "itself: attention is causal)"),
        Binding("home", "edge_key(0)", "First key", id="why-first-key", show=False,
                priority=True, tooltip="Why view: the first key position of the row"),
        Binding("end", "edge_key(-1)", "Last key", id="why-last-key", show=False,
                priority=True, tooltip="Why view: the last key position (the query's own)"),
    ]

    DEFAULT_CSS = """
    WhyView { height: 1fr; }
    WhyView #why-title { height: 1; text-style: bold; }
    WhyView #why-status { height: auto; max-height: 3; color: $text-muted; }
    WhyView #why-body { height: 1fr; min-height: 6; }
    WhyView #why-grid { width: 1fr; height: 1fr; }
    WhyView #why-terms { width: 31; height: 1fr; }
    WhyView #why-totals { height: 11; max-height: 45%; }
    WhyView #why-query-totals, WhyView #why-key-totals { width: 1fr; height: 1fr; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.state = "idle"
        self.attribution: QKAttribution | None = None
        self.key: int | None = None
        self.tokens: tuple[str, ...] | None = None
        self.status = ""  # the status lines, plain (tests read them)
        self._terms: list[tuple[str, str, float] | None] = []  # the ranked list's rows
        self._totals: dict[str, list[str | None]] = {"query": [], "key": []}
        self._line = ""  # status line 1: the tokens, the note, the flags
        self._cells: OrderedDict[int, Cell] = OrderedDict()  # the last keys shown, sliced
        # the row's exact removals (``show_exact``): None while being computed / not asked for
        self.exact: QKAttribution | None = None
        self.exact_pending = False

    def compose(self) -> ComposeResult:
        yield Static(id="why-title")
        yield Static(id="why-status")
        with Horizontal(id="why-body"):
            yield Chart(id="why-grid", placeholder=IDLE)
            yield DataTable(id="why-terms", cursor_type="row", zebra_stripes=True)
        with Horizontal(id="why-totals"):
            # the cursor row keeps its bar's colour (the cursor's text colour drew it grey);
            # bar_styles makes it read there
            yield DataTable(id="why-query-totals", cursor_type="row", cursor_foreground_priority="renderable")
            yield DataTable(id="why-key-totals", cursor_type="row", cursor_foreground_priority="renderable")

    def on_mount(self) -> None:
        self.query_one("#why-terms", DataTable).tooltip = (
            "The terms of the score, largest |term| first: query source × key source. enter: "
            "go to the key side's head (else the query side's)")
        for side in ("query", "key"):
            self.query_one(f"#why-{side}-totals", DataTable).tooltip = (
                f"Each {side}-side source's total: the score's drop when it alone leaves the "
                f"{side} side (the norm's scale frozen). exact: that removal done on the model, "
                f"the norm's scale recomputed (… while it runs). enter: go to that head")
        self.show_idle()

    # -- states ---------------------------------------------------------------------------
    def show_idle(self, text: str = IDLE) -> None:
        """Nothing computed yet."""
        self._blank("idle", "why", text)

    def show_computing(self, layer: int, head: int, query: int) -> None:
        """The row of ``layer``.``head`` at ``query`` is being computed."""
        self._blank("computing", f"why {head_label(layer, head)} attends from q={query}",
                    f"computing why {head_label(layer, head)} attends from q={query}… "
                    f"(one pass to layer {layer})")

    def show_error(self, message: str) -> None:
        """The computation failed: one line, the error's (data, never markup)."""
        self._blank("error", "why: cannot explain this cell", f"error: {printable(message)}")

    def show_out_of_scope(self, reason: str) -> None:
        """The model's scores are not decomposed (soft-capping, q/k norm, ALiBi, post-LN,
        ...): ``reason`` says what (the engine's refusal), and no wrong sum is shown."""
        self._blank("unsupported", "why: not decomposed for this model",
                    f"QK attribution does not apply: {printable(reason)}")

    def _blank(self, state: str, title: str, text: str) -> None:
        self.state, self.attribution, self.key = state, None, None
        self.exact, self.exact_pending = None, False
        self.query_one("#why-title", Static).update(Text(title))
        self.query_one("#why-grid", Chart).message(text)
        for table_id in ("#why-terms", "#why-query-totals", "#why-key-totals"):
            self.query_one(table_id, DataTable).clear(columns=True)
        self._terms, self._totals = [], {"query": [], "key": []}
        self._line = ""
        self._set_status("")  # the text is in the grid's place, once
        self._lists(False)  # and has the view's width

    def show(self, attribution: QKAttribution, key: int | None = None,
             tokens: Sequence[str] | None = None) -> None:
        """The row ``attribution`` (every key of one query), at ``key`` (None: the key the
        head scores highest); ``tokens``: the prompt's token strings, for the status line."""
        if not attribution.keys:
            self.show_error("no key position to explain")
            return
        self.state, self.attribution = "ready", attribution
        self.exact = attribution if attribution.removals else None
        self.exact_pending = False
        self._cells.clear()
        self.tokens = None if tokens is None else tuple(tokens)
        if key is None or key not in attribution.keys:
            finite = np.where(np.isfinite(attribution.score), attribution.score, -np.inf)
            key = attribution.keys[int(np.argmax(finite))]
        self._draw(key)

    def expect_exact(self) -> None:
        """The exact removals of the row shown are being computed: "…" in their column."""
        if self.attribution is not None and self.exact is None:
            self.exact_pending = True
            if self.key is not None:
                self._fill_totals(self._cell(self.key))

    def show_exact(self, attribution: QKAttribution | None) -> None:
        """The exact removals of the row shown (``attribution.removals``, the same row asked
        with ``confirm``) in the totals' "exact" column; None: they could not be computed (the
        column is left blank). A result for another row is ignored."""
        shown = self.attribution
        if shown is None:
            return
        if attribution is not None and (attribution.layer, attribution.head, attribution.query,
                                        attribution.keys) != (shown.layer, shown.head, shown.query, shown.keys):
            return
        self.exact, self.exact_pending = attribution, False
        if self.key is not None:
            self._fill_totals(self._cell(self.key))
            self._hint_focused()

    def _exact_at(self, side: str, name: str) -> tuple[float, float] | None:
        """``(frozen, recomputed)`` drops of ``name`` on ``side`` at the key shown, if removed."""
        if self.exact is None or self.key is None:
            return None
        for removal in self.exact.removals:
            if removal.side == side and name in removal.sources:
                i, j = removal.sources.index(name), self.exact.column(self.key)
                return float(removal.frozen[i, j]), float(removal.recomputed[i, j])
        return None

    def _exact_cell(self, side: str, name: str) -> Text:
        found = self._exact_at(side, name)
        if found is not None:
            return _value(found[1])
        return Text("…" if self.exact_pending and name != "bias" else "", style="dim", justify="right")

    # -- moving along the row ---------------------------------------------------------------
    def action_move_key(self, delta: int) -> None:
        attr = self.attribution
        if attr is None or self.key is None:
            return
        i = attr.keys.index(self.key)
        self.set_key(attr.keys[max(0, min(len(attr.keys) - 1, i + int(delta)))])

    def action_edge_key(self, end: int) -> None:
        if self.attribution is not None:
            self.set_key(self.attribution.keys[end])

    def set_key(self, key: int) -> None:
        """Show key position ``key`` of the cached row (no engine call)."""
        attr = self.attribution
        if attr is None or key == self.key or key not in attr.keys:
            return
        self._draw(key)
        self.post_message(WhyKeyMoved((attr.layer, attr.head), attr.query, key))

    # -- drawing ----------------------------------------------------------------------------
    def _draw(self, key: int) -> None:
        attr = self.attribution
        assert attr is not None
        self.key = key
        self._lists(True)
        cell = self._cell(key)
        score = cell.score
        self.query_one("#why-title", Static).update(Text(
            f"why {head_label(attr.layer, attr.head)} attends q={attr.query} → k={key}: "
            f"score {num(score)}"))
        self.query_one("#why-grid", Chart).show(term_grid(cell))
        self._fill_terms(cell)
        self._fill_totals(cell)
        parts = [f"q={attr.query}{_token(self.tokens, attr.query)} → "
                 f"k={key}{_token(self.tokens, key)} (keys {attr.keys[0]}..{attr.keys[-1]})"]
        if attr.note:
            parts.append(attr.note)
        if attr.nonfinite:
            parts.append("⚠ non-finite activations: some terms are NaN/inf, the sums do not hold")
        self._line = " · ".join(parts)
        self._hint_focused()

    def _cell(self, key: int) -> Cell:
        """Key ``key`` of the row, sliced (kept for the last few keys: back and forth)."""
        assert self.attribution is not None
        cell = self._cells.pop(key, None) or cell_at(self.attribution, key)
        self._cells[key] = cell
        while len(self._cells) > CELLS_KEPT:
            self._cells.popitem(last=False)
        return cell

    def _fill_terms(self, cell: Cell) -> None:
        table = self.query_one("#why-terms", DataTable)
        row = _reset(table, ("query", "key", "term"))
        rows, rest, rest_sum = top_terms(cell, TERMS_TOP)
        self._terms = [*rows]
        for q, k, v in rows:
            table.add_row(_name(q), _name(k), _value(v))
        if rest:
            self._terms.append(None)
            table.add_row(Text(f"+{rest} more", style="dim"), Text(""), _value(rest_sum, "dim"))
        table.move_cursor(row=min(row, max(table.row_count - 1, 0)))

    def _fill_totals(self, cell: Cell) -> None:
        sides = {side: top_totals(cell, side, TOTALS_TOP) for side in ("query", "key")}
        values = [abs(v) for rows, _, _ in sides.values() for _, v in rows if np.isfinite(v)]
        vmax = max(values, default=0.0)
        styles = bar_styles(self.query_one("#why-grid", Chart).colours(), self._table_backgrounds())
        for side, (rows, rest, rest_sum) in sides.items():
            table = self.query_one(f"#why-{side}-totals", DataTable)
            # the tables share the view's width (before layout: the widest bars)
            half = bar_half(self.size.width // 2, 12 + 9 + 9, BAR_MOST)  # name, total, exact
            row = _reset(table, (f"{side} side", "total", "exact", ""))
            self._totals[side] = [name for name, _ in rows]
            for name, v in rows:
                table.add_row(_name(name), _value(v), self._exact_cell(side, name),
                              signed_bar(v, vmax, half, styles))
            if rest:
                self._totals[side].append(None)
                table.add_row(Text(f"+{rest} more", style="dim"), _value(rest_sum, "dim"),
                              Text(""), Text(""))
            table.move_cursor(row=min(row, max(table.row_count - 1, 0)))

    def _table_backgrounds(self) -> tuple[RGB, ...]:
        """What the totals tables' rows are drawn on in the current theme: the surfaces and
        the cursor row's, focused or not."""
        variables = _theme_variables(self.app.current_theme)
        out = []
        for name in ("surface", "panel", "background", "block-cursor-background",
                     "block-cursor-blurred-background"):
            with contextlib.suppress(KeyError, ValueError):
                out.append(Color.parse(variables[name]).rgb)
        return tuple(out)

    def on_resize(self) -> None:
        # the bars' width follows the tables' (laid out after the first show)
        if self.attribution is not None and self.key is not None:
            self.call_after_refresh(self._refill_totals)

    def _refill_totals(self) -> None:
        if self.attribution is not None and self.key is not None:
            self._fill_totals(self._cell(self.key))

    def _set_status(self, hint: str) -> None:
        lines = [line for line in (self._line, hint) if line]
        self.status = "\n".join(lines)
        status = self.query_one("#why-status", Static)
        status.update(Text(self.status))
        status.display = bool(self.status)

    def _lists(self, shown: bool) -> None:
        for selector in ("#why-terms", "#why-totals"):
            self.query_one(selector).display = shown

    # -- the links --------------------------------------------------------------------------
    def _term_target(self, index: int) -> tuple[tuple[int, int], str] | None:
        """The head a ranked term links to: its key side's, else its query side's."""
        term = self._terms[index] if 0 <= index < len(self._terms) else None
        if term is None:
            return None
        q, k, _ = term
        for name, side in ((k, "key"), (q, "query")):
            head = source_head(name)
            if head is not None:
                return head, side
        return None

    def _total_target(self, side: str, index: int) -> tuple[tuple[int, int], str] | None:
        names = self._totals[side]
        name = names[index] if 0 <= index < len(names) else None
        head = source_head(name) if name is not None else None
        return (head, side) if head is not None else None

    def _target(self, table: DataTable[Any]) -> tuple[tuple[int, int], str] | None:
        """The head the row under ``table``'s cursor links to (None: not a head)."""
        if table.id == "why-terms":
            return self._term_target(table.cursor_row)
        return self._total_target(_side(table), table.cursor_row)

    def _hint(self, table: DataTable[Any]) -> None:
        """The status line for the row under ``table``'s cursor: what it is, where enter goes."""
        attr, key, i = self.attribution, self.key, table.cursor_row
        if attr is None or key is None:
            return
        target = self._target(table)
        go = (f"enter: go to {head_label(*target[0])}"
              + (f" ({target[1]} side)" if table.id == "why-terms" else "")
              if target else "not a head")
        if table.id == "why-terms":
            term = self._terms[i] if 0 <= i < len(self._terms) else None
            if term is None:
                self._set_status("the other terms, summed · " + HINT)
                return
            q, k, v = term
            score = self._cell(key).score
            share = (f" ({v / score:.0%} of the score)"
                     if score and np.isfinite(score) and np.isfinite(v) else "")
            self._set_status(f"{q} × {k}: {num(v)}{share} · {go}")
            return
        side = _side(table)
        names = self._totals[side]
        name = names[i] if 0 <= i < len(names) else None
        if name is None:
            self._set_status(f"the other {side}-side sources, summed · " + HINT)
            return
        found = self._exact_at(side, name)
        exact = (f" · removed exactly: {num(found[0])} scale frozen (the total), {num(found[1])} recomputed"
                 if found is not None else " · exact removal computing…" if self.exact_pending and name != "bias"
                 else "")
        self._set_status(f"{name}, {side} side{exact} · {go}")

    def _hint_focused(self) -> None:
        focused = self.screen.focused if self.is_attached else None
        if isinstance(focused, DataTable) and self in focused.ancestors:
            self._hint(focused)
        else:
            self._set_status(HINT)

    @on(DataTable.RowHighlighted)
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        if event.data_table.has_focus:  # the tables refilled at a key move say nothing
            self._hint(event.data_table)

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        if isinstance(event.widget, DataTable):
            self._hint(event.widget)

    @on(DataTable.RowSelected)
    def _selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        target = self._target(event.data_table)
        if target is not None:
            self.post_message(WhyHeadSelected(*target))


def _reset(table: DataTable[Any], columns: tuple[str, ...]) -> int:
    """Empty ``table`` with its columns anew (their widths follow the new rows, not the
    widest row ever shown); the row its cursor was on."""
    row = table.cursor_row
    table.clear(columns=True)
    for label in columns:
        table.add_column(label)
    return row


def _side(table: DataTable[Any]) -> str:
    return "query" if table.id == "why-query-totals" else "key"


def _name(name: str) -> Text:
    """A source name (a head's is underlined: a link)."""
    return Text(short_name(name), style="underline" if source_head(name) else "")


def _value(v: float, style: str = "") -> Text:
    return Text(num(v), style=style, justify="right")
