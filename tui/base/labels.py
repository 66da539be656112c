"""Reading engine results (engine/core/results.py) into what the widgets draw.

The readers use the exact field names of engine/core/results.py's dataclasses and nothing else:
a renamed or missing field raises (and fails a test) instead of drawing an empty view. The
scores go by their public names (``engine.core.validation.SCORE_NAMES``, the JSON keys of
``headscope heads --json``); this module is the one place the UI maps them to labels.
"""

from __future__ import annotations

import math

import numpy as np

from headscope.engine.core.export import jsonable
from headscope.engine.core.results import (
    Composition,
    HeadScores,
    Profile,
    PromptView,
    ScoreNull,
    ScoreTable,
    TopTokens,
)
from headscope.engine.core.validation import ABLATION_EFFECT, SCORE_NAMES

__all__ = ["ABLATION", "ABLATION_LABEL", "ABLATION_SHORT", "BADGES", "SCORES", "SCORE_KEYS", "SHORT", "jsonable"]

# (score name, column label) of the summary table and the focus line, in SCORE_NAMES order.
SCORES: tuple[tuple[str, str], ...] = (
    ("copying_score", "copying"), ("qk_positivity", "QK+"), ("prev_token_score", "prev-tok"),
    ("duplicate_token_score", "dup-tok"), ("induction_score", "induction"),
    ("attention_sink_score", "sink"), ("delimiter_sink_score", "delim-sink"))
SCORE_KEYS = SCORE_NAMES
# Short labels: the focus line on a narrow terminal, compare mode's Δ columns and A → B line.
SHORT: dict[str, str] = dict(zip(SCORE_NAMES, ("copy", "QK+", "prev", "dup", "ind", "sink", "delim"),
                             strict=True))
SINKS = ("attention_sink_score", "delimiter_sink_score")  # on the first token, on delimiters
# The zero-ablation effect: not part of HeadScores (an opt-in sweep, AblationSweepRequest).
ABLATION, ABLATION_LABEL = ABLATION_EFFECT, "zero-abl"
ABLATION_SHORT = "abl"  # its label where SHORT's are used (narrow focus line and Summary)
# Badges in the head tree: (score, letter). Colour follows the strength.
BADGES: tuple[tuple[str, str], ...] = (
    ("copying_score", "C"), ("prev_token_score", "P"), ("induction_score", "I"))
# Attention sink (on the first token or on delimiters, the larger of the two scores): shown
# only where it is there (≥ the middling strength), no "·" placeholder.
SINK_BADGE: tuple[str, str] = ("sink", "S")


def head_name(layer: int, head: int) -> str:
    """A head as the UI names it: ``L1.H5``."""
    return f"L{layer}.H{head}"


def score(hs: HeadScores, key: str) -> float:
    """The score ``key`` (one of ``SCORE_KEYS``) of a head, as a float (NaN if unknown)."""
    if key not in SCORE_KEYS:
        raise KeyError(f"not a head score: {key!r}")
    return float(getattr(hs, key))


def sink(hs: HeadScores) -> float:
    """The head's larger sink score (first token, delimiters); NaN if neither is known."""
    values = [v for v in (score(hs, k) for k in SINKS) if v == v]
    return max(values) if values else float("nan")


def filter_value(hs: HeadScores, key: str) -> float:
    """What the tree filter ``key`` compares: a score, or ``"sink"``: the larger sink score."""
    return sink(hs) if key == SINK_BADGE[0] else score(hs, key)


def filter_z(null: ScoreNull | None, hs: HeadScores, key: str) -> float:
    """The z of ``filter_value`` (for ``"sink"``: of the larger of the two sink scores)."""
    if key == SINK_BADGE[0]:
        values = [(score(hs, k), k) for k in SINKS if score(hs, k) == score(hs, k)]
        if not values:
            return float("nan")
        key = max(values)[1]
    return z_score(null, hs, key)


def z_text(z: float) -> str:
    """A z-score as the tree, the focus line and the Summary show it: ``z=9.3``, ``z=41``
    (whole numbers from 10 on), ``z=∞``; empty when unknown."""
    if z != z:
        return ""
    if math.isinf(z):
        return "z=∞" if z > 0 else "z=-∞"
    shown = f"{z:.1f}" if abs(z) < 9.95 else f"{z:.0f}"
    return f"z={'0.0' if shown == '-0.0' else shown}"


def z_score(null: ScoreNull | None, hs: HeadScores, key: str) -> float:
    """The score ``key`` of a head against the random-head null of its layer (NaN without one)."""
    if null is None or key not in null.names:
        return float("nan")
    # the engine's own formula (ScoreNull.z), so the UI shows the numbers of heads --json
    return null.head_z(key, hs.layer, score(hs, key))


def score_rows(table: ScoreTable) -> list[HeadScores]:
    """Every head of a ``ScoreTable``, layer by layer."""
    return [table.head(layer, head)
            for layer in range(table.n_layers) for head in range(table.n_heads)]


def top_tokens(tt: TopTokens) -> list[tuple[str, float]]:
    """``[(output token label, value)]``, largest first."""
    return list(zip(tt.labels, np.asarray(tt.values, dtype=np.float64).tolist(), strict=True))


def predictions(pv: PromptView) -> list[tuple[str, float]]:
    """``[(label, probability)]`` of the model's top predictions after the last token."""
    return [(label, float(prob)) for _, label, prob in pv.top_predictions]


def profile_xy(profile: Profile) -> tuple[np.ndarray, np.ndarray]:
    return (np.asarray(profile.offsets, dtype=np.float64),
            np.asarray(profile.values, dtype=np.float64))


def edges(comp: Composition) -> list[tuple[int, int, int, int, float]]:
    """``(l1, h1, l2, h2, score − baseline)`` of a Composition result, strongest first."""
    return [(int(l1), int(h1), int(l2), int(h2), float(s)) for l1, h1, l2, h2, s in comp.top_edges]


# The middling badge strength: what "has the behaviour" means (the tree filter ``f``, the sink
# scores on the focus line).
FILTER_THRESHOLD = 0.3
