"""The virtual heads pop-up (tui/screens/path.py): saved with s or a remapped key, its axes."""

from __future__ import annotations

from pathlib import Path

import pytest

from headscope.tui.screens.path import PathScreen
from headscope.tui.widgets.chart import Chart
from tests.conftest import notified
from tests.e2e import test_explorer_small_terminal
from tests.e2e.test_explorer_small_terminal import open_virtual_heads, screen_lines
from tests.tui.test_app import make_app, settle

_quiet_env = test_explorer_small_terminal._quiet_env  # test_explorer_small_terminal's autouse fixture


async def test_s_saves_the_virtual_heads_pop_up(tmp_path: Path) -> None:
    """`s` in the virtual-heads pop-up saved nothing: a modal screen stops the key chain
    before the app's bindings. The pop-up binds it itself (same id, so a user keymap moves
    both), says so on its last line, and the SVG is the pop-up, named after the edge."""
    out = tmp_path / "out"
    app, _ = make_app(output_dir=out)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        screen = await open_virtual_heads(pilot, app)
        await pilot.press("s")
        await settle(pilot, app)
        assert isinstance(app.screen, PathScreen)  # still open
        (svg,) = out.glob("*.svg")
        assert any("s saves" in line for line in screen_lines(app)), screen_lines(app)
        (la, ha), (lb, hb) = screen.source, screen.target
        assert f"_path_L{la}H{ha}-L{lb}H{hb}_" in svg.name
        text = svg.read_text()
        assert text.startswith("<svg") and text.rstrip().endswith("</svg>")
        for shown in ("K-path", "V-path", f"L{la}.H{ha}", f"L{lb}.H{hb}", "escape"):
            assert shown in text, shown
        assert any(svg.name in n.message and "output directory" in n.message
                   for n in notified(app))


async def test_a_remapped_screenshot_key_saves_the_pop_up_too(tmp_path: Path) -> None:
    """The pop-up's binding has the app's id: a user keymap that moves `screenshot` moves it
    in the pop-up as well (the old key then does nothing there either), and the pop-up's
    last line names the new key."""
    out = tmp_path / "out"
    app, _ = make_app(output_dir=out, keymap={"screenshot": "ctrl+s"})
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await open_virtual_heads(pilot, app)
        assert any("ctrl+s saves an SVG" in line for line in screen_lines(app))
        await pilot.press("s")
        await settle(pilot, app)
        assert not out.exists() or not list(out.glob("*.svg"))
        await pilot.press("ctrl+s")
        await settle(pilot, app)
        assert len(list(out.glob("*_path_*.svg"))) == 1


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_the_k_path_x_label_keeps_a_blank_column_before_the_spectrum(
        size: tuple[int, int]) -> None:
    """At 80×24 the K-path's x label ran into the V-path plot's tick label
    (`(rows: …-0.5┤`): the two charts now have a blank column between them, and every row
    of the heatmap's text ends before it."""
    app, _ = make_app()
    async with app.run_test(size=size) as pilot:
        await settle(pilot, app)
        screen = await open_virtual_heads(pilot, app)
        heatmap = screen.query_one("#path-heatmap", Chart)
        spectrum = screen.query_one("#path-spectrum", Chart)
        lines = screen_lines(app)
        drawn = heatmap.rendered.plain.splitlines()
        # the long label or, at 80×24, its short form (Heatmap.xlabel_short): the first that fits
        (xlabel,) = [line for line in drawn if "→" in line and "(rows:" in line]
        (row,) = [y for y, line in enumerate(lines) if xlabel.strip() in line]
        start, end = heatmap.region.x, heatmap.region.x + len(xlabel.rstrip())
        assert lines[row][start:end] == xlabel.rstrip(), lines[row]
        assert lines[row][end] == " ", lines[row]
        # the neighbouring text on that row is the spectrum's (its tick label or frame)
        right = lines[row][end:spectrum.region.right].strip()
        assert right, lines[row]
        # and no row of the heatmap's text reaches the column before the spectrum
        for y in range(heatmap.region.y, heatmap.region.bottom):
            assert lines[y][spectrum.region.x - 1] == " ", lines[y]
