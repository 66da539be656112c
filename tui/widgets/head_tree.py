"""The head tree: Embed, Layer i → Head j (and MLP), with score badges as they arrive.

Built from ``engine.structure`` alone (no torch, no tensor read), so it is on the first
frame. Badges (C copying, P previous-token, I induction) are coloured by strength and
only appear for heads whose score is known, so interesting heads stand out at a glance.
A head with NaN/inf weights shows a red "!" flag and "nan" instead of badges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

from ..adapt import BADGES, ScoreRow

Head = tuple[int, int]
NONFINITE_FLAG = "bold white on red"


@dataclass(frozen=True)
class NodeData:
    kind: str  # "embed" | "layer" | "head" | "mlp" | "unembed"
    layer: int | None = None
    head: int | None = None


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

    class HeadHighlighted(Message):
        """The cursor is on a head (debounced by the app)."""

        def __init__(self, head: Head | None, data: NodeData | None) -> None:
            super().__init__()
            self.head = head
            self.data = data

    class HeadChosen(Message):
        def __init__(self, head: Head) -> None:
            super().__init__()
            self.head = head

    def __init__(self, structure: dict[str, Any] | None, *, id: str | None = None) -> None:
        super().__init__("model", data=NodeData("model"), id=id)
        self.show_root = False
        self.guide_depth = 2
        self.head_nodes: dict[Head, TreeNode[NodeData]] = {}
        self.scores: dict[Head, ScoreRow] = {}
        self.structure = structure or {}
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
                self.head_nodes[(layer, head)] = node.add_leaf(
                    self._label(layer, head), data=NodeData("head", layer, head))
            if s.get("d_mlp"):
                node.add_leaf(Text("MLP", style="dim"), data=NodeData("mlp", layer))
        self.root.add_leaf("Unembed" + (" (tied W_Eᵀ)" if s.get("tied_unembed") else ""),
                           data=NodeData("unembed"))

    def set_structure(self, structure: dict[str, Any]) -> None:
        self.structure = structure
        self._populate()

    def _label(self, layer: int, head: int) -> Text:
        text = Text(f"H{head}")
        row = self.scores.get((layer, head))
        if row is None:
            return text
        if row.nonfinite:
            # NaN/inf in this head's weights: its scores are NaN, not weak. A red "!" flag
            # instead of badges, so a poisoned head is never mistaken for a dull one.
            text.append(" ")
            text.append("!", style=NONFINITE_FLAG)
            text.append(" nan", style="red")
            return text
        vars_ = self.app.theme_variables if self.is_attached else {}
        strong = vars_.get("badge-strong", "green")
        mid = vars_.get("badge-mid", "yellow")
        for key, letter in BADGES:
            style = badge_style(row.get(key), strong, mid)
            text.append(" ")
            text.append(letter if style else "·", style=style or "dim")
        return text

    def set_scores(self, rows: list[ScoreRow]) -> None:
        for row in rows:
            self.scores[(row.layer, row.head)] = row
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

    def select_head(self, head: Head) -> None:
        node = self.head_nodes.get(head)
        if node is None:
            return
        if node.parent is not None and not node.parent.is_expanded:
            node.parent.expand()
        self.move_cursor(node)

    def current(self) -> NodeData | None:
        node = self.cursor_node
        return node.data if node is not None else None

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted[NodeData]) -> None:
        event.stop()
        data = event.node.data
        head = (data.layer, data.head) if data and data.kind == "head" else None
        self.post_message(self.HeadHighlighted(head, data))

    def on_tree_node_selected(self, event: Tree.NodeSelected[NodeData]) -> None:
        event.stop()
        data = event.node.data
        if data and data.kind == "head":
            self.post_message(self.HeadChosen((data.layer, data.head)))

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
