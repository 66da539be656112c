"""The keymap (tui/base/keymap.py): every footer key fits at 120 columns."""

from __future__ import annotations

from tests.tui import test_app
from tests.tui.test_app import make_app, settle

_quiet_env = test_app._quiet_env  # test_app's autouse fixture


async def test_every_footer_key_fits_at_120_columns() -> None:
    """The footer shows every key it lists within 120 columns (SVG and Export came last and
    were cut off): compact, without the palette hint (ctrl+p is in the help screen)."""
    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        keys = {k.description: k.region for k in app.screen.query("FooterKey")}  # type: ignore[attr-defined]
        assert {"SVG", "Export", "Raw/proc", "Theme"} <= set(keys)
        assert all(region.width > 0 and region.right <= 120 for region in keys.values()), keys


async def test_every_footer_key_reads_in_full_at_80_columns() -> None:
    """Issue 39 §3: at 80×24 the footer ran past the edge (``r R``…). Narrow, one-word keys
    and the least used ones left to ``?``: every key shown ends inside the screen, also with
    ``esc Back`` shown (focus away from the head tree)."""
    app, _ = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        for focus in (None, "#comp-edges"):
            if focus is not None:
                await pilot.press("5")
                app.query_one(focus).focus()
                await settle(pilot, app)
            keys = {k.description: k.region for k in app.screen.query("FooterKey")}  # type: ignore[attr-defined]
            assert {"Quit", "Help", "Prev", "Next", "Raw", "Export"} <= set(keys), keys
            assert all(region.width > 0 and region.right <= 80 for region in keys.values()), keys
        assert "Back" in keys
