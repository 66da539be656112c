"""The Circuit tab: the circuit edge attribution found (docs/math.md, "Edge attribution").

The pane takes the engine's core results (``EdgeScores``, optionally a ``FaithfulnessCurve``,
``Faithfulness`` points and ``ExactEdge`` checks) and shows

- the circuit of the top N edges, pruned (``EdgeGraph.circuit``, numpy only: drawn at once when
  N changes), as a graph (``tui.plots.edge_circuit``: layers left to right, edges in the heatmaps'
  diverging map), scrollable when it is larger than the pane;
- under it the faithfulness curve over N (plotext, through ``Chart``; log % of the edges) with
  N marked;
- beside both the edges sorted by |estimate| (● in the circuit, ○ among the top N but pruned),
  with the exact check where one was made (``–`` where not).

``-``/``+`` step N along 1, 2, 5, 10, 20, 50, … (and the number of edges), ``<``/``>`` by one;
each change posts ``CircuitTopChanged`` (the faithfulness of a new N needs the engine: the
explorer computes it and hands it back with ``add_faithfulness``). Enter on an edge posts
``CircuitEdgeChosen`` (the explorer shows its heads' QK/OV views). Before a result the pane says
so: not computed yet (``clear``), computing with its progress (``computing``), an error
(``failed``); a result whose clean and corrupt runs give the same metric is shown as that, not
as a circuit (every score is 0 and faithfulness would divide by ~0).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, ScrollableContainer, Vertical
from textual.geometry import Region
from textual.widgets import DataTable, Static

from headscope.engine.core.edge_graph import EdgeGraph
from headscope.engine.core.edge_results import (
    EdgeScores,
    ExactEdge,
    Faithfulness,
    FaithfulnessCurve,
    metrics_differ,
)
from headscope.tui.base.datatext import data_text
from headscope.tui.base.messages import CircuitEdgeChosen, CircuitTopChanged, Head
from headscope.tui.plots.edge_circuit import CircuitDrawing, draw_circuit, edge_ends, edge_style
from headscope.tui.plots.figures import Line
from headscope.tui.widgets.chart import Chart

DEFAULT_TOP = 10
LIST_MIN, LIST_MAX = 20, 500  # rows of the edge list: the top N, at least / at most
GRAPH_MAX = 200  # more circuit edges than this are listed, not drawn
NOT_COMPUTED = "edge attribution not computed yet"
IN, PRUNED, OUT = "●", "○", " "


def ladder(n_edges: int) -> list[int]:
    """The values ``-``/``+`` step N through: 1, 2, 5, 10, 20, 50, … below ``n_edges``, then it."""
    out: list[int] = []
    base = 1
    while base < n_edges:
        out += [k * base for k in (1, 2, 5) if k * base < n_edges]
        base *= 10
    return [*out, n_edges] if n_edges > 0 else [0]


def node_head(graph: EdgeGraph, index: int) -> Head | None:
    """The (layer, head) of source node ``index``, None for input, an MLP or the logits."""
    if index <= 0 or index >= graph.n_sources:
        return None
    layer, within = divmod(index - 1, graph.per_layer_sources)
    return (layer, within) if within < graph.n_heads else None


def _number(value: float | None, style: str = "") -> Text:
    if value is None or not np.isfinite(value):
        return Text("–", style="dim", justify="right")
    return Text(f"{value:+.3g}", style=style, justify="right")


class CircuitPane(Vertical):
    """The Circuit tab's graph, edge list and faithfulness curve (see the module's docstring)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("equals_sign,plus", "step_top(1)", "N +", id="circuit-more", key_display="+",
                tooltip="Circuit tab: more edges in the circuit (N: 1, 2, 5, 10, 20, 50, …)"),
        Binding("minus", "step_top(-1)", "N −", id="circuit-fewer", key_display="-",
                tooltip="Circuit tab: fewer edges in the circuit (N: … 50, 20, 10, 5, 2, 1)"),
        Binding("greater_than_sign", "add_top(1)", "N+1", id="circuit-one-more", key_display=">",
                show=False, tooltip="Circuit tab: one edge more in the circuit"),
        Binding("less_than_sign", "add_top(-1)", "N−1", id="circuit-one-fewer", key_display="<",
                show=False, tooltip="Circuit tab: one edge fewer in the circuit"),
    ]

    # The status: two lines at 120 columns, four at 80 (each line wraps once; with three,
    # the edge line lost its "enter: its heads' QK/OV").
    DEFAULT_CSS = """
    CircuitPane { height: 1fr; }
    CircuitPane #circuit-status { height: auto; max-height: 4; }
    CircuitPane #circuit-body { height: 1fr; }
    CircuitPane #circuit-main { width: 1fr; height: 1fr; }
    CircuitPane #circuit-scroll { height: 1fr; }
    CircuitPane #circuit-graph { width: auto; height: auto; }
    CircuitPane #circuit-edges { width: 40; height: 1fr; }
    CircuitPane #circuit-curve { height: 40%; min-height: 8; }
    """

    def __init__(self, *, placeholder: str = NOT_COMPUTED, id: str | None = None) -> None:
        super().__init__(id=id)
        self.placeholder = placeholder
        self.scores: EdgeScores | None = None
        self.curve: FaithfulnessCurve | None = None
        self.exact: dict[str, ExactEdge] = {}
        self.points: dict[int, Faithfulness] = {}  # by top N
        self.top = DEFAULT_TOP
        self.selected: int | None = None  # an edge index
        self.state = "empty"  # empty | computing | error | same | result
        self.status = ""
        self._rows: list[int] = []  # the list's edge indices, in its order
        self.drawing: CircuitDrawing | None = None  # the graph on screen (tests read it)

    def compose(self) -> ComposeResult:
        yield Static(id="circuit-status")
        with Horizontal(id="circuit-body"):
            with Vertical(id="circuit-main"):
                # Not a focus stop: tab goes straight from the head tree to the edge list, where
                # the keys are (+/-, m, enter); the graph scrolls to the selected edge itself.
                with ScrollableContainer(id="circuit-scroll", can_focus=False):
                    yield Static(id="circuit-graph")
                yield Chart(id="circuit-curve", placeholder="faithfulness curve not computed")
            table: DataTable[Any] = DataTable(id="circuit-edges", cursor_type="row",
                                              zebra_stripes=True)
            yield table

    def on_mount(self) -> None:
        table = self.query_one("#circuit-edges", DataTable)
        table.add_column("", key="in")
        table.add_column("edge", key="edge")
        table.add_column("est", key="estimate")
        table.add_column("exact", key="exact")
        table.tooltip = ("The edges by |estimate| (● in the circuit, ○ among the top N but "
                         "pruned); exact: the edge alone patched (– not checked). "
                         "Enter: its heads' QK/OV views")
        self.clear()

    # -- states ---------------------------------------------------------------------------
    def clear(self, text: str | None = None) -> None:
        """Nothing computed yet (``text``: what to say instead of the placeholder)."""
        self.scores, self.curve, self.selected = None, None, None
        self.exact, self.points = {}, {}
        self._empty("empty", text or self.placeholder)

    def computing(self, what: str = "attributing every edge", fraction: float | None = None) -> None:
        """A computation under way: ``what`` and its progress (0 … 1, None if unknown). A
        result already shown stays up; the status line says what is coming."""
        progress = "" if fraction is None else f" {fraction:.0%}"
        line = f"{what}…{progress}"
        if self.scores is None:
            self._empty("computing", line)
        else:
            self._set_status(line)

    def failed(self, message: str) -> None:
        """The computation failed: one line, shown as data (never markup)."""
        self.scores, self.curve, self.selected = None, None, None
        self._empty("error", f"cannot find the circuit: {message}", style="bold red")

    def _empty(self, state: str, text: str, style: str = "dim") -> None:
        self.state = state
        self._rows = []
        self.drawing = None
        self.query_one("#circuit-graph", Static).update(data_text(text, style=style))
        self.query_one("#circuit-edges", DataTable).clear()
        self.query_one("#circuit-curve", Chart).message("")
        self._set_status(text)

    # -- results --------------------------------------------------------------------------
    def show(self, scores: EdgeScores, *, curve: FaithfulnessCurve | None = None,
             exact: Sequence[ExactEdge] = (), faithfulness: Sequence[Faithfulness] = (),
             top: int | None = None) -> None:
        """Show ``scores`` (and what else was computed for them); ``top``: N (else kept,
        within the graph's edges)."""
        self.scores = scores
        self.curve = None
        self.exact = {}
        self.points = {}
        self.selected = None
        n_edges = scores.graph.n_edges
        self.top = max(0, min(top if top is not None else self.top, n_edges))
        if not metrics_differ(scores.clean, scores.corrupt):
            self._empty("same", f"the clean and corrupt runs give the same {scores.metric} "
                                f"({scores.clean:.6g}): no edge carries a difference, and "
                                "faithfulness is undefined. Choose prompts that differ.")
            return
        self.state = "result"
        self.add_exact(exact, redraw=False)
        self.add_faithfulness(faithfulness, redraw=False)
        if curve is not None:
            self.set_curve(curve, redraw=False)
        ranked = scores.ranked()
        self.selected = int(ranked[0]) if len(ranked) else None
        self._redraw()

    def add_exact(self, rows: Sequence[ExactEdge], *, redraw: bool = True) -> None:
        """Exact checks of some edges (``--verify``): the list's exact column."""
        self.exact.update({row.edge: row for row in rows})
        if redraw and self.state == "result":
            self._fill_list()

    def add_faithfulness(self, points: Sequence[Faithfulness], *, redraw: bool = True) -> None:
        """Faithfulness of top-N circuits (their pruned masks and values, by N)."""
        self.points.update({p.top: p for p in points})
        if redraw and self.state == "result":
            self._redraw()

    def set_curve(self, curve: FaithfulnessCurve, *, redraw: bool = True) -> None:
        """The faithfulness curve (its points count as faithfulness of their N too)."""
        self.curve = curve
        self.points.update({p.top: p for p in curve.points})
        if redraw and self.state == "result":
            self._redraw()

    # -- N --------------------------------------------------------------------------------
    def set_top(self, n: int) -> None:
        """N: the circuit of the top ``n`` edges (clipped to the graph); posts
        ``CircuitTopChanged`` when it changes (only with a circuit on screen)."""
        if self.scores is None or self.state != "result":
            return
        n = max(0, min(int(n), self.scores.graph.n_edges))
        if n == self.top:
            return
        self.top = n
        self._redraw()
        self.post_message(CircuitTopChanged(n))

    def action_step_top(self, direction: int) -> None:
        if self.scores is None or self.state != "result":
            return
        steps = ladder(self.scores.graph.n_edges)
        if direction > 0:
            self.set_top(next((s for s in steps if s > self.top), steps[-1]))
        else:
            self.set_top(next((s for s in reversed(steps) if s < self.top), 0 if self.top <= 1 else 1))

    def action_add_top(self, delta: int) -> None:
        self.set_top(self.top + delta)

    def circuit_mask(self) -> np.ndarray:
        """The top-N circuit, pruned: the engine's when it evaluated this N, else the same
        ``EdgeGraph.circuit`` computed here."""
        assert self.scores is not None
        point = self.points.get(self.top)
        if point is not None:
            return np.asarray(point.in_circuit, dtype=bool)
        s = self.scores
        return s.graph.circuit(s.scores, self.top, ~s.nonfinite)

    # -- drawing --------------------------------------------------------------------------
    def _redraw(self) -> None:
        self._draw_graph()
        self._fill_list()
        self._draw_curve()
        self._set_status(self._detail())

    def _draw_graph(self) -> None:
        scores = self.scores
        assert scores is not None
        mask = self.circuit_mask()
        graph = self.query_one("#circuit-graph", Static)
        self.drawing = None
        if int(mask.sum()) > GRAPH_MAX:
            graph.update(Text(f"{int(mask.sum())} edges: too many to draw (the list shows them; "
                              "- fewer)", style="dim"))
            return
        colours = self.query_one("#circuit-curve", Chart).colours()
        selected = self.selected if self.selected is not None and mask[self.selected] else None
        self.drawing = draw_circuit(scores.graph, scores.scores, mask, colours, selected=selected)
        graph.update(self.drawing.text)
        lane = self.drawing.lanes.get(selected) if selected is not None else None
        if lane is not None:  # a graph wider or taller than the pane: the selected edge in view
            x, top, bottom = lane
            self.call_after_refresh(self.query_one("#circuit-scroll", ScrollableContainer).scroll_to_region,
                                    Region(max(x - 8, 0), top, 16, bottom - top + 1), animate=False)

    def _fill_list(self) -> None:
        scores = self.scores
        assert scores is not None
        table = self.query_one("#circuit-edges", DataTable)
        mask = self.circuit_mask()
        ranked = scores.ranked()
        rows = [int(i) for i in ranked[:min(max(self.top, LIST_MIN), LIST_MAX)]]
        self._rows = rows
        colours = self.query_one("#circuit-curve", Chart).colours()
        vmax = float(np.max(np.abs(scores.scores))) or 1.0
        table.clear()
        for rank, i in enumerate(rows):
            name = scores.graph.edges[i]
            estimate = scores.score(name)
            check = self.exact.get(name)
            mark = IN if mask[i] else PRUNED if rank < self.top else OUT
            # The marker carries the edge's colour (sign and strength, as in the graph); the
            # number stays in the text colour: a weak edge's colour is near the background
            # (1.4:1 on the dark theme), unreadable as text.
            marker = Text(mark) if estimate is None else Text(mark, style=edge_style(estimate, vmax, colours))
            table.add_row(marker, data_text(name), _number(estimate),
                          _number(None if check is None else check.exact), key=str(i))
        if self.selected in rows:
            with contextlib.suppress(Exception):
                table.move_cursor(row=rows.index(self.selected))

    def _draw_curve(self) -> None:
        chart = self.query_one("#circuit-curve", Chart)
        curve, scores = self.curve, self.scores
        if curve is None or scores is None:
            chart.message("faithfulness curve not computed")
            return
        x = np.asarray(curve.fractions, dtype=np.float64) * 100
        y = np.asarray([p.faithfulness for p in curve.points], dtype=np.float64)
        chart.show(Line(x, y, title=f"faithfulness · area {curve.area:.2f}", xlabel="% of edges",
                        mark_x=max(100.0 * self.top / max(scores.graph.n_edges, 1), x[0]), log_x=True))

    def _detail(self) -> str:
        scores = self.scores
        assert scores is not None
        mask = self.circuit_mask()
        point = self.points.get(self.top)
        faith = (f"faithfulness {point.faithfulness:.3f}" if point is not None
                 else "faithfulness not computed for this N")
        method = scores.method + (f" ({scores.steps} steps)" if scores.steps else "")
        head = (f"{method} · top {self.top} of {scores.graph.n_edges} edges → "
                f"{int(mask.sum())} after pruning · {faith}")
        if self.selected is None:
            return head
        name = scores.graph.edges[self.selected]
        check = self.exact.get(name)
        estimate = scores.score(name)
        est = "non-finite gradient" if estimate is None else f"{estimate:+.4g}"
        exact = "" if check is None else f", exact {check.exact:+.4g}"
        return f"{head}\n{name}: estimate {est}{exact} · enter: its heads' QK/OV"

    def _set_status(self, text: str) -> None:
        self.status = text
        self.query_one("#circuit-status", Static).update(
            Text("\n").join(data_text(line) for line in text.split("\n")))

    # -- the list -------------------------------------------------------------------------
    @on(DataTable.RowHighlighted, "#circuit-edges")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        if self.scores is None or not 0 <= event.cursor_row < len(self._rows):
            return
        edge = self._rows[event.cursor_row]
        if edge != self.selected:
            self.selected = edge
            self._draw_graph()
            self._set_status(self._detail())

    @on(DataTable.RowSelected, "#circuit-edges")
    def _selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        scores = self.scores
        if scores is None or not 0 <= event.cursor_row < len(self._rows):
            return
        edge = self._rows[event.cursor_row]
        source, target, which = edge_ends(scores.graph, edge)
        self.post_message(CircuitEdgeChosen(scores.graph.edges[edge], node_head(scores.graph, source),
                                            node_head(scores.graph, target), which))
