"""Which colours the terminal shows, for the heatmaps (tui/plots/colormap.py draws each mode).

``NO_COLOR`` (any non-empty value, https://no-color.org) means no colour; otherwise Rich's
detection, which reads ``COLORTERM`` (truecolor/24bit) and ``TERM`` (``*-256color``).
"""

from __future__ import annotations

from collections.abc import Mapping

from headscope.tui.base.settings import (
    COLOR_MODES,  # (tui/plots/colormap.py imports numpy: not before the first frame)
)

__all__ = ["COLOR_MODES", "detect_color_mode"]

_FROM_RICH = {"truecolor": "truecolor", "256": "256", "standard": "16", "windows": "16"}


def detect_color_mode(color_system: str | None, env: Mapping[str, str]) -> str:
    """``truecolor``, ``256``, ``16`` or ``none`` from Rich's ``Console.color_system``."""
    if env.get("NO_COLOR"):
        return "none"
    return _FROM_RICH.get(color_system or "", "none")
