"""The Prompt (4) and Composition (5) panes; the other tabs' panes are in circuit.py (QK, OV,
Spectrum), summary.py, compare.py (Changes), timeline.py and patch.py. Every pane loads what
it shows and draws it.

``load(host, key)`` asks the engine for the tab's results; the focused head, token set, ...
are the host's (``tui.base.protocols.PaneHost``, the explorer screen); ``key`` says what the
load is for, and a result for a ``key`` the host no longer shows is dropped. What the user
does in a pane goes to the explorer as a message (tui/base/messages.py). The ``show*`` methods turn an engine result into
``tui.plots`` figures (cheap: numpy views and labels) and hand them to ``Chart`` widgets,
which build the picture off the UI thread.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.table import Table
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import DataTable, Input, Static

from headscope.engine.core.errors import CancelledError, HeadscopeError
from headscope.engine.core.requests import CompositionRequest, PromptRequest, QKAttributionRequest
from headscope.engine.core.results import (
    Composition,
    PromptView,
)
from headscope.tui.base.datatext import data_text, printable
from headscope.tui.base.labels import (
    edges,
    head_name,
    predictions,
)
from headscope.tui.base.messages import EdgeChosen, WhyKeyMoved
from headscope.tui.base.prompt_words import UNKNOWN, unknown_note, vocabulary_hint
from headscope.tui.plots.figures import Graph, Heatmap
from headscope.tui.widgets.bars import bar_colours, bar_half, signed_bar
from headscope.tui.widgets.chart import Chart
from headscope.tui.widgets.path_column import PATH_CELL, PathEffects
from headscope.tui.widgets.why import TOTALS_TOP, WhyView

if TYPE_CHECKING:
    from headscope.tui.base.protocols import ExplorerEngine, LoadKey, PaneHost

THRESHOLD_STEP = 0.1  # composition graph: edges ≥ threshold × the strongest edge
Edge = tuple[int, int, int, int, float]  # (l1, h1, l2, h2, score − baseline)


PREDICTIONS_SHOWN = 5  # the rest are ~0 and would take the DLA's rows


def dla_title(view: PromptView, prefix: str = "") -> Text:
    """What the DLA column attributes: at each position, the logit of the token the model
    predicts next there (engine/forward/prompt.py); the last row's token named."""
    # short: at 80×24 the side column is 22 wide, and the rows must stay in view
    title = Text(f"{prefix}DLA: this head's push on each row's predicted next token",
                 style="table.title")
    n = len(view.tokens)
    if n and view.predicted:
        last = int(view.predicted[-1])
        label = next((lab for i, lab, _p in view.top_predictions if int(i) == last), f"#{last}")
        title.append("\n")
        title.append(f"last row: DLA of {printable(str(label))[:16]!r} (the next token) at "
                     f"position {n - 1}")
    return title


def _unknown_text(tokens: list[str], prompt: str) -> Text:
    """How many prompt tokens the vocabulary did not know (marked in the list below)."""
    note = unknown_note(prompt, tokens)
    return Text(note + "\n", style="bold yellow") if note else Text("")


class PromptPane(Vertical):
    """The prompt, the head's attention pattern, its per-token DLA and the top predictions.

    The DLA list scrolls on its own; the predictions sit under it at their own height, so
    all three parts are visible whatever the prompt length.

    The pattern has a cell cursor (query, key), named under it; ``w`` opens the "why" view
    (tui/widgets/why.py) of that cell in the pattern's place: the head's QK attribution of
    the cursor's whole query row (one ``QKAttributionRequest``, cached by the Engine), so
    moving along the row re-slices it; then the same row with ``confirm`` fills the totals'
    "exact" column. ``W`` puts the cursor on the pattern's strongest cell
    (``strongest_cell``) and opens it."""

    prompt_text = ""  # the prompt of the view shown (its unknown words are named)

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.view: PromptView | None = None  # A's view shown
        self.view_b: PromptView | None = None
        self.cursor: tuple[int, int] | None = None  # (query, key) of the pattern
        self.why_open = False

    def compose(self) -> ComposeResult:
        yield Input(placeholder="type a prompt and press enter (p)", id="prompt-input")
        with Horizontal(id="prompt-body"):
            yield Chart(id="prompt-pattern", placeholder="no prompt yet: press p")
            yield Chart(id="prompt-pattern-b", placeholder="waiting for model B…",
                        classes="compare-only")
            with Vertical(id="prompt-side"):
                with VerticalScroll(id="prompt-dla-scroll"):
                    yield Static(id="prompt-dla")
                yield Static(id="prompt-preds")
        yield WhyView(id="prompt-why")

    def on_mount(self) -> None:
        self.query_one("#prompt-why", WhyView).display = False
        path = getattr(self.app, "path", "")
        hint = vocabulary_hint(path)
        if hint:  # word-level models: say which words they know, where the prompt is typed
            box = self.query_one("#prompt-input", Input)
            box.border_title = Text(vocabulary_hint(path, short=True))
            box.tooltip = hint

    def show(self, view: PromptView, b: PromptView | None = None) -> None:
        """A's pattern, DLA and predictions; ``b``: model B's pattern on the same prompt,
        beside A's (compare mode; the DLA and predictions stay A's)."""
        self.shown_views = (view, b)
        tokens = [str(t) for t in view.tokens]
        n = len(tokens)
        if self.view is None or self.view.ids != view.ids or self.cursor is None \
                or max(self.cursor) >= n:
            # a new prompt: its last query, at the key it attends to most
            last = np.nan_to_num(np.asarray(view.pattern, dtype=np.float64)[n - 1], nan=-1.0) if n else None
            self.cursor = (n - 1, int(np.argmax(last))) if last is not None else None
        self.view, self.view_b = view, b
        self.draw_pattern()
        prefix = "A " if b is not None else ""
        dla = np.asarray(view.dla, dtype=np.float64)
        vmax = float(np.nanmax(np.abs(dla))) if dla.size else 1.0
        # the title above the table (a Text wraps; the table's title was cut at 80×24)
        title = dla_title(view, prefix)
        t = Table(box=None, padding=(0, 1), expand=True)
        # As the OV tab's top outputs: the token keeps up to 6 characters (at 80×24 the bar
        # left it 2, `Wh…`), the number its width; the bar gives way first.
        longest = max((len(printable(tok)) for tok in tokens), default=1)
        t.add_column("tok", no_wrap=True, overflow="ellipsis", max_width=10,
                     min_width=min(longest, 6))
        t.add_column("DLA", justify="right", no_wrap=True, min_width=5)
        numbers = [f"{v:+.2f}" for v in dla.tolist()]
        half = bar_half(self.query_one("#prompt-dla", Static).content_size.width,
                        min(longest, 10) + max(map(len, numbers), default=5) + 4, 5)
        if half:
            t.add_column("", no_wrap=True, overflow="crop")
        for tok, v, number in zip(tokens, dla.tolist(), numbers, strict=False):
            cell = data_text(tok, style="reverse yellow" if tok in UNKNOWN else "", width=10)
            bar = (signed_bar(v, vmax, half, bar_colours(self)),) if half else ()
            t.add_row(cell, number, *bar)
        last = printable(tokens[-1])[:10] if tokens else ""
        p = Table(box=None, padding=(0, 1), title=Text(f"{prefix}top predictions after {last!r}", style="table.title"),
                  title_justify="left", expand=True)
        p.add_column("next", no_wrap=True)
        p.add_column("p", justify="right")
        for tok, prob in predictions(view)[:PREDICTIONS_SHOWN]:
            p.add_row(data_text(tok, width=12), f"{prob:.3f}")
        note = Text("prompt truncated to the context length\n", style="bold yellow") \
            if view.truncated else Text("")
        note.append_text(_unknown_text(tokens, self.prompt_text))
        from rich.console import Group

        self.query_one("#prompt-dla", Static).update(Group(note, title, t))
        self.query_one("#prompt-preds", Static).update(p)

    def draw_pattern(self) -> None:
        """A's (and B's) pattern, the cursor's cell marked on A's (``Heatmap.mark``) and named
        under it."""
        view, b = self.view, self.view_b
        if view is None:
            return
        tokens = tuple(str(t) for t in view.tokens)
        prefix = "A " if b is not None else ""
        self.query_one("#prompt-pattern", Chart).show(Heatmap(
            np.asarray(view.pattern, dtype=np.float64), tokens, tokens, sequential=True, vmax=1.0,
            title=f"{prefix}attention {head_name(view.layer, view.head)}",
            xlabel=f"{self.cursor_text()} · key →  (rows: query)".lstrip(" ·"),
            xlabel_short=self.cursor_short(), mark=self.cursor))
        if b is not None:
            tokens_b = tuple(str(t) for t in b.tokens)
            self.query_one("#prompt-pattern-b", Chart).show(Heatmap(
                np.asarray(b.pattern, dtype=np.float64), tokens_b, tokens_b, sequential=True,
                vmax=1.0, title=f"B attention {head_name(b.layer, b.head)}",
                xlabel="key →  (rows: query)"))

    def cursor_text(self) -> str:
        """The cursor's cell: positions, tokens (printable, never markup) and attention."""
        cell = self._cell()
        return f"cell {cell} (shift+arrows · w why · W explain)" if cell else ""

    def cursor_short(self) -> tuple[str, ...]:
        """Shorter forms of the cursor's line, longest first, for a narrower chart (the cell
        itself was cut at 80×24 and at 120×40, its weight lost): the cell and ``w``, the
        cell, the cell without its words, with shorter tokens."""
        cell = self._cell()
        return (f"cell {cell} · w why", f"cell {cell}", cell, self._cell(tight=True)) if cell else ()

    def _cell(self, *, tight: bool = False) -> str:
        if self.view is None or self.cursor is None:
            return ""
        q, k = self.cursor
        tokens = self.view.tokens
        weight = float(np.asarray(self.view.pattern)[q, k])
        if tight:
            return f"q{q} {_short(tokens[q], 6)}→k{k} {_short(tokens[k], 6)} {weight:.2f}"
        return f"q={q} {_short(tokens[q])} → k={k} {_short(tokens[k])} {weight:.2f}"

    def move_cursor(self, d_query: int, d_key: int) -> tuple[int, int] | None:
        """Move the cursor (the key stays at or before the query: attention is causal)."""
        if self.view is None or self.cursor is None:
            return None
        n = len(self.view.tokens)
        q = max(0, min(n - 1, self.cursor[0] + int(d_query)))
        k = max(0, min(q, self.cursor[1] + int(d_key)))
        self.cursor = (q, k)
        self.draw_pattern()
        return self.cursor

    def strongest_cell(self) -> tuple[int, int] | None:
        """The pattern's strongest off-diagonal cell, measured against uniform attention
        (weight × the keys the query sees): the induction cell on a repeated sequence. The
        diagonal and, past two tokens, the first key (where heads park: an attention sink)
        are left out."""
        if self.view is None:
            return None
        pattern = np.asarray(self.view.pattern, dtype=np.float64)
        n = pattern.shape[0]
        if n < 2:
            return None
        lift = pattern * np.arange(1, n + 1)[:, None]  # weight × (q + 1)
        allowed = np.tril(np.ones((n, n), dtype=bool), -1)
        if n > 2:
            allowed[:, 0] = False
        lift = np.where(allowed & np.isfinite(lift), lift, -np.inf)
        q, k = np.unravel_index(int(np.argmax(lift)), lift.shape)
        return (int(q), int(k)) if np.isfinite(lift[q, k]) else None

    # -- the "why" view ----------------------------------------------------------------------
    def set_why_open(self, shown: bool) -> None:
        """The why view in the pattern's place, or the pattern back."""
        self.why_open = shown
        self.query_one("#prompt-body").display = not shown
        why = self.query_one("#prompt-why", WhyView)
        why.display = shown
        if shown:
            self.call_after_refresh(why.query_one("#why-terms").focus)

    def start_why(self, engine: ExplorerEngine) -> None:
        """``load_why`` in this pane's worker (a newer cell replaces an older one's)."""
        self.run_worker(partial(self.load_why, engine), group="why", exclusive=True, exit_on_error=False)

    async def load_why(self, engine: ExplorerEngine) -> None:
        """The QK attribution of the cursor's query row for the head shown (one request: the
        Engine caches it, so coming back to a row is instant), at the cursor's key."""
        why = self.query_one("#prompt-why", WhyView)
        view = self.view
        if view is None or self.cursor is None:
            why.show_idle("no prompt yet: press p, type, enter; then w on a cell")
            return
        query, key = self.cursor
        row = why.attribution
        if row is not None and (row.layer, row.head, row.query) == (view.layer, view.head, query) \
                and why.tokens == tuple(view.tokens):
            why.set_key(key)  # the same row: re-sliced, no engine call
            if why.exact is None:  # its exact column was cut short (a newer load replaced it)
                await self._load_exact(engine, why, QKAttributionRequest.of(
                    engine.structure, view.layer, view.head, view.ids, query, where=None))
            return
        why.show_computing(view.layer, view.head, query)
        try:
            request = QKAttributionRequest.of(engine.structure, view.layer, view.head, view.ids,
                                              query, key, where=None)
            row = await engine.get(request)
        except CancelledError:  # the head was left: its own load follows
            return
        except HeadscopeError as err:
            if err.reason.startswith("QK attribution of"):  # soft-capping, ALiBi, ...: said, no sum
                why.show_out_of_scope(err.reason.split(": ", 1)[-1])
            else:
                why.show_error(err.reason)
            return
        if self.view is view and self.cursor is not None and self.cursor[0] == query:
            why.show(row, self.cursor[1], view.tokens)
            await self._load_exact(engine, why, request)

    async def _load_exact(self, engine: ExplorerEngine, why: WhyView, row: QKAttributionRequest) -> None:
        """The row again with each side's top sources removed exactly (the why view's "exact"
        column; a second pass to the layer, on the engine's thread): shown when it arrives if
        the row is still the one shown; an error leaves the column blank."""
        why.expect_exact()
        try:
            found = await engine.get(dataclasses.replace(row, confirm=TOTALS_TOP))
        except CancelledError:
            return
        except HeadscopeError:
            found = None
        why.show_exact(found)

    @on(WhyKeyMoved)
    def _why_key_moved(self, msg: WhyKeyMoved) -> None:
        # the pattern's cursor follows the why view along the row (drawn when it is back)
        if self.cursor is not None and msg.query == self.cursor[0]:
            self.cursor = (msg.query, msg.key)
            self.draw_pattern()

    def redraw(self) -> None:
        """The prompt's views again (the DLA bars in the current theme's colour map)."""
        shown = getattr(self, "shown_views", None)
        if shown is not None:
            self.show(*shown)

    async def load(self, host: PaneHost, key: LoadKey) -> None:
        layer, head = key[1]
        if not host.choices.prompt_text.strip():
            for chart in ("#prompt-pattern", "#prompt-pattern-b"):
                self.query_one(chart, Chart).message("no prompt yet: press p, type, enter")
            return
        self.prompt_text = host.choices.prompt_text
        engine = host.engine
        found = await engine.get(PromptRequest.of(host.structure, host.choices.prompt_text,
                                                  limit=engine.max_block_bytes))
        view = found.view(layer, head)
        if not host.fresh(key):
            return
        view_b = await host.compare.prompt_b(host.choices.prompt_text, (layer, head)) \
            if host.compare.engine_b is not None else None
        if not host.fresh(key):
            return
        self.show(view, view_b)
        host.keep_result("prompt", view if view_b is None else {"a": view, "b": view_b})
        if self.why_open:  # another head or prompt: its why at the same cell
            await self.load_why(host.engine)


def _short(token: str, width: int = 10) -> str:
    """A token for the cursor line: printable, quoted, cut."""
    s = printable(str(token))
    return repr(s if len(s) <= width else s[: width - 1] + "…")


class CompositionPane(PathEffects, Horizontal):
    """The Q/K/V-composition graph and its edge list. The pane keeps the graph's state: the
    kind shown, the edge threshold, the selected edge, and the graphs already computed (per
    kind and weights generation)."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.kind = "k"
        self.threshold = 0.5  # draw edges ≥ this fraction of the strongest one
        self.selected: tuple[int, int, int, int] | None = None
        self.edges: list[Edge] = []  # the table's rows, strongest first
        self.cache: dict[tuple[str, int], Composition] = {}
        self.shown: Composition | None = None
        self._shape = (0, 0)  # (n_layers, n_heads) of the graph shown
        self.partials = 0  # partial graphs shown while sweeps ran (tests count them)
        self.compact = False  # below 100 columns: the edge list's columns packed (set_compact)
        self.init_paths()  # the top edges' path effects on the current task (path_column.py)

    def compose(self) -> ComposeResult:
        yield Chart(id="comp-graph", placeholder="composition scores not computed yet")
        with Vertical(id="comp-side"):
            yield Static(id="comp-detail")
            table: DataTable[Any] = DataTable(id="comp-edges", cursor_type="row",
                                              zebra_stripes=True)
            yield table

    def on_mount(self) -> None:
        self._add_columns()

    def _add_columns(self) -> None:
        table = self.query_one("#comp-edges", DataTable)
        if self.compact:
            # At 80×24 the side column has 31 columns for the list: with the default padding
            # (one column each side of every cell) the path column was off-screen. Packed,
            # the cells carry their own separating space (see _cells).
            table.cell_padding = 0
            table.add_column("from", key="source")
            table.add_column(" to", key="target")
            table.add_column(Text(" s−base", justify="right"), key="score")
            table.add_column(" path", key="path", width=13)  # over the values (path_cell)
            return
        table.cell_padding = 1
        table.add_column("source", key="source")
        table.add_column("target", key="target")
        table.add_column("s−base", key="score")
        table.add_column("path", key="path", width=PATH_CELL)  # "+0.00 unused" (path_cell)

    def set_compact(self, compact: bool) -> None:
        """Pack the edge list's columns below 100 columns (the explorer's layout_for)."""
        if compact == self.compact:
            return
        self.compact = compact
        table = self.query_one("#comp-edges", DataTable)
        selected = self.selected
        table.clear(columns=True)
        table._headscope_comp = (None, None, None)  # type: ignore[attr-defined]
        self._add_columns()
        self.redraw()
        if selected is not None:  # the cursor stays on the selected edge
            rows = [tuple(e[:4]) for e in self.edges]
            if tuple(selected) in rows:
                table.move_cursor(row=rows.index(tuple(selected)))

    def _cells(self, edge: Edge, style: str) -> tuple[Text, Text, Text, Text]:
        """An edge list row; packed (``compact``), every cell after the first starts with
        the space that separates it from the one before."""
        l1, h1, l2, h2, s = edge
        gap = " " if self.compact else ""
        path = self.path_cell(edge, not style)
        if self.compact and path.plain:
            path = Text(gap) + path
        return (Text(head_name(l1, h1), style=style), Text(gap + head_name(l2, h2), style=style),
                Text(f"{gap}{s:+.3f}", style=style, justify="right"), path)

    def show(self, comp: Composition, n_layers: int, n_heads: int,
             selected: tuple[int, int, int, int] | None,
             threshold: float = 0.5, *, partial: bool = False) -> list[tuple[int, int, int, int, float]]:
        """Draw the edges whose strength is at least ``threshold`` × the strongest one.

        Every edge stays in the table (the ones not drawn are dimmed); returns them, strongest
        first. ``partial``: the sweep is still running (``comp`` holds the layer pairs done so
        far, NaN elsewhere, and their top edges): the title says how far it is."""
        es = [e for e in edges(comp) if math.isfinite(e[4])]
        drawn, cut = threshold_edges(es, threshold)
        vmax = max((e[4] for e in drawn), default=1.0)
        kind = comp.kind.upper()
        baseline = float(comp.baseline)
        if self.compact:
            # Two lines of the narrow graph (26 columns at 80×24; it took three, the long one
            # lost its end): what is drawn (at most "K-comp 50/50 ≥ 50% of max", 25: a result
            # lists TOP_EDGES = 50 edges), then the baseline the strengths are measured from.
            # The cut (s−base of the weakest edge drawn) is the left end of the key under the
            # graph, so it is not repeated here; while the sweep runs, its layer pairs take
            # the place of the `< >` hint (the keys still work; `?` lists them).
            title = f"{kind}-comp {len(drawn)}/{len(es)} ≥ {threshold:.0%} of max\nbase {baseline:.3f}"
        else:
            title = (f"{kind}-composition · {len(drawn)}/{len(es)} edges ≥ {threshold:.0%} of max "
                     f"(score − baseline ≥ {cut:+.3f}; baseline {baseline:.3f}) · < >")
        if partial:
            pairs = n_layers * (n_layers - 1) // 2
            done = sum(1 for t in range(n_layers) for s in range(t)
                       if np.isfinite(comp.scores[s, :, t, :]).any())
            title = f"{title} · {done}/{pairs} pairs" if self.compact else \
                f"{title} · computing: {done}/{pairs} layer pairs"
        elif self.compact:
            title += " · < >"
        self.query_one("#comp-graph", Chart).show(Graph(
            n_layers, n_heads, tuple(drawn), selected=selected, vmax=vmax, vmin=cut,
            title=title,
            nodes=tuple((s[0], s[1]) for s in ([selected[:2], selected[2:]] if selected else []))))
        table = self.query_one("#comp-edges", DataTable)
        shown = getattr(table, "_headscope_comp", (None, None, None))
        paths = (id(self.paths), self.paths_state)
        if shown[0] is not comp or shown[1:] != (threshold, paths):  # identity: results hold arrays
            fresh = shown[0] is not comp
            table._headscope_comp = (comp, threshold, paths)  # type: ignore[attr-defined]
            if fresh:
                table.clear()
            for i, edge in enumerate(es):
                s = edge[4]
                style = "" if s >= cut and s > 0 else "dim"  # dim: below threshold, not drawn
                cells = self._cells(edge, style)
                if fresh:
                    table.add_row(*cells, key=str(i))
                else:
                    for column, cell in zip(("source", "target", "score", "path"), cells,
                                            strict=True):
                        table.update_cell(str(i), column, cell)
        return es

    def redraw(self) -> None:
        """The graph shown again, with the current threshold and selected edge."""
        if self.shown is not None:
            self.show(self.shown, *self._shape, self.selected, self.threshold)

    def step_threshold(self, step: int) -> float:
        """Raise or lower the edge threshold by one step (0 … 90 %); the new threshold."""
        self.threshold = round(min(0.9, max(0.0, self.threshold + step * THRESHOLD_STEP)), 2)
        self.redraw()
        return self.threshold

    @on(DataTable.RowHighlighted, "#comp-edges")
    def _edge_highlighted(self, event: DataTable.RowHighlighted) -> None:
        edge = self._edge(event.row_key.value)
        if edge is None or self.shown is None:
            return
        self.selected = edge[:4]
        self.redraw()
        self.detail(self.shown, edge)

    @on(DataTable.RowSelected, "#comp-edges")
    def _edge_selected(self, event: DataTable.RowSelected) -> None:
        """Enter on an edge opens its virtual heads (``g`` there focuses the target head)."""
        edge = self._edge(event.row_key.value)
        if edge is not None:
            l1, h1, l2, h2, _ = edge
            self.post_message(EdgeChosen((l1, h1), (l2, h2)))

    def _edge(self, row_key: str | None) -> Edge | None:
        try:
            return self.edges[int(row_key or "")]
        except (ValueError, IndexError):
            return None

    def detail(self, comp: Composition, edge: tuple[int, int, int, int, float] | None) -> None:
        if edge is None:
            why = ""
            if not self.edges:  # an empty table says why
                why = ("one layer: no head has an earlier layer's head to compose with"
                       if self._shape[0] < 2 else "no finite composition scores")
            self.query_one("#comp-detail", Static).update(Text(why, style="italic"))
            return
        l1, h1, l2, h2, s = edge
        kind = comp.kind.upper()
        base = float(comp.baseline)
        _, cut = threshold_edges(self.edges, self.threshold)
        path = self.path_line(edge, s > 0 and s >= cut)
        self.query_one("#comp-detail", Static).update(Text.assemble(
            (f"{head_name(l1, h1)} → {head_name(l2, h2)} ", "bold"),
            f"│ {kind}-comp {s + base:.3f} − baseline {base:.3f} = {s:+.3f}  "
            "(enter: virtual heads)", f"\n{path}" if path else ""))

    async def load(self, host: PaneHost, key: LoadKey) -> None:
        kind = self.kind
        cache_key = (kind, host.gen)
        comp = self.cache.get(cache_key)
        chart = self.query_one("#comp-graph", Chart)
        if comp is None:
            chart.message(f"computing {kind.upper()}-composition for every pair of heads…")

            def progress(fraction: float) -> None:
                host.sweep_progress(float(fraction))

            def partial(found: Composition) -> None:
                # the layer pairs done so far (on the event loop; the engine built it on its
                # thread): the graph and the table fill in while the sweep runs
                if host.fresh(key) and self.cache.get(cache_key) is None:
                    self.shown, self._shape = found, (host.n_layers, host.n_heads)
                    self.edges = self.show(found, host.n_layers, host.n_heads, self.selected,
                                           self.threshold, partial=True)
                    self.partials += 1

            try:
                comp = await host.engine.get(CompositionRequest.of(host.structure, kind), progress,
                                             partial=partial)
            finally:
                host.sweep_progress(None)
            self.cache[cache_key] = comp
        if not host.fresh(key):
            return
        self.selected = None
        self.init_paths()
        self.shown, self._shape = comp, (host.n_layers, host.n_heads)
        self.edges = self.show(comp, host.n_layers, host.n_heads, None, self.threshold)
        # the row under the table's cursor (the first) has its detail from the start: it
        # was blank until the cursor moved
        self.detail(comp, self.edges[0] if self.edges else None)
        host.keep_result("composition", comp)
        await self.load_paths(host, key, kind, self.edges)


def threshold_edges(es: list[tuple[int, int, int, int, float]], threshold: float
                    ) -> tuple[list[tuple[int, int, int, int, float]], float]:
    """The edges at least ``threshold`` × the strongest (and above the baseline), and the cut."""
    strongest = max((e[4] for e in es), default=0.0)
    cut = max(threshold * strongest, 0.0)
    return [e for e in es if e[4] > 0 and e[4] >= cut], cut
