"""A found circuit (docs/math.md, "Edge attribution") drawn as a graph of box-drawing lines.

Layers run left to right: a column for ``input``, then each layer's heads, its MLP (a column of
its own: the MLP reads its layer's heads), and ``logits``; only the columns and nodes of the
circuit are drawn. Every node has a row of its own, in the order the model writes them, so the
graph is a staircase down to the right and a line leaving a node along its row never runs into
another node. Each edge ``S->D`` leaves ``S`` along its row, turns down in a lane of its own
just before ``D``'s column and ends on ``D``'s row in the letter of the input it enters (``q``,
``k``, ``v`` for a head; ``└`` for an MLP or the logits), then joins the other edges into ``D``::

    input──┐
           v─a0.h1─────┐
                       k─a1.h2──┐
                                └─logits

An edge's lane is its own, so its colour is its score: the diverging map of the heatmaps (sign
as hue, |score| as saturation, never fainter than ``FLOOR`` of the map so weak edges stay
visible against the background), as palette entries in 256 colours (``colormap.palette_ramp``:
lightness monotone in |score|), the terminal's two bright colours in 16 (``ansi16_pair``), and
no colour without one, where negative edges are dashed. Strong edges (``HEAVY`` of the largest
|score| or more) are heavy lines in every mode. Where lines share a cell (a node's row carries
all its outgoing edges; the row into a node all its incoming ones) the stronger edge's colour
wins: edges are drawn weakest first. Everything is a ``Text`` built cell by cell: no markup.

Pure numpy and Rich, no Textual: tested on its own (tests/tui/plots/test_edge_circuit.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from rich.color import Color
from rich.style import Style
from rich.text import Text

from headscope.engine.core.edge_graph import EdgeGraph
from headscope.tui.plots.colormap import RGB, diverging_rgb, nearest_entry, palette_ramp, ramp_index
from headscope.tui.plots.figures import Colours, ansi16_pair

FLOOR = 0.35  # the weakest edge is drawn at this fraction of the map (not the background)
HEAVY = 0.5  # |score| ≥ this × the largest |score|: heavy lines
LOGITS = "logits"

# up, down, left, right -> the box-drawing character (light, heavy)
_U, _D, _L, _R = 1, 2, 4, 8
_BOX = {
    _L | _R: "─━", _U | _D: "│┃", _D | _R: "┌┏", _D | _L: "┐┓", _U | _R: "└┗", _U | _L: "┘┛",
    _L | _R | _D: "┬┳", _L | _R | _U: "┴┻", _U | _D | _R: "├┣", _U | _D | _L: "┤┫",
    _U | _D | _L | _R: "┼╋", _L: "─━", _R: "─━", _U: "│┃", _D: "│┃",
}
_DASHED = {_L | _R: "╌╍", _U | _D: "╎╏"}  # negative edges without colour


@dataclass(frozen=True)
class Node:
    """One node of the drawn circuit: ``index`` is its source index (``graph.n_sources`` for
    the logits), ``column`` its column among those drawn, ``row`` its row."""

    name: str
    index: int
    column: int
    row: int


def node_column(graph: EdgeGraph, index: int) -> int:
    """The column of source ``index`` (or the logits) when every column is drawn: input 0,
    layer ``l``'s heads ``1 + 2l``, its MLP ``2 + 2l``, the logits last."""
    if index == 0:
        return 0
    if index >= graph.n_sources:
        return 2 * graph.n_layers + 1
    layer, within = divmod(index - 1, graph.per_layer_sources)
    return 1 + 2 * layer + int(within >= graph.n_heads)


def edge_ends(graph: EdgeGraph, edge: int) -> tuple[int, int, str | None]:
    """Edge ``edge``'s source node, destination node (``n_sources`` for the logits) and the
    input it enters (``q``/``k``/``v`` of a head, else None)."""
    dst = int(graph.edge_dst[edge])
    node = int(graph.dst_node[dst])
    which = None
    if node < 0:
        node = graph.n_sources
    elif node != 0 and (node - 1) % graph.per_layer_sources < graph.n_heads:
        which = graph.destinations[dst][-2]  # "a1.h2<k>"
    return int(graph.edge_src[edge]), node, which


def node_name(graph: EdgeGraph, index: int) -> str:
    return LOGITS if index >= graph.n_sources else graph.sources[index]


def circuit_nodes(graph: EdgeGraph, in_circuit: np.ndarray) -> list[Node]:
    """The nodes the circuit's edges touch, in the order the model writes them, each on its
    own row, in the columns that have a node (empty columns are not drawn)."""
    used: set[int] = set()
    for e in np.nonzero(in_circuit)[0]:
        s, d, _ = edge_ends(graph, int(e))
        used.update((s, d))
    ordered = sorted(used)
    columns = sorted({node_column(graph, i) for i in ordered})
    at = {c: k for k, c in enumerate(columns)}
    return [Node(node_name(graph, i), i, at[node_column(graph, i)], row)
            for row, i in enumerate(ordered)]


# -- colours ----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _ramp(stops: tuple[RGB, RGB, RGB]) -> tuple[int, ...]:
    return palette_ramp(stops)  # a nearest-colour search: once per colour map, not per edge


def edge_style(score: float, vmax: float, colours: Colours) -> Style:
    """The colour of an edge of ``score`` when the strongest is ``vmax``: the heatmaps' diverging
    map at ``±(FLOOR + (1 − FLOOR)·|score|/vmax)``, in the terminal's colours."""
    strength = min(abs(score) / vmax, 1.0) if vmax > 0 else 1.0
    t = float(np.sign(score)) * (FLOOR + (1.0 - FLOOR) * strength) if score else 0.0
    if colours.mode == "256":
        ramp = _ramp(colours.stops)
        return Style(color=Color.from_ansi(ramp[int(ramp_index(np.array([t]), 1.0)[0])]))
    if colours.mode == "16":
        neg, pos = ansi16_pair(colours.stops)
        return Style(color=neg if score < 0 else pos, bold=strength >= HEAVY)
    if colours.mode == "none":
        return Style()
    r, g, b = (int(c) for c in diverging_rgb(np.array([t]), colours.stops, 1.0)[0])
    return Style(color=Color.from_rgb(r, g, b))


def _single(rgb: RGB, colours: Colours) -> Style:
    """A theme colour (labels, the selection) in the terminal's colours."""
    if colours.mode == "none":
        return Style()
    if colours.mode == "16":
        return Style(color="default")
    if colours.mode == "256":
        return Style(color=Color.from_ansi(_nearest(tuple(rgb))))
    return Style(color=Color.from_rgb(*rgb))


@functools.lru_cache(maxsize=64)
def _nearest(rgb: RGB) -> int:
    return nearest_entry(rgb)


def key_line(vmax: float, colours: Colours) -> Text:
    """The colour key: edge colours from −vmax to +vmax as drawn (zero itself is never an
    edge's colour: the map's middle is the background), and the line weights."""
    text = Text()
    muted = _single(colours.muted, colours)
    text.append(f"{-vmax:+.3g} ", style=muted)
    for half in (np.linspace(-vmax, -vmax / 5, 5), np.linspace(vmax / 5, vmax, 5)):
        for s in half:
            weight = int(abs(s) >= HEAVY * vmax)
            dashed = colours.mode == "none" and s < 0
            text.append((_DASHED if dashed else _BOX)[_L | _R][weight], style=edge_style(float(s), vmax, colours))
        if half[0] < 0:
            text.append(" 0 ", style=muted)
    text.append(f" {vmax:+.3g}", style=muted)
    return text


# -- the drawing ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CircuitDrawing:
    """The drawn graph (``text``), its nodes, and where each drawn edge's lane is
    (``lanes[edge] = (column of the lane, first row, last row)``: tests and the widget read it)."""

    text: Text
    nodes: tuple[Node, ...]
    lanes: dict[int, tuple[int, int, int]]
    width: int
    height: int


def draw_circuit(graph: EdgeGraph, scores: np.ndarray, in_circuit: np.ndarray, colours: Colours, *,
                 selected: int | None = None, key: bool = True) -> CircuitDrawing:
    """The circuit of the edges ``in_circuit`` (a mask over ``graph.edges``) coloured by
    ``scores``; the edge ``selected`` (an index, if in the circuit) in the accent colour with
    its two nodes, drawn last; ``key``: the colour key under the graph."""
    mask = np.asarray(in_circuit, dtype=bool)
    values = np.asarray(scores, dtype=np.float64)
    nodes = circuit_nodes(graph, mask)
    if not nodes:
        return CircuitDrawing(Text("no circuit: no edge left after pruning", style="dim"), (), {}, 0, 0)
    by_index = {n.index: n for n in nodes}
    circuit = [int(e) for e in np.nonzero(mask)[0]]
    ends = {e: edge_ends(graph, e) for e in circuit}
    n_columns = max(n.column for n in nodes) + 1
    # lanes of each column: lowest destination leftmost, then lowest source (fewest crossings)
    into: list[list[int]] = [[] for _ in range(n_columns)]
    for e in circuit:
        into[by_index[ends[e][1]].column].append(e)
    for lanes in into:
        lanes.sort(key=lambda e: (-by_index[ends[e][1]].row, -by_index[ends[e][0]].row, e))
    label_w = [max((len(n.name) for n in nodes if n.column == c), default=0) for c in range(n_columns)]
    lane_x: dict[int, int] = {}
    label_x: list[int] = []
    x = 0
    for c in range(n_columns):
        for k, e in enumerate(into[c]):
            lane_x[e] = x + k
        x += len(into[c]) + (1 if into[c] else 0)  # the lanes, then one cell of the bus into the node
        label_x.append(x)
        x += label_w[c] + 1
    width, height = x, len(nodes)

    dirs = np.zeros((height, width), dtype=np.int64)
    heavy = np.zeros((height, width), dtype=bool)
    dashed = np.zeros((height, width), dtype=bool)
    ports: dict[tuple[int, int], tuple[str, Style]] = {}  # port letters, in their edge's colour
    styles: dict[tuple[int, int], Style] = {}
    vmax = float(np.max(np.abs(values[circuit]))) if circuit else 1.0
    vmax = vmax if vmax > 0 else 1.0
    accent = _single(colours.accent, colours) + Style(bold=True)

    def mark(row: int, col: int, d: int, style: Style, strong: bool, neg: bool) -> None:
        dirs[row, col] |= d
        heavy[row, col] = strong
        dashed[row, col] = neg
        styles[(row, col)] = style

    order = sorted(circuit, key=lambda e: (e == selected, abs(values[e])))  # strongest on top
    for e in order:
        s_node, d_node = by_index[ends[e][0]], by_index[ends[e][1]]
        which = ends[e][2]
        style = accent if e == selected else edge_style(float(values[e]), vmax, colours)
        strong = abs(values[e]) >= HEAVY * vmax or e == selected
        neg = colours.mode == "none" and values[e] < 0
        lx, rs, rd = lane_x[e], s_node.row, d_node.row
        for col in range(label_x[s_node.column] + len(s_node.name), lx):  # along the source's row
            mark(rs, col, _L | _R, style, strong, neg)
        mark(rs, lx, _L | _D, style, strong, neg)  # turn down
        for row in range(rs + 1, rd):
            mark(row, lx, _U | _D, style, strong, neg)
        mark(rd, lx, _U | _R, style, strong, neg)  # turn into the destination's row
        if which is not None:
            ports[(rd, lx)] = (which, style)
        for col in range(lx + 1, label_x[d_node.column]):
            mark(rd, col, _L | _R, style, strong, neg)

    ends_selected = set(ends[selected][:2]) if selected in ends else set()
    label_style = _single(colours.foreground, colours) + Style(bold=True)
    text = Text()
    for row in range(height):
        node = nodes[row]
        line = Text()
        for col in range(width):
            if label_x[node.column] <= col < label_x[node.column] + len(node.name):
                if col == label_x[node.column]:
                    line.append(node.name, style=accent + Style(reverse=True)
                                if node.index in ends_selected else label_style)
                continue
            d = int(dirs[row, col])
            if not d:
                line.append(" ")
                continue
            port = ports.get((row, col))
            if port is not None:  # the edge's own end: its colour, whatever passes through
                line.append(*port)
                continue
            table = _DASHED if dashed[row, col] and d in _DASHED else _BOX
            line.append(table[d][int(heavy[row, col])], style=styles[(row, col)])
        line.rstrip()
        text.append_text(line)
        if row < height - 1:
            text.append("\n")
    if key:
        text.append("\n")
        text.append_text(key_line(vmax, colours))
    lanes = {e: (lane_x[e], by_index[ends[e][0]].row, by_index[ends[e][1]].row) for e in circuit}
    return CircuitDrawing(text, tuple(nodes), lanes, width, height + int(key))
