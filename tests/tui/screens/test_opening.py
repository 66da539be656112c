"""The explorer's first frame is drawn before numpy, plotext, torch or the explorer are imported
(tui/opening.py; the budget is bench/firstframe.py's), and the explorer follows it.

One fresh interpreter (imports are per process): the first app is checked at its first frame
and quit there, before the engine exists; a second app opens the help on its first frame, then
is checked once the explorer is up.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
HEAVY = ("numpy", "plotext", "textual_plotext", "torch", "headscope.tui.screens.explorer",
         "headscope.engine.model.loading")

CODE = f"""
import asyncio, sys
from headscope.tui.app import HeadscopeApp
from headscope.tui.base.settings import Settings

HEAVY = {HEAVY!r}

async def main():
    app = HeadscopeApp("sample_models/attn-only-2l", settings=Settings(), sweep=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause(0)
        loaded = [m for m in HEAVY if m in sys.modules]
        assert not loaded, f"imported before the first frame: {{loaded}}"
        assert type(app.screen).__name__ == "OpeningScreen", app.screen
        status = str(app.screen.query_one("#opening-status").render())
        assert "attn-only-2l" in status and "opening" in status, status
        assert "q" in [b.binding.key for b in app.screen.active_bindings.values()]
        await pilot.press("q")  # quit on the first frame: the app ends, no engine is made
        await pilot.pause(0.3)
    assert (app.engine, app.return_code) == (None, 0), (app.engine, app.return_code)
    # the explorer follows the first frame, its tree from the checkpoint's header; the help
    # opened on the first frame stays on top until closed
    app = HeadscopeApp("sample_models/attn-only-2l", settings=Settings(), sweep=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("question_mark")
        await pilot.pause(0.5)
        assert type(app.screen).__name__ == "HelpScreen", app.screen_stack
        await pilot.press("escape")
        for _ in range(600):
            if app.explorer_up:
                break
            await pilot.pause(0.05)
        assert app.explorer_up and app.screen is app.explorer
        from headscope.tui.widgets.head_tree import HeadTree
        tree = app.explorer.query_one(HeadTree)
        assert [str(n.label) for n in tree.root.children][1:3] == ["Layer 0", "Layer 1"]
        await pilot.press("q")
    print("ok")

asyncio.run(main())
"""


def test_first_frame_comes_before_the_heavy_imports_and_the_explorer_follows() -> None:
    done = subprocess.run([sys.executable, "-c", CODE], cwd=ROOT, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("ok")
