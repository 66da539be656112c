"""The "why" view's pictures (tui/plots/why.py) on a real QK attribution: attn-only-2l's
induction head L1.H2 on a repeated random sequence, at the induction cell.

The selections (``top_terms``, ``top_totals``, ``strongest_sources``) are checked against a
full sort (``QKAttribution.ranked_terms``, numpy's ``argsort``): they are top-k partitions
for speed at 7B and must pick exactly what a sort would. The grid's cells are the heatmaps'
(``figures.cell_colours``), read back from the emitted styles in every colour mode.
"""

from __future__ import annotations

import dataclasses
import io
import re

import numpy as np
import pytest
from rich.color import ColorType
from rich.console import Console
from rich.style import Style
from rich.text import Text

from headscope.engine.core.attribution import QKAttribution
from headscope.engine.forward.behaviour import repeated_tokens
from headscope.engine.forward.qk_attribution import qk_attribution
from headscope.engine.model.loading import load_model
from headscope.themes import COLORMAPS
from headscope.tui.plots.colormap import NEG_GLYPHS, diverging_rgb, palette_ramp, symmetric_range
from headscope.tui.plots.figures import Colours
from headscope.tui.plots.why import (
    TermGrid,
    bar_styles,
    cell_at,
    num,
    source_head,
    strongest_sources,
    term_grid,
    top_terms,
    top_totals,
)
from headscope.tui.widgets.bars import signed_bar
from tests.conftest import INDUCTION_HEAD, PREV_TOKEN_HEAD, sample_model

HALF = 20  # the repeated sequence: 20 random tokens twice
QUERY = 25  # in the second copy
KEY = QUERY - HALF + 1  # the token after the query token's first occurrence: the induction cell
TRUECOLOR = re.compile(r"\x1b\[[0-9;]*?[34]8;2;")


def colours(mode: str, cmap: str = "red-blue") -> Colours:
    return Colours((200, 200, 200), (128, 128, 128), (255, 170, 0), (90, 170, 255),
                   COLORMAPS[cmap], mode)


@pytest.fixture(scope="module")
def row() -> QKAttribution:
    model = load_model(sample_model("attn-only-2l"))
    tokens = repeated_tokens(model.cfg.d_vocab, model.cfg.n_ctx, seed=0, seq_len=HALF,
                             batch=1)[0].tolist()
    return qk_attribution(model.weights, tokens, *INDUCTION_HEAD, QUERY)


def test_top_terms_are_the_sorted_terms_and_the_rest_adds_up_to_the_score(row: QKAttribution) -> None:
    for key in (0, KEY, QUERY):
        for top in (1, 5, 12, len(row.names) ** 2):
            rows, rest, rest_sum = top_terms(cell_at(row, key), top)
            assert rows == row.ranked_terms(key, top)  # the engine's full sort
            assert rest == len(row.names) ** 2 - len(rows)
            score = float(row.score[row.column(key)])
            assert sum(v for _, _, v in rows) + rest_sum == pytest.approx(
                score, abs=1e-4 * np.abs(row.terms).max())


def synthetic(terms: np.ndarray) -> QKAttribution:
    """A row of ``terms`` [n, n, keys] under made-up names (what the selections read)."""
    n, _, k = terms.shape
    return QKAttribution(layer=3, head=0, query=k - 1, keys=tuple(range(k)),
                         names=tuple(f"c{i}" for i in range(n)),
                         score=terms.sum((0, 1)).astype(np.float32), terms=terms,
                         query_totals=terms.sum(1, dtype=np.float64),
                         key_totals=terms.sum(0, dtype=np.float64),
                         nonfinite=not np.isfinite(terms).all())


def test_top_terms_search_only_some_rows_yet_match_a_full_sort() -> None:
    """The pruned search (rows whose maximum can reach the top) against argsort of all n²,
    with many ties (values on a coarse grid) and with a NaN term (listed first)."""
    rng = np.random.default_rng(1)
    terms = np.round(rng.normal(size=(60, 60, 2)) * 3).astype(np.float32)  # ties galore
    terms[:, :, 1] *= np.exp(rng.normal(size=(60, 1)) * 2)  # a few rows dominate
    for j in (0, 1):
        flat = terms[:, :, j].ravel()
        for top in (1, 3, 12, 59, 60, 61, 500, 3600):
            expected = np.argsort(-np.abs(flat), kind="stable")[:top]
            rows, _, _ = top_terms(cell_at(synthetic(terms), j), top)
            assert [(q, k) for q, k, _ in rows] == [
                (f"c{i // 60}", f"c{i % 60}") for i in expected.tolist()], (j, top)
    terms[7, 9, 0] = np.nan
    rows, _, _ = top_terms(cell_at(synthetic(terms), 0), 3)
    assert rows[0][:2] == ("c7", "c9") and np.isnan(rows[0][2])


def test_key_side_totals_name_the_previous_token_head_first(row: QKAttribution) -> None:
    rows, rest, rest_sum = top_totals(cell_at(row, KEY), "key", 4)
    assert rows[0][0] == "a{}.h{}".format(*PREV_TOKEN_HEAD) and rows[0][1] > 0
    _, key_totals = row.totals(KEY)
    by_size = sorted(key_totals.items(), key=lambda kv: -abs(kv[1]))
    assert [name for name, _ in rows] == [name for name, _ in by_size[:4]]
    assert rest == len(row.names) - 4
    assert sum(v for _, v in rows) + rest_sum == pytest.approx(sum(key_totals.values()))
    q_rows, _, _ = top_totals(cell_at(row, KEY), "query", len(row.names))
    assert dict(q_rows) == pytest.approx(row.totals(KEY)[0])


def test_strongest_sources_carry_the_most_of_the_terms(row: QKAttribution) -> None:
    cell = np.asarray(row.terms[:, :, row.column(KEY)], dtype=np.float64)
    q, k = strongest_sources(cell_at(row, KEY), 3)
    assert list(q) == list(np.argsort(-np.abs(cell).sum(1), kind="stable")[:3])
    assert list(k) == list(np.argsort(-np.abs(cell).sum(0), kind="stable")[:3])
    grid = term_grid(cell_at(row, KEY), top=3)
    assert grid.col_labels[0] == "a{}.h{}".format(*PREV_TOKEN_HEAD)
    np.testing.assert_array_equal(grid.values, cell[np.ix_(q, k)])
    assert grid.vmax == symmetric_range(cell)  # the whole cell's range, not the shown block's


def _cells(text: Text, label: str) -> list[tuple[str, Style]]:
    """(characters, style) of the cells on the grid row labelled ``label``."""
    lines = text.plain.split("\n")
    start = sum(len(line) + 1 for line in lines[: next(
        i for i, line in enumerate(lines) if line.strip().startswith(label + " "))])
    line = next(line for line in lines if line.strip().startswith(label + " "))
    first = start + line.index(label) + len(label) + 1
    return [(text.plain[s.start:s.end], s.style) for s in text.spans
            if first <= s.start < start + len(line) and isinstance(s.style, Style)
            and text.plain[s.start:s.end].strip()]


def test_grid_cells_are_the_heatmaps_colours_in_each_mode(row: QKAttribution) -> None:
    grid = term_grid(cell_at(row, KEY))
    assert grid.row_labels[0] == "embed" and grid.col_labels[0] == "a0.h1"
    strongest = float(grid.values[0, 0])
    assert abs(strongest) == grid.vmax  # embed × a0.h1: the largest term of the cell
    true = grid.draw(70, 12, colours("truecolor"))
    chars, style = _cells(true, "embed")[0]
    expected = tuple(int(c) for c in diverging_rgb(np.array(strongest), COLORMAPS["red-blue"],
                                                   grid.vmax))
    assert set(chars) == {"█"} and tuple(style.color.triplet) == expected
    eight = grid.draw(70, 12, colours("256"))
    cell_styles = [s for _, s in _cells(eight, "embed")]
    assert all(s.color.type == ColorType.EIGHT_BIT for s in cell_styles)
    assert cell_styles[0].color.number == palette_ramp(COLORMAPS["red-blue"])[-1]
    console = Console(file=io.StringIO(), color_system="256", force_terminal=True, width=80)
    console.print(eight)
    out = console.file.getvalue()
    assert "38;5;" in out and not TRUECOLOR.search(out)
    sixteen = grid.draw(70, 12, colours("16"))
    assert _cells(sixteen, "embed")[0][0][0] == "█"
    assert _cells(sixteen, "embed")[0][1].color.name == "bright_red"
    # without colour, a negative cell is a glyph, a positive one a shade
    signed = TermGrid(np.array([[-1.0, 1.0]]), ("r",), ("neg", "pos"), vmax=1.0, total=2)
    plain = signed.draw(40, 6, colours("none")).plain
    assert NEG_GLYPHS[-1] * 3 in plain and "█" * 3 in plain


def test_grid_fits_any_width_and_says_how_much_it_shows(row: QKAttribution) -> None:
    grid = term_grid(cell_at(row, KEY))
    for width in (24, 30, 45, 60, 80, 120):
        for height in (5, 9, 12, 16, 30):
            text = grid.draw(width, height, colours("truecolor")).plain
            lines = text.split("\n")
            assert all(len(line) <= width for line in lines), (width, text)
            assert len(lines) <= height, (width, height, text)
    # room to spare: every entry two lines tall, the grid's rows all there
    tall = grid.draw(80, 30, colours("truecolor")).plain.split("\n")
    assert sum(line.strip().startswith("embed ") for line in tall) == 1
    assert len(tall) == 1 + 1 + 2 * len(grid.row_labels) + 1
    narrow = grid.draw(30, 12, colours("truecolor")).plain
    assert narrow.split("\n")[0] == f"query ↓ × key → (6×2 of {len(row.names)})"
    assert grid.draw(8, 3, colours("truecolor")).plain == "(pane too small)"


def test_non_finite_terms_are_marked_not_drawn_as_zero(row: QKAttribution) -> None:
    terms = np.array(row.terms)
    terms[0, :, row.column(KEY)] = np.nan
    bad = dataclasses.replace(row, terms=terms, nonfinite=True)
    grid = term_grid(cell_at(bad, KEY))
    assert grid.row_labels[0] == "embed"  # NaN counts as the largest: never hidden
    assert "???" in grid.draw(70, 12, colours("truecolor")).plain


def test_bars_in_256_colours_are_palette_entries() -> None:
    neg, pos = bar_styles(colours("256"))
    ramp = palette_ramp(COLORMAPS["red-blue"])
    assert (neg, pos) == (f"color({ramp[0]})", f"color({ramp[-1]})")
    console = Console(file=io.StringIO(), color_system="256", force_terminal=True, width=40)
    console.print(signed_bar(-0.5, 1.0, 8, (neg, pos)), signed_bar(0.7, 1.0, 8, (neg, pos)))
    assert not TRUECOLOR.search(console.file.getvalue())
    assert bar_styles(colours("16")) == ("bright_blue", "bright_red")
    assert bar_styles(colours("none")) == ("", "")
    assert bar_styles(colours("truecolor"))[1] == "rgb({},{},{})".format(*COLORMAPS["red-blue"][2])


def test_numbers_and_head_names() -> None:
    assert [num(v) for v in (12.34, -0.04123, 1234.5, 0.0, float("nan"), float("-inf"))] == [
        "+12.3", "-0.0412", "+1234", "+0", "nan", "-inf"]
    assert source_head("a0.h1") == (0, 1) and source_head("a12.h31") == (12, 31)
    for name in ("embed", "pos", "a0.bias", "m3", "bias", "a0.h1x"):
        assert source_head(name) is None
