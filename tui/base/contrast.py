"""WCAG 2 contrast, and text colours that meet it (AA: 4.5:1) on a theme's backgrounds.

Pure Python (the opening screen imports the widgets that use it before numpy). The 256-colour
check is Rich's own downgrade: what a ``TERM=*-256color`` terminal gets.
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.color import Color, ColorSystem

RGB = tuple[int, int, int]
AA = 4.5


def relative_luminance(rgb: RGB) -> float:
    """WCAG 2 relative luminance of an sRGB colour."""
    def channel(c: int) -> float:
        v = c / 255
        return v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4
    r, g, b = (channel(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: RGB, b: RGB) -> float:
    """WCAG 2 contrast ratio, 1 (same luminance) to 21 (black on white)."""
    hi, lo = sorted((relative_luminance(a), relative_luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def in_256(rgb: RGB) -> RGB:
    """The colour a 256-colour terminal shows for ``rgb``."""
    return tuple(Color.from_rgb(*rgb).downgrade(ColorSystem.EIGHT_BIT).get_truecolor())  # type: ignore[return-value]


def worst_contrast(fg: RGB, backgrounds: Iterable[RGB]) -> float:
    """The lowest contrast of ``fg`` on any of ``backgrounds``, in truecolor and in 256."""
    return min(min(contrast(fg, bg), contrast(in_256(fg), in_256(bg))) for bg in backgrounds)


def readable(colour: RGB, foreground: RGB, backgrounds: Iterable[RGB], ratio: float = AA) -> RGB:
    """``colour`` as text on ``backgrounds``: itself if it reaches ``ratio`` there, else the
    first tenth-step blend towards ``foreground`` (the theme's text colour) that does. Keeps
    the hue of a heatmap's end where it can (a value's sign stays readable as its colour)."""
    backgrounds = tuple(backgrounds)
    for step in range(11):
        t = step / 10
        blended = tuple(round(c * (1 - t) + f * t) for c, f in zip(colour, foreground, strict=True))
        if worst_contrast(blended, backgrounds) >= ratio:  # type: ignore[arg-type]
            return blended  # type: ignore[return-value]
    return foreground
