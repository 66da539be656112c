"""The timeline pane (tui/widgets/timeline.py): sparklines of a head's scores over the steps."""

from __future__ import annotations

from headscope.tui.widgets.timeline import sparkline_cells
from tests.tui.screens import test_timeline

_quiet_env = test_timeline._quiet_env  # test_timeline's autouse fixture


def test_sparklines_fit_the_width_and_mark_the_steps_each_character_shows() -> None:
    values = [i / 17 for i in range(18)]
    blocks = sparkline_cells(values, 20, 0.0, 1.0)
    assert "".join(c for c, _ in blocks) == "".join(
        "▁▂▃▄▅▆▇█"[round(v * 7)] for v in values)
    braille = sparkline_cells(values, 9, 0.0, 1.0)
    assert len(braille) == 9 and [s for _, s in braille][4] == (8, 9)
    assert braille[0][0] == chr(0x2800 | 0x40 | 0x80) and braille[-1][0] == "⣿"
    sampled = sparkline_cells(values, 4, 0.0, 1.0)
    assert len(sampled) == 4
    assert sorted(i for _, s in sampled for i in s) == list(range(18))  # every step covered
