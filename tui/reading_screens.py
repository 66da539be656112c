"""Reading a head in the explorer (docs/math.md, "Reading a head"): two dialogs over it.

- ``DirectionsScreen``: a head's OV (or QK) singular directions as tokens, one at a time,
  beside the singular values; ``{`` / ``}`` (or ↑ ↓) step through them, ``x`` switches OV/QK.
- ``PathScreen``: the virtual heads of a composition edge: the K-path heatmap (query token ×
  the token the earlier head moved), its positivity and diagonal rate, the V-path's copying
  score; ``g`` focuses the later head.

``v`` opens them (``ExplorerScreen.action_read_head``): the path of the highlighted edge on
the composition tab, else the focused head's directions. Token strings are data: they go into
``rich.text.Text``, never markup.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from .plots import Heatmap
from .widgets.chart import Chart

if TYPE_CHECKING:
    from headscope.engine.results import SingularDirections, VirtualPath

    from .engine_api import ExplorerEngine

Head = tuple[int, int]
N_DIRECTIONS = 8  # directions asked for (a head has at most d_head)
N_TOKENS = 10  # tokens listed each side

_CSS = """
{name} {{ align: center middle; }}
{name} > Vertical {{
    width: 95%; max-width: 140; height: 90%;
    border: round $primary; background: $surface; padding: 0 1;
}}
{name} .reading-title {{ text-style: bold; }}
"""


def _token(label: str) -> Text:
    return Text(repr(label)[1:-1][:14], no_wrap=True)


def _signed(value: float) -> Text:
    return Text(f"{value:+.3f}", style="green" if value > 0 else "red")


def sigma_list(found: SingularDirections, index: int) -> Text:
    """The singular values, the shown one marked."""
    text = Text("σ  ", style="dim")
    for i, s in enumerate(found.singular_values.tolist()):
        text.append(f"{s:.3g}", style="bold reverse" if i == index else "")
        text.append("  ")
    return text


def direction_table(found: SingularDirections, index: int) -> Table:
    """Direction ``index``: the tokens it reads and writes (OV) or queries and keys (QK)."""
    d = found.directions[index]
    left, right = ("reads (source)", "writes (output)") if found.kind == "ov" \
        else ("query token", "key token")
    overlap = "n/a" if math.isnan(d.overlap) else f"{d.overlap:+.2f}"
    table = Table(box=None, padding=(0, 1), expand=True, title_justify="left",
                  title=f"direction {d.index + 1}/{len(found.directions)}  σ = {d.sigma:.3g}  "
                        f"overlap {overlap}")
    for name in (left, "", right, ""):
        table.add_column(name, no_wrap=True)
    for i in range(max(len(d.in_ids), len(d.out_ids))):
        cells: list[Text] = []
        for labels, values in ((d.in_labels, d.in_values), (d.out_labels, d.out_values)):
            if i < len(labels):
                cells += [_token(labels[i]), _signed(float(values[i]))]
            else:
                cells += [Text(""), Text("")]
        table.add_row(*cells)
    return table


class DirectionsScreen(ModalScreen[None]):
    """A head's singular directions as tokens, stepped through one at a time."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,v", "dismiss", "Close", id="directions-close"),
        Binding("right_curly_bracket,down,j", "step(1)", "Next direction", id="directions-next"),
        Binding("left_curly_bracket,up,k", "step(-1)", "Prev direction", id="directions-prev"),
        Binding("x", "switch_kind", "OV/QK", id="directions-kind"),
    ]
    DEFAULT_CSS = _CSS.format(name="DirectionsScreen")

    def __init__(self, engine: ExplorerEngine, head: Head, kind: str = "ov") -> None:
        super().__init__()
        self.engine, self.head, self.kind = engine, head, kind
        self.index = 0
        self.found: SingularDirections | None = None

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("", id="directions-title", classes="reading-title")
            yield Static("loading…", id="directions-sigma")
            yield Static("", id="directions-table")
            yield Label(Text("} / ↓ next · { / ↑ previous · x OV/QK · escape closes", style="dim"))

    def on_mount(self) -> None:
        self.load()

    @work(exclusive=True, group="directions")
    async def load(self) -> None:
        layer, head = self.head
        self.query_one("#directions-title", Label).update(
            f"L{layer}.H{head} {self.kind.upper()} singular directions "
            f"({'W_E OV W_U' if self.kind == 'ov' else 'W_E QK W_Eᵀ'})")
        self.found = await self.engine.singular_directions(layer, head, self.kind,
                                                           k=N_DIRECTIONS, top=N_TOKENS)
        self.index = min(self.index, max(0, len(self.found.directions) - 1))
        self.redraw()

    def redraw(self) -> None:
        if self.found is None or not self.found.directions:
            return
        self.query_one("#directions-sigma", Static).update(sigma_list(self.found, self.index))
        self.query_one("#directions-table", Static).update(direction_table(self.found, self.index))

    def action_step(self, step: int) -> None:
        if self.found is None or not self.found.directions:
            return
        self.index = (self.index + step) % len(self.found.directions)
        self.redraw()

    def action_switch_kind(self) -> None:
        self.kind = "qk" if self.kind == "ov" else "ov"
        self.found = None
        self.load()

    def action_dismiss(self, result: None = None) -> None:  # type: ignore[override]
        self.dismiss(None)


def path_summary(found: VirtualPath) -> Text:
    """The path's scores, one line."""
    (la, ha), (lb, hb) = found.source, found.target
    text = Text(f"L{la}.H{ha} → L{lb}.H{hb}   ", style="bold")
    text.append(f"K-path positivity {found.k_positivity:+.3f} · diagonal {found.k_diagonal:.2f}   ")
    text.append(f"V-path copying {found.v_copying_score:+.3f}")
    return text


def path_heatmap(found: VirtualPath) -> Heatmap:
    same = found.row_ids == found.col_ids
    return Heatmap(found.k_block.astype(float), found.row_labels, found.col_labels,
                   title="K-path  W_E QK_B (W_E OV_A)ᵀ",
                   xlabel="token moved by the earlier head →  (rows: query token)", diagonal=same)


class PathScreen(ModalScreen[Head | None]):
    """The virtual heads of a composition edge; ``g`` focuses the later head."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,v", "close", "Close", id="path-close"),
        Binding("g", "goto_target", "Go to head", id="path-goto"),
    ]
    DEFAULT_CSS = _CSS.format(name="PathScreen")

    def __init__(self, engine: ExplorerEngine, source: Head, target: Head,
                 tokens: Any = None) -> None:
        super().__init__()
        self.engine, self.source, self.target, self.tokens = engine, source, target, tokens
        self.found: VirtualPath | None = None

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("loading…", id="path-summary")
            with Horizontal():
                yield Chart(id="path-heatmap", placeholder="loading…")
            yield Label(Text("g focuses the later head · escape closes", style="dim"))

    def on_mount(self) -> None:
        self.load()

    @work(exclusive=True, group="path")
    async def load(self) -> None:
        self.found = await self.engine.virtual_path(self.source, self.target,
                                                    rows=self.tokens, cols=self.tokens)
        self.query_one("#path-summary", Static).update(path_summary(self.found))
        self.query_one("#path-heatmap", Chart).show(path_heatmap(self.found))

    def action_goto_target(self) -> None:
        self.dismiss(self.target)

    def action_close(self) -> None:
        self.dismiss(None)
