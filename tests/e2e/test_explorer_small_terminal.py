"""The explorer at 80×24, the size most SSH sessions open at, and in 256 colours (issue #28).

The heatmap checks read the rendered cells (their palette entries), not the figure's data;
the colour check reads what the app would write to the terminal after each action.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import textual.constants
from rich.style import Style
from rich.text import Text
from textual.widgets import DataTable

from headscope.engine.core.requests import AblationRequest, AblationSweepRequest, ScoreNullRequest
from headscope.tui.app import HeadscopeApp
from headscope.tui.base.settings import Settings, default_export_dir
from headscope.tui.plots.colormap import bins, palette_ramp, ramp_index
from headscope.tui.screens.path import PathScreen
from headscope.tui.session.export import saved_where
from headscope.tui.widgets.chart import Chart
from tests.conftest import INDUCTION_HEAD, notified, sample_model
from tests.tui.test_app import make_app, settle, wait_until

ROOT = Path(__file__).resolve().parents[2]
TRUECOLOR = re.compile(r"\x1b\[[0-9;]*?[34]8;2;")


@pytest.fixture(autouse=True)
def _quiet_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HEADSCOPE_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("HEADSCOPE_OUTPUT_DIR", str(tmp_path / "out"))


def heatmap_cells(text: Text) -> list[list[int | None]]:
    """The palette entry of every cell of a 256-colour heatmap, row by row (the characters
    between the y axis and the right frame of each canvas line)."""
    lines = text.plain.split("\n")
    starts = np.cumsum([0] + [len(line) + 1 for line in lines])
    entry: dict[int, int] = {}
    for span in text.spans:
        style = span.style
        if isinstance(style, Style) and style.color is not None and style.color.number is not None:
            for k in range(span.start, span.end):
                entry[k] = style.color.number
    grid = []
    for i, line in enumerate(lines):
        if "█" not in line:
            continue
        left = line.index("┤") + 1 if "┤" in line[:12] else line.index("│") + 1
        right = line.index("│", left)
        grid.append([entry.get(int(starts[i]) + k) for k in range(left, right)])
    return grid


async def test_the_ov_diagonal_of_the_induction_head_is_bright_at_80x24() -> None:
    """Pooled by block means, attn-only-2l L1.H2's 24×24 OV circuit came out grey at 80×24
    (entries 234–237): each cell now keeps its block's signed extreme, so every cell that
    holds a bright diagonal entry is in the top quarter of the ramp (+vmax/2 … +vmax)."""
    app = HeadscopeApp(sample_model("attn-only-2l"), settings=Settings(), debounce=0.01,
                       sweep=False, head=INDUCTION_HEAD, colors="256")
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, app.model_ready.is_set, "the model", limit=1200)
        await pilot.press("2")
        await settle(pilot, app)
        chart = app.explorer.query_one("#ov-heatmap", Chart)
        await wait_until(pilot, lambda: chart.rendered is not None, "the OV heatmap")
        text = chart.rendered
        assert "largest |value|" in text.plain
        # the shape README.md's tour quotes for 80×24
        quoted = re.search(r"`(pooled 24×24→\d+×\d+)`", (ROOT / "README.md").read_text())
        assert quoted and quoted.group(1) in text.plain, text.plain
        ramp = palette_ramp(chart.colours().stops)
        top_quarter = set(ramp[12:]) - set(ramp[:12])  # positions 12…16 of −8…+8
        grid = heatmap_cells(text)
        n_rows, n_cols = len(grid), len(grid[0])
        assert n_rows < 24 and all(len(row) == n_cols for row in grid)
        r0, r1 = bins(24, n_rows)
        c0, c1 = bins(24, n_cols)
        # the diagonal entries that are bright themselves (23 of 24: <bos>, never in the
        # training text, copies nothing, -0.16 of the range; shown unpooled in its own
        # column since the columns use the width, it is rightly not bright)
        values = np.asarray(chart.figure.values)
        vmax = np.abs(values).max()
        bright = {k for k in range(24) if ramp_index(values[k, k], vmax) >= 12}
        assert len(bright) >= 23
        diagonal = [(i, j) for i in range(n_rows) for j in range(n_cols)
                    if any(r0[i] <= k < r1[i] and c0[j] <= k < c1[j] for k in bright)]
        assert len(diagonal) >= n_rows
        dim = [(i, j, grid[i][j]) for i, j in diagonal if grid[i][j] not in top_quarter]
        assert dim == [], dim


async def test_256_colours_never_become_truecolor_codes(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Everything the app writes in 256-colour mode is 256-colour codes, after theme cycling,
    raw/processed toggles, resizes, the virtual-heads pop-up and a screenshot. The screenshot
    was the cause: Textual's export renders the screen through a truecolor console, Rich
    caches the codes on each Style, and Textual's output reused them (38;2;… in 256 mode)."""
    monkeypatch.setattr(textual.constants, "COLOR_SYSTEM", "256")  # the app's console
    app, _ = make_app(colors="256", output_dir=tmp_path)

    def written() -> str:
        # what the driver writes for a full repaint (App._display renders the same update)
        update = app.screen._compositor.render_update(full=True)
        return update.render_segments(app.console)

    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        assert app.console.color_system == "256"

        async def check(what: str) -> None:
            # a screenshot of the new state before the terminal output has drawn it (the
            # headless app draws nothing itself): the order that poisoned the styles
            await settle(pilot, app)
            await pilot.press("s")
            await settle(pilot, app)
            out = written()
            assert "38;5;" in out and not TRUECOLOR.search(out), what

        await check("start")
        for keys, what in [("2", "OV tab"), ("t", "theme"), ("t", "theme 2"), ("r", "raw"),
                           ("r", "processed"), ("1", "QK tab"), ("3", "spectrum"),
                           ("4", "prompt"), ("6", "summary")]:
            await pilot.press(keys)
            await check(what)
        await pilot.resize_terminal(120, 40)
        await check("resized to 120×40")
        await pilot.press("5")
        await settle(pilot, app)
        app.explorer.query_one("#comp-edges", DataTable).focus()
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, PathScreen), "the virtual heads")
        await settle(pilot, app)
        app.action_screenshot_svg()  # the pop-up has its own keys: the app's action
        await settle(pilot, app)
        assert not TRUECOLOR.search(written()), "virtual heads"
        await pilot.press("escape")
        await pilot.resize_terminal(80, 24)
        await check("back at 80×24")
        assert list(tmp_path.glob("*.svg"))


async def test_saves_say_where_and_follow_the_output_dir_setting(tmp_path: Path) -> None:
    """`s` and `e` wrote into the current directory (after `make run`, the checkout) and said
    only the path. The output_dir setting (config.toml, $HEADSCOPE_OUTPUT_DIR) is honoured and
    the notification names the directory and how to change it."""
    out = tmp_path / "chosen"
    app, _ = make_app(settings=Settings(output_dir=str(out)))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        assert app.output_dir() == out.resolve()
        await pilot.press("s", "e")
        await settle(pilot, app)
        saved = sorted(p.suffix for p in out.iterdir())
        assert saved == [".json", ".svg"]
        messages = [n.message for n in notified(app)]
        for suffix in (".svg", ".json"):
            (name,) = [p.name for p in out.iterdir() if p.suffix == suffix]
            assert any(name in m and f"{out.resolve()}/" in m and "output directory" in m
                       for m in messages), messages
            # the name on a line of its own: the toast wraps at spaces, never inside it
            assert any(name in m.splitlines() for m in messages), messages


async def test_saves_go_to_the_documented_export_folder_not_the_current_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an output_dir, `s` and `e` wrote into the current directory (after `make run`
    the git checkout: `?? headscope_…svg`); now $XDG_DATA_HOME/headscope/exports."""
    cwd, data = tmp_path / "checkout", tmp_path / "data"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("HEADSCOPE_OUTPUT_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(data))
    app, _ = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await pilot.press("s", "e")
        await settle(pilot, app)
    assert list(cwd.iterdir()) == []
    exports = data / "headscope" / "exports"
    assert sorted(p.suffix for p in exports.iterdir()) == [".json", ".svg"]


def test_default_export_dir_follows_xdg_data_home_else_the_home(tmp_path: Path) -> None:
    assert default_export_dir({"XDG_DATA_HOME": "/srv/data"}) == Path("/srv/data/headscope/exports")
    assert default_export_dir({}) == Path.home() / ".local/share/headscope/exports"


def test_the_toast_shortens_the_home_and_keeps_name_and_folder_apart(tmp_path: Path) -> None:
    home = tmp_path / "home"
    text = saved_where(home / ".local/share/headscope/exports/headscope_m_qk_L0H0.svg", home)
    assert text.splitlines()[:2] == ["headscope_m_qk_L0H0.svg",
                                     "in ~/.local/share/headscope/exports/"]


def test_the_output_dir_setting_is_read_from_the_file_and_the_environment(tmp_path: Path) -> None:
    from headscope.engine.core.errors import ConfigError
    from headscope.tui.base.settings import load_settings

    config = tmp_path / "config.toml"
    config.write_text('output_dir = "/srv/shots"\n')
    assert load_settings({"HEADSCOPE_CONFIG": str(config)}).output_dir == "/srv/shots"
    env = {"HEADSCOPE_CONFIG": str(config), "HEADSCOPE_OUTPUT_DIR": "/tmp/x"}
    assert load_settings(env).output_dir == "/tmp/x"
    config.write_text("output_dir = 3\n")
    with pytest.raises(ConfigError, match="output_dir"):
        load_settings({"HEADSCOPE_CONFIG": str(config)})


async def test_a_filter_marks_the_focused_head_that_fails_it() -> None:
    """Under the previous-token filter the focused head showed `H2 0.02 z=-6.4` like a match;
    it stays (filtering never moves the focus), marked `focus`, its score struck through."""
    from headscope.tui.session.choices import TREE_FILTERS
    from headscope.tui.widgets.head_tree import HeadTree

    app, _ = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        tree = app.query_one(HeadTree)
        seen = 0
        for _ in range(len(TREE_FILTERS)):
            await pilot.press("f")
            await settle(pilot, app)
            for head, node in tree.head_nodes.items():
                label = node.label
                if head == app.explorer.head and not tree.meets(head):
                    seen += 1
                    assert label.plain.endswith(" focus"), label.plain
                    assert "z=" not in label.plain
                    assert any("strike" in str(span.style) for span in label.spans)
                else:
                    assert "focus" not in label.plain
        assert seen, "the focused head met every filter: pick another"


async def test_stored_ablation_effects_show_in_the_summary_without_a() -> None:
    """Effects already in the results store showed as `—` in the Summary until `a`."""
    from headscope.tui.base.labels import ABLATION

    app, engine = make_app()
    engine.stored_ablation = True
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await pilot.press("6")
        await settle(pilot, app)
        assert engine.calls["all_ablation_effects"] == 0  # nothing swept
        assert app.explorer.scores.ablation is not None
        table = app.query_one("#summary-table", DataTable)
        column = list(table.columns).index(ABLATION)
        cells = [str(table.get_row_at(r)[column]) for r in range(table.row_count)]
        assert len(cells) == 8 and not any("—" in c for c in cells), cells
        expected = {f"{await engine.get(AblationRequest.of(engine.structure, layer, head)):+.3f}" for layer in range(2)
                    for head in range(4)}
        assert {c.strip() for c in cells} == expected
        assert "press a" not in str(app.query_one("#summary-hint").render())


async def test_the_real_engine_reads_stored_ablation_effects(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from headscope.engine.api.model import open_model
    from headscope.engine.api.report import head_table
    from headscope.engine.service.engine import Engine
    from headscope.engine.sweeps.store import ResultStore

    store = ResultStore(tmp_path / "store")
    path = sample_model("attn-only-2l")
    engine = Engine(path, workers=1, prefetch=False, store=store)
    await engine.ready()
    try:
        assert await engine.get(AblationSweepRequest(stored_only=True)) is None
    finally:
        await engine.aclose()
    rows = head_table(open_model(path), ablation=True, store=store)
    engine = Engine(path, workers=1, prefetch=False, store=store)
    await engine.ready()
    try:
        effects = await engine.get(AblationSweepRequest(stored_only=True))
    finally:
        await engine.aclose()
    assert effects is not None
    for r in rows:
        assert effects[r["layer"], r["head"]] == pytest.approx(r["ablation_effect"], abs=1e-6)


async def test_qk_and_spectrum_use_the_width_at_80x24() -> None:
    """QK: the token heatmap and the positional QK side by side (the positional one was
    hidden and ~35 columns left blank). Spectrum: the two plots side by side, each with a
    canvas tall enough that the real axis is the row labelled 0.0 (stacked, each had two
    rows), and the title's score whole."""
    app, _ = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        token = app.explorer.query_one("#qk-token", Chart)
        position = app.explorer.query_one("#qk-position", Chart)
        assert position.display and position.region.width >= 25
        assert position.region.x >= token.region.right
        assert "positional QK" in position.rendered.plain
        await pilot.press("3")
        await settle(pilot, app)
        for chart_id in ("spectrum-ov", "spectrum-qk"):
            chart = app.explorer.query_one(f"#{chart_id}", Chart)
            lines = chart.rendered.plain.splitlines()
            canvas = [line for line in lines if "┤" in line or "├" in line or
                      (line.lstrip().startswith("│") and "┬" not in line)]
            assert len(canvas) >= 9, lines
            zero = [line for line in lines if "├" in line]  # the axis line through Im 0
            assert len(zero) == 1 and zero[0].split("├")[0].strip() == "0.0", lines
            label = "copying" if chart_id == "spectrum-ov" else "QK positivity"
            assert re.search(rf"{label} [+-]\d\.\d{{3}}", " ".join(lines)), lines


async def test_focus_is_drawn_and_comes_back_with_its_tab() -> None:
    """The focused pane has a heavy frame; after `5`, `tab` to the edge list, `1` and `5`
    again, the edge list has focus (it was nowhere, so `tab` went to the tree and `enter`
    did nothing until a second `tab`)."""
    from headscope.tui.widgets.head_tree import HeadTree

    app, _ = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        tree = app.query_one(HeadTree)
        edges = app.explorer.query_one("#comp-edges", DataTable)
        assert app.focused is tree and tree.styles.border.top[0] == "heavy"
        await pilot.press("5", "tab")
        await settle(pilot, app)
        assert app.focused is edges and edges.styles.border.top[0] == "heavy"
        assert tree.styles.border.top[0] == "round"
        await pilot.press("1")
        await settle(pilot, app)
        assert app.focused is tree  # never a hidden widget
        await pilot.press("5")
        await settle(pilot, app)
        assert app.focused is edges
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, PathScreen), "the virtual heads")


def canvas(chart: Chart) -> tuple[int, int]:
    """(rows, columns) of cells a heatmap chart draws, read from its rendered text."""
    grid = heatmap_cells(chart.rendered)
    assert grid and all(len(row) == len(grid[0]) for row in grid)
    return len(grid), len(grid[0])


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_hiding_the_directions_panel_gives_its_room_to_the_heatmaps(
        size: tuple[int, int]) -> None:
    """`v` hid the directions panel and the heatmaps stayed as they were: height-bound with
    square cells, the OV heatmap at 80×24 was 6×12 cells in a 31-column canvas. A grid
    bound by the height now widens its cells into the width (up to twice square), so the
    room the panel leaves goes to the heatmaps: read from the rendered cells, before and
    after `v`."""
    app, _ = make_app()
    async with app.run_test(size=size) as pilot:
        await settle(pilot, app)
        narrow = size[0] < 100
        views = {}
        for tab, ids in (("2", ("ov-heatmap",)), ("1", ("qk-token", "qk-position"))):
            await pilot.press(tab)
            for shown in (not narrow, narrow):  # the panel as it starts, then after v
                await settle(pilot, app)
                assert app.explorer.directions_visible == shown
                for chart_id in ids:
                    chart = app.explorer.query_one(f"#{chart_id}", Chart)
                    if chart.display and chart.region.width:
                        await wait_until(pilot, lambda c=chart: c.rendered is not None, chart_id)
                        views[chart_id, shown] = (canvas(chart), chart.figure.values.shape,
                                                  chart.rendered.plain.splitlines())
                await pilot.press("v")  # (twice in all: back to the start)
        ov_on, ov_off = views["ov-heatmap", True], views["ov-heatmap", False]
        (rows_on, cols_on), (rows_off, cols_off) = ov_on[0], ov_off[0]
        n_rows, n_cols = ov_off[1]
        if narrow:
            # the panel's side column (34) gives way to the top outputs (22): 12 columns more
            assert rows_off >= rows_on and cols_off > cols_on, (ov_on[0], ov_off[0])
            # every column shown (the rows pooled: 6 of 24), entries twice square at most
            assert cols_off == n_cols and rows_off < n_rows, "\n".join(ov_off[2])
            assert cols_off / n_cols <= 2 * 2 * rows_off / n_rows
            # with the panel shown, the narrower canvas reaches the chart's right edge
            assert any(line.endswith("┘") for line in ov_on[2]), ov_on[2]
            # QK: without the panel the positional QK comes back beside the token heatmap
            assert ("qk-position", False) in views and ("qk-position", True) not in views
            token_on, token_off = views["qk-token", True][0], views["qk-token", False][0]
            assert token_off[1] >= token_on[1]
        else:
            # 120×40: the panel sits under the side lists; the OV heatmap is unpooled at one
            # row per entry either way, and the positional QK takes the height it leaves
            assert (rows_on, cols_on) == (rows_off, cols_off) == (n_rows, 2 * n_cols)
            pos_on, pos_off = views["qk-position", True][0], views["qk-position", False][0]
            assert pos_off[0] > pos_on[0] and pos_off[1] >= pos_on[1], (pos_on, pos_off)
            assert views["qk-token", False][0] == views["qk-token", True][0]


async def _tabs_on_screen(pilot: object, app: HeadscopeApp) -> list[str]:
    """The tab strip's labels, each checked to lie whole inside the strip (not scrolled)."""
    from textual.widgets import TabbedContent
    from textual.widgets._tabbed_content import ContentTabs
    from textual.widgets._tabs import Tab

    strip = app.explorer.query_one("#tabs", TabbedContent).query_one(ContentTabs)
    assert strip.scroll_x == 0
    labels = []
    for tab in strip.query(Tab):
        if not tab.display:
            continue
        label = str(tab.label)
        assert strip.region.x <= tab.region.x and tab.region.right <= strip.region.right, label
        assert tab.region.width >= len(label) + 1, label
        labels.append(label)
    return labels


@pytest.mark.parametrize("mode", ["plain", "compare"])
async def test_every_tab_is_on_screen_at_80_columns(mode: str) -> None:
    """With the `9 Patch` tab the strip overflowed 80 columns (`9` cut, and with `5` active
    `1 QK` scrolled off): below 100 columns the long names are shortened and each tab has
    one column of padding, so every tab number and name stays on screen, on every tab."""
    from headscope.tui.screens.explorer import SHORT_TAB_TITLES, TAB_TITLES

    if mode == "compare":
        from tests.tui.widgets.test_compare import fake_pair

        app, _, _ = fake_pair()
        keys = "123456790"
    else:
        app, _ = make_app()
        keys = "12345690"
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        for key in keys:
            await pilot.press(key)
            await settle(pilot, app)
            labels = await _tabs_on_screen(pilot, app)
            assert [label.split()[0] for label in labels] == list(keys), labels
            assert set(labels) <= set(SHORT_TAB_TITLES.values())
        await pilot.resize_terminal(120, 40)  # wide again: the full names
        await settle(pilot, app)
        labels = await _tabs_on_screen(pilot, app)
        assert set(labels) <= set(TAB_TITLES.values()) and "5 Composition" in labels
    # timeline mode (8 Time instead of 7 Changes) is narrower than compare mode's strip
    timeline = [SHORT_TAB_TITLES[t] for t in SHORT_TAB_TITLES if t != "changes"]
    changes = [SHORT_TAB_TITLES[t] for t in SHORT_TAB_TITLES if t != "timeline"]
    assert sum(len(t) + 1 for t in timeline) <= sum(len(t) + 1 for t in changes) <= 80 - 18


def screen_lines(app: HeadscopeApp) -> list[str]:
    """The screen as the terminal shows it, one string per row (the top screen over the
    ones below it, as a screenshot renders it)."""
    import io

    from rich.console import Console

    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True,
                      color_system=None, record=True, legacy_windows=False)
    console.print(app.screen._compositor.render_update(
        full=True, screen_stack=app._background_screens))
    return console.export_text().splitlines()


async def test_the_summary_fits_80_columns_without_scrolling_sideways() -> None:
    """At 80×24 the Summary's nine columns (head, seven scores, zero-abl) were 86 columns
    wide in a 58-column table: it scrolled sideways and `sink`, `delim-sink` and `zero-abl`
    were off-screen. Below 100 columns the headers are the short labels, the cells carry
    their own separating space (no cell padding), the scores show two decimals and their
    z's the bare number under them: every column fits, sorted by the widest header too."""
    from headscope.tui.base.labels import ABLATION, ABLATION_SHORT, SCORES, SHORT, z_text

    app, engine = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await pilot.press("a")  # the ablation column filled, the rows sorted by it
        await settle(pilot, app)
        table = app.query_one("#summary-table", DataTable)
        null = await engine.get(ScoreNullRequest())
        for sort in (ABLATION, "delimiter_sink_score"):  # the widest header: "delim ▼"
            app.explorer.sort_summary(sort)
            await settle(pilot, app)
            assert list(table.columns) == ["head", *(k for k, _ in SCORES), ABLATION]
            widths = [c.get_render_width(table) for c in table.columns.values()]
            inside = table.scrollable_content_region.width
            assert sum(widths) <= inside, (widths, inside)
            assert table.max_scroll_x == 0 and table.virtual_size.width <= inside
            short = ["head", *(SHORT[k] for k, _ in SCORES), ABLATION_SHORT]
            assert [str(c.label).strip() for c in table.columns.values()] == [
                label + (" ▼" if key == sort else "")
                for key, label in zip(table.columns, short, strict=True)]
            # readable: every cell's value (and z) with a space before it, none cut
            for i in range(table.row_count):
                row = table.get_row_at(i)
                layer, head = (int(x) for x in str(row[0])[1:].split(".H"))
                scores = engine._scores(layer, head)
                for (key, _), cell in zip(SCORES, row[1:-1], strict=True):
                    value = getattr(scores, key)
                    z = null.head_z(key, layer, value)
                    assert str(cell).split("\n") == [f" {value:+.2f}",
                                                     " " + z_text(z).removeprefix("z=")]
                assert str(row[-1]).strip() == f"{await engine.get(AblationRequest.of(engine.structure, layer, head)):+.3f}"
        hint = str(app.query_one("#summary-hint").render())
        assert hint.startswith(f"{ABLATION_SHORT}: loss increase"), hint
        # 120×40 as before: the long labels, padded cells, three decimals and z=…
        await pilot.resize_terminal(120, 40)
        await settle(pilot, app)
        labels = [str(c.label) for c in table.columns.values()]
        assert labels == ["head", *(label for _, label in SCORES[:-1]), "delim-sink ▼",
                          "zero-abl"]
        assert table.cell_padding == 1
        row = table.get_row_at(0)
        layer, head = (int(x) for x in str(row[0])[1:].split(".H"))
        value = engine._scores(layer, head).copying_score
        assert str(row[1]) == f"{value:+.3f}\n{z_text(null.head_z('copying_score', layer, value))}"


async def open_virtual_heads(pilot: object, app: HeadscopeApp) -> PathScreen:
    """Tab 5, enter on the edge list's first edge: the virtual-heads pop-up, drawn."""
    await pilot.press("5")  # type: ignore[attr-defined]
    await settle(pilot, app)
    app.explorer.query_one("#comp-edges", DataTable).focus()
    await pilot.press("enter")  # type: ignore[attr-defined]
    await wait_until(pilot, lambda: isinstance(app.screen, PathScreen), "the virtual heads")
    await settle(pilot, app)
    screen = app.screen
    assert isinstance(screen, PathScreen)
    for chart_id in ("path-heatmap", "path-spectrum"):
        chart = screen.query_one(f"#{chart_id}", Chart)
        await wait_until(pilot, lambda c=chart: c.rendered is not None, chart_id)
    await settle(pilot, app)
    return screen
