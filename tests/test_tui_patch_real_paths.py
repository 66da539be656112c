"""The README's claim about the Composition tab's path column, on the real engine: on the
default induction task L0.H1 → L1.H2 (K) is `unused on this task` (the runs share the first
half, where the keys sit); with the README's first-occurrence prompts typed into the Patch
tab, the same edge shows the path effect `headscope path-patch` prints (0.33)."""

from __future__ import annotations

from textual.widgets import Input

from headscope.tui.widgets.patch import PatchPane
from tests.test_tui_patch import settle, wait_until

CLEAN = "cake card kite cup hotel mouse cake card kite cup hotel"
CORRUPT = "cake card kite cup lamp mouse cake card kite cup hotel"
EDGE = ((0, 1), (1, 2))


async def test_the_path_column_follows_the_patch_tabs_prompts() -> None:
    from headscope.tui.app import HeadscopeApp
    from headscope.tui.base.settings import Settings
    from tests.conftest import sample_model
    from tests.test_tui_real_engine import wait_ready

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
