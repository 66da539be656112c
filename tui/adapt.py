"""Reading engine results (engine/results.py) into what the widgets draw.

The TUI only reads attributes named in docs/internals.md; where the contract leaves a
field's spelling open (top tokens, profiles, score tables, predictions), the readers here
accept the plausible spellings so a renamed field degrades to an empty view, not a crash.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

SCORES: tuple[tuple[str, str], ...] = (
    ("copying", "copying"),
    ("qk_positivity", "QK+"),
    ("prev_token", "prev-tok"),
    ("duplicate_token", "dup-tok"),
    ("induction", "induction"),
)
SCORE_KEYS = tuple(k for k, _ in SCORES)
# Badges in the head tree: (score, letter). Colour follows the strength.
BADGES: tuple[tuple[str, str], ...] = (("copying", "C"), ("prev_token", "P"), ("induction", "I"))


@dataclass(frozen=True)
class ScoreRow:
    layer: int
    head: int
    copying: float
    qk_positivity: float
    prev_token: float
    duplicate_token: float
    induction: float
    nonfinite: bool = False

    def get(self, key: str) -> float:
        return float(getattr(self, key))


def _first(obj: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        if isinstance(obj, dict) and name in obj:
            return obj[name]
        if hasattr(obj, name):
            return getattr(obj, name)
    return default


def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def score_row(hs: Any) -> ScoreRow:
    """One ``HeadScores`` (or a dict with the same keys, with or without ``_score``)."""
    vals = {k: _num(_first(hs, k, f"{k}_score", default=math.nan)) for k in SCORE_KEYS}
    return ScoreRow(layer=int(_first(hs, "layer")), head=int(_first(hs, "head")),
                    nonfinite=bool(_first(hs, "nonfinite", default=False)), **vals)


def score_rows(table: Any) -> list[ScoreRow]:
    """Every head of a ``ScoreTable``: a sequence of HeadScores, or arrays ``[L, H]``."""
    if table is None:
        return []
    if isinstance(table, (list, tuple)):
        return [score_row(h) for h in table]
    seq = _first(table, "heads", "rows", "head_scores", "items")
    if seq is not None and not isinstance(seq, np.ndarray):
        return [score_row(h) for h in (seq.values() if isinstance(seq, dict) else seq)]
    arrays = {k: _first(table, k, f"{k}_score") for k in SCORE_KEYS}
    arrays.update({k: v for k, v in (_first(table, "scores", default={}) or {}).items()
                   if k in SCORE_KEYS} if isinstance(_first(table, "scores"), dict) else {})
    ref = next((np.asarray(a) for a in arrays.values() if a is not None), None)
    if ref is None or ref.ndim != 2:
        return []
    nonfinite = _first(table, "nonfinite")
    rows = []
    for layer in range(ref.shape[0]):
        for head in range(ref.shape[1]):
            vals = {k: (_num(np.asarray(a)[layer, head]) if a is not None else math.nan)
                    for k, a in arrays.items()}
            bad = bool(np.asarray(nonfinite)[layer, head]) if nonfinite is not None else False
            rows.append(ScoreRow(layer=layer, head=head, nonfinite=bad, **vals))
    return rows


def pairs(obj: Any, labels: Iterable[str] = ("tokens", "labels", "strings"),
          values: Iterable[str] = ("values", "scores", "logits", "probs")) -> list[tuple[str, float]]:
    """``[(token string, value)]`` from a TopTokens-like result or a list of pairs."""
    if obj is None:
        return []
    if isinstance(obj, (list, tuple)):
        out = []
        for item in obj:
            if isinstance(item, (list, tuple)) and len(item) >= 3:  # (id, label, value)
                out.append((str(item[1]), _num(item[-1])))
            elif isinstance(item, (list, tuple)) and len(item) == 2:  # (label, value)
                out.append((str(item[0]), _num(item[-1])))
            else:
                out.append((str(_first(item, "token", "label", "string", default=item)),
                            _num(_first(item, "value", "prob", "logit", "score", default=0))))
        return out
    toks = _first(obj, *labels, default=[])
    vals = _first(obj, *values, default=[])
    return [(str(t), _num(v)) for t, v in zip(toks, np.asarray(vals).tolist(), strict=False)]


def top_tokens(tt: Any) -> list[tuple[str, float]]:
    return pairs(tt)


def predictions(pv: Any) -> list[tuple[str, float]]:
    return pairs(_first(pv, "top_predictions", "predictions", default=[]))


def profile_xy(profile: Any) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(_first(profile, "offsets", "x", default=[]), dtype=np.float64)
    y = np.asarray(_first(profile, "values", "scores", "y", default=[]), dtype=np.float64)
    return x, y


def edges(comp: Any) -> list[tuple[int, int, int, int, float]]:
    """``(l1, h1, l2, h2, score − baseline)`` of a Composition result, strongest first."""
    out = []
    for e in _first(comp, "top_edges", default=[]) or []:
        if isinstance(e, dict):
            (l1, h1), (l2, h2) = e["source"], e["target"]
            out.append((int(l1), int(h1), int(l2), int(h2), _num(e["above_baseline"])))
        else:
            l1, h1, l2, h2, s = e[:5]
            out.append((int(l1), int(h1), int(l2), int(h2), _num(s)))
    return out


def stats_line(stats: Any) -> tuple[str | None, int, int, int, float | None]:
    """(activity, hits, misses, in flight, sweep progress) of a CacheStats."""
    if stats is None:
        return None, 0, 0, 0, None
    act = _first(stats, "activity", default=None)
    if isinstance(act, dict):
        act = ", ".join(f"{k} {v:.0%}" if isinstance(v, float) else str(k) for k, v in act.items())
    elif isinstance(act, (list, tuple)):
        act = ", ".join(map(str, act))
    return (act or None, int(_first(stats, "hits", default=0) or 0),
            int(_first(stats, "misses", default=0) or 0),
            int(_first(stats, "in_flight", default=0) or 0),
            _first(stats, "progress", default=None))


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
