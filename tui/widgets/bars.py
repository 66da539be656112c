"""Signed values drawn as text: horizontal bars and their colours, the ends of the heatmap
colour map in use (so a bar's colour means what a heatmap cell's does)."""

from __future__ import annotations

import math
from typing import Any

from rich.text import Text
from textual.color import Color

from headscope.themes import COLORMAPS
from headscope.tui.base.contrast import readable


def bar_colours(widget: Any) -> tuple[str, str]:
    """Negative/positive bar colours: the ends of the app's heatmap colour map."""
    neg, _, pos = COLORMAPS.get(getattr(widget.app, "colormap_name", ""), COLORMAPS["red-blue"])
    return (f"rgb({neg[0]},{neg[1]},{neg[2]})", f"rgb({pos[0]},{pos[1]},{pos[2]})")


def text_colours(widget: Any) -> tuple[str, str]:
    """Negative/positive colours for signed numbers written as text: the heatmap's ends,
    blended towards the theme's foreground until they read (WCAG AA) on its surface, panel
    and background (the plain ends were 2.6–4.4:1 on the dark themes)."""
    neg, _, pos = COLORMAPS.get(getattr(widget.app, "colormap_name", ""), COLORMAPS["red-blue"])
    variables = getattr(widget.app, "theme_variables", {}) or {}
    try:
        fg = Color.parse(variables["foreground"]).rgb
        backgrounds = [Color.parse(variables[k]).rgb for k in ("surface", "panel", "background")]
    except (KeyError, ValueError):  # not a headscope theme's variables: the plain ends
        return bar_colours(widget)
    out = []
    for end in (neg, pos):
        r, g, b = readable(end, fg, backgrounds)
        out.append(f"rgb({r},{g},{b})")
    return out[0], out[1]


def bar_half(width: int, used: int, most: int) -> int:
    """How wide each half of a ``signed_bar`` can be in a table ``width`` columns wide whose
    other columns take ``used`` (padding included): up to ``most``, 0 when not one block
    fits (cropped, a positive bar lost its right half, all of it); ``most`` while the
    widget is not laid out yet (``width`` 0)."""
    if width <= 0:
        return most
    return max(0, min(most, (width - used - 2 - 1) // 2))  # the column's padding, the axis


def signed_bar(value: float, vmax: float, width: int = 12,
               colours: tuple[str, str] = ("blue", "red")) -> Text:
    """A signed horizontal bar: right of the axis for positive values, left for negative."""
    if not math.isfinite(value) or vmax <= 0:
        return Text(" " * (2 * width + 1))
    n = min(width, round(abs(value) / vmax * width))
    left = " " * (width - n) + ("█" * n if value < 0 else " " * n)
    right = ("█" * n if value > 0 else " " * n) + " " * (width - n)
    text = Text(left[:width], style=colours[0])
    text.append("│", style="dim")
    text.append(right[:width], style=colours[1])
    return text
