"""The Prompt tab's DLA panel says which logit it attributes (issue 39 §3)."""

from __future__ import annotations

import numpy as np

from headscope.engine.core.results import PromptView
from headscope.tui.widgets.panes import dla_title


def view(predicted: tuple[int, ...], top: tuple[tuple[int, str, float], ...]) -> PromptView:
    n = len(predicted)
    return PromptView(tokens=tuple(f"t{i}" for i in range(n)), ids=tuple(range(n)),
                      pattern=np.eye(n), dla=np.zeros(n), predicted=predicted,
                      top_predictions=top, truncated=False, layer=1, head=2)


def test_the_title_names_the_predicted_next_token_and_its_position():
    text = dla_title(view((4, 9, 7), ((7, " Mary", 0.8), (3, " John", 0.1)))).plain
    assert "predicted next token" in text
    assert "last row: DLA of ' Mary' (the next token) at position 2" in text


def test_a_prediction_outside_the_top_list_is_named_by_id_and_data_is_not_markup():
    assert "DLA of '#7'" in dla_title(view((7,), ((3, "x", 0.9),))).plain
    title = dla_title(view((5,), ((5, "[bold]x", 0.9),)))
    assert "[bold]x" in title.plain  # shown as typed, never read as a style
