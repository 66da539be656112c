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
