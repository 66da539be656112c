"""The Circuit tab on the real engine (issue #37): 0 opens it, it finds the first-occurrence
circuit of attn-only-2l without typing (input → a0.h1<v>, a0.h1 → a1.h2<k>, a1.h2 → logits
among the top edges, with exact checks), - and + change N (its faithfulness computed), and
enter on an edge focuses its target head's QK view (the two heads' composition score beside
the edge), and m switches to EAP."""

from __future__ import annotations

from textual.widgets import DataTable

from headscope.tui.widgets.circuit_tab import CircuitTab
from tests.tui.widgets.test_patch import settle, wait_until

CIRCUIT = ("input->a0.h1<v>", "a0.h1->a1.h2<k>", "a1.h2->logits")


async def test_the_circuit_tab_finds_and_navigates_the_induction_circuit() -> None:
    from headscope.tui.app import HeadscopeApp
    from headscope.tui.base.settings import Settings
    from tests.conftest import sample_model
    from tests.e2e.test_explorer_real_engine import wait_ready

    app = HeadscopeApp(sample_model("attn-only-2l"), settings=Settings(), debounce=0.01, sweep=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot, app)
        await pilot.press("0")
        pane = app.query_one(CircuitTab)
        await wait_until(pilot, lambda: pane.state == "result" and pane.top in pane.points,
                         "the circuit and its faithfulness", 1200)
        scores = pane.scores
        assert scores is not None and scores.method == "eap-ig"
        top = [scores.graph.edges[int(i)] for i in scores.ranked()[:3]]
        assert set(top) == set(CIRCUIT)
        assert all(edge in pane.exact for edge in CIRCUIT)  # verified beside the estimate
        table = pane.query_one("#circuit-edges", DataTable)
        shown = [str(table.get_row_at(r)[1]) for r in range(3)]
        assert shown == top
        assert pane.curve is not None and 0 < pane.curve.area <= 1.0
        before = pane.top
        table.focus()  # the list's keys bubble to the pane
        await settle(pilot, app)
        await pilot.press("minus")
        await wait_until(pilot, lambda: pane.top < before and pane.top in pane.points,
                         "the faithfulness of the smaller N", 1200)
        assert "faithfulness" in pane.status
        table.move_cursor(row=shown.index("a0.h1->a1.h2<k>"))
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.screen.head == (1, 2) and app.screen.active_tab == "qk",
                         "the edge's target head in the QK tab", 600)
        await wait_until(pilot, lambda: "K-composition" in pane.status, "the composition score", 1200)
        await pilot.press("0")
        await settle(pilot, app)
        pane.query_one("#circuit-edges", DataTable).focus()
        await pilot.press("m")
        await wait_until(pilot, lambda: pane.scores is not None and pane.scores.method == "eap"
                         and pane.state == "result", "the EAP circuit", 1200)
        assert pane.scores.steps == 0


async def test_the_circuit_tab_follows_the_patch_tabs_prompts() -> None:
    """Prompts typed in the Patch tab (words, the answer and wrong tokens) are the Circuit
    tab's inputs: its metric is their logit difference, as ``headscope edges --clean …``."""
    from textual.widgets import Input

    from headscope.engine.api.model import open_model
    from headscope.tui.app import HeadscopeApp
    from headscope.tui.base.settings import Settings
    from tests.conftest import sample_model
    from tests.e2e.test_explorer_real_engine import wait_ready

    clean = "cake card kite cup hotel mouse cake card kite cup hotel"
    corrupt = "cake card kite cup lamp mouse cake card kite cup hotel"
    app = HeadscopeApp(sample_model("attn-only-2l"), settings=Settings(), debounce=0.01, sweep=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_ready(pilot, app)
        await pilot.press("9")
        await settle(pilot, app)
        for box, text in (("clean", clean), ("corrupt", corrupt), ("answer", "mouse"), ("wrong", "lamp")):
            app.query_one(f"#patch-{box}", Input).value = text
        app.query_one("#patch-clean", Input).focus()
        await pilot.press("enter")  # the boxes are the Patch tab's inputs once entered
        await settle(pilot, app)
        await pilot.press("escape", "0")
        pane = app.query_one(CircuitTab)
        try:
            await wait_until(pilot, lambda: pane.state == "result" and pane.scores is not None
                             and pane.scores.metric == "logit_diff", "the circuit of the typed prompts", 1200)
        except AssertionError:
            raise AssertionError(f"{pane.state}: {pane.status}; {app.explorer.patch_request()}") from None
        want = open_model(sample_model("attn-only-2l")).edges(clean, corrupt, answer="mouse", wrong="lamp").scores
        assert pane.scores.clean == want.clean and pane.scores.corrupt == want.corrupt
