"""The command palette (tui/screens/palette.py) goes to a head."""

from __future__ import annotations

from textual.command import CommandList, CommandPalette

from tests.tui import test_app
from tests.tui.test_app import make_app, settle, wait_until

_quiet_env = test_app._quiet_env  # test_app's autouse fixture


async def test_palette_goes_to_a_head() -> None:
    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("ctrl+p")
        await wait_until(pilot, lambda: isinstance(app.screen, CommandPalette), "the palette")
        await pilot.press(*"Go to head 1.2")

        def highlighted() -> str:
            hits = app.screen.query_one(CommandList)
            i = hits.highlighted
            return "" if i is None else str(hits.get_option_at_index(i).prompt)

        await wait_until(pilot, lambda: highlighted().startswith("Go to head 1.2"),
                         "the palette highlights the head")
        await pilot.press("enter")
        await settle(pilot, app)
        assert app.explorer.head == (1, 2)
