"""The help screen (tui/screens/dialogs.py) lists every key as the keymap binds it."""

from __future__ import annotations

from textual.widgets import Static

from headscope.tui.base.keymap import APP_BINDINGS
from headscope.tui.screens.dialogs import HelpScreen
from tests.tui import test_app
from tests.tui.test_app import make_app, plain, settle, wait_until

_quiet_env = test_app._quiet_env  # test_app's autouse fixture


async def test_help_lists_every_key_and_follows_the_keymap() -> None:
    app, _ = make_app(keymap={"next-head": "n"})
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("n")
        await settle(pilot, app)
        assert app.explorer.head == (0, 1)
        await pilot.press("question_mark")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help screen")
        text = plain(app.screen.query_one("#help-keys", Static))
        for b in APP_BINDINGS:
            assert b.id in text
        next_line = next(line for line in text.splitlines() if "next-head" in line)
        assert next_line.strip().startswith("n ")
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
