"""The "why" view wired into the explorer on the real engine (issue 38): on attn-only-2l with a
repeated prompt typed into the Prompt tab, ``W`` (explain this head) on the induction head
L1.H2 opens the why view at the induction cell, whose key side names the previous-token head
L0.H1 first; ``←``/``→`` move along the row from the cached row (no new request); ``shift+↑``
moves the query (a new row, one request); enter on a source head focuses it and shows its own
why at the same cell; ``w`` closes the view. At 120×40 and 80×24; what is asserted is what
the screen shows and the Engine's request count."""

from __future__ import annotations

import re
from typing import Any

import pytest
from textual.widgets import DataTable, Input

from headscope.engine.core.requests import QKAttributionRequest
from headscope.engine.forward.qk_attribution import qk_attribution
from headscope.engine.model.loading import load_model
from headscope.tui.app import HeadscopeApp
from headscope.tui.base.settings import Settings
from headscope.tui.widgets.chart import Chart
from headscope.tui.widgets.panes import PromptPane
from headscope.tui.widgets.why import WhyView
from tests.conftest import INDUCTION_HEAD, PREV_TOKEN_HEAD, sample_model
from tests.e2e.test_explorer_real_engine import wait_ready
from tests.tui.test_app import settle, wait_until
from tests.tui.widgets.test_why import screen_lines

WORDS = ["market", "bakery", "map", "basket", "old", "light", "duck", "twenty", "August", "give",
         "epsilon", "omega", "copper", "orange", "wind", "brass", "truck", "wall"]
PROMPT = " ".join(WORDS + WORDS)
HALF = len(WORDS)


@pytest.fixture
def rows_computed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """Every QK attribution row the Engine computes (its cache hits are not computed); the
    same row with ``confirm`` (the why view's exact column) is not counted."""
    from headscope.engine.core import requests
    from headscope.engine.sweeps import dispatch  # noqa: F401  (the computations registered)

    computed: list[tuple[int, int, int]] = []
    compute = requests.COMPUTATIONS[QKAttributionRequest]

    def counted(model: Any, req: QKAttributionRequest, **kwargs: Any) -> Any:
        if not req.confirm:
            computed.append((req.layer, req.head_index, req.query))
        return compute(model, req, **kwargs)

    monkeypatch.setitem(requests.COMPUTATIONS, QKAttributionRequest, counted)
    return computed


@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
async def test_explain_this_head_opens_why_at_the_induction_cell(
        size: tuple[int, int], rows_computed: list[tuple[int, int, int]]) -> None:
    path = sample_model("attn-only-2l")
    app = HeadscopeApp(path, settings=Settings(), debounce=0.01, sweep=False, head=INDUCTION_HEAD)
    async with app.run_test(size=size) as pilot:
        await wait_ready(pilot, app)
        assert app.explorer.head == INDUCTION_HEAD
        await pilot.press("p")  # the prompt box, focused
        app.query_one("#prompt-input", Input).value = PROMPT
        await pilot.press("enter")
        pane = app.query_one(PromptPane)
        await wait_until(pilot, lambda: pane.view is not None, "the prompt", 1200)
        await pilot.press("W")
        why = app.query_one(WhyView)
        await wait_until(pilot, lambda: why.state == "ready", "the why row", 1200)
        await settle(pilot, app, limit=1200)  # a busy box: up to a minute
        query, key = 2 * HALF - 1, HALF  # 'wall' again: attends to what followed it, 'market'
        assert pane.cursor == (query, key) and (why.attribution.query, why.key) == (query, key)
        lines = screen_lines(app)
        text = "\n".join(lines)
        assert f"why L1.H2 attends q={query} → k={key}" in text
        assert f"q={query} 'wall' → k={key} 'market'" in text
        # the key side's totals: the previous-token head first, the score the engine's
        previous = "a{}.h{}".format(*PREV_TOKEN_HEAD)
        header = next(i for i, line in enumerate(lines) if "query side" in line and "key side" in line)
        column = lines[header].index("key side")
        assert lines[header + 1][column:].split()[0] == previous, text  # the first row: the largest
        expected = qk_attribution(load_model(path).weights, app.explorer.query_one(PromptPane).view.ids,
                                  *INDUCTION_HEAD, query)
        _, key_totals = expected.totals(key)
        assert max(key_totals, key=lambda c: abs(key_totals[c])) == previous
        assert f"score {float(expected.score[key]):+.3g}" in text
        assert rows_computed == [(1, 2, query)]
        await wait_until(pilot, lambda: why.exact is not None, "the exact column", 1200)
        assert why.exact.removals and why.exact.query == query  # filled by a second request

        # along the row: the cached row, re-sliced
        await pilot.press("left")
        await settle(pilot, app, limit=1200)  # a busy box: up to a minute
        assert why.key == key - 1 and pane.cursor == (query, key - 1)
        assert f"why L1.H2 attends q={query} → k={key - 1}" in "\n".join(screen_lines(app))
        assert len(rows_computed) == 1
        # another query: one more row
        await pilot.press("shift+up")
        await wait_until(pilot, lambda: why.state == "ready" and why.attribution.query == query - 1,
                         "the row above", 1200)
        assert rows_computed[1:] == [(1, 2, query - 1)]
        # enter on the top term's source head: L0.H1 focused, its why at the same cell
        await pilot.press("shift+down")
        await wait_until(pilot, lambda: why.state == "ready" and why.attribution.query == query,
                         "the first row again", 1200)
        assert len(rows_computed) == 2  # cached by the Engine
        await pilot.press("right")  # back at the induction cell: its top term, embed × a0.h1
        why.query_one("#why-terms", DataTable).move_cursor(row=0)
        why.query_one("#why-terms").focus()
        await settle(pilot, app, limit=1200)  # a busy box: up to a minute
        assert why.key == key and f"embed × {previous}" in "\n".join(screen_lines(app))
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.explorer.head == PREV_TOKEN_HEAD and why.state == "ready"
                         and why.attribution.layer == 0, "the source head's why", 600)
        assert "why L0.H1 attends" in "\n".join(screen_lines(app))
        # w: back to the pattern, its cursor named under it
        await pilot.press("w")
        await settle(pilot, app, limit=1200)  # a busy box: up to a minute
        assert not pane.why_open
        # the cell line, in the longest form that fits (PromptPane.cursor_short: at 80×24 the
        # tight `q35 'wall'→k…`)
        assert re.search(rf"q=?{query} 'wall' ?→", "\n".join(screen_lines(app))), screen_lines(app)
        # the cursor's cell drawn on the pattern (pooled at 80×24): Heatmap.mark, a ◆
        assert pane.query_one("#prompt-pattern", Chart).figure.mark == pane.cursor
        assert "◆" in "\n".join(screen_lines(app))
        assert app.errors == []


async def test_the_request_is_refused_as_the_cli_refuses_it() -> None:
    structure = load_model(sample_model("attn-only-2l")).structure()
    with pytest.raises(Exception, match=r"key 5 is after the query \(causal attention\): query 3 sees keys 0\.\.3"):
        QKAttributionRequest.of(structure, 1, 2, [1, 2, 3, 4, 5, 6], 3, 5)
