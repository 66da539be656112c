"""The status bar (tui/widgets/status.py): the model's name, processing and shape, raw or processed."""

from __future__ import annotations

import re

from textual.widgets import Static

from headscope.tui.widgets.status import StatusBar
from tests.tui import test_app
from tests.tui.test_app import chart_text, make_app, plain, settle

_quiet_env = test_app._quiet_env  # test_app's autouse fixture


async def test_raw_toggle_switches_the_engine_and_status() -> None:
    app, engine = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("r")
        await settle(pilot, app)
        assert engine.raw is True and app.raw is True
        assert " raw " in app.query_one(StatusBar).render().plain
        assert engine.calls["all_head_scores"] == 2  # scores recomputed for raw weights


async def test_header_and_focus_line_separate_name_shape_head_and_scores() -> None:
    app, engine = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        top, bottom = app.query_one(StatusBar).render().plain.splitlines()
        assert "attn-only-2l │ processed │ 2L×4H" in top
        # 120 columns: every shape and the family/architecture whole ("headscope ·" gives way)
        assert " dh4 " in top and " ctx32 " in top and top.endswith("│ native/headscope-attn-only")
        assert bottom.startswith("L0.H0 │ ")
        focus = plain(app.query_one("#focus-line", Static))
        copying_score = engine._scores(0, 0).copying_score
        # the null is in: short labels, each score with its z (the richest line that fits)
        assert f"L0.H0 │ copy {copying_score:+.2f} z=" in focus and "· QK+" in focus


async def test_at_80_columns_the_header_keeps_the_architecture_and_the_cell_line_its_weight() -> None:
    """80×24 (issue 39 §3): the header drops "headscope ·", the head size, context and the
    family rather than cutting the architecture away; the OV heatmap beside the directions
    panel says what its rows are; the Prompt tab's cell line keeps the cell's weight."""
    app, _engine = make_app(prompt="the cat sat on the mat the cat sat", sweep=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        top = app.query_one(StatusBar).render().plain.splitlines()[0]
        architecture = app.screen.structure["architecture"]
        assert top.endswith(f"│ {architecture}") and "2L×4H" in top and "…" not in top
        await pilot.press("2", "v")
        await settle(pilot, app)
        assert "(rows: source)" in chart_text(app, "ov-heatmap")
        await pilot.press("4")
        await settle(pilot, app)
        cell = next(line for line in chart_text(app, "prompt-pattern").splitlines() if "q=" in line)
        assert "…" not in cell and re.search(r"→ k=\d+ .* \d\.\d\d", cell), cell
