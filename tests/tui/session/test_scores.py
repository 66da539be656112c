"""tui/session/scores.py without Textual: the explorer's scores, ablation, null and Summary
order, and how a change of weights forgets them."""

from __future__ import annotations

import math

import numpy as np

from headscope.engine.core.results import HeadScores, ScoreNull
from headscope.tui.base.labels import ABLATION, SCORES
from headscope.tui.session.scores import ScoreBoard


def row(layer: int, head: int, induction: float, copying: float = 0.1,
        nonfinite: bool = False) -> HeadScores:
    return HeadScores(layer=layer, head=head, copying_score=copying, qk_positivity=0.0,
                      prev_token_score=0.0, duplicate_token_score=0.0,
                      induction_score=induction, attention_sink_score=0.0,
                      delimiter_sink_score=math.nan, nonfinite=nonfinite)


def board() -> ScoreBoard:
    b = ScoreBoard()
    b.add([row(1, 1, 0.2), row(0, 0, 0.9), row(1, 0, math.nan), row(0, 1, 0.5)])
    return b


def test_summary_is_in_layer_order_until_sorted_then_highest_first_nan_last() -> None:
    b = board()
    rows, ablation = b.summary()
    assert [(r.layer, r.head) for r in rows] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(math.isnan(a) for a in ablation)  # not swept yet
    b.summary_sort = "induction_score"
    rows, _ = b.summary()
    assert [(r.layer, r.head) for r in rows] == [(0, 0), (0, 1), (1, 1), (1, 0)]


def test_sort_keys_cycle_through_the_scores_and_the_ablation_once_swept() -> None:
    b = board()
    keys = [b.next_sort() for _ in range(len(SCORES))]
    assert keys == [k for k, _ in SCORES]
    assert b.next_sort() == SCORES[0][0]  # no ablation column yet: back to the first
    b.set_ablation(np.zeros((2, 2)))
    assert b.sort_keys()[-1] == ABLATION


def test_ablation_names_the_costliest_head_and_sorts_the_summary_by_it() -> None:
    b = board()
    effects = np.array([[0.1, 0.05], [np.nan, 0.7]])
    assert b.set_ablation(effects) == (1, 1)
    assert b.summary_sort == ABLATION
    assert b.ablation_of((0, 0)) == 0.1 and math.isnan(b.ablation_of((1, 0)))
    rows, ablation = b.summary()
    assert (rows[0].layer, rows[0].head) == (1, 1) and ablation[0] == 0.7
    assert math.isnan(ablation[-1])  # NaN last


def test_no_finite_ablation_effect_names_no_head() -> None:
    b = board()
    assert b.set_ablation(np.full((2, 2), np.nan)) is None
    assert b.ablation is not None


def test_new_weights_forget_scores_ablation_and_null_and_drop_old_results() -> None:
    b = board()
    b.set_ablation(np.zeros((2, 2)))
    b.null = ScoreNull(("induction_score",), np.zeros((1, 2)), np.ones((1, 2)), 8, 0)
    old = b.gen
    assert b.current(old)
    assert b.new_weights() == old + 1
    assert not b.current(old) and b.current(old + 1)
    assert b.rows == {} and b.ablation is None and b.null is None


def test_the_null_is_asked_for_once_per_generation_after_a_failure() -> None:
    b = ScoreBoard()
    assert b.wants_null()
    b.null_failed_for(b.gen)
    assert not b.wants_null()  # said once: not asked again for these weights
    b.new_weights()
    assert b.wants_null()  # other weights: asked again
    b.null = ScoreNull(("induction_score",), np.zeros((1, 2)), np.ones((1, 2)), 8, 0)
    assert not b.wants_null()


def test_summary_records_carry_each_score_its_z_and_the_ablation_effect() -> None:
    b = board()
    b.null = ScoreNull(("induction_score",), np.array([[0.1, 0.0]]), np.array([[0.2, 1.0]]),
                       8, 0)
    rows, ablation = b.summary()
    records = b.summary_records(rows, ablation)
    first = records[0]
    assert (first["layer"], first["head"]) == (0, 0)
    assert math.isclose(first["induction_score_z"], (0.9 - 0.1) / 0.2, rel_tol=1e-6)
    assert math.isnan(first["copying_score_z"])  # not in the null
    assert math.isnan(first["ablation_effect"])
    assert set(first) >= {f"{k}_z" for k, _ in SCORES}
