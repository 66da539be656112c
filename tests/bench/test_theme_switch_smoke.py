"""``python -m bench.theme_switch`` measures what it says: ``t`` pressed in the minimal app and
in the explorer (the fake engine here: the bench's own run uses the real one on the bundled
model), each press timed to a settled frame with the theme it showed, and the table of both."""

from __future__ import annotations

import asyncio

from bench.theme_switch import explorer_ready, minimal_app, presses, table
from headscope.themes import THEME_NAMES
from tests.tui.test_app import make_app


def test_bench_theme_switch_smoke() -> None:
    n = 2  # a theme's first uses only (quick): the table says "–" for the later ones
    size = (80, 24)
    minimal = asyncio.run(presses(minimal_app(), n, size))
    app, _ = make_app(sweep=False)
    explorer = asyncio.run(presses(app, n, size, explorer_ready))
    cycle = [THEME_NAMES[(i + 1) % len(THEME_NAMES)] for i in range(n)]
    for result in (minimal, explorer):
        runs = result["presses"]
        assert [r["theme"] for r in runs] == cycle  # every press showed the next theme
        assert all(r["wall"] > 0 and r["cpu"] >= 0 for r in runs)
    assert minimal["widgets"] == 1 and explorer["widgets"] > 50
    text = table({"minimal": [minimal], "headscope": [explorer]}, size, n)
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert set(rows) == {"app", "minimal", "headscope", "headscope / minimal"}
    assert rows["headscope / minimal"].count("×") == 2
