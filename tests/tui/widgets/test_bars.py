"""Signed bars (tui/widgets/bars.py): a value drawn right of the axis when positive, left when
negative, as long as its share of the largest value; the colours are the heatmap's ends."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from headscope.themes import COLORMAPS
from headscope.tui.widgets.bars import bar_colours, bar_half, signed_bar


@pytest.mark.parametrize(("value", "blocks"), [(1.0, 12), (0.5, 6), (0.25, 3), (0.01, 0), (3.0, 12)])
def test_a_positive_value_is_a_bar_right_of_the_axis_as_long_as_its_share(value: float,
                                                                           blocks: int) -> None:
    text = signed_bar(value, vmax=1.0, width=12).plain
    left, right = text.split("│")
    assert len(left) == len(right) == 12
    assert left == " " * 12
    assert right == "█" * blocks + " " * (12 - blocks)


def test_a_negative_value_mirrors_the_positive_one() -> None:
    pos = signed_bar(0.75, vmax=1.5, width=8).plain
    neg = signed_bar(-0.75, vmax=1.5, width=8).plain
    assert neg == pos[::-1]
    assert neg.split("│")[0] == " " * 4 + "█" * 4


@pytest.mark.parametrize(("value", "vmax"), [(math.nan, 1.0), (math.inf, 1.0), (0.5, 0.0)])
def test_no_bar_for_a_non_finite_value_or_an_empty_range(value: float, vmax: float) -> None:
    assert signed_bar(value, vmax=vmax, width=5).plain == " " * 11


def test_the_bar_takes_the_colours_given() -> None:
    text = signed_bar(-1.0, vmax=1.0, width=3, colours=("rgb(1,2,3)", "rgb(4,5,6)"))
    assert str(text.style) == "rgb(1,2,3)"
    assert [str(s.style) for s in text.spans] == ["dim", "rgb(4,5,6)"]


def test_each_half_fits_the_column_left_by_the_others() -> None:
    assert bar_half(0, used=40, most=12) == 12  # not laid out yet
    assert bar_half(100, used=40, most=12) == 12
    assert bar_half(60, used=40, most=12) == (60 - 40 - 3) // 2
    assert bar_half(42, used=40, most=12) == 0  # not one block fits


def test_bar_colours_are_the_ends_of_the_apps_colour_map() -> None:
    name = next(n for n in COLORMAPS if n != "red-blue")
    neg, _, pos = COLORMAPS[name]
    widget = SimpleNamespace(app=SimpleNamespace(colormap_name=name))
    assert bar_colours(widget) == (f"rgb({neg[0]},{neg[1]},{neg[2]})",
                                   f"rgb({pos[0]},{pos[1]},{pos[2]})")
    neg, _, pos = COLORMAPS["red-blue"]
    unknown = SimpleNamespace(app=SimpleNamespace(colormap_name="no-such-map"))
    assert bar_colours(unknown) == (f"rgb({neg[0]},{neg[1]},{neg[2]})",
                                    f"rgb({pos[0]},{pos[1]},{pos[2]})")
