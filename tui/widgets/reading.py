"""Reading a head in the explorer (docs/math.md, "Reading a head").

- ``DirectionsPanel``: beside the QK and OV heatmaps, the focused head's singular directions
  of that circuit as tokens, one at a time: index/k, σ, the tokens it reads (in) and writes
  (out) with their signed values, the direction's in/out overlap and the head's. ``(`` / ``)``
  step through them (``ExplorerScreen.action_step_direction``); ``v`` shows or hides the panel
  (hidden by default on a narrow terminal and in compare mode). The explorer loads it through
  the engine's ``singular_directions`` request in a worker, cached per head (the panel keeps
  what it has shown, per head and weights generation).
- ``PathScreen``: the virtual heads of a composition edge (enter on an edge of the composition
  tab): the K-path heatmap (query token × the token the earlier head moved), its positivity and
  diagonal rate, the V-path's copying score and eigenvalues; ``g`` focuses the later head.

Token strings are data: they go into ``rich.text.Text`` (``data_text``), never markup.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from headscope.engine.core.errors import CancelledError as EngineCancelled
from headscope.engine.core.errors import HeadscopeError
from headscope.tui.base.datatext import data_text
from headscope.tui.plots.figures import Heatmap, Scatter
from headscope.tui.widgets.bars import bar_colours
from headscope.tui.widgets.chart import Chart

if TYPE_CHECKING:
    from headscope.engine.core.results import SingularDirections, VirtualPath
    from headscope.tui.base.protocols import ExplorerEngine, PaneHost

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
        border-title-align: right;
    }}
    """

    def __init__(self, kind: str, *, id: str | None = None) -> None:
        super().__init__(Text("waiting for the model…", style="dim italic"), id=id)
        self.kind = kind
        self.key: tuple[Head, int] | None = None
        self.cache: dict[tuple[Head, int], SingularDirections] = {}
        self.found: SingularDirections | None = None
        self.index = 0
        self.border_title = Text("( ) step · v hides", style="dim")

    def loading(self, key: tuple[Head, int]) -> None:
        (layer, head), _gen = key
        self.key, self.found = key, None
        self.update(Text(f"L{layer}.H{head} {self.kind.upper()} directions: loading…",
                         style="dim italic"))

    async def load(self, host: PaneHost, key: tuple[Head, int]) -> None:
        """Ask the engine for the head's directions of ``key`` (the explorer runs this in an
        exclusive worker per panel); shown if the panel still waits for ``key``."""
        (layer, head), _gen = key
        try:
            found = await host.engine.singular_directions(layer, head, self.kind,
                                                          k=N_DIRECTIONS, top=N_TOKENS)
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
        self.update(direction_view(found, self.index, bar_colours(self)))


# -- the path view ----------------------------------------------------------------------------

_CSS = """
{name} {{ align: center middle; }}
{name} > Vertical {{
    width: 95%; max-width: 140; height: 90%;
    border: round $primary; background: $surface; padding: 0 1;
}}
{name} .reading-title {{ text-style: bold; }}
{name} #path-charts {{ height: 1fr; }}
{name} #path-heatmap {{ width: 3fr; }}
{name} #path-spectrum {{ width: 2fr; }}
"""


def path_summary(found: VirtualPath) -> Text:
    """The path's scores and the V-path's singular values."""
    (la, ha), (lb, hb) = found.source, found.target
    text = Text(f"L{la}.H{ha} → L{lb}.H{hb}\n", style="bold")
    text.append("K-path ")
    text.append(f"positivity {found.k_positivity:+.3f}", style="bold")
    text.append(f" · diagonal {found.k_diagonal:.2f}   V-path ")
    text.append(f"copying {found.v_copying_score:+.3f}", style="bold")
    sigma = np.asarray(found.v_singular_values, dtype=np.float64)[:6]
    if sigma.size:
        text.append("  σ " + " ".join(f"{s:.3g}" for s in sigma), style="dim")
    return text


def path_heatmap(found: VirtualPath) -> Heatmap:
    same = found.row_ids == found.col_ids
    return Heatmap(found.k_block.astype(float), found.row_labels, found.col_labels,
                   title="K-path  W_E QK_B (W_E OV_A)ᵀ",
                   xlabel="token moved by the earlier head →  (rows: query token)", diagonal=same)


def path_spectrum(found: VirtualPath) -> Scatter:
    eig = np.asarray(found.v_eigenvalues).astype(np.complex128)
    return Scatter(eig.real, eig.imag, title="V-path λ  W_E OV_A OV_B W_U")


class PathScreen(ModalScreen[Head | None]):
    """The virtual heads of a composition edge; ``g`` focuses the later head."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q", "close", "Close", id="path-close"),
        Binding("g", "goto_target", "Go to head", id="path-goto"),
    ]
    DEFAULT_CSS = _CSS.format(name="PathScreen")

    def __init__(self, engine: ExplorerEngine, source: Head, target: Head,
                 tokens: Any = None) -> None:
        super().__init__()
        self.engine, self.source, self.target, self.tokens = engine, source, target, tokens
        self.found: VirtualPath | None = None

    def compose(self) -> ComposeResult:
        (la, ha), (lb, hb) = self.source, self.target
        with Vertical():
            yield Static(Text(f"L{la}.H{ha} → L{lb}.H{hb}: loading the virtual heads…"),
                         id="path-summary")
            with Horizontal(id="path-charts"):
                yield Chart(id="path-heatmap", placeholder="loading…")
                yield Chart(id="path-spectrum", placeholder="")
            yield Label(Text(f"g focuses L{lb}.H{hb} · escape closes", style="dim"))

    def on_mount(self) -> None:
        self.load()

    @work(exclusive=True, group="path", exit_on_error=False)
    async def load(self) -> None:
        try:
            self.found = await self.engine.virtual_path(self.source, self.target,
                                                        rows=self.tokens, cols=self.tokens)
        except HeadscopeError as err:
            self.query_one("#path-summary", Static).update(Text(f"cannot read the path: {err}"))
            self.query_one("#path-heatmap", Chart).message("")
            return
        self.query_one("#path-summary", Static).update(path_summary(self.found))
        self.query_one("#path-heatmap", Chart).show(path_heatmap(self.found))
        self.query_one("#path-spectrum", Chart).show(path_spectrum(self.found))

    def action_goto_target(self) -> None:
        self.dismiss(self.target)

    def action_close(self) -> None:
        self.dismiss(None)
