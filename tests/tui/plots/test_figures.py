"""Colour maps, pooling and plotext figures of the explorer (pure functions, no app)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from rich.console import Console

from headscope.themes import COLORMAPS, THEMES, colormap_for
from headscope.tui.plots.colormap import (
    diverging_rgb,
    fit_shape,
    pool_extreme,
    resample,
)
from headscope.tui.plots.figures import Colours, Graph, Heatmap, Scatter, build, diagonal_summary

STOPS = COLORMAPS["red-blue"]
COLOURS = Colours((200, 200, 200), (120, 120, 120), (255, 170, 0), (90, 170, 255), STOPS)


def test_pooling_keeps_a_diagonal_bright() -> None:
    """A 24×24 identity pooled to 7×7: block means give 1/3-ish, the extreme keeps 1."""
    pooled = pool_extreme(np.eye(24) - 0.05, 7, 7)
    assert np.allclose(np.diag(pooled), 0.95)
    assert resample(np.eye(24) - 0.05, 7, 7).diagonal().max() < 0.5


def _canvas_colours(text, width: int) -> list[list[tuple[int, int, int]]]:
    """The colour of every █ cell, row by row, read back from the rendered ANSI."""
    console = Console(color_system="truecolor", width=width + 5, force_terminal=True)
    with console.capture() as cap:
        console.print(text, crop=False, soft_wrap=True)
    rows = []
    for line in cap.get().splitlines():
        cells = []
        for r, g, b, blocks in re.findall(r"38;2;(\d+);(\d+);(\d+)(?:;[\d;]*)?m(█+)", line):
            cells += [(int(r), int(g), int(b))] * len(blocks)
        if cells:
            rows.append(cells)
    return rows


def test_heatmap_draws_every_entry_in_place_without_overwriting() -> None:
    """Entry (i, j) fills its own k × 2k block of cells in its own colour (no cell lost)."""
    rng = np.random.default_rng(0)
    v = rng.normal(size=(6, 9))
    width, height = 60, 20
    text = build(Heatmap(v, tuple("abcdef"), tuple("ABCDEFGHI"), title="t", xlabel="x"),
                 width, height, COLOURS)
    assert len(text.plain.splitlines()) <= height
    assert all(len(line) <= width for line in text.plain.splitlines())
    ch, cw = fit_shape(6, 9, height - 6, width - 3)
    k, kw = ch // 6, cw // 9  # every entry k rows by kw columns (2k … 4k)
    assert ch == 6 * k and cw == 9 * kw and 2 * k <= kw <= 4 * k
    expected = diverging_rgb(v, STOPS)
    grid = _canvas_colours(text, width)[:ch]
    assert len(grid) == ch and all(len(row) == cw for row in grid)
    for i in range(ch):
        for j in range(cw):
            assert grid[i][j] == tuple(int(x) for x in expected[i // k, j // kw])


def test_heatmap_pools_big_matrices_and_says_so() -> None:
    v = np.zeros((200, 200))
    np.fill_diagonal(v, 1.0)
    text = build(Heatmap(v, tuple(map(str, range(200))), tuple(map(str, range(200))),
                         diagonal=True), 80, 30, COLOURS)
    assert "pooled 200×200→" in text.plain
    assert len(text.plain.splitlines()) <= 30


def test_diagonal_summary_counts_rows_peaking_on_the_diagonal() -> None:
    v = -np.ones((5, 5))
    v[np.arange(4), np.arange(4)] = 3.0  # 4 of 5 rows peak on the diagonal
    s = diagonal_summary(v)
    assert "4/5 rows peak on diag" in s
    assert "diag +2.2" in s  # (4·3 − 1)/5


def test_scatter_and_graph_render_at_the_requested_size() -> None:
    ev = np.array([1 + 2j, 1 - 2j, -0.5, 3.0])
    text = build(Scatter(ev.real, ev.imag, "full OV λ · copying +0.5"), 50, 18, COLOURS)
    lines = text.plain.splitlines()
    assert len(lines) == 18 and "copying +0.5" in lines[0]
    assert text.plain.count("•") >= 3  # the conjugate pair and the real ones (may overlap)
    g = build(Graph(3, 4, ((0, 1, 1, 2, 0.4), (1, 0, 2, 3, 0.1)), "K", selected=(0, 1, 1, 2)),
              60, 16, COLOURS)
    assert "L0" in g.plain and "L2" in g.plain and g.plain.count("●") >= 12


def test_scatter_overlays_model_b_with_a_legend_and_a_shared_range() -> None:
    a = np.array([1.0 + 0j, 0.5 + 0j])
    b = np.array([-4.0 + 0j])  # B's range must widen the axes, not fall off them
    text = build(Scatter(a.real, a.imag, "λ", bx=b.real, by=b.imag), 50, 18, COLOURS).plain
    assert "x" in text.replace("xx B", "") and "B" in text and "A" in text
    assert "-4" in text or "-4.2" in text  # axis ticks reach B's eigenvalue
    only_a = build(Scatter(a.real, a.imag, "λ"), 50, 18, COLOURS).plain
    assert " B" not in only_a and "-4" not in only_a


def test_every_theme_names_a_known_colour_map() -> None:
    for theme in THEMES:
        assert colormap_for(theme.name) in COLORMAPS
    assert colormap_for("textual-dark") in COLORMAPS


async def test_a_figure_that_fails_to_draw_says_so_instead_of_rendering_forever() -> None:
    from textual.app import App, ComposeResult

    from headscope.tui.widgets.chart import Chart

    class Broken:
        def draw(self, width: int, height: int, colours: Colours):
            raise ValueError("bad data")

    class OneChart(App):
        def compose(self) -> ComposeResult:
            yield Chart(id="c")

    app = OneChart()
    async with app.run_test(size=(60, 20)) as pilot:
        chart = app.query_one(Chart)
        chart.show(Broken())
        for _ in range(400):  # until the build (a worker thread) has finished, not a fixed delay
            await pilot.pause(0.05)
            await app.workers.wait_for_complete()
            if chart.rendered is not None:
                break
        assert chart.rendered is not None and "cannot draw this figure" in chart.rendered.plain
        assert "bad data" in chart.rendered.plain


def test_a_heatmap_key_never_runs_past_the_chart() -> None:
    """The virtual-heads pop-up drew `… 24/24 rows peak` into the plot beside it
    (`peakIm λ`): a key part wider than the chart is wrapped at its spaces."""
    values = np.eye(24) + 0.01
    labels = tuple(f"t{i}" for i in range(24))
    for width in (30, 40, 45, 60):
        text = build(Heatmap(values, labels, labels, diagonal=True), width, 22, COLOURS).plain
        assert all(len(line) <= width for line in text.splitlines()), (width, text)
        assert "rows peak on diag" in " ".join(text.split())


@pytest.mark.parametrize("mode", ["truecolor", "256", "16", "none"])
def test_missing_cells_are_marked_not_drawn_as_zero(mode: str) -> None:
    """``Heatmap(missing="?")``: a NaN cell is the mark in the muted colour, named in the key;
    without it NaN keeps the zero colour (the heatmaps where NaN means "nothing there")."""
    import dataclasses

    from rich.color import Color

    colours = dataclasses.replace(COLOURS, mode=mode)
    values = np.array([[0.5, np.nan, -0.2], [0.1, 0.9, 0.0]])
    marked = Heatmap(values, ("L0", "L1"), ("H0", "H1", "H2"), missing="?").draw(60, 20, colours)
    assert "?" in marked.plain and "? no finite value" in marked.plain
    muted = Color.from_rgb(*COLOURS.muted)
    assert any(marked.plain[s.start:s.end].strip("?") == "" and s.style.color == muted
               for s in marked.spans if hasattr(s.style, "color"))
    plain = Heatmap(values, ("L0", "L1"), ("H0", "H1", "H2")).draw(60, 20, colours)
    assert "?" not in plain.plain
    finite = Heatmap(np.nan_to_num(values), ("L0", "L1"), ("H0", "H1", "H2"), missing="?").draw(60, 20, colours)
    assert "?" not in finite.plain


def test_the_graph_key_keeps_both_ends_in_a_narrow_graph() -> None:
    """Issue 39 §3: in the 26-column graph of 80×24 the key lost its strong end. Narrow, the
    words go, then the ramp shortens: both values always read in full."""
    graph = Graph(2, 3, ((0, 0, 1, 1, 0.087),), "K", vmin=0.044, vmax=0.087)
    assert graph.key(COLOURS, 80).plain == "weak +0.044 " + "━" * 12 + " +0.087 strong"
    for width in (26, 22, 17):
        key = graph.key(COLOURS, width).plain
        assert len(key) <= width and key.startswith("+0.044 ━") and key.endswith("━ +0.087"), key
    lines = build(graph, 26, 14, COLOURS).plain.splitlines()
    assert all(len(line) <= 26 for line in lines) and lines[-1].endswith("+0.087")


@pytest.mark.parametrize("mode", ["truecolor", "256", "16", "none"])
@pytest.mark.parametrize(("n", "size"), [(11, (56, 30)), (40, (36, 14))])
def test_the_cursor_cell_is_drawn_on_the_heatmap(mode: str, n: int, size: tuple[int, int]) -> None:
    """``Heatmap(mark=(q, k))`` (the Prompt tab's cell cursor; its chart at 80×24 and 120×40):
    one ◆ in the cells that draw entry (q, k), pooled or not, in a colour that stands out on
    the cell's own: palette codes only in 256 colours, inverted in 16 colours / none."""
    import dataclasses

    from rich.color import ColorType

    from headscope.tui.plots.colormap import source_index

    colours = dataclasses.replace(COLOURS, mode=mode)
    pattern = np.tril(np.random.default_rng(1).random((n, n)))
    pattern /= pattern.sum(1, keepdims=True)
    labels = tuple(f"t{i}" for i in range(n))
    mark = (n - 2, n // 3)
    text = Heatmap(pattern, labels, labels, sequential=True, vmax=1.0, mark=mark).draw(*size, colours)
    lines = text.plain.splitlines()
    top = next(i for i, line in enumerate(lines) if "┌" in line)
    bottom = next(i for i, line in enumerate(lines) if "└" in line)
    x0, x1 = lines[top].index("┌") + 1, lines[top].index("┐")
    ch, cw = bottom - top - 1, x1 - x0
    hits = [(r, c) for r in range(ch) for c in range(cw) if lines[top + 1 + r][x0 + c] == "◆"]
    assert hits and text.plain.count("◆") == len(hits)
    for r, c in hits:  # the entry (q, k) is in the block that canvas cell draws
        for axis, cell, cells in ((0, r, ch), (1, c, cw)):
            first = source_index(cell, n, cells)
            last = max(first + 1, source_index(cell + 1, n, cells)) if cell + 1 < cells else n
            assert first <= mark[axis] < last, (mode, n, size, (r, c))
    assert len({r for r, _ in hits}) * len({c for _, c in hits}) >= len(hits)
    offset = len("\n".join(text.plain.split("\n")[: top + 1 + hits[0][0]])) + 1 + x0 + hits[0][1]
    style = next(s.style for s in text.spans if s.start <= offset < s.end)
    assert style.bold
    if mode == "truecolor":
        assert style.color.type == style.bgcolor.type == ColorType.TRUECOLOR and style.color != style.bgcolor
    elif mode == "256":
        assert style.color.type == style.bgcolor.type == ColorType.EIGHT_BIT and style.color != style.bgcolor
    else:
        assert style.reverse
    unmarked = Heatmap(pattern, labels, labels, sequential=True, vmax=1.0).draw(*size, colours)
    assert "◆" not in unmarked.plain


def test_heatmap_x_label_takes_the_first_short_form_that_fits() -> None:
    """A chart too narrow for the x label draws its first shorter form that fits (at 80×24
    the OV label beside the directions panel was cut to "(rows: so…", losing what the rows
    are); wide enough, the full label; none fits: the last, cut."""
    values = np.eye(4)
    labels = ("a", "b", "c", "d")
    full, shorter, shortest = "output token →  (rows: source token)", "out →  (rows: source)", "src"

    def xlabel_line(width: int, short: tuple[str, ...]) -> str:
        text = build(Heatmap(values, labels, labels, xlabel=full, xlabel_short=short), width, 20, COLOURS)
        return text.plain.splitlines()[text.plain.splitlines().index(next(
            line for line in text.plain.splitlines() if line.startswith(("out", "src", "s…"))))]

    assert xlabel_line(60, (shorter, shortest)) == full
    assert xlabel_line(26, (shorter, shortest)) == shorter
    assert xlabel_line(20, (shorter, shortest)) == shortest
    assert xlabel_line(26, ()) == full[:25] + "…"  # no short form: cut as before
