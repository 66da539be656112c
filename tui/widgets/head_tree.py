"""The head tree: Embed, Layer i → Head j (and MLP), with score badges as they arrive.

Built from ``engine.structure`` alone (no torch, no tensor read), so it is on the first
frame. Badges (C copying, P previous-token, I induction, S attention sink) are coloured by
strength and only appear for heads whose score is known, so interesting heads stand out at a
glance. Filtered (``f``), each head shows the filtered score and its z against random heads;
the focused head stays in the tree when it fails the filter, marked ``focus`` (score struck).
A head with NaN/inf weights shows a red "!" flag and "nan" instead of badges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

from headscope.engine.core.results import HeadScores, ScoreNull
from headscope.tui.base.labels import (
    BADGES,
    SINK_BADGE,
    filter_value,
    filter_z,
    score,
    sink,
    z_text,
)
from headscope.tui.base.messages import HeadChosen, HeadHighlighted

Head = tuple[int, int]
NONFINITE_FLAG = "bold white on red"


@dataclass(frozen=True)
class NodeData:
    kind: str  # "embed" | "layer" | "head" | "mlp" | "unembed"
    layer: int | None = None
    head: int | None = None


def delta_style(change: float, strong: str, mid: str) -> str | None:
    """Compare mode: big changes (≥ 0.5) loud, middling (≥ 0.15) coloured, small ones dim."""
    if change != change:
        return None
    if change >= 0.5:
        return f"bold {strong}"
    if change >= 0.15:
        return mid
    if change >= 0.02:
        return "dim"
    return None


def badge_style(value: float, strong: str, mid: str) -> str | None:
    """Strong (≥ 0.6) and middling (≥ 0.3) scores get a colour; weak ones no badge."""
    if value != value:  # NaN
        return None
    if value >= 0.6:
        return f"bold {strong}"
    if value >= 0.3:
        return mid
    return None


class HeadTree(Tree[NodeData]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("j", "cursor_down", "Down", show=False, id="tree-down",
                tooltip="Move down the head tree"),
        Binding("k", "cursor_up", "Up", show=False, id="tree-up",
                tooltip="Move up the head tree"),
        Binding("h,left", "collapse_or_parent", "Collapse", show=False, id="tree-left",
                tooltip="Collapse the layer, or go to its parent"),
        Binding("l,right", "expand_or_child", "Expand", show=False, id="tree-right",
                tooltip="Expand the layer, or go to its first head"),
    ]

    # Textual's Tree moves to a sibling or the parent on shift+arrows. Here those keys are the
    # Prompt tab's cell cursor (the screen's why-cursor keys): the tree, focused by default,
    # took them, and shift+↑ on the Prompt tab went to the previous head. Refused here, the
    # key goes on to the screen.
    SCREEN_KEYS: ClassVar[frozenset[str]] = frozenset({
        "cursor_previous_sibling", "cursor_next_sibling", "cursor_parent", "cursor_parent_next_sibling"})

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in self.SCREEN_KEYS:
            return False
        return super().check_action(action, parameters)

    def __init__(self, structure: dict[str, Any] | None, *, id: str | None = None) -> None:
        super().__init__("model", data=NodeData("model"), id=id)
        self.show_root = False
        self.guide_depth = 2
        self.head_nodes: dict[Head, TreeNode[NodeData]] = {}
        self.scores: dict[Head, HeadScores] = {}
        self.structure = structure or {}
        self.filter: tuple[str, str, float] | None = None  # (score key, label, threshold)
        self.null: ScoreNull | None = None  # calibrates the filtered score: "0.95 z=41"
        self.compact = False  # a narrow tree: while filtering, the score and z replace the badges
        self.keep: Head | None = None  # shown whatever the filter (the focused head)
        self.deltas: dict[Head, float] = {}
        self._populate()

    def _populate(self) -> None:
        self.clear()
        self.head_nodes.clear()
        s = self.structure
        n_layers, n_heads = int(s.get("n_layers") or 0), int(s.get("n_heads") or 0)
        if not n_layers:
            return
        self.root.add_leaf("Embed", data=NodeData("embed"))
        for layer in range(n_layers):
            node = self.root.add(f"Layer {layer}", data=NodeData("layer", layer),
                                 expand=layer < 4 or n_layers <= 6)
            for head in range(n_heads):
                if not self.passes((layer, head)):
                    continue
                self.head_nodes[(layer, head)] = node.add_leaf(
                    self._label(layer, head), data=NodeData("head", layer, head))
            if s.get("d_mlp"):
                node.add_leaf(Text("MLP", style="dim"), data=NodeData("mlp", layer))
        self.root.add_leaf("Unembed" + (" (tied W_Eᵀ)" if s.get("tied_unembed") else ""),
                           data=NodeData("unembed"))
        self._retitle()

    def passes(self, head: Head) -> bool:
        """Whether the filter keeps ``head`` (unscored heads are hidden while filtering)."""
        return head == self.keep or self.meets(head)

    def meets(self, head: Head) -> bool:
        """Whether ``head`` meets the filter (the kept head aside)."""
        if self.filter is None:
            return True
        row = self.scores.get(head)
        if row is None:
            return False
        value = filter_value(row, self.filter[0])
        return value == value and value >= self.filter[2]

    def set_filter(self, key: str | None, label: str = "", threshold: float = 0.3,
                   keep: Head | None = None) -> None:
        """Keep only heads with score ``key`` ≥ ``threshold`` (``None``: every head).

        ``keep`` (the explorer's focused head) stays in the tree and under the cursor even
        when it does not pass, so filtering never moves the focus."""
        current = self.current()
        if keep is None and current is not None and current.kind == "head":
            keep = (current.layer, current.head)  # type: ignore[assignment]
        self.keep = keep
        self.filter = (key, label or key, threshold) if key else None
        self._populate()
        if keep is not None:  # after the rebuilt tree has its lines (a new node has none)
            self.call_after_refresh(self.select_head, keep)

    def _retitle(self) -> None:
        if self.filter is None:
            self.border_title = "heads"
            return
        _, label, threshold = self.filter
        n = sum(1 for head in self.head_nodes if self.meets(head))
        self.border_title = filter_title(label, threshold, n, self.compact)

    def set_deltas(self, deltas: dict[Head, float]) -> None:
        """Compare mode: how much each head changed (0 = same circuit and scores)."""
        self.deltas = dict(deltas)
        self.refresh_badges()

    def _label(self, layer: int, head: int) -> Text:
        text = Text(f"H{head}")
        row = self.scores.get((layer, head))
        vars_ = self.app.theme_variables if self.is_attached else {}
        if row is not None and row.nonfinite:
            # NaN/inf in this head's weights: its scores are NaN, not weak. A red "!" flag
            # instead of badges, so a poisoned head is never mistaken for a dull one.
            text.append(" ")
            text.append("!", style=NONFINITE_FLAG)
            text.append(" nan", style="red")
        elif row is not None:
            strong = vars_.get("badge-strong", "green")
            mid = vars_.get("badge-mid", "yellow")
            if not (self.compact and self.filter is not None):
                for key, letter in BADGES:
                    style = badge_style(score(row, key), strong, mid)
                    text.append(" ")
                    text.append(letter if style else "·", style=style or "dim")
                sink_style = badge_style(sink(row), strong, mid)
                if sink_style:
                    text.append(f" {SINK_BADGE[1]}", style=sink_style)
            if self.filter is not None and not self.meets((layer, head)):
                # the focused head, kept in the tree though it fails the filter: marked as
                # such, its score struck through, never shown like a match
                text.append(f" {filter_value(row, self.filter[0]):.2f}", style="dim strike")
                text.append(" focus", style="italic")
            elif self.filter is not None:
                # the filtered score and, once the null is in, its z: "0.95 z=41"
                text.append(f" {filter_value(row, self.filter[0]):.2f}", style="bold")
                z = z_text(filter_z(self.null, row, self.filter[0]))
                if z:
                    text.append(f" {z}", style="dim")
        change = self.deltas.get((layer, head))
        if change is not None:
            style = delta_style(change, vars_.get("error", "red"), vars_.get("warning", "yellow"))
            text.append(" ")
            text.append("Δ" if style else "=", style=style or "dim")
        return text

    def set_compact(self, compact: bool) -> None:
        if compact != self.compact:
            self.compact = compact
            self._retitle()
            self.refresh_badges()

    def set_null(self, null: ScoreNull | None) -> None:
        """The random-head null that turns the filtered score into a z (docs/math.md)."""
        self.null = null
        self.refresh_badges()

    def set_scores(self, rows: list[HeadScores]) -> None:
        for row in rows:
            self.scores[(row.layer, row.head)] = row
        if self.filter is not None:  # which heads pass may have changed
            self.set_filter(self.filter[0], self.filter[1], self.filter[2])
            return
        for row in rows:
            node = self.head_nodes.get((row.layer, row.head))
            if node is not None:
                node.set_label(self._label(row.layer, row.head))

    def refresh_badges(self) -> None:
        """Re-colour after a theme change."""
        for (layer, head), node in self.head_nodes.items():
            node.set_label(self._label(layer, head))

    def badge_text(self, head: Head) -> str:
        node = self.head_nodes.get(head)
        return str(node.label) if node is not None else ""

    def select_head(self, head: Head) -> bool:
        """Move the cursor to ``head``; False if the tree does not show it (filtered out)."""
        node = self.head_nodes.get(head)
        if node is None:
            return False
        if node.parent is not None and not node.parent.is_expanded:
            node.parent.expand()
        self.move_cursor(node)
        return True

    def current(self) -> NodeData | None:
        node = self.cursor_node
        return node.data if node is not None else None

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted[NodeData]) -> None:
        event.stop()
        data = event.node.data
        head = (data.layer, data.head) if data and data.kind == "head" else None
        self.post_message(HeadHighlighted(head, data.kind if data else None))

    def on_tree_node_selected(self, event: Tree.NodeSelected[NodeData]) -> None:
        event.stop()
        data = event.node.data
        if data and data.kind == "head":
            self.post_message(HeadChosen((data.layer, data.head)))

    def action_collapse_or_parent(self) -> None:
        node = self.cursor_node
        if node is None:
            return
        if node.allow_expand and node.is_expanded:
            node.collapse()
        elif node.parent is not None and node.parent is not self.root:
            self.move_cursor(node.parent)

    def action_expand_or_child(self) -> None:
        node = self.cursor_node
        if node is None or not node.allow_expand:
            return
        if not node.is_expanded:
            node.expand()
        elif node.children:
            self.move_cursor(node.children[0])


# The narrow tree's title has 12 columns (18 wide, less the corners and the title's gaps):
# "induction ≥ 0.30: 3" lost its count (issue 39 §3). Narrow, the focus line's short names.
SHORT_FILTER_LABELS = {"induction": "ind", "prev-token": "prev", "copying": "copy"}
NARROW_TITLE = 12


def filter_title(label: str, threshold: float, n: int, compact: bool) -> str:
    """The filtered tree's title: which score, its threshold, how many heads pass."""
    if not compact:
        return f"{label} ≥ {threshold:.2f}: {n}"
    short = SHORT_FILTER_LABELS.get(label, label)
    for title in (f"{short} ≥{threshold:g}: {n}", f"{short}: {n}"):
        if len(title) <= NARROW_TITLE:
            return title
    return f"{short[:NARROW_TITLE - len(str(n)) - 2]}: {n}"
