"""Reading a head in the explorer (docs/math.md, "Reading a head").

- ``DirectionsPanel``: beside the QK and OV heatmaps, the focused head's singular directions
  of that circuit as tokens, one at a time: index/k, σ, the tokens it reads (in) and writes
  (out) with their signed values, the direction's in/out overlap and the head's. ``(`` / ``)``
  step through them (``ExplorerScreen.action_step_direction``); ``v`` shows or hides the panel
  (hidden by default on a narrow terminal and in compare mode). The panel loads it through
  a ``DirectionsRequest`` in its own worker (``want``), cached per head (the panel keeps
  what it has shown, per head and weights generation).
- ``PathScreen`` (tui/screens/path.py): the virtual heads of a composition edge.

Token strings are data: they go into ``rich.text.Text`` (``data_text``), never markup.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from headscope.engine.core.errors import CancelledError as EngineCancelled
from headscope.engine.core.errors import HeadscopeError
from headscope.engine.core.requests import DirectionsRequest
from headscope.tui.base.datatext import data_text
from headscope.tui.widgets.bars import text_colours

if TYPE_CHECKING:
    from headscope.engine.core.results import SingularDirections
    from headscope.tui.base.protocols import PaneHost

Head = tuple[int, int]
# The CLI's defaults (headscope svd --k 5 --top 10): the panel shows the numbers `svd` prints.
N_DIRECTIONS = 5
N_TOKENS = 10
TOKEN_WIDTH = 9  # characters of a token shown in the panel


def _signed(value: float, colours: tuple[str, str]) -> Text:
    """A signed value, coloured like the heatmaps' ends (``colours``: negative, positive)."""
    return Text(f"{value:+.2f}", style=colours[1] if value > 0 else colours[0] if value < 0 else "")


def _overlap(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:+.2f}"


def direction_view(found: SingularDirections, index: int,
                   colours: tuple[str, str] = ("red", "blue")) -> Group:
    """Direction ``index`` of ``found``: its σ and overlap, then the tokens it reads and writes
    (OV: source → output token) or the query and key tokens it pairs (QK), signed (coloured
    ``colours``: negative, positive)."""
    d = found.directions[index]
    name = "OV" if found.kind == "ov" else "QK"
    head = Text.assemble((f"{name} direction {d.index + 1}/{len(found.directions)}", "bold"),
                         f"  σ {d.sigma:.3g}")
    overlap = Text.assemble("overlap ", (_overlap(d.overlap), "bold"),
                            f" · head {_overlap(found.overlap)}", style="")
    left, right = ("reads", "writes") if found.kind == "ov" else ("query", "key")
    table = Table(box=None, padding=(0, 1, 0, 0), expand=True, show_edge=False)
    for column in (left, "", right, ""):
        table.add_column(column, no_wrap=True, overflow="crop",
                         justify="right" if column == "" else "left")
    for i in range(max(len(d.in_ids), len(d.out_ids))):
        cells: list[Text] = []
        for labels, values in ((d.in_labels, d.in_values), (d.out_labels, d.out_values)):
            if i < len(labels):
                cells += [data_text(labels[i], width=TOKEN_WIDTH),
                          _signed(float(values[i]), colours)]
            else:
                cells += [Text(""), Text("")]
        table.add_row(*cells)
    return Group(head, overlap, table)


class DirectionsPanel(Static):
    """One circuit's (``kind``: ``ov`` or ``qk``) singular directions of the focused head.

    ``key`` is (head, weights generation) of what the panel shows or is loading; ``cache``
    the results already shown (this generation's); ``index`` the direction shown."""

    # A fixed height (the border, σ, overlap, the header, N_TOKENS rows): the heatmaps beside it
    # keep their size while it loads.
    DEFAULT_CSS = f"""
    DirectionsPanel {{
        height: {N_TOKENS + 4}; padding: 0 1; border-top: solid $panel-lighten-1;
        border-title-align: right; border-title-color: $text-muted;
    }}
    """

    def __init__(self, kind: str, *, id: str | None = None) -> None:
        super().__init__(Text("waiting for the model…", style="dim italic"), id=id)
        self.kind = kind
        self.key: tuple[Head, int] | None = None
        self.cache: dict[tuple[Head, int], SingularDirections] = {}
        self.found: SingularDirections | None = None
        self.index = 0
        self.border_title = Text("( ) step · v hides")

    def loading(self, key: tuple[Head, int]) -> None:
        (layer, head), _gen = key
        self.key, self.found = key, None
        self.update(Text(f"L{layer}.H{head} {self.kind.upper()} directions: loading…",
                         style="dim italic"))

    def want(self, host: PaneHost, key: tuple[Head, int],
             ready: Callable[[], Awaitable[object]]) -> None:
        """Show the directions of ``key``: from the cache, else asked of the engine (once
        ``ready()``) in this panel's exclusive worker, a loading note meanwhile."""
        if self.key == key:  # shown, or on its way
            return
        cached = self.cache.get(key)
        if cached is not None:
            self.show(key, cached)
            return
        self.loading(key)
        self.run_worker(partial(self._when_ready, host, key, ready), group="directions",
                        exclusive=True, exit_on_error=False)

    async def _when_ready(self, host: PaneHost, key: tuple[Head, int],
                          ready: Callable[[], Awaitable[object]]) -> None:
        await ready()
        await self.load(host, key)

    def stop(self) -> None:
        """The weights changed: stop asking for the old ones' directions."""
        self.app.workers.cancel_group(self, "directions")

    async def load(self, host: PaneHost, key: tuple[Head, int]) -> None:
        """Ask the engine for the head's directions of ``key`` (``want`` runs this in the
        panel's exclusive worker); shown if the panel still waits for ``key``."""
        (layer, head), _gen = key
        try:
            found = await host.engine.get(DirectionsRequest.of(host.structure, layer, head, self.kind,
                                                               k=N_DIRECTIONS, top=N_TOKENS))
        except EngineCancelled:
            if self.key == key:
                self.key = None  # asked again at the next load
            return
        except HeadscopeError as err:
            if self.key == key:
                self.failed(f"cannot read the directions: {err}")
            return
        except Exception as err:  # keep running: an engine bug becomes a notification
            host.report(f"directions: unexpected error {err!r}")
            if self.key == key:
                self.failed("cannot read the directions (see the notification)")
            return
        if self.key == key:
            self.show(key, found)

    def failed(self, why: str) -> None:
        self.key, self.found = None, None
        self.update(Text(why, style="italic"))

    def show(self, key: tuple[Head, int], found: SingularDirections) -> None:
        """``found`` for ``key``; the direction shown stays if it is the same head's."""
        if self.found is None or (self.found.layer, self.found.head) != key[0]:
            self.index = 0
        self.cache = {k: v for k, v in self.cache.items() if k[1] == key[1]}  # this gen's only
        self.cache[key] = found
        self.key, self.found = key, found
        self.redraw()

    def step(self, step: int) -> bool:
        """Show the next (``step`` 1) or previous (-1) direction, cyclically; False if none."""
        if self.found is None or not self.found.directions:
            return False
        self.index = (self.index + step) % len(self.found.directions)
        self.redraw()
        return True

    def redraw(self) -> None:
        found = self.found
        if found is None:
            return
        if not found.directions:
            self.update(Text("no singular directions (non-finite weights?)", style="italic"))
            return
        self.index = min(self.index, len(found.directions) - 1)
        self.update(direction_view(found, self.index, text_colours(self)))
