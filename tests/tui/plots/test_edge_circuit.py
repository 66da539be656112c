"""The circuit graph (tui/plots/edge_circuit.py): its layout on the circuit edge attribution finds on
attn-only-2l's first-occurrence task, its colours in every colour mode, and that nothing in it
is markup."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from rich.color import ColorType
from rich.console import Console
from rich.style import Style
from rich.text import Text

from headscope.engine.core.edge_graph import edge_graph
from headscope.engine.core.edge_results import EdgeScores, FaithfulnessCurve
from headscope.themes import COLORMAPS
from headscope.tui.plots.colormap import lightness, palette_ramp, xterm_rgb
from headscope.tui.plots.edge_circuit import (
    circuit_nodes,
    draw_circuit,
    edge_ends,
    edge_style,
    key_line,
)
from headscope.tui.plots.figures import Colours

K_EDGE = "a0.h1->a1.h2<k>"


def colours(mode: str, cmap: str = "red-blue") -> Colours:
    return Colours((200, 200, 200), (128, 128, 128), (255, 170, 0), (90, 170, 255), COLORMAPS[cmap], mode)


@pytest.fixture(scope="module")
def found() -> tuple[EdgeScores, FaithfulnessCurve, list[Any]]:
    """EAP-IG on attn-only-2l's first-occurrence task, its faithfulness curve and the exact
    checks of its top 3 edges (computed once for this module and tests/tui/widgets/test_edge_circuit.py)."""
    from tests.tui.widgets.test_edge_circuit import first_occurrence_circuit

    return first_occurrence_circuit()


def cell_style(text: Text, row: int, col: int) -> Style | None:
    """The style of the character at ``(row, col)`` of the drawing."""
    offset = sum(len(line) + 1 for line in text.plain.split("\n")[:row]) + col
    for span in text.spans:
        if span.start <= offset < span.end and isinstance(span.style, Style):
            return span.style
    return None


def test_the_three_edge_circuit_is_the_induction_circuit_left_to_right(found: Any) -> None:
    """The top 3 edges (the test of tests/engine/forward/test_edges.py) form input → a0.h1 (its values) →
    a1.h2 (its keys: the K-composition) → logits: one row per node, later layers further right,
    each edge ending in the letter of the input it enters."""
    scores = found[0]
    g = scores.graph
    mask = g.circuit(scores.scores, 3)
    drawing = draw_circuit(g, scores.scores, mask, colours("truecolor"), key=False)
    lines = drawing.text.plain.split("\n")
    assert [n.name for n in drawing.nodes] == ["input", "a0.h1", "a1.h2", "logits"]
    starts = [line.index(n.name) for line, n in zip(lines, drawing.nodes, strict=True)]
    assert starts == sorted(starts) and len(set(starts)) == 4  # layers left to right
    for e, (col, top, bottom) in drawing.lanes.items():
        which = edge_ends(g, e)[2]
        assert lines[bottom][col] == (which or "└"), g.edges[e]
        assert lines[top][col] in "┐┓┬┳", g.edges[e]  # leaves its source's row downwards
        assert all(lines[r][col] in "│┃┼╋" for r in range(top + 1, bottom))
    assert lines[2][drawing.lanes[g.index[K_EDGE]][0]] == "k"
    assert len({col for col, _, _ in drawing.lanes.values()}) == len(drawing.lanes)  # own lanes


def test_nodes_are_only_the_circuits_and_every_edge_has_its_lane(found: Any) -> None:
    scores = found[0]
    g = scores.graph
    for n in (1, 5, 10, 26, g.n_edges):
        mask = g.circuit(scores.scores, n)
        nodes = circuit_nodes(g, mask)
        touched = {edge_ends(g, int(e))[i] for e in np.nonzero(mask)[0] for i in (0, 1)}
        assert {node.index for node in nodes} == touched
        drawing = draw_circuit(g, scores.scores, mask, colours("256"))
        assert set(drawing.lanes) == {int(e) for e in np.nonzero(mask)[0]}
        assert max((len(line) for line in drawing.text.plain.split("\n")), default=0) <= max(drawing.width, 40)


def test_edges_take_the_heatmaps_diverging_map_by_sign_and_strength() -> None:
    """A made-up circuit with both signs: each lane is drawn in ``edge_style`` of its score, the
    negative ones in the map's negative hue, stronger ones further from the zero stop."""
    g = edge_graph(2, 2, attn_only=True, parallel=False)
    scores = np.zeros(g.n_edges)
    chosen = {"input->a0.h0<v>": -4.0, "a0.h0->a1.h1<k>": 2.0, "a1.h1->logits": -1.0,
              "input->a1.h1<q>": 0.5}
    for name, value in chosen.items():
        scores[g.index[name]] = value
    mask = scores != 0
    c = colours("truecolor")
    drawing = draw_circuit(g, scores, mask, c, key=False)
    neg, mid, pos = (np.asarray(s, dtype=float) for s in c.stops)
    for name, value in chosen.items():
        col, _, bottom = drawing.lanes[g.index[name]]
        style = cell_style(drawing.text, bottom, col)
        assert style == edge_style(value, 4.0, c)
        rgb = np.asarray(style.color.triplet, dtype=float)
        end = neg if value < 0 else pos
        other = pos if value < 0 else neg
        assert np.linalg.norm(rgb - end) < np.linalg.norm(rgb - other), name
    strengths = [np.linalg.norm(np.asarray(edge_style(-v, 4.0, c).color.triplet, dtype=float) - mid)
                 for v in (0.5, 1.0, 2.0, 4.0)]
    assert strengths == sorted(strengths)
    assert strengths[0] > 0.3 * np.linalg.norm(neg - mid)  # the weakest is not the background


@pytest.mark.parametrize("cmap", ["red-blue", "blue-orange-light"])
def test_256_colours_are_palette_entries_monotone_in_strength(found: Any, cmap: str) -> None:
    """In 256 colours every colour of the graph and its key is an xterm entry (16–255), the
    edges' from the heatmaps' palette ramp, so nothing is quantised again and a truecolor
    console prints no ``38;2``; lightness moves away from the zero stop as |score| grows."""
    scores = found[0]
    g = scores.graph
    c = colours("256", cmap)
    drawing = draw_circuit(g, scores.scores, g.circuit(scores.scores, 10), c,
                           selected=g.index[K_EDGE])
    ramp = set(palette_ramp(c.stops))
    seen = set()
    for span in drawing.text.spans:
        colour = span.style.color if isinstance(span.style, Style) else None
        if colour is not None:
            assert colour.type == ColorType.EIGHT_BIT and colour.number >= 16
            seen.add(colour.number)
    assert seen & ramp
    console = Console(color_system="truecolor", force_terminal=True, width=200)
    with console.capture() as cap:
        console.print(drawing.text)
    assert "38;2" not in cap.get() and "38;5;" in cap.get()
    zero = lightness(xterm_rgb(palette_ramp(c.stops)[8]))  # the middle of 2·8 + 1 entries
    for sign in (-1, 1):
        ls = [abs(lightness(xterm_rgb(edge_style(sign * v, 1.0, c).color.number)) - zero)
              for v in np.linspace(0.05, 1.0, 8)]
        assert all(b >= a - 1e-9 for a, b in itertools.pairwise(ls)), ls


def test_sixteen_colours_and_none_keep_sign_and_strength(found: Any) -> None:
    """16 colours: the terminal's two bright colours by sign; no colour: no colour at all,
    negative edges dashed; heavy lines for the strong edges in both."""
    scores = found[0]
    g = scores.graph
    mask = g.circuit(scores.scores, 10)
    sixteen = draw_circuit(g, scores.scores, mask, colours("16"))
    names = {str(s.style.color.name) for s in sixteen.text.spans
             if isinstance(s.style, Style) and s.style.color is not None and s.style.color.name != "default"}
    assert names <= {"bright_blue", "bright_red"} and names
    plain = draw_circuit(g, scores.scores, mask, colours("none"))
    assert all(not isinstance(s.style, Style) or s.style.color is None for s in plain.text.spans)
    assert "╏" in plain.text.plain or "╍" in plain.text.plain  # every edge here is negative
    assert "━" in key_line(1.0, colours("none")).plain


def test_empty_circuit_says_so(found: Any) -> None:
    scores = found[0]
    drawing = draw_circuit(scores.graph, scores.scores, np.zeros(scores.graph.n_edges, bool), colours("256"))
    assert "no circuit" in drawing.text.plain and not drawing.nodes
