"""The Composition tab's path effects: for its strongest edges, what path patching the edge
does on the current task (the Patch tab's inputs: its chosen built-in task unless edited), beside
the weight score; a strong edge whose path barely moves the metric is marked "unused on this
task" (docs/math.md, "Patching"; tui/session/patch.py decides what is strong and unused).

A mixin of ``CompositionPane`` (tui/widgets/panes.py), kept here so that the pane only calls
``load_paths`` after its graph and ``path_cell`` / ``path_line`` when it draws an edge. The
edges go to the engine in one ``PatchInputsRequest`` (the receiver's input is the composition
kind: Q-, K- or V-composition ↔ the receiver's q, k or v), on the engine's workers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text

from headscope.engine.core.errors import CancelledError as EngineCancelled
from headscope.engine.core.errors import HeadscopeError
from headscope.engine.core.requests import PatchInputsRequest
from headscope.tui.session.patch import path_edges, path_effects, unused, used

if TYPE_CHECKING:
    from collections.abc import Sequence

    from headscope.tui.base.protocols import LoadKey, PaneHost

Head = tuple[int, int]
UNUSED = "unused on this task"
USED = "used on this task"


PATH_CELL = len("+0.00 unused")  # the widest cell: the column's width (tui/widgets/panes.py)


def _cell(value: str, word: str = "", style: str = "") -> Text:
    """A path cell: ``value`` in the value's five columns, ``word`` after it, padded to
    ``PATH_CELL`` so every cell starts its value in the same column."""
    text = f"{value:>5} {word}".rstrip() if value else ""
    return Text(text.ljust(PATH_CELL) if text else "", style=style, justify="left")


class PathEffects:
    """The path effect of each of the top edges, for the composition kind and task shown."""

    paths: dict[tuple[Head, Head], float | None]
    paths_state: str  # "" not asked, "computing", "done", or why it failed
    paths_task: str  # what the effects were measured on, in words ("the induction task")

    def init_paths(self) -> None:
        self.paths = {}
        self.paths_state = ""
        self.paths_task = "the task"

    def path_cell(self, edge: tuple[int, int, int, int, float], strong: bool) -> Text:
        """The "path" column: the edge's recovered fraction, then "used" or "unused" when the
        weights are strong (the verdict of tui/session/patch.py); blank for edges without one.

        Every cell is one fixed-width string, left-aligned: the value in the first five
        columns, the word (or its blank) after it. Right-aligned as before, a row with a word
        pushed its value 5 or 7 columns left of a bare value's, so the column read as three
        (``+0.72 used``, ``+0.00 unused``, ``       +0.00``) and a glance down it could not
        compare the numbers. ``+0.00 unused`` is 12 columns, the column's width (13 packed,
        with its separating space), so at 80 columns nothing is cut and the numbers line up
        under the header."""
        pair = ((edge[0], edge[1]), (edge[2], edge[3]))
        if pair not in self.paths:
            pending = self.paths_state == "computing" and self._is_top(pair)
            return _cell("…" if pending else "", style="dim")
        value = self.paths[pair]
        if value is None:
            return _cell("—", style="dim")
        if unused(strong, value):
            # the theme's warning colour (ANSI yellow was 2.8:1 on the light theme)
            warning = (getattr(self.app, "theme_variables", None) or {}).get("warning", "yellow")
            return _cell(f"{value:+.2f}", "unused", style=f"bold {warning}")
        if used(strong, value):  # as the README's tour reads it: "+0.72, used"
            return _cell(f"{value:+.2f}", "used")
        return _cell(f"{value:+.2f}")

    def path_line(self, edge: tuple[int, int, int, int, float], strong: bool) -> str:
        """The detail line's part about the edge's path effect."""
        pair = ((edge[0], edge[1]), (edge[2], edge[3]))
        if pair not in self.paths:
            if self.paths_state == "computing":
                return "path patching on the current task…"
            return "" if not self.paths_state or self.paths_state == "done" \
                else f"path patching: {self.paths_state}"
        value = self.paths[pair]
        if value is None:
            return f"path patching on {self.paths_task}: recovered undefined"
        line = f"path patching on {self.paths_task}: recovered {value:+.3f}"
        if unused(strong, value):  # strong weights, |path effect| < NEAR_ZERO
            line += f" · {UNUSED}"
        elif used(strong, value):
            line += f" · {USED}"
        return line

    def _is_top(self, pair: tuple[Head, Head]) -> bool:
        return pair in getattr(self, "path_top", ())

    async def load_paths(self, host: PaneHost, key: LoadKey, kind: str,
                         edges: Sequence[tuple[int, int, int, int, float]]) -> None:
        """Path-patch the top edges on the current task (the Patch tab's inputs)."""
        top = path_edges([e for e in edges if e[4] > 0])
        self.path_top = set(top)
        if not top:
            return
        self.paths_state = "computing"
        self.redraw_paths()
        try:
            found = await host.engine.get(PatchInputsRequest.of(host.structure, edges=top, site=kind,
                                                                **host.patch_request()))
        except EngineCancelled:
            self.paths_state = ""
            raise
        except HeadscopeError as err:
            self.paths_state = err.one_line() if hasattr(err, "one_line") else str(err)
            self.redraw_paths()
            return
        if not host.fresh(key):
            return
        self.paths = path_effects(found)
        # the result's metric names the task (core.validation.PATCH_TASKS): say which it was
        self.paths_task = "your prompts" if found.metric == "logit_diff" else f"the {found.metric} task"
        self.paths_state = "done"
        self.redraw_paths()

    def redraw_paths(self) -> None:
        """The pane draws its table and the selected edge's detail again."""
        pane: Any = self
        pane.redraw()
        if pane.shown is None:
            return
        if pane.selected is not None:
            edge = next((e for e in pane.edges if tuple(e[:4]) == tuple(pane.selected)), None)
        else:  # the cursor has not moved: the first row's detail
            edge = pane.edges[0] if pane.edges else None
        if edge is not None:
            pane.detail(pane.shown, edge)
