"""Charts (tui/widgets/chart.py): the theme's colour map, switching it, rendered figures cached."""

from __future__ import annotations

import pytest

from headscope.themes import COLORMAPS
from headscope.tui.widgets.chart import Chart
from tests.tui import test_app
from tests.tui.test_app import make_app, settle

_quiet_env = test_app._quiet_env  # test_app's autouse fixture


@pytest.mark.parametrize(("theme", "expected"), [
    ("headscope-light", "headscope-light"), ("light", "headscope-light"),
    (None, "headscope-dark"), ("no-such-theme", "headscope-dark")])
async def test_the_first_frame_already_has_the_chosen_theme(theme: str | None, expected: str) -> None:
    # Set before the first mount (a theme switch afterwards restyles every widget).
    app, _ = make_app(theme=theme)
    async with app.run_test(size=(120, 40)) as pilot:
        assert app.theme == expected
        await settle(pilot, app)
        light = expected == "headscope-light"
        assert app.query_one("#qk-token", Chart).colours().stops == \
            COLORMAPS["red-blue-light" if light else "red-blue"]


async def test_theme_switch_changes_heatmap_colours() -> None:
    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        chart = app.query_one("#qk-token", Chart)
        builds = chart.builds
        assert chart.colours().stops == COLORMAPS["red-blue"]
        await pilot.press("t")
        await settle(pilot, app)
        assert app.theme == "headscope-light"
        assert chart.colours().stops == COLORMAPS["red-blue-light"]
        assert chart.builds > builds and chart.rendered is not None
        await pilot.press("m")  # cycle colour maps explicitly
        assert app.colormap_name != "red-blue-light"


async def test_rendered_charts_are_cached() -> None:
    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        chart = app.query_one("#qk-token", Chart)
        builds = chart.builds
        for _ in range(5):
            chart.refresh()
            await pilot.pause(0.02)
        await settle(pilot, app)
        assert chart.builds == builds  # repaints hit the cache


async def test_a_build_replaced_before_it_started_leaves_no_unawaited_coroutine() -> None:
    """Each chart's builds run as one exclusive worker group: a build asked for while the last
    one waits to start cancels it. The worker is handed the build's function, not a coroutine
    made ahead, so a cancelled one leaves nothing that Python warns of ("coroutine
    'Chart._build' was never awaited", printed on the terminal when the app exits)."""
    import gc
    import warnings

    app, _ = make_app()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, app)
            chart = app.query_one("#qk-token", Chart)
            key = chart._key()
            for _ in range(3):  # in one tick: the first two never start
                chart._start_build(key)
            await settle(pilot, app)
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]
