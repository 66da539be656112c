"""Command palette: "Go to head L.H", sorting, themes, colour maps, exports."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, cast

from textual.command import DiscoveryHit, Hit, Hits, Provider

from headscope.themes import COLORBLIND_SAFE, COLORMAPS, THEME_NAMES
from headscope.tui.base.labels import SCORES

if TYPE_CHECKING:
    from headscope.tui.screens.explorer import ExplorerScreen


class PaletteHost(Protocol):
    """What the palette's commands act on: the app (``HeadscopeApp``) and its explorer."""

    structure: dict[str, Any]
    theme: str

    @property
    def explorer(self) -> ExplorerScreen: ...

    def set_colormap(self, name: str | None) -> None: ...

    def action_screenshot_svg(self) -> None: ...

    def action_choose_output_dir(self) -> None: ...


class HeadscopeCommands(Provider):
    def _commands(self) -> list[tuple[str, Callable[[], object], str]]:
        app = cast("PaletteHost", self.app)
        explorer = app.explorer
        cmds: list[tuple[str, Callable[[], object], str]] = []
        s = app.structure
        for layer in range(int(s.get("n_layers") or 0)):
            for head in range(int(s.get("n_heads") or 0)):
                cmds.append((f"Go to head {layer}.{head}",
                             partial(explorer.goto_head, (layer, head)),
                             f"Focus layer {layer}, head {head}"))
        for key, label in SCORES:
            cmds.append((f"Sort heads by {label}", partial(explorer.sort_summary, key),
                         "Summary table, highest first"))
        for name in THEME_NAMES:
            cmds.append((f"Theme: {name}", partial(setattr, app, "theme", name), "Switch theme"))
        for name in COLORMAPS:
            safe = " (colour-blind safe)" if name in COLORBLIND_SAFE else ""
            cmds.append((f"Colour map: {name}{safe}", partial(app.set_colormap, name),
                         "Heatmap colours"))
        for kind in "qkv":
            cmds.append((f"Composition: {kind.upper()}", partial(explorer.show_composition, kind),
                         f"{kind.upper()}-composition graph and edges"))
        cmds += [
            ("Export current view (JSON)", explorer.action_export, "Write the view's data"),
            ("Save screenshot (SVG)", app.action_screenshot_svg, "To the output directory"),
            ("Set output directory…", app.action_choose_output_dir,
             "Where screenshots and exports go"),
            ("Toggle raw / processed weights", explorer.action_toggle_raw, "Weight processing"),
            ("Choose tokens…", explorer.action_choose_tokens, "Rows/columns of QK and OV"),
            ("Ablation sweep: zero each head", explorer.action_ablation_sweep,
             "Loss increase on repeated random tokens, per head (Summary tab)"),
        ]
        return cmds

    async def discover(self) -> Hits:
        for name, callback, help_text in self._commands():
            if not name.startswith("Go to head"):
                yield DiscoveryHit(name, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, callback, help_text in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, help=help_text)
