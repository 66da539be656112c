"""Results of edge attribution (docs/math.md, "Edge attribution"): frozen dataclasses of
read-only numpy arrays, no torch (as ``core.results``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from headscope.engine.core.edge_graph import EdgeGraph
from headscope.engine.core.results import SAME_METRIC_RTOL, readonly

__all__ = [
    "CURVE_FRACTIONS",
    "EdgeAttribution",
    "EdgeMethod",
    "EdgeScores",
    "ExactEdge",
    "Faithfulness",
    "FaithfulnessCurve",
    "FaithfulnessResult",
    "curve_area",
    "metrics_differ",
]

EdgeMethod = Literal["eap", "eap-ig"]
# the curve's points: fractions of the graph's edges (MIB's CPR sweeps the same kind of grid)
CURVE_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def metrics_differ(clean: float, corrupt: float) -> bool:
    """The two runs give different metrics (beyond float32 rounding of equal inputs): the
    faithfulness ``(m - m_corrupt) / (m_clean - m_corrupt)`` is defined."""
    span = clean - corrupt
    return bool(np.isfinite(span)) and abs(span) > SAME_METRIC_RTOL * max(1.0, abs(clean), abs(corrupt))


@dataclass(frozen=True)
class EdgeScores:
    """Every edge's score, in ``graph.edges`` order. ``scores[i]`` estimates
    ``m(clean, edge i corrupted) - m_clean``. An edge whose gradient was not finite is
    ``nonfinite[i]`` and its ``scores[i]`` is 0 (never NaN); ``score(name)`` gives ``None``."""

    method: EdgeMethod
    steps: int  # eap-ig's steps; 0 for eap
    metric: str
    clean: float
    corrupt: float
    graph: EdgeGraph
    scores: np.ndarray  # [n_edges] float64
    nonfinite: np.ndarray  # [n_edges] bool
    tokens: int
    batch: int

    def score(self, edge: str) -> float | None:
        i = self.graph.index[edge]
        return None if self.nonfinite[i] else float(self.scores[i])

    def ranked(self) -> np.ndarray:
        """Edge indices by ``|score|``, largest first (non-finite ones last)."""
        key = np.where(self.nonfinite, -np.inf, np.abs(self.scores))
        return np.argsort(-key, kind="stable")

    def rank(self, edge: str) -> int:
        """The 1-based rank of ``edge`` by ``|score|``."""
        return int(np.nonzero(self.ranked() == self.graph.index[edge])[0][0]) + 1

    def matrix(self) -> np.ndarray:
        """EAP-IG's ``[n_sources, n_destinations]`` score matrix (0 where there is no edge)."""
        return self.graph.matrix(self.scores)


def edge_scores_result(*, method: EdgeMethod, steps: int, metric: str, clean: float, corrupt: float,
                       graph: EdgeGraph, scores: np.ndarray, tokens: int, batch: int) -> EdgeScores:
    """``EdgeScores`` of raw per-edge values (non-finite ones flagged and zeroed)."""
    values = np.asarray(scores, dtype=np.float64)
    bad = ~np.isfinite(values)
    return EdgeScores(method=method, steps=steps, metric=metric, clean=float(clean), corrupt=float(corrupt),
                      graph=graph, scores=readonly(np.where(bad, 0.0, values)), nonfinite=readonly(bad),
                      tokens=tokens, batch=batch)


@dataclass(frozen=True)
class Faithfulness:
    """A top-``top`` circuit, pruned until stable (``edges`` left of it), evaluated by
    patching: ``circuit`` is the metric when every edge outside it is corrupted, and
    ``faithfulness = (circuit - corrupt) / (clean - corrupt)``."""

    top: int
    edges: int
    clean: float
    corrupt: float
    circuit: float
    faithfulness: float
    in_circuit: np.ndarray  # [n_edges] bool, graph.edges order


@dataclass(frozen=True)
class FaithfulnessCurve:
    """Faithfulness at ``fractions`` of the edges (``points[i].top = int(fraction ×
    n_edges)``, as MIB's ``evaluate_area_under_curve``: 0 edges is the corrupt run) and the
    areas MIB reports: ``area`` (CPR, under the curve) and ``area_from_1`` (CMD, between the
    curve and 1), both by the trapezoid rule over the fraction between the first and the last
    point (``curve_area``)."""

    fractions: tuple[float, ...]
    points: tuple[Faithfulness, ...]
    area: float
    area_from_1: float


def curve_area(fractions: tuple[float, ...], values: tuple[float, ...]) -> float:
    """MIB's CPR (hannamw/MIB-circuit-track, ``evaluate_area_under_curve`` with
    ``log_scale=False``): ``Σ_i (x_{i+1} - x_i)(f_i + f_{i+1}) / 2`` over consecutive points
    (fraction ``x``, faithfulness ``f``); CMD is the same sum of ``|1 - f|``."""
    x = np.asarray(fractions, dtype=np.float64)
    y = np.asarray(values, dtype=np.float64)
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2))


@dataclass(frozen=True)
class ExactEdge:
    """One edge corrupted alone on the clean run (its destination's input gets ``S_corrupt -
    S_clean``): ``exact = m - m_clean``, what ``estimate`` (its score) approximates."""

    edge: str
    estimate: float | None
    patched: float  # the metric with the edge corrupted
    exact: float  # patched - clean


@dataclass(frozen=True)
class EdgeAttribution:
    """What ``EdgesRequest`` gives: every edge's score and the exact checks of its top
    ``verify`` edges by |score| (in that order)."""

    scores: EdgeScores
    exact: tuple[ExactEdge, ...] = ()


@dataclass(frozen=True)
class FaithfulnessResult:
    """What ``FaithfulnessRequest`` gives: one point per asked N (in the order asked), the
    curve when asked, and the attribution they were made from."""

    scores: EdgeScores
    points: tuple[Faithfulness, ...]
    curve: FaithfulnessCurve | None = None
