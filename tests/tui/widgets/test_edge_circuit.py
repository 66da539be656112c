"""The Circuit pane (tui/widgets/edge_circuit.py) in a tiny app, at 80×24 and 120×40: the circuit
edge attribution finds on attn-only-2l's first-occurrence task on screen, N changed by keys,
enter asking for the edge's heads, 256 colours, and its states before a result."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest
from rich.color import ColorSystem, ColorType
from rich.console import Console
from rich.style import Style
from rich.text import Text
from textual.app import App, ComposeResult
from textual.widgets import DataTable, Static

from headscope.engine.core.edge_results import (
    EdgeScores,
    ExactEdge,
    FaithfulnessCurve,
    edge_scores_result,
)
from headscope.tui.base.messages import CircuitEdgeChosen, CircuitTopChanged
from headscope.tui.plots.colormap import xterm_rgb
from headscope.tui.plots.edge_circuit import edge_style
from headscope.tui.widgets.chart import Chart
from headscope.tui.widgets.edge_circuit import DEFAULT_TOP, NOT_COMPUTED, CircuitPane, ladder
from tests.conftest import sample_model

K_EDGE = "a0.h1->a1.h2<k>"
EDGE_GLYPHS = "─━│┃┌┏┐┓└┗┘┛┬┳┴┻├┣┤┫┼╋╌╍╎╏qkv"


@functools.lru_cache(maxsize=1)
def first_occurrence_circuit() -> tuple[EdgeScores, FaithfulnessCurve, list[ExactEdge]]:
    """EAP-IG (5 steps) on attn-only-2l's first-occurrence task (as tests/engine/forward/test_edges.py), its
    faithfulness curve, and the exact checks of its top 3 edges."""
    from headscope.engine.forward import edges, patch_tasks
    from headscope.engine.model.loading import load_model

    w = load_model(sample_model("attn-only-2l")).weights
    clean, corrupt = patch_tasks.induction_task(w.cfg.d_vocab, w.cfg.n_ctx, 0, task="first-occurrence")
    metric = patch_tasks.task_metric("first-occurrence", clean)
    scores = edges.edge_scores(w, clean, corrupt, metric, method="eap-ig")
    curve = edges.faithfulness_curve(w, clean, corrupt, metric, scores)
    top = [scores.graph.edges[i] for i in scores.ranked()[:3]]
    return scores, curve, edges.exact_edges(w, clean, corrupt, metric, top, scores)


class PaneApp(App[None]):
    """Just the pane; ``color_mode`` as the app's (tui/app.py) for the chart and the graph."""

    def __init__(self, mode: str = "truecolor") -> None:
        super().__init__()
        self.mode = mode

    @property
    def color_mode(self) -> str:
        return self.mode

    def compose(self) -> ComposeResult:
        yield CircuitPane(id="circuit")


def unique(posted: list[Any], kind: type) -> list[Any]:
    """The messages of ``kind`` the hook saw, each once (it sees a message at every hop as it
    bubbles up)."""
    seen: dict[int, Any] = {}
    for m in posted:
        if isinstance(m, kind):
            seen.setdefault(id(m), m)
    return list(seen.values())


def screen_text(app: App[Any]) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


async def shown(pilot: Any, app: PaneApp, **kwargs: Any) -> CircuitPane:
    """The pane with the first-occurrence result, its list focused, the curve built."""
    scores, curve, exact = first_occurrence_circuit()
    pane = app.query_one(CircuitPane)
    pane.show(scores, curve=curve, exact=exact, **kwargs)
    app.query_one("#circuit-edges", DataTable).focus()
    chart = app.query_one("#circuit-curve", Chart)
    for _ in range(200):
        await pilot.pause(0.02)
        if chart.rendered is not None:
            break
    await pilot.pause()
    return pane


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_the_circuit_its_edges_and_the_curve_are_on_screen(size: tuple[int, int]) -> None:
    scores, _, exact = first_occurrence_circuit()
    app = PaneApp()
    async with app.run_test(size=size) as pilot:
        pane = await shown(pilot, app)
        text = screen_text(app)
        top = [scores.graph.edges[i] for i in scores.ranked()[:3]]
        assert K_EDGE in top
        for name in top:
            assert name in text, name
        # estimate and exact of the top edge, as the list prints them
        first = exact[0]
        assert f"{first.estimate:+.3g}" in text and f"{first.exact:+.3g}" in text
        assert "–" in text  # edges without an exact check
        # the graph: the circuit's nodes, left to right
        for node in ("input", "a0.h1", "a1.h2"):
            assert node in text
        assert f"top {DEFAULT_TOP} of {scores.graph.n_edges} edges" in text
        assert pane.status.startswith("eap-ig (5 steps)")
        # the curve, plotted
        chart = app.query_one("#circuit-curve", Chart)
        assert chart.rendered is not None
        assert "faithfulness · area" in text and "% of edges" in text
        assert "⠉" in chart.rendered.plain or "⠒" in chart.rendered.plain  # braille line


async def test_keys_change_n_and_post_it() -> None:
    posted: list[Any] = []
    app = PaneApp()
    async with app.run_test(size=(80, 24), message_hook=posted.append) as pilot:
        pane = await shown(pilot, app)
        assert pane.top == DEFAULT_TOP
        await pilot.press("plus")
        await pilot.pause()
        assert pane.top == 20 and "top 20 of 52" in screen_text(app)
        await pilot.press("minus", "minus")
        await pilot.pause()
        assert pane.top == 5
        await pilot.press("greater_than_sign")
        await pilot.pause()
        assert pane.top == 6
        await pilot.press("less_than_sign", "minus", "minus", "minus", "minus")
        await pilot.pause()
        assert pane.top == 0 and "no circuit" in screen_text(app)
        changes = [m.top for m in unique(posted, CircuitTopChanged)]
        assert changes == [20, 10, 5, 6, 5, 2, 1, 0]
        # the circuit drawn is the one of N: 5 edges, one pruned (tests/engine/forward/test_edges.py's curve)
        pane.set_top(5)
        await pilot.pause()
        mask = pane.circuit_mask()
        assert mask.sum() == 5
        assert "→ 5 after pruning" in screen_text(app)
    assert ladder(52) == [1, 2, 5, 10, 20, 50, 52]


async def test_the_status_is_whole_in_the_explorers_80_column_pane() -> None:
    """At 80 columns the explorer leaves the pane 62: both status lines wrap, and the edge
    line's end ("enter: its heads' QK/OV") stays on screen."""
    app = PaneApp()
    async with app.run_test(size=(62, 24)) as pilot:
        pane = await shown(pilot, app)
        assert pane.selected is not None
        status = app.query_one("#circuit-status", Static)
        assert status.size.height == 4
        assert "heads' QK/OV" in screen_text(app)


async def test_tab_reaches_the_edge_list_first() -> None:
    """The graph is no focus stop: one tab from outside reaches the list, where N's keys are."""
    app = PaneApp()
    async with app.run_test(size=(80, 24)) as pilot:
        await shown(pilot, app)
        app.set_focus(None)
        await pilot.press("tab")
        assert app.focused is app.query_one("#circuit-edges", DataTable)


async def test_enter_on_an_edge_asks_for_its_heads() -> None:
    posted: list[Any] = []
    app = PaneApp()
    async with app.run_test(size=(80, 24), message_hook=posted.append) as pilot:
        await shown(pilot, app)
        await pilot.press("enter")
        await pilot.press("down", "enter")
        await pilot.pause()
        chosen = unique(posted, CircuitEdgeChosen)
        assert chosen == [CircuitEdgeChosen("input->a0.h1<v>", None, (0, 1), "v"),
                          CircuitEdgeChosen(K_EDGE, (0, 1), (1, 2), "k")]
        # the highlighted edge is the graph's selection, its nodes reversed
        text = screen_text(app)
        assert f"{K_EDGE}: estimate" in text
        # the list: each edge's marker in its colour (sign and strength, as in the graph), its
        # estimate in the text colour (a weak edge's colour is near the background, 1.4:1)
        pane = app.query_one(CircuitPane)
        table = app.query_one("#circuit-edges", DataTable)
        assert pane.scores is not None
        vmax = float(np.max(np.abs(pane.scores.scores)))
        colours = app.query_one("#circuit-curve", Chart).colours()
        for row, edge in enumerate(pane._rows[:12]):
            marker, _, estimate, _ = table.get_row_at(row)
            assert marker.style == edge_style(float(pane.scores.scores[edge]), vmax, colours)
            assert not estimate.style and not estimate.spans


async def test_256_colours_draw_palette_entries_only() -> None:
    """At 256 colours the graph's colours are xterm entries (16–255): printed by a truecolor
    console they give no ``38;2``; on screen (Textual keeps colours as RGB) each is exactly its
    entry's RGB, which a 256-colour terminal gets back as that entry, never a neighbour."""
    app = PaneApp("256")
    async with app.run_test(size=(80, 24)) as pilot:
        pane = await shown(pilot, app)
        assert pane.drawing is not None
        entries = {s.style.color.number for s in pane.drawing.text.spans
                   if isinstance(s.style, Style) and s.style.color is not None}
        types = {s.style.color.type for s in pane.drawing.text.spans
                 if isinstance(s.style, Style) and s.style.color is not None}
        assert types == {ColorType.EIGHT_BIT} and min(entries) >= 16
        console = Console(color_system="truecolor", force_terminal=True, width=200)
        with console.capture() as cap:
            console.print(pane.drawing.text)
        assert "38;2" not in cap.get()
        region = app.query_one("#circuit-graph", Static).region
        strips = app.screen._compositor.render_strips()
        coloured = [seg for y in range(region.y, region.bottom)
                    for seg in strips[y].crop(region.x, region.right)
                    if seg.text.strip() and seg.style is not None and seg.style.color is not None]
        assert coloured
        # the edges' cells (the node labels are a theme colour, maybe a grey, which Rich maps
        # to the grey ramp by its own rounding: a neighbouring grey at worst)
        lines = [seg for seg in coloured if set(seg.text) <= set(EDGE_GLYPHS)]
        assert len(lines) > 10
        for seg in lines:
            back = seg.style.color.downgrade(ColorSystem.EIGHT_BIT)
            assert back.number in entries, (seg, back)
            assert xterm_rgb(back.number) == tuple(seg.style.color.triplet)
        terminal = Console(color_system="256", force_terminal=True, width=200)
        with terminal.capture() as cap:
            terminal.print(Text.assemble(*((seg.text, seg.style) for seg in coloured)))
        assert "38;2" not in cap.get() and "38;5;" in cap.get()


async def test_states_before_a_result() -> None:
    scores, _, _ = first_occurrence_circuit()
    app = PaneApp()
    async with app.run_test(size=(80, 24)) as pilot:
        pane = app.query_one(CircuitPane)
        await pilot.pause()
        assert NOT_COMPUTED in screen_text(app) and pane.state == "empty"
        pane.computing("attributing every edge", 0.4)
        await pilot.pause()
        assert "attributing every edge… 40%" in screen_text(app) and pane.state == "computing"
        pane.failed("bad [b]input[/b] in /tmp/x")  # data, never markup
        await pilot.pause()
        assert "bad [b]input[/b] in /tmp/x" in screen_text(app) and pane.state == "error"
        same = edge_scores_result(method="eap", steps=0, metric="logit_diff", clean=1.5, corrupt=1.5,
                                  graph=scores.graph, scores=np.zeros(scores.graph.n_edges), tokens=4, batch=1)
        pane.show(same)
        await pilot.pause()
        assert "give the same logit_diff" in screen_text(app) and pane.state == "same"
        app.query_one("#circuit-edges", DataTable).focus()
        await pilot.press("plus")  # no circuit to change: the message stays
        await pilot.pause()
        assert "give the same logit_diff" in screen_text(app) and pane.top == DEFAULT_TOP
        pane.show(scores)
        await pilot.pause()
        assert pane.state == "result" and "faithfulness curve not computed" in screen_text(app)
        pane.computing("faithfulness curve", 0.5)  # a result stays up while more is computed
        await pilot.pause()
        assert "faithfulness curve… 50%" in screen_text(app) and K_EDGE in screen_text(app)
        pane.clear()
        await pilot.pause()
        assert NOT_COMPUTED in screen_text(app) and K_EDGE not in screen_text(app)


async def test_a_graph_wider_than_the_pane_scrolls_to_the_selected_edge() -> None:
    """N = 26 at 80 columns: the graph is wider than its pane; the edge highlighted in the list
    is scrolled into view (its lane's column is on screen)."""
    app = PaneApp()
    async with app.run_test(size=(80, 24)) as pilot:
        pane = await shown(pilot, app, top=26)
        scroll = app.query_one("#circuit-scroll")
        assert pane.drawing is not None and pane.drawing.width > scroll.size.width
        lanes = pane.drawing.lanes
        far = max(lanes, key=lambda e: lanes[e][0])  # the rightmost lane
        row = pane._rows.index(far)
        table = app.query_one("#circuit-edges", DataTable)
        table.move_cursor(row=row)
        for _ in range(5):
            await pilot.pause()
        assert pane.selected == far
        x = pane.drawing.lanes[far][0]
        assert scroll.scroll_x <= x < scroll.scroll_x + scroll.size.width
