"""The README's claim about the Composition tab's path column, on the real engine: on the
default induction task L0.H1 → L1.H2 (K) is `unused on this task` (the runs share the first
half, where the keys sit); with the README's first-occurrence prompts typed into the Patch
tab, the same edge shows the path effect `headscope path-patch` prints (0.33); with the
first-occurrence task chosen in the Patch tab, it shows the task's path effect, used."""

from __future__ import annotations

import pytest
from textual.widgets import Input

from headscope.tui.widgets.patch import PatchPane
from tests.tui.widgets.test_patch import settle, wait_until

CLEAN = "cake card kite cup hotel mouse cake card kite cup hotel"
CORRUPT = "cake card kite cup lamp mouse cake card kite cup hotel"
EDGE = ((0, 1), (1, 2))


async def test_the_path_column_follows_the_patch_tabs_prompts() -> None:
    from headscope.tui.app import HeadscopeApp
    from headscope.tui.base.settings import Settings
    from tests.conftest import sample_model
    from tests.e2e.test_explorer_real_engine import wait_ready

    app = HeadscopeApp(sample_model("attn-only-2l"), settings=Settings(), debounce=0.01,
                       sweep=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot, app)
        await pilot.press("5")
        pane = app.query_one("#composition-pane")
        await wait_until(pilot, lambda: pane.paths_state == "done", "the path effects", 1200)
        assert abs(pane.paths[EDGE]) < 0.05  # the induction task: no K edge carries anything
        await pilot.press("9")
        await settle(pilot, app)
        patch = app.query_one(PatchPane)
        for box, text in (("clean", CLEAN), ("corrupt", CORRUPT), ("answer", "mouse"),
                          ("wrong", "lamp")):
            app.query_one(f"#patch-{box}", Input).value = text
        app.query_one("#patch-clean", Input).focus()
        await pilot.press("enter")
        await wait_until(pilot, lambda: patch.session.result is not None
                         and patch.session.result.clean != patch.session.result.corrupt,
                         "the patching", 1200)
        await pilot.press("5")
        await wait_until(pilot, lambda: pane.paths_state == "done" and EDGE in pane.paths
                         and abs(pane.paths[EDGE] or 0) > 0.05, "the new path effects", 1200)
        assert 0.25 < pane.paths[EDGE] < 0.4


async def test_choosing_the_first_occurrence_task_makes_the_k_edge_used() -> None:
    """The Patch tab's task select, by keys at 80×24: the first-occurrence task's prompts
    fill the boxes, it is patched as the task (not as typed prompts), and the Composition
    tab's path column shows L0.H1 → L1.H2 (K) used, with the number ``headscope path-patch
    --task first-occurrence`` prints."""
    from textual.widgets import Select

    from headscope.engine.api.model import open_model
    from headscope.tui.app import HeadscopeApp
    from headscope.tui.base.settings import Settings
    from headscope.tui.session.patch import NEAR_ZERO, ids_text
    from tests.conftest import sample_model
    from tests.e2e.test_explorer_real_engine import wait_ready

    path = sample_model("attn-only-2l")
    app = HeadscopeApp(path, settings=Settings(), debounce=0.01, sweep=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_ready(pilot, app)
        await pilot.press("9")
        patch = app.query_one(PatchPane)
        await wait_until(pilot, lambda: patch.session.result is not None, "the induction task", 1200)
        select = app.query_one("#patch-task", Select)
        region = select.region
        assert region.area > 0 and region.right <= 80 and region.bottom <= 24
        select.focus()
        await pilot.press("enter", "down", "enter")
        await wait_until(pilot, lambda: patch.session.result is not None
                         and patch.session.result.metric == "first-occurrence", "the new task", 1200)
        model = open_model(path)
        from headscope.engine.forward.patch_tasks import induction_task

        clean, corrupt = induction_task(model.cfg.d_vocab, model.cfg.n_ctx, task="first-occurrence")
        assert app.query_one("#patch-clean", Input).value == ids_text(clean[0].tolist())
        assert app.query_one("#patch-corrupt", Input).value == ids_text(corrupt[0].tolist())
        assert "first-occurrence task" in patch.status
        await pilot.press("5")
        pane = app.query_one("#composition-pane")
        await wait_until(pilot, lambda: pane.paths_state == "done" and EDGE in pane.paths
                         and pane.paths[EDGE] is not None and abs(pane.paths[EDGE]) > NEAR_ZERO,
                         "the path effects on the new task", 1200)
        expected = model.path_patch(*EDGE, patch="k", task="first-occurrence").rows[0].recovered
        assert pane.paths[EDGE] == pytest.approx(expected, abs=1e-6)
        row = [tuple(e[:4]) for e in pane.edges].index((0, 1, 1, 2))
        cell = str(app.query_one("#comp-edges").get_row_at(row)[3])
        assert "unused" not in cell and f"{expected:+.2f}" in cell
