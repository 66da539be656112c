"""A plotext chart that is built off the UI thread and cached.

textual-plotext's own ``render()`` rebuilds the whole figure on the UI thread at every
repaint and resets the colours to the theme. Here ``render()`` only looks up a cache keyed
by (size, figure version, theme, colour map); on a miss it shows the last picture (or a
placeholder) and starts a worker that builds the figure in a thread (see STYLE.md: dolphie).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from functools import partial

from rich.text import Text
from textual.app import RenderResult
from textual.color import Color
from textual.theme import Theme
from textual_plotext import PlotextPlot

from headscope.themes import COLORMAPS
from headscope.tui.plots.figures import Colours, Figure, build

CACHE_ENTRIES = 8


class Chart(PlotextPlot):
    """Shows a ``tui.plots`` figure; ``show(figure)`` swaps it, ``message(text)`` a note."""

    DEFAULT_CSS = """
    Chart { width: 1fr; height: 1fr; }
    """
    # `z` (the explorer's zoom) shows a chart on the whole screen (``Screen.maximize``); the
    # picture is cached by size, so the chart is built again at the new size, and back.
    ALLOW_MAXIMIZE = True

    def __init__(self, *, placeholder: str = "", id: str | None = None,
                 classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.figure: Figure | None = None
        self.version = 0
        self.note = placeholder
        self._cache: OrderedDict[tuple, Text] = OrderedDict()
        self._last: Text | None = None
        self._pending: tuple | None = None
        self.builds = 0  # how many figures were built (tests check the cache by it)

    # -- public -----------------------------------------------------------------------
    def show(self, figure: Figure | None) -> None:
        """Replace the figure; the old picture stays up until the new one is built."""
        if figure is self.figure:
            return
        self.figure = figure
        self.version += 1
        self.note = ""
        self.refresh()
        self.call_later(self._kick)  # start building now, not at the next paint

    def _kick(self) -> None:
        key = self._key()
        if self.figure is not None and key not in self._cache and key != self._pending \
                and self.size.width > 0 and self.size.height > 0:
            self._pending = key
            self._start_build(key)

    def message(self, text: str, *, keep_figure: bool = False) -> None:
        """A note instead of a figure (loading…, errors, 'not available')."""
        if not keep_figure:
            self.figure = None
            self._last = None
            self.version += 1
        self.note = text
        self.refresh()

    @property
    def rendered(self) -> Text | None:
        """The picture currently on screen, if built (tests read its plain text)."""
        return self._cache.get(self._key()) if self.figure is not None else None

    # -- rendering ------------------------------------------------------------------------
    def _key(self) -> tuple:
        app = self.app
        return (self.size.width, self.size.height, self.version, app.theme,
                getattr(app, "colormap_name", ""), getattr(app, "color_mode", "truecolor"))

    def render(self) -> RenderResult:
        if self.figure is None:
            return Text(self.note, style="dim")
        key = self._key()
        text = self._cache.get(key)
        if text is not None:
            self._cache.move_to_end(key)
            return text
        if key != self._pending and self.size.width > 0 and self.size.height > 0:
            self._pending = key
            self.call_later(self._start_build, key)
        if self._last is not None:
            return self._last
        return Text(self.note or "rendering…", style="dim")

    def _start_build(self, key: tuple) -> None:
        figure, colours = self.figure, self.colours()
        if figure is None:
            return
        self.run_worker(partial(self._build, key, figure, colours), group=f"chart-{id(self)}",
                        exclusive=True, exit_on_error=False)

    async def _build(self, key: tuple, figure: Figure, colours: Colours) -> None:
        width, height = key[0], key[1]
        try:
            text = await asyncio.to_thread(build, figure, width, height, colours)
        except Exception as err:  # a plotting bug: say so instead of "rendering…" forever
            text = Text(f"cannot draw this figure: {err!r}", style="bold red")
        self.builds += 1
        self._cache[key] = text
        while len(self._cache) > CACHE_ENTRIES:
            self._cache.popitem(last=False)
        if key[2] == self.version:
            self._last = text
        if self._pending == key:
            self._pending = None
        self.refresh()

    def colours(self) -> Colours:
        """Theme colours as RGB, read on the UI thread for the worker.

        From the current theme itself, not ``app.theme_variables``: those are recomputed
        only when the stylesheet is refreshed, after the theme changes, and a chart painted
        in between would cache the old theme's colours under the new theme's key."""
        v = _theme_variables(self.app.current_theme)

        def rgb(name: str, fallback: str) -> tuple[int, int, int]:
            try:
                return Color.parse(v.get(name, fallback)).rgb
            except Exception:
                return Color.parse(fallback).rgb

        cmap = getattr(self.app, "colormap_name", "red-blue")
        return Colours(
            foreground=rgb("foreground", "#d0d0d0"),
            muted=rgb("foreground-muted", "#808080"),
            accent=rgb("accent", "#ffaf5f"),
            primary=rgb("primary", "#5fafff"),
            stops=COLORMAPS.get(cmap, COLORMAPS["red-blue"]),
            mode=getattr(self.app, "color_mode", "truecolor"),
        )


_THEME_VARIABLES: dict[int, tuple[Theme, dict[str, str]]] = {}


def _theme_variables(theme: Theme) -> dict[str, str]:
    """The CSS variables a theme generates (cached: render() asks at every paint)."""
    hit = _THEME_VARIABLES.get(id(theme))
    if hit is None or hit[0] is not theme:
        hit = (theme, {**theme.to_color_system().generate(), **theme.variables})
        _THEME_VARIABLES[id(theme)] = hit
    return hit[1]
