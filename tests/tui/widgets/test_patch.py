"""The Patch tab (9) against the fake engine: the induction task prefilled, the heatmap and
the sorted list of what each head recovers, enter to focus a head, the inputs edited, the
run's progress and its cancellation (x), at 120×40 and 80×24 and in 256 colours.

The real engine's numbers on attn-only-2l are checked in tests/e2e/test_explorer_real_engine.py-style at the
end (a ``PatchInputsRequest``: L1.H2 recovers most on the induction task)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rich.color import ColorType
from rich.style import Style
from textual import events
from textual.widgets import DataTable, Input

from headscope.tui.widgets.chart import Chart
from headscope.tui.widgets.patch import PatchPane
from tests.fake_engine import FakeEngine
from tests.tui.test_app import make_app, settle, wait_until


@pytest.fixture(autouse=True)
def _quiet_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HEADSCOPE_CONFIG", str(tmp_path / "no-config.toml"))
    monkeypatch.setenv("HEADSCOPE_OUTPUT_DIR", str(tmp_path / "out"))


def rows(app: Any) -> list[str]:
    table = app.query_one("#patch-table", DataTable)
    return [str(table.get_row_at(i)[0]) for i in range(table.row_count)]


@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
async def test_nine_opens_the_patch_tab_on_the_induction_task(size: tuple[int, int]) -> None:
    app, engine = make_app()
    async with app.run_test(size=size) as pilot:
        await settle(pilot, app)
        await pilot.press("9")
        await settle(pilot, app)
        ex = app.explorer
        assert ex.active_tab == "patch"
        pane = app.query_one(PatchPane)
        # prefilled with the task's prompts; the request is the whole task
        assert app.query_one("#patch-clean", Input).value == "#3 #4 #5 #6 #7 #8 " * 1 + \
            "#3 #4 #5 #6 #7 #8"
        assert engine.patch_requests == [{"clean": None, "corrupt": None, "answer": None,
                                          "wrong": None, "site": "out", "method": "exact",
                                          "task": "induction"}]
        # the sorted list: the planted induction head first, then the rest by recovered
        table = engine.patch_table()
        order = sorted(((layer, head) for layer in range(engine.L) for head in range(engine.H)),
                       key=lambda h: -table[h])
        assert rows(app) == [f"L{layer}.H{head}" for layer, head in order]
        assert rows(app)[0] == "L1.H2"
        chart = app.query_one("#patch-map", Chart)
        await wait_until(pilot, lambda: chart.rendered is not None, "the heatmap")
        assert "recovered · out · exact" in chart.rendered.plain
        assert "L1" in chart.rendered.plain and "H2" in chart.rendered.plain
        # every part of the tab is on screen
        for widget in ("#patch-task", "#patch-clean", "#patch-corrupt", "#patch-answer", "#patch-wrong",
                       "#patch-site", "#patch-method", "#patch-map", "#patch-table",
                       "#patch-status"):
            region = app.query_one(widget).region
            assert region.area > 0 and region.right <= size[0] and region.bottom <= size[1], widget
        assert "induction task" in pane.status or "L1.H2" in pane.status
        assert ex.results["patch"]["heads"][0]["layer"] == 1


async def test_enter_on_a_head_focuses_it() -> None:
    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("9")
        await settle(pilot, app)
        table = app.query_one("#patch-table", DataTable)
        table.focus()
        await pilot.press("down")  # the second head of the list
        await settle(pilot, app)
        second = rows(app)[1]
        assert second in app.query_one(PatchPane).status
        await pilot.press("enter")
        await settle(pilot, app)
        layer, head = (int(x) for x in second[1:].split(".H"))
        assert app.explorer.head == (layer, head)
        assert app.explorer.active_tab == "patch"


async def test_edited_inputs_site_and_method_run_again() -> None:
    app, engine = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("9")
        await settle(pilot, app)
        box = app.query_one("#patch-answer", Input)
        box.focus()
        box.value = "#7"
        wrong = app.query_one("#patch-wrong", Input)
        wrong.focus()
        wrong.value = "#9"
        await pilot.press("enter")
        await settle(pilot, app)
        assert engine.patch_requests[-1] == {
            "clean": [3, 4, 5, 6, 7, 8, 3, 4, 5, 6, 7, 8],
            "corrupt": [3, 4, 5, 6, 7, 8, 20, 21, 22, 23, 24, 25],
            "answer": "#7", "wrong": "#9", "site": "out", "method": "exact", "task": None}
        assert "logit[#7] − logit[#9]" in app.query_one(PatchPane).status
        pane = app.query_one(PatchPane)
        app.query_one("#patch-method").value = "attribution"
        await settle(pilot, app)
        assert engine.patch_requests[-1]["method"] == "attribution"
        assert pane.session.result is not None and pane.session.result.method == "attribution"
        chart = app.query_one("#patch-map", Chart)
        await wait_until(pilot, lambda: chart.rendered is not None
                         and "estimated recovered" in chart.rendered.plain, "the estimate")
        app.query_one("#patch-site").value = "v"
        await settle(pilot, app)
        assert engine.patch_requests[-1]["site"] == "v"


async def test_the_task_select_fills_the_boxes_and_the_path_column_follows() -> None:
    """Choosing the first-occurrence task: its prompts replace the boxes (typed tokens are
    cleared), the request is that task, the Composition tab asks its path effects on it;
    back to induction: its prompts again."""
    from textual.widgets import Select

    app, engine = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await pilot.press("9")
        await settle(pilot, app)
        pane = app.query_one(PatchPane)
        app.query_one("#patch-answer", Input).value = "#7"
        select = app.query_one("#patch-task", Select)
        select.focus()
        await pilot.press("enter", "down", "enter")
        await settle(pilot, app)
        assert select.value == "first-occurrence"
        assert app.query_one("#patch-corrupt", Input).value == "#20 #4 #21 #6 #22 #8 #3 #4 #5 #6 #7 #8"
        assert app.query_one("#patch-answer", Input).value == ""
        assert engine.patch_requests[-1] == {"clean": None, "corrupt": None, "answer": None,
                                             "wrong": None, "site": "out", "method": "exact",
                                             "task": "first-occurrence"}
        assert "first-occurrence task" in pane.status
        assert "even positions" in str(app.query_one("#patch-task-note").render())
        await pilot.press("5")
        await settle(pilot, app)
        assert engine.path_tasks[-1] == "first-occurrence"
        await pilot.press("9")
        await settle(pilot, app)
        select.focus()
        await pilot.press("enter", "up", "enter")
        await settle(pilot, app)
        assert engine.patch_requests[-1]["task"] == "induction"
        assert app.query_one("#patch-corrupt", Input).value == "#3 #4 #5 #6 #7 #8 #20 #21 #22 #23 #24 #25"


async def test_an_engine_error_is_one_line_in_the_tab() -> None:
    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("9")
        await settle(pilot, app)
        for box, value in (("answer", "#7"), ("wrong", "#9"), ("clean", "#1 #2 #3")):
            app.query_one(f"#patch-{box}", Input).value = value
        app.query_one("#patch-clean", Input).focus()
        await pilot.press("enter")
        await settle(pilot, app)
        task, news = app.query_one(PatchPane).status.split("\n")
        assert "logit[#7] − logit[#9]" in task  # the form is complete: the engine's error
        assert news.startswith("cannot patch:") and "same length" in news


async def test_progress_and_x_stops_the_run() -> None:
    engine = FakeEngine(sweep_steps=1000)
    app, _ = make_app(engine, sweep=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        engine.delay = 30.0  # spread over the patch run's 1000 progress steps
        await pilot.press("9")
        pane = app.query_one(PatchPane)
        await wait_until(pilot, lambda: engine.calls["patch"] == 1, "the run")
        await wait_until(pilot, lambda: pane.session.progress is not None
                         and "patching every head…" in pane.status, "its progress")
        await pilot.press("x")
        await wait_until(pilot, lambda: engine.calls["patch cancelled"] == 1, "the cancellation")
        await settle(pilot, app)
        assert pane.status.split("\n")[1].startswith("stopped")
        assert pane.session.progress is None and app.explorer.scores.progress is None
        # 9 again asks for it again
        engine.delay = 0.0
        await pilot.press("1", "9")
        await settle(pilot, app)
        assert engine.calls["patch"] == 2 and pane.session.result is not None


@pytest.mark.parametrize("colors", ["truecolor", "256", "16"])
async def test_a_non_finite_head_is_a_question_mark_not_zero(colors: str) -> None:
    """A head whose patched run was not finite (``patched``/``recovered`` None, the note
    naming it) is drawn as ``?`` — the colour of 0 would read as "no effect" — and its
    detail says why."""
    import dataclasses

    engine = FakeEngine()
    real = engine.patch

    async def one_not_finite(*args: Any, **kwargs: Any) -> Any:
        found = await real(*args, **kwargs)
        rows = tuple(dataclasses.replace(r, patched=None, recovered=None) if r.heads == ((0, 1),) else r
                     for r in found.rows)
        return dataclasses.replace(found, rows=rows, note="the metric after patching is not finite for L0.H1")

    engine.patch = one_not_finite  # type: ignore[method-assign]
    app, _ = make_app(engine, colors=colors)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("9")
        await settle(pilot, app)
        chart = app.query_one("#patch-map", Chart)
        await wait_until(pilot, lambda: chart.rendered is not None, "the heatmap")
        plain = chart.rendered.plain
        assert "?" in plain and "? no finite value" in plain
        pane = app.query_one(PatchPane)
        assert "not finite for L0.H1" in pane.status
        assert rows(app)[-1] == "L0.H1"  # sorted last, its cells "—"
        table = app.query_one("#patch-table", DataTable)
        table.focus()
        table.move_cursor(row=table.row_count - 1)
        await settle(pilot, app)
        assert "L0.H1: not finite" in pane.status


async def test_the_heatmap_in_256_colours_has_no_truecolor() -> None:
    app, _ = make_app(colors="256")
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await pilot.press("9")
        await settle(pilot, app)
        chart = app.query_one("#patch-map", Chart)
        await wait_until(pilot, lambda: chart.rendered is not None, "the heatmap")
        text = chart.rendered
        cells = [s.style.color for s in text.spans
                 if isinstance(s.style, Style) and s.style.color is not None
                 and set(text.plain[s.start:s.end]) <= set("█▀▄ ") and "█" in text.plain[s.start:s.end]]
        # the heatmap's cells (and its key's ramp) are palette entries: nothing truecolor
        # for the terminal to quantise (the ticks' theme colours Textual downgrades itself)
        assert cells and {c.type for c in cells} == {ColorType.EIGHT_BIT}


async def test_composition_edges_show_their_path_effect_and_unused_ones() -> None:
    app, engine = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("5")
        await settle(pilot, app)
        pane = app.query_one("#composition-pane")
        # one request: the top edges into the receivers' k (K-composition is shown first),
        # on the current task (the Patch tab's inputs: the induction task)
        assert len(engine.path_requests) == 1
        asked, kind = engine.path_requests[0]
        assert kind == "k" and len(asked) == min(8, len([e for e in pane.edges if e[4] > 0]))
        assert [tuple(map(tuple, a)) for a in asked] == \
            [((e[0], e[1]), (e[2], e[3])) for e in pane.edges[:len(asked)]]
        table = app.query_one("#comp-edges", DataTable)
        induction = (1, 2)
        cells = {}
        for i, e in enumerate(pane.edges[:len(asked)]):
            cells[(e[0], e[1]), (e[2], e[3])] = str(table.get_row_at(i)[3]).rstrip()
        _, cut = __import__("headscope.tui.widgets.panes", fromlist=["x"]).threshold_edges(
            pane.edges, pane.threshold)
        for (sender, receiver), cell in cells.items():
            effect = pane.paths[(sender, receiver)]
            edge = next(e for e in pane.edges if ((e[0], e[1]), (e[2], e[3])) == (sender, receiver))
            strong = edge[4] >= cut and edge[4] > 0
            if receiver == induction:
                assert effect == pytest.approx(0.2 * engine._behaviour[0][sender])
            else:
                assert effect == 0.0
            assert ("unused" in cell) == (strong and abs(effect) < 0.05), (sender, receiver, cell)
            assert cell.endswith(" used") == (strong and abs(effect) >= 0.05), (sender, receiver, cell)
        assert any("unused" in c for c in cells.values())
        assert any(c.endswith(" used") for c in cells.values())
        # the first edge's detail is there before the cursor moves (it was blank)
        first = pane.edges[0]
        detail = str(app.query_one("#comp-detail").render())
        assert f"L{first[0]}.H{first[1]}" in detail
        assert "path patching on the induction task: recovered" in detail
        # the detail line of a highlighted edge says it
        table.focus()
        await pilot.press("down", "up")
        await settle(pilot, app)
        detail = str(app.query_one("#comp-detail").render())
        assert "path patching on the induction task: recovered" in detail
        # another task (the Patch tab's answer/wrong): the path effects are asked again
        await pilot.press("9")
        await settle(pilot, app)
        box = app.query_one("#patch-answer", Input)
        box.value = "#7"
        app.query_one("#patch-wrong", Input).value = "#9"
        box.focus()
        await pilot.press("enter")
        await settle(pilot, app)
        await pilot.press("5")
        await settle(pilot, app)
        assert len(engine.path_requests) == 2 and engine.calls["composition"] == 1


async def test_on_the_real_engine_the_induction_head_recovers_most() -> None:
    """attn-only-2l through the real Engine: the Patch tab's list starts with L1.H2, then
    the other layer-1 heads, as the Engine computes them."""
    from headscope.tui.app import HeadscopeApp
    from headscope.tui.base.settings import Settings
    from tests.conftest import sample_model
    from tests.e2e.test_explorer_real_engine import wait_ready

    app = HeadscopeApp(sample_model("attn-only-2l"), settings=Settings(), debounce=0.01,
                       sweep=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_ready(pilot, app)
        await pilot.press("9")
        pane = app.query_one(PatchPane)
        await wait_until(pilot, lambda: pane.session.result is not None, "the patching", 1200)
        await settle(pilot, app)
        assert rows(app)[:3] == ["L1.H2", "L1.H1", "L1.H0"]
        assert "induction task" in pane.status and "L1.H2: recovered +0.7" in pane.status
        assert app.query_one("#patch-map", Chart).rendered is not None


async def test_e_exports_the_patch_result_as_the_cli_prints_it(tmp_path: Path) -> None:
    import json

    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("9")
        await settle(pilot, app)
        await pilot.press("e")
        await settle(pilot, app)
        files = list((tmp_path / "out").glob("*.json"))
        assert len(files) == 1
        doc = json.loads(files[0].read_text())
        assert doc["view"] == "patch" and doc["head"] is None
        assert doc["data"]["method"] == "exact" and doc["data"]["site"] == "out"
        assert (doc["data"]["heads"][0]["layer"], doc["data"]["heads"][0]["head"]) == (1, 2)


async def test_an_incomplete_form_names_its_boxes_and_clears_the_old_result() -> None:
    """Issue 39 §3: with the prompts edited and the wrong token left empty, the error named
    the CLI's flags (`--answer`) and the old heatmap and list stayed beside it."""
    app, engine = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("9")
        await settle(pilot, app)
        pane = app.query_one(PatchPane)
        table = app.query_one("#patch-table", DataTable)
        assert pane.session.result is not None and table.row_count > 0
        asked = len(engine.patch_requests)
        box = app.query_one("#patch-answer", Input)
        box.focus()
        box.value = "#7"
        await pilot.press("enter")
        await settle(pilot, app)
        assert "the wrong box" in pane.status and "--" not in pane.status
        assert len(engine.patch_requests) == asked  # nothing was asked of the engine
        assert pane.session.result is None and table.row_count == 0
        chart = app.query_one("#patch-map", Chart)
        assert chart.figure is None and "no result" in chart.note


async def test_typing_on_the_tab_goes_to_the_form_not_to_the_bindings() -> None:
    """Issue 39 §3: on the Patch tab with the head tree focused, typing a prompt ran the app's
    keys (`r` switched to raw weights, `t` the theme). Printable keys go to the form's last
    box (the clean prompt at first, its text replaced); the tab's own keys keep working."""
    app, _ = make_app(sweep=False)  # no score sweep: only the tab's own run to wait for
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await pilot.press("9")
        await settle(pilot, app)
        raw, theme = app.raw, app.theme
        clean = app.query_one("#patch-clean", Input)
        assert not clean.has_focus
        await pilot.press(*"rat sat")
        await pilot.pause()
        assert clean.has_focus and clean.value == "rat sat"
        assert (app.raw, app.theme) == (raw, theme)
        # from the list (focused after a run), typing goes back to the box last typed in
        wrong = app.query_one("#patch-wrong", Input)
        wrong.focus()
        app.query_one("#patch-table", DataTable).focus()
        await pilot.press("t", "o")
        await pilot.pause()
        assert wrong.has_focus and wrong.value == "to" and app.theme == theme
        # a burst (a terminal delivers fast typing at once): every key reaches the box, even
        # those that arrived while the list still had focus
        app.query_one("#patch-table", DataTable).focus()
        await pilot.pause()
        for ch in "cat 1":
            app.post_message(events.Key("space" if ch == " " else ch, ch))
        await pilot.pause()
        assert wrong.value == "cat 1" and app.explorer.active_tab == "patch"
        # the tab keys still switch tabs from outside the form
        app.query_one("#patch-table", DataTable).focus()
        await pilot.press("1")
        await pilot.pause()
        assert app.explorer.active_tab == "qk"


async def test_a_burst_that_opens_the_tab_types_into_its_form() -> None:
    """`9cat` delivered at once (a fast typist, a paste, tmux send-keys): the keys after `9`
    reached the screen before the app had run 9's binding, so `a` ran the ablation sweep and
    `c`/`t` their bindings. The tab keys switch tabs in the screen's own order of keys."""
    app, _ = make_app(sweep=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        theme = app.theme
        for ch in "9cat":
            app.post_message(events.Key(ch, ch))
        await settle(pilot, app)
        # `a` would have opened the Summary tab for the ablation sweep, `t` the next theme
        assert app.explorer.active_tab == "patch" and app.theme == theme
        assert app.query_one("#patch-clean", Input).value == "cat"
