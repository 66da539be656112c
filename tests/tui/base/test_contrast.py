"""Every text on every theme readable: WCAG 2 contrast ≥ 4.5:1 (AA) between each rendered
character's colour and its background, on every tab, in truecolor and in the 256-colour
downgrade the terminal gets with ``TERM=*-256color`` (issue 39 §3: the Prompt input's title
was colour 16 on 234, 1.2:1).

The colours are read from the screen the compositor renders (after the app's line filters),
not from the theme's intent: a title drawn in a blend of the border colour, a ``dim`` hint or
a muted variable all show up as what the user sees. Heatmap cells, bars and frame glyphs
carry data or structure, not text: only letters and digits are checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rich.color import Color, ColorSystem
from rich.segment import Segment
from rich.style import Style

from headscope.themes import THEME_NAMES
from tests.fake_engine import FakeEngine
from tests.tui.test_app import make_app, settle

ROOT = Path(__file__).resolve().parents[3]
# a word-level sample model's folder: the Prompt input gets its vocabulary title
WORD_MODEL = ROOT / "sample_models" / "attn-only-2l"

AA = 4.5
TABS = ("1", "2", "3", "4", "5", "6", "9")


def relative_luminance(rgb: tuple[int, int, int]) -> float:
    """WCAG 2 relative luminance of an sRGB colour."""
    def channel(c: int) -> float:
        v = c / 255
        return v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4
    r, g, b = (channel(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: tuple[int, int, int], b: tuple[int, int, int]) -> float:
    la, lb = sorted((relative_luminance(a), relative_luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def test_contrast_formula_matches_wcag_reference_values():
    assert contrast((0, 0, 0), (255, 255, 255)) == pytest.approx(21.0)
    assert contrast((119, 119, 119), (255, 255, 255)) == pytest.approx(4.48, abs=0.01)
    assert contrast((0, 0, 0), (28, 28, 28)) == pytest.approx(1.2, abs=0.05)  # 16 on 234


def rgb(color: Color, system: ColorSystem) -> tuple[int, int, int]:
    return tuple(color.downgrade(system).get_truecolor())  # type: ignore[return-value]


def texts(segments: list[Segment]) -> list[tuple[str, Style]]:
    return [(s.text, s.style) for s in segments
            if s.style is not None and any(ch.isalnum() for ch in s.text)]


def screen_segments(app: Any) -> list[Segment]:
    strips = app.screen._compositor.render_strips()
    for line_filter in app.get_line_filters():
        strips = [strip.apply_filter(line_filter, app.screen.styles.background) for strip in strips]
    return [seg for strip in strips for seg in strip]


def low_contrast(segments: list[Segment], system: ColorSystem) -> list[str]:
    bad = []
    for text, style in texts(segments):
        if style.color is None or style.bgcolor is None or style.color.is_default \
                or style.bgcolor.is_default:
            continue
        fg, bg = rgb(style.color, system), rgb(style.bgcolor, system)
        if style.reverse:
            fg, bg = bg, fg
        ratio = contrast(fg, bg)
        if ratio < AA:
            bad.append(f"{fg} on {bg}: {ratio:.2f}:1, e.g. {text.strip()!r}")
    return bad


@pytest.mark.parametrize("theme", THEME_NAMES)
async def test_every_text_on_every_tab_has_aa_contrast(theme: str):
    assert (WORD_MODEL / "vocab.txt").is_file()
    app, _ = make_app(FakeEngine(str(WORD_MODEL)), theme=theme)
    found: dict[tuple, str] = {}
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        for tab in TABS:
            await pilot.press(tab)
            await settle(pilot, app)
            app.clear_notifications()
            await pilot.pause(0.05)
            segments = screen_segments(app)
            for system in (ColorSystem.TRUECOLOR, ColorSystem.EIGHT_BIT):
                for line in low_contrast(segments, system):
                    found.setdefault((system.name, line.split(", e.g.")[0]), f"tab {tab}: {line}")
    assert not found, "\n".join(f"{system}: {line}" for (system, _), line in found.items())
