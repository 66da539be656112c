"""Heatmaps in each colour mode (truecolor, 256, 16, none), the theme switch redrawing
charts, and the CLI refusing mistakes before any screen.

The lightness checks read the colours actually emitted (the styles of the rendered cells,
xterm entries turned back into RGB) and compute CIE L* of them, not the intended ramp.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.color import ColorType
from rich.style import Style
from rich.text import Text

from headscope.themes import COLORMAPS, THEME_NAMES, THEMES
from headscope.tui.base.colormode import detect_color_mode
from headscope.tui.plots.colormap import (
    NEG_GLYPHS,
    SHADES,
    lightness,
    palette_ramp,
    srgb_to_lab,
    xterm_rgb,
)
from headscope.tui.plots.figures import Colours, Heatmap, ansi16_pair, build
from headscope.tui.widgets.chart import Chart
from tests.tui.test_app import make_app, settle
from tests.tui.test_app_snapshots import settle_after

ROOT = Path(__file__).resolve().parents[3]
FG, MUTED = (200, 200, 200), (128, 128, 128)


def colours(cmap: str, mode: str) -> Colours:
    return Colours(FG, MUTED, (255, 170, 0), (90, 170, 255), COLORMAPS[cmap], mode)


def ramp_figure(n: int = 17) -> Heatmap:
    """One row from −1 to +1: cell i shows value −1 + 2i/(n−1)."""
    values = np.linspace(-1.0, 1.0, n)[None, :]
    return Heatmap(values, ("r",), tuple(str(i) for i in range(n)), vmax=1.0)


def cell_spans(text: Text) -> list[tuple[str, Style]]:
    """(characters, style) of the heatmap's cells: the row labelled ``r`` inside the frame."""
    line_start = text.plain.index("r┤") + 2
    line_end = text.plain.index("│", line_start)
    out = []
    for span in text.spans:
        if line_start <= span.start < line_end and isinstance(span.style, Style):
            out.append((text.plain[span.start:span.end], span.style))
    return out


def emitted_rgb(style: Style) -> tuple[int, int, int]:
    colour = style.color
    assert colour is not None
    if colour.type == ColorType.EIGHT_BIT:
        assert colour.number is not None and colour.number >= 16, "entries 0–15 vary by terminal"
        return xterm_rgb(colour.number)
    assert colour.type == ColorType.TRUECOLOR and colour.triplet is not None
    return tuple(colour.triplet)  # type: ignore[return-value]


def assert_monotone_from_zero(lstar: list[float], zero: int) -> None:
    """L* changes in one direction from the zero cell to each end (repeats allowed)."""
    for half in (lstar[zero::-1], lstar[zero:]):
        d = np.diff(half)
        assert (d >= -1e-9).all() or (d <= 1e-9).all(), half


def test_lab_matches_known_values() -> None:
    assert lightness((255, 255, 255)) == pytest.approx(100.0, abs=0.01)
    assert lightness((0, 0, 0)) == pytest.approx(0.0, abs=0.01)
    # sRGB red (255, 0, 0) is L*a*b* (53.24, 80.09, 67.20) (CIE 1976, D65)
    np.testing.assert_allclose(srgb_to_lab(np.array([255, 0, 0])), [53.24, 80.09, 67.20],
                               atol=0.05)
    assert xterm_rgb(16) == (0, 0, 0) and xterm_rgb(231) == (255, 255, 255)
    assert xterm_rgb(196) == (255, 0, 0) and xterm_rgb(232) == (8, 8, 8)


@pytest.mark.parametrize("cmap", sorted(COLORMAPS))
@pytest.mark.parametrize("mode", ["truecolor", "256"])
def test_emitted_ramp_is_monotone_in_lightness(cmap: str, mode: str) -> None:
    text = build(ramp_figure(), 60, 8, colours(cmap, mode))
    spans = cell_spans(text)
    # Each cell is 2 characters wide, 4 with the width to spare (fit_shape widens a
    # height-bound grid); spans may merge equal neighbours: expand per character.
    per_char = [emitted_rgb(style) for chars, style in spans for _ in chars]
    step = len(per_char) // 17
    assert len(per_char) == 17 * step and 2 <= step <= 4
    lstar = [float(lightness(rgb)) for rgb in per_char[::step]]
    assert_monotone_from_zero(lstar, 8)
    assert abs(lstar[0] - lstar[8]) > 15 and abs(lstar[16] - lstar[8]) > 15, lstar
    if mode == "256":  # no truecolor left for the terminal (or Rich) to quantise
        assert all(style.color.type == ColorType.EIGHT_BIT for _, style in spans)


@pytest.mark.parametrize("cmap", sorted(COLORMAPS))
def test_palette_ramp_lightness(cmap: str) -> None:
    ramp = palette_ramp(COLORMAPS[cmap])
    assert len(ramp) == 17 and all(16 <= i <= 255 for i in ramp)
    assert_monotone_from_zero([float(lightness(xterm_rgb(i))) for i in ramp], 8)


def test_sixteen_colours_shade_magnitude_and_colour_sign() -> None:
    c = colours("red-blue", "16")
    spans = cell_spans(build(ramp_figure(9), 60, 8, c))
    every = "".join(chars for chars, _ in spans)
    chars = every[::len(every) // 9]
    assert chars == "█▓▒░ ░▒▓█"
    neg, pos = ansi16_pair(COLORMAPS["red-blue"])
    assert (neg, pos) == ("bright_blue", "bright_red")
    names = [style.color.name for chars, style in spans for _ in chars][::len(every) // 9]
    assert names[:4] == [neg] * 4 and names[5:] == [pos] * 4
    assert ansi16_pair(COLORMAPS["blue-orange"]) == ("bright_cyan", "bright_yellow")


def test_no_colour_uses_glyphs_for_sign() -> None:
    text = build(ramp_figure(9), 60, 8, colours("red-blue", "none"))
    spans = cell_spans(text)
    every = "".join(chars for chars, _ in spans)
    chars = every[::len(every) // 9]
    assert chars == NEG_GLYPHS[:0:-1] + " " + SHADES[1:]
    assert all(style.color is None for _, style in spans)
    key = text.plain.splitlines()[-1]
    assert "●" in key and "█" in key


def test_detect_color_mode() -> None:
    assert detect_color_mode("truecolor", {}) == "truecolor"
    assert detect_color_mode("256", {"TERM": "tmux-256color"}) == "256"
    assert detect_color_mode("standard", {}) == "16"
    assert detect_color_mode(None, {}) == "none"
    assert detect_color_mode("truecolor", {"NO_COLOR": "1"}) == "none"
    assert detect_color_mode("256", {"NO_COLOR": ""}) == "256"  # empty means unset


@pytest.mark.parametrize("mode", ["256", "16", "none"])
async def test_app_draws_heatmaps_in_the_chosen_mode(mode: str) -> None:
    app, _ = make_app(colors=mode)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        assert app.color_mode == mode
        chart = app.query_one("#qk-token", Chart)
        assert chart.rendered is not None
        plain = chart.rendered.plain
        types = {s.style.color.type for s in chart.rendered.spans
                 if isinstance(s.style, Style) and s.style.color is not None}
        if mode == "256":
            assert ColorType.EIGHT_BIT in types and "█" in plain
        else:
            assert any(ch in plain for ch in "░▒▓")


async def test_theme_switch_redraws_with_the_new_themes_colours() -> None:
    """Every chart built after `t` uses the new theme's foreground for its ticks, including
    a chart painted before the stylesheet caught up with the theme."""
    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("t")
        await settle(pilot, app)
        assert app.theme == "headscope-light"
        light = next(t for t in THEMES if t.name == "headscope-light")
        fg = tuple(__import__("textual.color", fromlist=["Color"]).Color.parse(
            light.foreground).rgb)
        for chart in app.explorer.query(Chart):
            if chart.rendered is None or not chart.display or chart.region.area == 0:
                continue
            tick_colours = {tuple(s.style.color.triplet) for s in chart.rendered.spans
                            if isinstance(s.style, Style) and s.style.color is not None
                            and s.style.color.triplet is not None
                            and "┤" in chart.rendered.plain[s.start:s.end]}
            assert tick_colours == {fg}, (chart.id, tick_colours)


async def test_chart_colours_follow_the_theme_before_the_stylesheet_does() -> None:
    """A chart painted between the theme change and the stylesheet refresh builds under the
    new theme's cache key: it must get the new theme's colours, or it keeps the old ones."""
    from textual.color import Color

    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        chart = app.query_one("#qk-token", Chart)
        app.theme = "headscope-light"  # no await: refresh_css has not run yet
        light = next(t for t in THEMES if t.name == "headscope-light")
        assert chart.colours().foreground == Color.parse(light.foreground).rgb
        await settle(pilot, app)


def test_snapshot_setup_is_truecolor_when_headless() -> None:
    from headscope.tui.app import HeadscopeApp
    from headscope.tui.base.settings import Settings

    assert HeadscopeApp("x", settings=Settings(colors="16"))._colors == "16"


@pytest.mark.parametrize("mode", ["256", "16", "none"])
def test_snapshot_qk_in_each_mode(snap_compare: Any, mode: str,
                                  monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HEADSCOPE_CONFIG", str(tmp_path / "none.toml"))
    app, _ = make_app(colors=mode, debounce=0.01, prompt="the cat sat on the mat the cat")
    assert snap_compare(app, terminal_size=(120, 40), run_before=settle_after())


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "headscope.tui.cli.main", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_cli_typo_of_a_command_is_a_usage_error() -> None:
    out = run_cli("head", "sample_models/attn-only-2l")
    assert out.returncode == 2
    assert out.stderr.strip() == "headscope: unknown command 'head'; did you mean 'heads'?"


def test_cli_missing_path_is_one_line_before_any_screen() -> None:
    out = run_cli("no/such/model")
    assert out.returncode == 2  # a usage error, as a folder that is not a checkpoint
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("headscope: no/such/model: no such file")
    assert "\x1b[" not in out.stdout  # no screen was drawn


def test_cli_unknown_theme_lists_the_themes() -> None:
    out = run_cli("open", "--theme", "nope")
    assert out.returncode == 2
    for name in THEME_NAMES:
        assert name in out.stderr


def test_help_and_readme_list_every_theme() -> None:
    help_text = " ".join(run_cli("open", "--help").stdout.split())
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name in THEME_NAMES:
        assert name in help_text and name in readme


# -- focus ------------------------------------------------------------------------------------


async def test_prompt_enter_leaves_the_box_and_escape_leaves_any_input() -> None:
    from textual.widgets import Input

    from headscope.tui.widgets.head_tree import HeadTree

    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("4", "p")
        box = app.query_one("#prompt-input", Input)
        assert app.focused is box
        footer_keys = {b.binding.key for b in app.screen.active_bindings.values()
                       if b.enabled and b.binding.show}
        assert "escape" in footer_keys  # the footer says how to get back
        await pilot.press("escape")
        assert isinstance(app.focused, HeadTree)
        await pilot.press("p", "x", "enter")
        await settle(pilot, app)
        assert isinstance(app.focused, HeadTree)
        await pilot.press("1")
        await settle(pilot, app)
        assert app.explorer.active_tab == "qk" and box.value.endswith("x")


async def test_every_focusable_widget_shows_its_focus() -> None:
    """Focusing any widget Tab reaches changes how it (or the pane around it) is drawn."""
    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        for tab in "123456":
            await pilot.press(tab)
            await settle(pilot, app)
            app.explorer.query_one("HeadTree").focus()
            await pilot.pause()
            for widget in list(app.screen.focus_chain):
                if type(widget).__name__ in ("HeadTree", "ContentTabs"):
                    continue  # their focus styles are Textual's / checked elsewhere
                around = [widget, *widget.ancestors_with_self][:4]
                before = [(w.styles.border, w.styles.background) for w in around]
                widget.focus()
                await pilot.pause()
                after = [(w.styles.border, w.styles.background) for w in around]
                assert before != after, f"tab {tab}: {widget!r} shows no focus"
                app.explorer.query_one("HeadTree").focus()
                await pilot.pause()


async def test_filter_keeps_the_focused_head() -> None:
    from headscope.tui.session.choices import TREE_FILTERS
    from headscope.tui.widgets.head_tree import HeadTree

    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        app.explorer.goto_head((1, 0), immediate=True)
        await settle(pilot, app)
        tree = app.query_one(HeadTree)
        for _ in range(len(TREE_FILTERS) + 1):  # each filter in turn, then every head
            await pilot.press("f")
            await settle(pilot, app)
            assert app.explorer.head == (1, 0)
            current = tree.current()
            assert current is not None and (current.layer, current.head) == (1, 0), current
        assert app.explorer.choices.tree_filter is None


async def test_help_title_shows_the_keymap_table_name() -> None:
    from textual.widgets import Label

    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("question_mark")
        await pilot.pause()
        title = app.screen.query_one("#help-title", Label)
        assert "[keymap]" in str(title.render())


# -- unknown words ------------------------------------------------------------------------------


async def test_prompt_view_counts_and_marks_unknown_tokens() -> None:
    from textual.widgets import Input, Static

    from headscope.engine.core.results import PromptView
    from headscope.tui.widgets.panes import PromptPane
    from tests.fake_engine import FakeEngine
    from tests.tui.test_app import plain

    app, _ = make_app(FakeEngine(str(ROOT / "sample_models/attn-only-2l")))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        pane = app.query_one(PromptPane)
        box = app.query_one("#prompt-input", Input)
        assert "414-word vocabulary" in str(box.border_title)  # the sample model's vocab.txt
        tokens = ("the", "<unk>", "sat", "<unk>")
        n = len(tokens)
        pane.prompt_text = "the zebra sat quietly"
        pane.show(PromptView(tokens=tokens, ids=(0, 1, 2, 1),
                             pattern=np.tril(np.ones((n, n), np.float32)) / n,
                             dla=np.zeros(n, np.float32), predicted=(0,) * n,
                             top_predictions=((0, "the", 1.0),), truncated=False, layer=0,
                             head=0))
        await pilot.pause()
        dla = app.query_one("#prompt-dla", Static)
        text = plain(dla)
        assert "2 of 4 prompt tokens are unknown (<unk>): zebra, quietly" in text
        marked = [r for r in dla.content.renderables[-1].columns[0]._cells
                  if isinstance(r, Text) and "reverse" in str(r.style)]
        assert [str(r) for r in marked] == ["<unk>", "<unk>"]


def test_forward_names_the_unknown_words(capsys: Any) -> None:
    from headscope.tui.cli.main import main

    assert main(["forward", "sample_models/attn-only-2l", "--prompt", "the zebra went"]) == 0
    err = capsys.readouterr().err
    assert "1 of 3 prompt tokens are unknown (<unk>): zebra" in err


def test_open_runs_the_readme_repeated_phrase_on_the_sample_models(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import headscope.tui.app as app_module
    from headscope.tui.base.prompt_words import REPEATED_PHRASE
    from headscope.tui.cli.main import main

    seen: dict[str, Any] = {}
    monkeypatch.setattr(app_module, "run_app", lambda path, **kw: seen.update(kw))
    assert main(["open", "sample_models/attn-only-2l"]) == 0
    assert seen["prompt"] == REPEATED_PHRASE
    words = set((ROOT / "sample_models/attn-only-2l/vocab.txt").read_text().splitlines())
    assert all(w in words for w in REPEATED_PHRASE.split())
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "**`4`** runs a prompt with a repeated phrase" in readme


async def test_status_bar_shows_one_percentage() -> None:
    from headscope.tui.widgets.status import StatusBar

    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        app.explorer.scores.progress = None
        bar = app.query_one(StatusBar)
        bar.activity, bar.progress = "head scores 80%", 0.2
        text = bar.render().plain
        assert text.count("%") == 1 and "20%" in text and "head scores" in text


# -- numbers in the explorer's tables ---------------------------------------------------------


def shown(widget: Any) -> str:
    """What a Static shows at its own width (not a wide console's)."""
    import io

    from rich.console import Console

    console = Console(width=widget.content_region.width, file=io.StringIO(), record=True)
    console.print(widget.content)
    return console.export_text()


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_ov_top_outputs_show_whole_numbers(size: tuple[int, int]) -> None:
    import re

    from textual.widgets import Static

    app, _ = make_app()
    async with app.run_test(size=size) as pilot:
        await settle(pilot, app)
        await pilot.press("2")
        await settle(pilot, app)
        text = shown(app.query_one("#ov-top", Static))
        numbers = re.findall(r"[+-]\d[\d.e+-]*", text)
        assert len(numbers) >= 5, text
        assert not re.search(r"[+-][\d.]*…", text), text


async def test_changes_table_shows_every_column_at_120() -> None:
    from textual.widgets import DataTable

    from tests.tui.test_app_snapshots import make_compare_app

    app = make_compare_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("7")
        await settle(pilot, app)
        table = app.query_one("#changes-table", DataTable)
        assert table.row_count > 0
        assert table.virtual_size.width <= table.scrollable_content_region.width, \
            (table.virtual_size.width, table.scrollable_content_region.width)


def test_compare_with_a_different_layout_is_refused_before_any_screen() -> None:
    out = run_cli("sample_models/attn-only-2l", "--compare", "sample_models/attn-only-1l")
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "different head layouts: 2×3 vs 1×8" in lines[0]
    assert "\x1b[" not in out.stdout


async def test_empty_composition_table_on_one_layer_says_why() -> None:
    from textual.widgets import DataTable, Static

    from tests.fake_engine import FakeEngine
    from tests.tui.test_app import plain

    app, _ = make_app(FakeEngine(n_layers=1, n_heads=4))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("5")
        await settle(pilot, app)
        assert app.query_one("#comp-edges", DataTable).row_count == 0
        assert "one layer" in plain(app.query_one("#comp-detail", Static))


def test_pooled_heatmap_key_says_which_rows_were_merged() -> None:
    from headscope.tui.plots.figures import merged

    values = np.arange(24 * 24, dtype=float).reshape(24, 24)
    text = build(Heatmap(values, tuple("abcdefghijklmnopqrstuvwx"),
                         tuple("abcdefghijklmnopqrstuvwx"), vmax=1.0), 60, 18,
                 colours("red-blue", "truecolor")).plain
    key = " ".join(text.splitlines()[-3:])
    assert "pooled 24×24→" in key and "largest |value|" in key
    assert all(len(line) <= 60 for line in text.splitlines())
    assert merged(24, 12) == " (rows 0–1, 2–3, …: largest |value|)"
    assert merged(24, 23) == " (rows 22–23: largest |value|)"  # pool_extreme's blocks
    assert merged(5, 10) == ""


def test_quitting_the_explorer_skips_the_interpreter_teardown(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """From the shell, after the explorer closed, the process ends at once (os._exit);
    called with arguments (tests, the API) main() returns as before."""
    import headscope.tui.app as app_module
    import headscope.tui.cli.main as cli

    exits: list[int] = []
    monkeypatch.setattr(app_module, "run_app", lambda path, **kw: None)
    monkeypatch.setattr(cli.os, "_exit", exits.append)
    monkeypatch.setattr(sys, "argv", ["headscope", "sample_models/attn-only-2l"])
    cli.main()
    assert exits == [0]
    assert cli.main(["sample_models/attn-only-2l"]) == 0 and exits == [0]
    monkeypatch.setattr(sys, "argv", ["headscope", "info", "sample_models/attn-only-2l"])
    cli.main()
    assert exits == [0]  # other commands end normally


async def test_positional_qk_says_when_it_shows_part_of_the_positions() -> None:
    from tests.fake_engine import FakeEngine
    from tests.tui.test_app import chart_text

    app, _ = make_app(FakeEngine(n_ctx=48))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        title = chart_text(app, "qk-position").splitlines()[0]
        assert "0–31 of 48" in title and "…" not in title
    app, _ = make_app(FakeEngine(n_ctx=48))
    async with app.run_test(size=(80, 24)) as pilot:  # was "positional QK L0.H0 · 0–31 o…"
        await settle(pilot, app)
        lines = chart_text(app, "qk-position").splitlines()
        assert "0–31/48" in lines[0] and "…" not in lines[0]
        assert any("(rows: query)" in line for line in chart_text(app, "qk-token").splitlines())


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_compare_focus_line_keeps_every_number(size: tuple[int, int]) -> None:
    import re

    from textual.widgets import Static

    from tests.tui.test_app_snapshots import make_compare_app

    app = make_compare_app()
    async with app.run_test(size=size) as pilot:
        await settle(pilot, app)
        line = app.query_one("#focus-line", Static)
        lines = shown(line).splitlines()[:line.size.height]  # what fits in the widget
        text = " ".join(lines)
        assert "…" not in text, text
        assert len(re.findall(r"[+-]\d*\.\d\d", text)) == 8, text  # 3 × (A, B) + OV, QK


@pytest.mark.parametrize("cmap", sorted(COLORMAPS))
def test_graph_edges_in_256_colours_are_palette_entries_monotone_in_strength(cmap: str) -> None:
    """Edges of rising strength, each on its own row: the colours emitted for their braille
    cells are xterm entries ≥ 16 (never left to Rich to quantise), from the theme's ramp, and
    their L* moves one way from the zero stop as the strength rises (as the heatmap's do)."""
    from headscope.tui.plots.figures import Graph

    c = colours(cmap, "256")
    strengths = np.linspace(0.05, 0.5, 6)
    edges = tuple((0, h, 1, h, float(s)) for h, s in enumerate(strengths))
    text = build(Graph(2, 6, edges, "K", vmin=0.05, vmax=0.5, labels=0), 60, 30, c)
    ramp = set(palette_ramp(c.stops))
    braille = [s for s in text.spans if isinstance(s.style, Style) and s.style.color is not None
               and all("\u2800" <= ch <= "\u28ff" for ch in text.plain[s.start:s.end])]
    assert braille
    for span in braille:
        assert span.style.color.type == ColorType.EIGHT_BIT and span.style.color.number in ramp
    graph = Graph(2, 6, edges, vmin=0.05, vmax=0.5)
    emitted = [graph.edge_colour(float(s), c) for s in strengths]
    zero = lightness(xterm_rgb(palette_ramp(c.stops)[len(palette_ramp(c.stops)) // 2]))
    away = [abs(lightness(rgb) - zero) for rgb in emitted]
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(away)), away
    assert len(set(emitted)) > 2  # strength is visible: several entries, not one


@pytest.mark.parametrize("cmap", sorted(COLORMAPS))
def test_spectrum_dots_and_edge_diff_in_256_colours_are_palette_entries(cmap: str) -> None:
    """Single marks in the colour map's end colours (eigenvalue dots by the sign of Re λ, lost
    and gained edges of the compare diff) are the 256-colour ramp's end entries, the colours
    of the heatmaps' strongest cells; the diff's "changed" edges are the muted colour's nearest
    entry. None of them is left to Rich to quantise."""
    from headscope.tui.plots.colormap import nearest_entry
    from headscope.tui.plots.figures import EdgeDiff, Scatter

    c = colours(cmap, "256")
    ramp = palette_ramp(c.stops)

    def marks(text: Text, chars: str) -> dict[str, set[Any]]:
        out: dict[str, set[Any]] = {}
        for span in text.spans:
            part = text.plain[span.start:span.end]
            if isinstance(span.style, Style) and span.style.color is not None and part \
                    and all(ch in chars for ch in part):
                out.setdefault(part[0], set()).add(span.style.color)
        return out

    dots = build(Scatter(np.array([0.5, -0.5]), np.array([0.0, 0.3]), "OV"), 40, 16, c)
    found = {col for cols in marks(dots, "•").values() for col in cols}
    assert {col.type for col in found} == {ColorType.EIGHT_BIT}
    assert {col.number for col in found} == {ramp[0], ramp[-1]}

    edges = (("lost", 0, 0, 1, 0, 0.3, 0.0), ("gained", 0, 1, 1, 1, 0.0, 0.3),
             ("changed", 0, 2, 1, 2, 0.2, 0.25))
    diff = build(EdgeDiff(2, 3, edges, "K diff", labels=0), 50, 16, c)
    braille = "".join(chr(i) for i in range(0x2800, 0x2900)) + "━"
    found = {col for cols in marks(diff, braille).values() for col in cols}
    assert {col.type for col in found} == {ColorType.EIGHT_BIT}
    assert {col.number for col in found} == {ramp[0], ramp[-1], nearest_entry(MUTED)}
