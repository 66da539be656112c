"""headscope's Textual themes and heatmap colour maps (data only, no logic).

Each theme names the diverging colour map its heatmaps use, so switching the theme switches
the heatmaps too. A colour map is three RGB stops: negative end, zero, positive end; the
zero stop is close to the theme's surface colour so that "nothing" looks like background.
``headscope-colorblind`` uses blue/orange, which stays distinguishable under the common
red–green deficiencies (the scheme of ColorBrewer's PuOr / Okabe–Ito).
"""

from __future__ import annotations

from pathlib import Path

from textual.theme import Theme

RGB = tuple[int, int, int]

# name -> (negative, zero, positive)
COLORMAPS: dict[str, tuple[RGB, RGB, RGB]] = {
    "red-blue": ((66, 133, 244), (24, 26, 31), (234, 67, 53)),
    "red-blue-light": ((33, 102, 172), (247, 247, 247), (178, 24, 43)),
    "blue-orange": ((0, 114, 178), (24, 26, 31), (230, 159, 0)),  # colour-blind safe
    "blue-orange-light": ((0, 90, 160), (247, 247, 247), (213, 94, 0)),  # colour-blind safe
    "contrast": ((0, 200, 255), (0, 0, 0), (255, 255, 0)),
}

# Every theme sets "text-muted" and "text-disabled" (hints, placeholders, inactive tabs) to
# a colour with WCAG AA contrast (≥ 4.5:1) on its background, surface and panel, also after
# the 256-colour downgrade: Textual's defaults (60% and 38% of the foreground) and a "dim"
# on top fell to 1.3–3.9:1 (tests/test_tui_contrast.py reads what the screen shows).
COLORBLIND_SAFE = frozenset({"blue-orange", "blue-orange-light", "contrast"})

DARK = Theme(
    name="headscope-dark",
    primary="#5fafff",
    secondary="#87d7af",
    accent="#ffaf5f",
    warning="#ffd75f",
    error="#ff5f5f",
    success="#5fd787",
    foreground="#d0d4dc",
    background="#121418",
    surface="#181a1f",
    panel="#23262e",
    dark=True,
    variables={"heatmap": "red-blue", "text-muted": "#9aa0aa", "text-disabled": "#9aa0aa",
               "block-cursor-background": "#162d4a", "block-cursor-blurred-background": "#23262e",
               "badge-strong": "#5fd787", "badge-mid": "#ffd75f"},
)

LIGHT = Theme(
    name="headscope-light",
    primary="#0055aa",
    secondary="#2a7f62",
    accent="#8f4e00",
    warning="#8a5c00",
    error="#c62828",
    success="#146c31",
    foreground="#1e2228",
    background="#f4f5f7",
    surface="#ffffff",
    panel="#e9eaec",  # 256 colours: grey 254, not 253 (dim status text stays ≥ 4.5:1)
    dark=False,
    variables={"heatmap": "red-blue-light", "text-muted": "#555c66",
               "text-disabled": "#555c66", "block-cursor-background": "#e6eefa",
               "block-cursor-blurred-background": "#e9eaec", "badge-strong": "#146c31", "badge-mid": "#8a5c00"},
)

CONTRAST = Theme(
    name="headscope-contrast",
    primary="#ffff00",
    secondary="#00ffff",
    accent="#ff00ff",
    warning="#ffff00",
    error="#ff3030",
    success="#00ff00",
    foreground="#ffffff",
    background="#000000",
    surface="#000000",
    panel="#1a1a1a",
    dark=True,
    luminosity_spread=0.25,
    text_alpha=1.0,
    variables={"heatmap": "contrast", "text-muted": "#aaaaaa", "text-disabled": "#aaaaaa",
               "block-cursor-background": "#00005f", "block-cursor-blurred-background": "#1a1a1a",
               "badge-strong": "#00ff00", "badge-mid": "#ffff00"},
)

COLORBLIND = Theme(
    name="headscope-colorblind",
    primary="#56b4e9",
    secondary="#009e73",
    accent="#e69f00",
    warning="#f0e442",
    error="#d55e00",
    success="#56b4e9",
    foreground="#d0d4dc",
    background="#121418",
    surface="#181a1f",
    panel="#23262e",
    dark=True,
    variables={"heatmap": "blue-orange", "text-muted": "#9aa0aa", "text-disabled": "#9aa0aa",
               "block-cursor-background": "#162d4a", "block-cursor-blurred-background": "#23262e",
               "badge-strong": "#56b4e9", "badge-mid": "#e69f00"},
)

THEMES: tuple[Theme, ...] = (DARK, LIGHT, CONTRAST, COLORBLIND)
DEFAULT_THEME = DARK.name
THEME_NAMES: tuple[str, ...] = tuple(t.name for t in THEMES)
# Short names accepted on the command line (`--theme light`).
ALIASES: dict[str, str] = {
    "dark": DARK.name,
    "light": LIGHT.name,
    "contrast": CONTRAST.name,
    "high-contrast": CONTRAST.name,
    "colorblind": COLORBLIND.name,
    "colourblind": COLORBLIND.name,
}

STYLESHEET: Path = Path(__file__).with_name("headscope.tcss")


def colormap_for(theme_name: str) -> str:
    """The heatmap colour map of a theme (built-in Textual themes get the dark map)."""
    for theme in THEMES:
        if theme.name == theme_name:
            return theme.variables["heatmap"]
    return "red-blue"
