"""Reading engine results (engine/results.py) into what the widgets draw.

The readers use the exact field names of engine/results.py's dataclasses and nothing else:
a renamed or missing field raises (and fails a test) instead of drawing an empty view.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from headscope.engine.results import (
    CacheStats,
    Composition,
    HeadScores,
    Profile,
    PromptView,
    ScoreTable,
    TopTokens,
)

SCORES: tuple[tuple[str, str], ...] = (
    ("copying", "copying"),
    ("qk_positivity", "QK+"),
    ("prev_token", "prev-tok"),
    ("duplicate_token", "dup-tok"),
    ("induction", "induction"),
)
SCORE_KEYS = tuple(k for k, _ in SCORES)
# The zero-ablation effect: not part of HeadScores (an opt-in sweep, Engine.all_ablation_effects).
ABLATION, ABLATION_LABEL = "ablation", "zero-abl"
# Badges in the head tree: (score, letter). Colour follows the strength.
BADGES: tuple[tuple[str, str], ...] = (("copying", "C"), ("prev_token", "P"), ("induction", "I"))


def score(hs: HeadScores, key: str) -> float:
    """The score ``key`` (one of ``SCORE_KEYS``) of a head, as a float (NaN if unknown)."""
    if key not in SCORE_KEYS:
        raise KeyError(f"not a head score: {key!r}")
    return float(getattr(hs, key))


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


def stats_line(stats: CacheStats) -> tuple[str | None, int, int, int, float | None]:
    """(activity, hits, misses, in flight, sweep progress) of a CacheStats."""
    return stats.activity or None, stats.hits, stats.misses, stats.in_flight, stats.progress


def jsonable(obj: Any) -> Any:
    """Results → JSON values: arrays to lists, complex to [re, im], NaN/inf to None."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, complex | np.complexfloating):
        return [jsonable(float(obj.real)), jsonable(float(obj.imag))]
    if isinstance(obj, np.generic):
        return jsonable(obj.item())
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    return str(obj)
