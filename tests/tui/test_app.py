"""Pilot tests of the explorer against the fake engine (tests/fake_engine.py).

Numbers the app shows are checked against the fake's weights computed here independently
(dense matrices, numpy eigenvalues), and against the rendered widgets, not just "no crash".
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from textual.widgets import DataTable, Static, TabbedContent
from textual.worker import WorkerCancelled

from headscope.engine.core.requests import CircuitRequest, CompositionRequest, PromptRequest
from headscope.themes import COLORMAPS
from headscope.tui.app import HeadscopeApp
from headscope.tui.base.settings import Settings
from headscope.tui.screens.dialogs import HelpScreen, InputScreen
from headscope.tui.widgets.chart import Chart
from headscope.tui.widgets.head_tree import HeadTree
from headscope.tui.widgets.panes import CompositionPane, PromptPane, threshold_edges
from headscope.tui.widgets.status import StatusBar
from tests.conftest import notified
from tests.fake_engine import FakeEngine, broken_factory


def make_app(engine: FakeEngine | None = None, **kw: Any) -> tuple[HeadscopeApp, FakeEngine]:
    engine = engine or FakeEngine()
    kw.setdefault("settings", Settings())
    kw.setdefault("debounce", 0.05)
    app = HeadscopeApp(engine.path, engine_factory=lambda _p, _r: engine, **kw)
    return app, engine


async def settle(pilot: Any, app: HeadscopeApp, rounds: int = 3, limit: int = 400) -> None:
    """Until the app is quiet for ``rounds`` pauses in a row: every worker finished, the
    messages they posted handled, no head focus waiting for its debounce. By events, not by
    a fixed delay (up to ``limit`` pauses: a busy machine only makes it take longer)."""
    quiet = 0
    for _ in range(limit):
        await pilot.pause(0.05)
        # A worker cancelled meanwhile (a newer one of its exclusive group, e.g. a chart
        # rebuilt at its new size) has finished too: the loop looks again.
        with contextlib.suppress(WorkerCancelled):
            await app.workers.wait_for_complete()
        await pilot.pause()  # what the finished workers posted
        busy = any(not w.is_finished for w in app.workers) or app.explorer.focus_pending
        quiet = 0 if busy else quiet + 1
        if quiet >= rounds:
            return
    raise AssertionError(f"the app was still busy after {limit} pauses")


async def wait_until(pilot: Any, condition: Callable[[], object], what: str,
                     limit: int = 400) -> None:
    """Pause until ``condition()`` holds (up to ``limit`` pauses of 50 ms)."""
    for _ in range(limit):
        if condition():
            return
        await pilot.pause(0.05)
    raise AssertionError(f"never happened: {what}")


def plain(widget: Static) -> str:
    """The text a Static shows (Rich tables included), as the terminal would print it."""
    from rich.console import Console

    console = Console(width=200, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(widget.content)
    return console.export_text()


def chart_text(app: HeadscopeApp, chart_id: str) -> str:
    chart = app.query_one(f"#{chart_id}", Chart)
    assert chart.rendered is not None, f"{chart_id} has not rendered"
    return chart.rendered.plain


def copying(matrix: np.ndarray) -> float:
    eig = np.linalg.eigvals(matrix.astype(np.float64))
    return float(eig.real.sum() / np.abs(eig).sum())


@pytest.fixture(autouse=True)
def _quiet_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HEADSCOPE_CONFIG", str(tmp_path / "no-config.toml"))
    monkeypatch.setenv("HEADSCOPE_OUTPUT_DIR", str(tmp_path / "out"))


async def test_first_frame_shows_the_tree_before_the_model_is_ready() -> None:
    import asyncio

    engine = FakeEngine(n_layers=3, n_heads=5)
    engine.gate = asyncio.Event()  # the model never finishes opening in this test
    app, _ = make_app(engine)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: "3L×5H" in app.query_one(StatusBar).render().plain,
                         "the status line shows the header's structure")
        tree = app.query_one(HeadTree)
        labels = [str(n.label) for n in tree.root.children]
        assert labels[0] == "Embed" and labels[1:4] == ["Layer 0", "Layer 1", "Layer 2"]
        assert len(tree.head_nodes) == 15
        status = app.query_one(StatusBar).render().plain
        assert "attn-only-2l" in status and "3L×5H" in status and "processed" in status
        # The engine is created after the first frame and the status line follows on its next
        # tick: wait for that by events (up to 100 pauses), not by a fixed delay.
        for _ in range(100):
            if "opening model" in app.query_one(StatusBar).render().plain:
                break
            await pilot.pause(0.05)
        assert "opening model" in app.query_one(StatusBar).render().plain
        assert engine.requests == []  # nothing computed before ready
        engine.gate.set()
        await settle(pilot, app)
        assert engine.requests[0] == (0, 0, "qk", "token")


async def test_ctrl_c_says_how_to_quit_in_plain_text() -> None:
    """Textual's ``Press [b]ctrl+q[/b] to quit the app`` was shown with its markup as text
    (the app's notifications are never markup: they carry data)."""
    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("ctrl+c")
        await pilot.pause()
        said = [n for n in notified(app) if "quit" in n.message]
        # the keys as the footer shows them (`^q`), whatever the keymap binds to quit
        assert [n.message for n in said] == ["Press ^q or q to quit the app"]
        assert not said[0].markup


async def test_navigation_debounces_and_focuses_the_last_head() -> None:
    app, engine = make_app(debounce=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        assert app.explorer.head == (0, 0)
        engine.requests.clear()
        await pilot.press("j", "j", "j")  # H1, H2, H3 of layer 0, faster than the debounce
        await settle(pilot, app)
        assert app.explorer.head == (0, 3) and engine.focused == (0, 3)
        assert {r[:2] for r in engine.requests} == {(0, 3)}  # no work for heads passed over
        await pilot.press("right_square_bracket")  # ] : next head crosses into layer 1
        await settle(pilot, app)
        assert app.explorer.head == (1, 0)
        assert "L1.H0" in plain(app.query_one("#focus-line", Static))
        assert "token QK L1.H0" in chart_text(app, "qk-token")
        await pilot.press("left_square_bracket")
        await settle(pilot, app)
        assert app.explorer.head == (0, 3)


async def test_bracket_keys_faster_than_the_debounce_step_from_where_the_last_one_went() -> None:
    """`] ] [` pressed within one debounce ends one head on. ``]`` stepped from the focused
    head, which changes only when the debounce runs out, so keys pressed meanwhile stepped
    from a stale head: a busy box ended a test of this at L0.H0. A debounce far longer than
    the keys makes the stale head certain here, whatever the box's load."""
    app, engine = make_app(debounce=30.0)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        assert app.explorer.head == (0, 0)
        engine.requests.clear()
        await pilot.press("right_square_bracket", "right_square_bracket", "left_square_bracket")
        await pilot.pause()
        assert app.explorer.head == (0, 0) and app.explorer.focus_pending  # still waiting
        assert engine.requests == []  # nothing asked for the heads on the way
        await pilot.press("enter")  # choose the cursor's head now
        await settle(pilot, app)
        assert app.explorer.head == (0, 1)
        assert {r[:2] for r in engine.requests} == {(0, 1)}


async def test_tabs_show_the_engine_numbers() -> None:
    app, engine = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("2")
        await settle(pilot, app)
        assert app.query_one("#tabs", TabbedContent).active == "ov"
        text = chart_text(app, "ov-heatmap")
        full = engine.full_ov(0, 0)[:24, :24]
        n = full.shape[0]
        diag_mean = float(np.diag(full).mean())
        peaks = int((full.argmax(axis=1) == np.arange(n)).sum())
        assert f"diag {diag_mean:+.3g}" in text and f"{peaks}/{n} rows peak on diag" in text
        top = np.argsort(-engine.full_ov(0, 0)[0])[0]
        from tests.fake_engine import WORDS

        assert WORDS[top] in plain(app.query_one("#ov-top", Static))
        await pilot.press("full_stop")  # next source token: top outputs of token 1
        await settle(pilot, app)
        assert "top outputs of 'cat'" in plain(app.query_one("#ov-top", Static))

        await pilot.press("3")
        await settle(pilot, app)
        score = copying(engine.full_ov(0, 0))  # dense V×V eigenvalues, independent of BA
        assert f"copying {score:+.3f}" in chart_text(app, "spectrum-ov")
        qk_score = copying(engine.token_qk(0, 0))
        assert f"QK positivity {qk_score:+.3f}" in chart_text(app, "spectrum-qk")


async def test_prompt_entry_shows_pattern_dla_and_predictions() -> None:
    app, engine = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("p")
        assert app.explorer.active_tab == "prompt"
        await pilot.press(*"the cat sat", "enter")
        await settle(pilot, app)
        view = (await engine.get(PromptRequest.of(engine.structure, "the cat sat", limit=engine.max_block_bytes))).view(0, 0)
        text = chart_text(app, "prompt-pattern")
        assert "attention L0.H0" in text and "sat" in text
        preds = plain(app.query_one("#prompt-preds", Static))
        assert view.top_predictions[0][1] in preds
        assert f"{view.top_predictions[0][2]:.3f}" in preds
        assert f"{float(view.dla[1]):+.2f}" in plain(app.query_one("#prompt-dla", Static))


async def test_composition_edges_select_heads_and_kind_switches() -> None:
    app, engine = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("c")
        await settle(pilot, app)
        comp = await engine.get(CompositionRequest.of(engine.structure, "k"))
        table = app.query_one("#comp-edges", DataTable)
        assert table.row_count == len(comp.top_edges)
        assert "K-composition" in chart_text(app, "comp-graph")
        table.focus()
        await pilot.press("down")
        await settle(pilot, app)
        l1, h1, l2, h2, s = comp.top_edges[1]
        detail = plain(app.query_one("#comp-detail", Static))
        assert f"L{l1}.H{h1} → L{l2}.H{h2}" in detail and f"{s:+.3f}" in detail
        assert app.query_one(CompositionPane).selected == (l1, h1, l2, h2)
        await pilot.press("enter")  # the edge's virtual heads; g focuses the later head
        await settle(pilot, app)
        await pilot.press("g")
        await settle(pilot, app)
        assert app.explorer.head == (l2, h2)
        await pilot.press("c")  # already on composition: K → V
        await settle(pilot, app)
        assert app.query_one(CompositionPane).kind == "v" and "V-composition" in chart_text(app, "comp-graph")


async def test_summary_sorts_and_enter_jumps_to_the_head() -> None:
    app, engine = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("6")
        await settle(pilot, app)
        table = app.query_one("#summary-table", DataTable)
        assert table.row_count == engine.L * engine.H
        await pilot.press("o")  # sort by copying, highest first
        await settle(pilot, app)
        scores = {(la, h): engine._scores(la, h).copying_score
                  for la in range(engine.L) for h in range(engine.H)}
        best = max(scores, key=scores.get)
        assert table.get_row_at(0)[0] == f"L{best[0]}.H{best[1]}"
        table.focus()
        table.move_cursor(row=0)
        await pilot.press("enter")
        await settle(pilot, app)
        assert app.explorer.head == best


async def test_ablation_sweep_fills_the_summary_focus_line_and_export(tmp_path: Path) -> None:
    app, engine = make_app(output_dir=tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("6")
        await settle(pilot, app)
        table = app.query_one("#summary-table", DataTable)
        hint = plain(app.query_one("#summary-hint", Static))
        assert "press a" in hint and engine.calls["all_ablation_effects"] == 0, "opt-in"
        assert str(table.get_row_at(0)[-1]) == "—"
        await pilot.press("a")
        await settle(pilot, app)
        assert engine.calls["all_ablation_effects"] == 1 and app.explorer.active_tab == "summary"
        effects = engine._behaviour[2]  # what the fake's ablation sweep returns
        best = np.unravel_index(np.argmax(effects), effects.shape)
        # sorted by the ablation effect, highest first, its values in the last column
        assert table.get_row_at(0)[0] == f"L{best[0]}.H{best[1]}"
        column = [float(str(table.get_row_at(i)[-1])) for i in range(table.row_count)]
        assert column == sorted(column, reverse=True)
        assert column[0] == pytest.approx(float(effects[best]), abs=1e-3)
        assert "loss increase" in plain(app.query_one("#summary-hint", Static))
        assert any(f"L{best[0]}.H{best[1]} costs the most" in n.message for n in notified(app))
        app.explorer.goto_head((int(best[0]), int(best[1])), immediate=True)
        await settle(pilot, app)
        assert f"abl {float(effects[best]):+.2f}" in plain(app.query_one("#focus-line", Static))
        await pilot.press("e")  # the summary export carries the column too
        await settle(pilot, app)
        doc = json.loads(next(tmp_path.glob("*summary*.json")).read_text())
        rows = {(r["layer"], r["head"]): r["ablation_effect"] for r in doc["data"]}
        assert rows[(int(best[0]), int(best[1]))] == pytest.approx(float(effects[best]), abs=1e-6)
        await pilot.press("a")  # computed already: no second sweep
        await settle(pilot, app)
        assert engine.calls["all_ablation_effects"] == 1
        await pilot.press("r")  # other weights: the effects are gone until swept again
        await settle(pilot, app)
        assert app.explorer.scores.ablation is None and "abl " not in plain(app.query_one("#focus-line", Static))


async def test_a_finished_ablation_sweep_does_not_pull_the_user_back_to_summary() -> None:
    app, _ = make_app(FakeEngine(delay=0.05, sweep_steps=8))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("a")
        assert app.explorer.active_tab == "summary"
        await pilot.press("2")  # the user moves on while the sweep runs
        await settle(pilot, app)
        assert app.explorer.scores.ablation is not None and app.explorer.active_tab == "ov"
        await pilot.press("6")  # ...and finds the table sorted by it on return
        await settle(pilot, app)
        table = app.query_one("#summary-table", DataTable)
        column = [float(str(table.get_row_at(i)[-1])) for i in range(table.row_count)]
        assert column == sorted(column, reverse=True)


@pytest.mark.parametrize(("head", "expected"), [((1, 2), (1, 2)), ((5, 0), (0, 0)), ((0, 9), (0, 0))])
async def test_opening_on_a_head_focuses_it_or_says_the_model_has_no_such_head(
        head: tuple[int, int], expected: tuple[int, int]) -> None:
    app, engine = make_app(head=head)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        assert app.explorer.head == expected
        assert f"L{expected[0]}.H{expected[1]}" in plain(app.query_one("#focus-line", Static))
        if expected != head:
            assert len(app.errors) == 1 and f"no head L{head[0]}.H{head[1]}" in app.errors[0]
            assert f"{engine.L} layers × {engine.H} heads" in app.errors[0]
        else:
            assert app.errors == []


async def test_clicking_a_summary_header_sorts_by_that_column() -> None:
    app, engine = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("6")
        await settle(pilot, app)
        table = app.query_one("#summary-table", DataTable)

        def click(key: str) -> None:
            column = table.columns[key]  # type: ignore[index]
            index = list(table.columns).index(key)  # type: ignore[arg-type]
            table.post_message(DataTable.HeaderSelected(table, column.key, index, column.label))

        click("induction_score")
        await settle(pilot, app)
        values = [engine._scores(*(int(x) for x in str(table.get_row_at(i)[0])[1:].split(".H")))
                  .induction_score for i in range(table.row_count)]
        assert values == sorted(values, reverse=True) and app.explorer.scores.summary_sort == "induction_score"
        assert str(table.columns["induction_score"].label).endswith("▼")  # type: ignore[index]
        assert not str(table.columns["copying_score"].label).endswith("▼")  # type: ignore[index]
        click("ablation_effect")  # not swept yet: a hint, the order stays
        await settle(pilot, app)
        assert app.explorer.scores.summary_sort == "induction_score"
        assert any("press a first" in n.message for n in notified(app))
        click("head")
        await settle(pilot, app)
        assert app.explorer.scores.summary_sort is None and str(table.get_row_at(0)[0]) == "L0.H0"


async def test_toggling_raw_cancels_a_running_ablation_sweep() -> None:
    # The fake's sweep takes 0.5 + 20 s, its raw switch 0.5 s: the switch lands mid-sweep even
    # on a busy box (with 1 + 1 s against 1 s, a slow event loop once let the sweep finish first)
    app, engine = make_app(FakeEngine(delay=0.5, sweep_steps=10, sweep_delay=20.0))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        app.explorer.action_ablation_sweep()
        await wait_until(pilot, lambda: engine.calls["all_ablation_effects"],
                         "the ablation sweep started")
        assert engine.calls["all_ablation_effects"] == 1
        app.explorer.action_toggle_raw()
        # not settle(): waiting on a cancelled worker raises
        await wait_until(pilot, lambda: engine.calls["all_ablation_effects cancelled"] and app.raw,
                         "the raw switch cancelled the sweep")
        assert engine.calls["all_ablation_effects cancelled"] == 1
        assert app.raw and app.explorer.scores.ablation is None


async def test_broken_checkpoint_is_a_notification_and_the_app_keeps_running() -> None:
    app = HeadscopeApp("broken/model.safetensors", engine_factory=broken_factory(),
                       settings=Settings())
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        assert app.engine is None
        assert any("header length exceeds file size" in e for e in app.errors)
        notes = [n.message for n in notified(app)]
        assert any("broken/model.safetensors" in m for m in notes)
        await pilot.press("j", "2", "c", "r", "question_mark")
        # still alive and answering keys
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help screen")


async def test_engine_errors_in_one_view_do_not_stop_the_others() -> None:
    app, _ = make_app(FakeEngine(fail={"spectrum"}))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("3")
        await settle(pilot, app)
        assert any("spectrum failed" in e for e in app.errors)
        await pilot.press("2")
        await settle(pilot, app)
        assert "full OV L0.H0" in chart_text(app, "ov-heatmap")


async def test_export_and_screenshot_go_to_the_output_dir_not_the_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    monkeypatch.delenv("HEADSCOPE_OUTPUT_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.chdir(model_dir)  # cwd is the checkpoint: outputs must go elsewhere
    engine = FakeEngine(str(model_dir))
    app, _ = make_app(engine)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        out = app.output_dir()
        assert model_dir not in out.parents and out != model_dir
        before = set(out.glob("headscope_model_qk*"))
        await pilot.press("e", "s")
        await settle(pilot, app)
        new = set(out.glob("headscope_model_qk*")) - before
        exported = [p for p in new if p.suffix == ".json"]
        assert len(exported) == 1 and any(p.suffix == ".svg" for p in new)
        doc = json.loads(exported[0].read_text())
        block = await engine.get(CircuitRequest.of(engine.structure, 0, 0, "qk", "token", limit=engine.max_block_bytes))
        assert np.allclose(np.array(doc["data"]["token"]["values"]), block.values, atol=1e-4)
        assert doc["head"] == [0, 0] and doc["processed"] is True
        assert list(model_dir.iterdir()) == []
        for p in new:
            p.unlink()


async def test_small_terminal_collapses_panes() -> None:
    app, _ = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        assert app.screen.has_class("narrow")
        assert app.query_one(HeadTree).size.width <= 18
        assert chart_text(app, "qk-token")  # still draws something that fits
        for line in chart_text(app, "qk-token").splitlines():
            assert len(line) <= app.query_one("#qk-token", Chart).size.width


async def test_choose_tokens_sets_rows_and_columns() -> None:
    app, engine = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("slash")
        await wait_until(pilot, lambda: isinstance(app.screen, InputScreen), "the token dialog")
        await pilot.press(*"dog cat mat", "enter")
        await settle(pilot, app)
        assert app.explorer.choices.tokens == engine.encode("dog cat mat")
        block = app.explorer.results["qk"]["token"]
        assert list(block.row_labels) == ["dog", "cat", "mat"]


async def test_composition_graph_draws_edges_above_the_threshold_only() -> None:
    app, engine = make_app(FakeEngine(n_layers=3, n_heads=4))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("c")
        await settle(pilot, app)
        comp = await engine.get(CompositionRequest.of(engine.structure, "k"))
        strongest = max(e[4] for e in comp.top_edges)

        def expected(fraction: float) -> set[tuple[int, int, int, int]]:
            return {e[:4] for e in comp.top_edges if e[4] > 0 and e[4] >= fraction * strongest}

        graph = app.query_one("#comp-graph", Chart)
        assert {e[:4] for e in graph.figure.edges} == expected(0.5)
        text = chart_text(app, "comp-graph")
        assert f"{len(expected(0.5))}/{len(comp.top_edges)} edges ≥ 50% of max" in text
        assert f"≥ {0.5 * strongest:+.3f}" in text
        assert f"{strongest:+.2f}" in text  # the strongest edge is labelled with its value
        for _ in range(2):
            await pilot.press("greater_than_sign")
        await settle(pilot, app)
        assert {e[:4] for e in graph.figure.edges} == expected(0.7)
        assert "≥ 70% of max" in chart_text(app, "comp-graph")
        for _ in range(9):
            await pilot.press("less_than_sign")
        await settle(pilot, app)
        assert app.query_one(CompositionPane).threshold == 0.0
        assert {e[:4] for e in graph.figure.edges} == expected(0.0)
        # the table keeps every edge whatever the threshold
        assert app.query_one("#comp-edges", DataTable).row_count == len(comp.top_edges)


async def test_prompt_tab_shows_pattern_dla_and_predictions_at_once() -> None:
    app, engine = make_app(prompt=" ".join(["the cat sat on the mat"] * 5))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("4")
        await settle(pilot, app)
        screen = app.screen.region
        for wid in ("#prompt-pattern", "#prompt-dla-scroll", "#prompt-preds"):
            region = app.query_one(wid).region
            assert region.height >= 3 and screen.contains_region(region), wid
        preds = app.query_one("#prompt-preds")
        assert preds.region.y < app.query_one("#prompt-side").region.bottom
        view = (await engine.get(PromptRequest.of(engine.structure, app.explorer.choices.prompt_text, limit=engine.max_block_bytes))).view(0, 0)
        assert view.top_predictions[0][1] in plain(app.query_one("#prompt-preds", Static))
        # shift+arrows move the pattern's cell cursor with the head tree focused, as it is at
        # first (Textual's Tree took them: shift+↑ went to the previous head)
        pane, tree = app.query_one(PromptPane), app.query_one(HeadTree)
        tree.focus()
        head, (q, k) = app.explorer.head, pane.cursor
        await pilot.press("shift+up", "shift+left")
        await pilot.pause()
        assert app.explorer.head == head and app.focused is tree
        assert pane.cursor == (q - 1, min(q - 1, k) - 1)


def test_graph_title_wraps_instead_of_being_cut() -> None:
    from headscope.tui.plots.figures import Colours, Graph, build

    colours = Colours((200, 200, 200), (120, 120, 120), (255, 170, 0), (0, 120, 255),
                      COLORMAPS["red-blue"])
    title = "K-composition · 3/9 edges ≥ 50% of max (score − baseline ≥ +0.123; baseline 0.089)"
    text = build(Graph(2, 3, ((0, 0, 1, 1, 0.2), (0, 1, 1, 2, 0.15)), title, vmax=0.2,
                       vmin=0.1), 40, 16, colours).plain
    lines = text.splitlines()
    assert " ".join(lines[:3]).split() == title.split()  # every word, over three lines
    assert all(len(line) <= 40 for line in lines)
    assert lines[-1].startswith("weak +0.100") and lines[-1].endswith("+0.200 strong")


def test_a_graph_title_breaks_at_its_newlines_first() -> None:
    from headscope.tui.plots.figures import Colours, Graph, build

    colours = Colours((200, 200, 200), (120, 120, 120), (255, 170, 0), (0, 120, 255),
                      COLORMAPS["red-blue"])
    graph = Graph(2, 3, ((0, 0, 1, 1, 0.2),), "K-comp 1/9 ≥ 50% of max\nbase 0.088 · < >",
                  vmax=0.2, vmin=0.1)
    lines = build(graph, 40, 16, colours).plain.splitlines()
    assert [line.rstrip() for line in lines[:2]] == ["K-comp 1/9 ≥ 50% of max", "base 0.088 · < >"]
    assert lines[2].strip().startswith("┌")  # the plot right under the two lines
    lines = build(graph, 12, 16, colours).plain.splitlines()  # each part wrapped: three lines
    assert [line.rstrip() for line in lines[:3]] == ["K-comp 1/9 ≥", "50% of max", "base 0.088 …"]


async def test_the_narrow_composition_graph_reads_in_full() -> None:
    """Issue 39 §3: at 80×24 the composition title lost its end (`baseli…`) and the key its
    strong end. Narrow, a shorter title and a key that fits, both whole. The title then took
    three of the graph's 17 lines; it takes two (the cut it repeated is the key's left end),
    while the sweep runs too."""
    app, _ = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await pilot.press("c")
        await settle(pilot, app)
        chart = app.query_one("#comp-graph", Chart)
        pane = app.query_one(CompositionPane)
        await wait_until(pilot, lambda: chart.rendered is not None, "the graph")

        def title() -> list[str]:
            lines = chart.rendered.plain.splitlines()
            assert all(len(line) <= chart.content_size.width for line in lines)
            key = lines[-1].strip()  # the key: the cut (s−base of the weakest edge drawn) on its left
            cut = threshold_edges(pane.edges, pane.threshold)[1]
            assert re.fullmatch(re.escape(f"{cut:+.3f}") + r" ━+ [+-]\d\.\d{3}( strong)?", key), lines[-1]
            return lines[:next(i for i, line in enumerate(lines) if "┌" in line)]

        shown = pane.shown
        drawn = len(threshold_edges(pane.edges, pane.threshold)[0])
        lines = title()
        assert len(lines) <= 2, lines
        assert re.fullmatch(rf"K-comp {drawn}/\d+ ≥ 50% of max", lines[0].strip()), lines
        assert lines[1].strip() == f"base {shown.baseline:.3f} · < >", lines
        before = chart.rendered
        pane.show(shown, *pane._shape, None, partial=True)  # as a partial graph of the sweep draws it
        await wait_until(pilot, lambda: chart.rendered is not None and chart.rendered is not before,
                         "the partial graph")
        lines = title()
        assert len(lines) <= 2 and lines[1].strip() == f"base {shown.baseline:.3f} · 1/1 pairs", lines


async def test_quitting_before_the_deferred_engine_opens_creates_no_engine() -> None:
    """`q` in the first frame, before the real engine is created: no engine, no traceback."""
    created = []

    def factory(path, raw):
        created.append(path)
        return FakeEngine(path)

    app = HeadscopeApp("sample_models/attn-only-2l", engine_factory=factory, settings=Settings())
    app._deferred_engine = True  # as with the real Engine: created after the first paint
    async with app.run_test(size=(100, 30)):
        app.exit()
        app._open_deferred()  # the timer set at mount firing after `q`
    assert created == []


async def test_shutdown_without_quit_before_the_deferred_engine_opens_creates_no_engine() -> None:
    """Torn down without `q` (a closed terminal, a test harness): the timer that opens the
    engine fires during shutdown; it used to create the engine and then raise NoMatches."""
    created = []

    def factory(path, raw):
        created.append(path)
        return FakeEngine(path)

    app = HeadscopeApp("sample_models/attn-only-2l", engine_factory=factory, settings=Settings())
    app._deferred_engine = True
    async with app.run_test(size=(100, 30)):
        pass
    app._open_deferred()  # the pending timer, after the shutdown
    assert created == [] and app.errors == []


async def test_help_is_grouped_searchable_and_explains_the_badges() -> None:
    """`?` was ~100 lines at ~7 keys a screen: now a section per tab/pane and global, a
    filter (`/`, then type) that keeps every binding id findable, and the badge legend."""
    from headscope.tui.screens.dialogs import HELP_GROUPS

    app, _ = make_app(keymap={"next-head": "n"})
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await pilot.press("question_mark")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help screen")
        text = plain(app.screen.query_one("#help-keys", Static))
        for name, _ids in HELP_GROUPS:
            assert name in text
        assert text.index("Global") < text.index("Tabs") < text.index("Patch tab")
        legend = plain(app.screen.query_one("#help-badges", Static))
        assert "C copying" in legend and "I induction" in legend and "≥ 0.6" in legend
        await pilot.press("slash", *"patch")
        await pilot.pause()
        filtered = plain(app.screen.query_one("#help-keys", Static))
        assert "stop-patch" in filtered and "tab-patch" in filtered
        assert "next-head" not in filtered and "cycle-theme" not in filtered
        await pilot.press(*"zzzz")
        await pilot.pause()
        assert "no key matches" in plain(app.screen.query_one("#help-keys", Static))
        for _ in range(9):
            await pilot.press("backspace")
        await pilot.press("n")  # the remapped key is found by what it is
        await pilot.pause()
        line = next(line for line in plain(app.screen.query_one("#help-keys", Static)).splitlines()
                    if "next-head" in line)
        assert line.strip().startswith("n ")
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
