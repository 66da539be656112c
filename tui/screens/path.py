"""The virtual heads of a composition edge (docs/math.md, "Reading a head"), opened by enter on
an edge of the Composition tab: the K-path heatmap (query token × the token the earlier head
moved), its positivity and diagonal rate, the V-path's copying score and eigenvalues; ``g``
focuses the later head, ``s`` saves an SVG of the pop-up.

Token strings are data: they go into ``rich.text.Text``, never markup.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from headscope.engine.core.errors import HeadscopeError
from headscope.engine.core.requests import PathRequest
from headscope.tui.base.keymap import modal_binding
from headscope.tui.plots.figures import Heatmap, Scatter
from headscope.tui.widgets.chart import Chart

if TYPE_CHECKING:
    from headscope.engine.core.results import VirtualPath
    from headscope.tui.base.protocols import ExplorerEngine

Head = tuple[int, int]

CSS = """
{name} {{ align: center middle; }}
{name} > Vertical {{
    width: 95%; max-width: 140; height: 90%;
    border: round $primary; background: $surface; padding: 0 1;
}}
{name} .reading-title {{ text-style: bold; }}
{name} #path-charts {{ height: 1fr; }}
/* a blank column between the charts: the heatmap's text lines (title, x label, key) may
   fill its width, and the x label ran into the spectrum's tick labels ("(rows: …-0.5┤") */
{name} #path-heatmap {{ width: 3fr; margin-right: 1; }}
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
                   xlabel="token moved by the earlier head →  (rows: query token)",
                   # the pop-up's heatmap is ~42 columns at 80×24 ("(rows:…")
                   xlabel_short=("earlier head's token →  (rows: query)", "moved token →  (rows: query)"),
                   diagonal=same)


def path_spectrum(found: VirtualPath) -> Scatter:
    eig = np.asarray(found.v_eigenvalues).astype(np.complex128)
    return Scatter(eig.real, eig.imag, title="V-path λ  W_E OV_A OV_B W_U")


class PathScreen(ModalScreen[Head | None]):
    """The virtual heads of a composition edge; ``g`` focuses the later head."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q", "close", "Close", id="path-close"),
        Binding("g", "goto_target", "Go to head", id="path-goto"),
        modal_binding("screenshot"),  # s: an SVG of the pop-up
    ]
    DEFAULT_CSS = CSS.format(name="PathScreen")

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
            yield Label(Text(f"{self.key('path-goto', 'g')} focuses L{lb}.H{hb} · "
                             f"{self.key('screenshot', 's')} saves an SVG · escape closes",
                             style="dim"))

    def key(self, binding_id: str, default: str) -> str:
        """The key bound to ``binding_id``: ``default``, or the user's (the app's keymap)."""
        keymap = getattr(self.app, "keymap_in_use", None) or {}
        return str(keymap.get(binding_id, default)).split(",")[0]

    def on_mount(self) -> None:
        self.load()

    @work(exclusive=True, group="path", exit_on_error=False)
    async def load(self) -> None:
        try:
            engine = self.engine
            self.found = await engine.get(PathRequest.of(engine.structure, self.source, self.target,
                                                         rows=self.tokens, cols=self.tokens,
                                                         limit=engine.max_block_bytes))
        except HeadscopeError as err:
            self.query_one("#path-summary", Static).update(Text(f"cannot read the path: {err}"))
            self.query_one("#path-heatmap", Chart).message("")
            return
        self.query_one("#path-summary", Static).update(path_summary(self.found))
        self.query_one("#path-heatmap", Chart).show(path_heatmap(self.found))
        self.query_one("#path-spectrum", Chart).show(path_spectrum(self.found))

    @property
    def file_view(self) -> str:
        """What a screenshot's file name says is on screen (``HeadscopeApp.stem``)."""
        (la, ha), (lb, hb) = self.source, self.target
        return f"path_L{la}H{ha}-L{lb}H{hb}"

    def action_goto_target(self) -> None:
        self.dismiss(self.target)

    def action_close(self) -> None:
        self.dismiss(None)
