"""Signed bars beside the top outputs and the DLA follow the theme's colour map when the
theme changes (issue 39 §3: they stayed red in the colour-blind theme)."""

from __future__ import annotations

from headscope.themes import COLORMAPS
from tests.tui.base.test_contrast import screen_segments
from tests.tui.test_app import make_app, settle


def bar_colours_on_screen(app) -> set[tuple[int, int, int]]:
    return {tuple(seg.style.color.get_truecolor()) for seg in screen_segments(app)
            if "█" in seg.text and seg.style is not None and seg.style.color is not None
            and seg.style.bgcolor is not None}


async def test_top_output_bars_take_the_colour_blind_map_after_t() -> None:
    app, _ = make_app(theme="headscope-dark")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("2")
        await settle(pilot, app)
        red_blue = {COLORMAPS["red-blue"][0], COLORMAPS["red-blue"][2]}
        assert bar_colours_on_screen(app) & red_blue
        app.theme = "headscope-colorblind"
        await settle(pilot, app)
        shown = bar_colours_on_screen(app)
        assert not shown & red_blue
        assert shown & {COLORMAPS["blue-orange"][0], COLORMAPS["blue-orange"][2]}
