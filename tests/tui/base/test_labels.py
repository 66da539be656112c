"""Reading engine results into what the widgets draw (tui/base/labels.py): scores by their
public names, the larger sink, z against the random-head null (the engine's own formula, so
the explorer shows the numbers of ``heads --json``), and z as the views print it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from headscope.engine.core.results import HeadScores, ScoreNull, ScoreTable
from headscope.engine.core.validation import SCORE_NAMES
from headscope.tui.base import labels


def table() -> ScoreTable:
    rng = np.random.default_rng(0)
    scores = {name: rng.uniform(-1, 1, (2, 3)).astype(np.float32) for name in SCORE_NAMES}
    scores["delimiter_sink_score"][1, 2] = np.nan  # no tokenizer: unknown
    return ScoreTable(**scores, nonfinite=np.zeros((2, 3), bool))


def null() -> ScoreNull:
    n = len(SCORE_NAMES)
    mean = np.arange(2 * n, dtype=np.float32).reshape(n, 2) / 10
    std = np.full((n, 2), 0.5, np.float32)
    std[SCORE_NAMES.index("qk_positivity"), 1] = 0.0  # a score every random head shares
    return ScoreNull(names=tuple(SCORE_NAMES), mean=mean, std=std, samples=8, seed=0)


def test_score_rows_are_every_head_layer_by_layer_with_the_tables_numbers() -> None:
    t = table()
    rows = labels.score_rows(t)
    assert [(r.layer, r.head) for r in rows] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    for r in rows:
        for name in SCORE_NAMES:
            got, want = labels.score(r, name), float(getattr(t, name)[r.layer, r.head])
            assert got == want or (math.isnan(got) and math.isnan(want))


def test_an_unknown_score_name_raises_instead_of_drawing_nothing() -> None:
    with pytest.raises(KeyError, match="not a head score: 'induction'"):
        labels.score(table().head(0, 0), "induction")


def test_the_sink_is_the_larger_of_the_two_sink_scores_ignoring_an_unknown_one() -> None:
    t = table()
    for layer, head in ((0, 0), (1, 1)):
        hs = t.head(layer, head)
        assert labels.sink(hs) == max(hs.attention_sink_score, hs.delimiter_sink_score)
        assert labels.filter_value(hs, "sink") == labels.sink(hs)
    hs = t.head(1, 2)
    assert labels.sink(hs) == hs.attention_sink_score
    assert labels.filter_value(hs, "induction_score") == hs.induction_score


def test_z_is_the_engines_standardised_score_of_the_head_in_its_layer() -> None:
    t, n = table(), null()
    for hs in labels.score_rows(t):
        for name in SCORE_NAMES:
            expected = n.z(name, getattr(t, name))[hs.layer, hs.head]
            got = labels.z_score(n, hs, name)
            assert got == expected or (math.isnan(got) and math.isnan(expected))
    hs = t.head(1, 0)
    i = SCORE_NAMES.index("induction_score")
    assert labels.z_score(n, hs, "induction_score") == pytest.approx(
        (hs.induction_score - n.mean[i, 1]) / n.std[i, 1], rel=1e-6)
    assert math.isnan(labels.z_score(None, hs, "induction_score"))


def test_the_sink_filters_z_is_that_of_the_larger_sink_score() -> None:
    t, n = table(), null()
    hs = t.head(0, 1)
    larger = max(labels.SINKS, key=lambda k: labels.score(hs, k))
    assert labels.filter_z(n, hs, "sink") == labels.z_score(n, hs, larger)
    nothing = HeadScores(0, 0, *([0.0] * 5), math.nan, math.nan, False)
    assert math.isnan(labels.filter_z(n, nothing, "sink"))


@pytest.mark.parametrize(("z", "shown"), [
    (9.31, "z=9.3"), (-0.04, "z=0.0"), (9.96, "z=10"), (41.4, "z=41"), (-12.6, "z=-13"),
    (math.inf, "z=∞"), (-math.inf, "z=-∞"), (math.nan, "")])
def test_z_text_rounds_as_the_views_show_it(z: float, shown: str) -> None:
    assert labels.z_text(z) == shown
