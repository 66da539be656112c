"""Compare the circuits of two checkpoints of the same architecture.

The question after pruning, distillation or more training: which heads kept their circuits?
Per head we compare the *circuits*, not the weights, so the answer does not depend on the
head's internal basis (``W_V M``, ``M⁻¹ W_O`` is the same head):

- ``ov_similarity``: normalised Frobenius inner product of the full OV circuits
  ``W_E OV W_U`` of A and B, ``⟨C_A, C_B⟩_F / (‖C_A‖_F ‖C_B‖_F)`` in [-1, 1];
- ``qk_similarity``: the same for the token QK circuits ``W_E QK W_Eᵀ``.

Both are taken in the *token* basis, which two models with the same tokenizer share even when
their residual streams are rotated or of different width. Everything is computed from the
factors: with ``G_E = W_E,Aᵀ W_E,B`` and ``G_U = W_U,A W_U,Bᵀ`` (``d_model × d_model``, once per
model pair), ``⟨A₁B₁, A₂B₂⟩_F = Σ (A₁ᵀA₂) ∘ (B₁B₂ᵀ)`` needs only ``d_head``-sized blocks; no
``vocab × vocab`` matrix is ever built.

The two models may differ in ``d_model`` and ``d_head`` (an original and a distilled copy):
only the layout (layers × heads) and the vocabulary must agree. When both models share
``d_model`` we also report principal angles between the heads' read subspaces (column spaces
of ``W_V``) and write subspaces (row spaces of ``W_O``) in the residual stream: the cosines of
the angles, 1 meaning the same subspace.

A head with NaN/inf weights gets NaN similarities (and NaN cosines; nothing non-finite reaches
an SVD) and ``nonfinite: true`` in its row; heads with finite weights near 1e19 are rescaled
per head by a power of two first (the similarities are scale-free), so they do not overflow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from headscope.engine.core.progress import Progress, report
from headscope.engine.core.validation import (
    EDGE_THRESHOLD,
    SCORE_NAMES,
    WEIGHT_SCORE_NAMES,
)

if TYPE_CHECKING:
    from headscope.engine.core.progress import Progress
    from headscope.engine.model.loading import LoadedModel
    from headscope.engine.sweeps.cluster import Cluster
    from headscope.engine.sweeps.store import ResultStore

# The scores a diff compares (every head score but the duplicate-token one).
SCORE_KEYS = tuple(k for k in SCORE_NAMES if k != "duplicate_token_score")

def best_matching(similarity: list[list[float]]) -> list[int]:
    """Hungarian assignment maximising total similarity: ``match[i]`` is B's head for A's ``i``.

    O(n³) Kuhn–Munkres with potentials (n = heads per layer, at most a few dozen).
    """
    n = len(similarity)
    cost = [[-v for v in row] for row in similarity]
    inf = math.inf
    u, v = [0.0] * (n + 1), [0.0] * (n + 1)
    p, way = [0] * (n + 1), [0] * (n + 1)  # p[j]: row matched to column j (1-based)
    for i in range(1, n + 1):
        p[0], j0 = i, 0
        minv, used = [inf] * (n + 1), [False] * (n + 1)
        while True:
            used[j0] = True
            i0, delta, j1 = p[j0], inf, 0
            for j in range(1, n + 1):
                if not used[j]:
                    cur = cost[i0 - 1][j - 1] - u[i0] - v[j]
                    if cur < minv[j]:
                        minv[j], way[j] = cur, j0
                    if minv[j] < delta:
                        delta, j1 = minv[j], j
            for j in range(n + 1):
                if used[j]:
                    u[p[j]] += delta
                    v[j] -= delta
                else:
                    minv[j] -= delta
            j0 = j1
            if p[j0] == 0:
                break
        while j0:  # augment along the alternating path
            j1 = way[j0]
            p[j0] = p[j1]
            j0 = j1
    match = [0] * n
    for j in range(1, n + 1):
        match[p[j] - 1] = j - 1
    return match


@dataclass(frozen=True)
class ModelDiff:
    heads: list[dict[str, Any]]  # one row per head of A (with its matched head of B)
    matching: list[list[int]] | None  # per layer, B's head for each of A's heads (None: identity)
    composition: dict[str, dict[str, Any]]  # kind -> gained / lost / changed edges
    biggest_changes: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "heads": self.heads,
            "matching": self.matching,
            "composition": self.composition,
            "biggest_changes": self.biggest_changes,
        }


def diff_models(
    a: LoadedModel, b: LoadedModel, *, match_heads: bool = False, threshold: float = EDGE_THRESHOLD,
    seed: int = 0, store: ResultStore | None = None, progress: Progress = None,
    cluster: Cluster | None = None, behaviour: bool = True,
) -> ModelDiff:
    """Per-head score deltas and circuit similarities, and the composition-graph diff.

    With ``match_heads`` each layer's heads of B are first matched to A's by a Hungarian
    assignment on OV + QK similarity (for checkpoints from independent runs, where head
    numbering is arbitrary); otherwise head ``h`` of A is compared with head ``h`` of B.
    Composition edges count when their score exceeds the baseline by ``threshold``.
    ``store``: the on-disk results store both models' sweeps read and write
    (``sweeps.store``); ``progress(fraction)`` follows the whole diff. ``cluster``: both
    models' weight sweeps (copying, QK positivity, composition tiles) run there
    (``sweeps.cluster``); the similarities and the behavioural pass stay here.

    Everything but the behavioural scores is weight algebra (``engine.circuits``, numpy):
    ``behaviour=False`` compares only the weight scores (``WEIGHT_SCORE_NAMES``) and never
    imports torch; with the behavioural scores (the default) torch is imported for their
    forward pass only, on a background thread while the similarities are computed.
    """

    from headscope.engine.circuits.similarity import circuit_similarity
    from headscope.engine.core.progress import progress_span
    from headscope.engine.forward.runtime import import_torch_in_background

    report(progress, 0.0)
    arrays_a, arrays_b = a.weights, b.weights
    if behaviour:
        import_torch_in_background()
    sim_ov, sim_qk = circuit_similarity(arrays_a, arrays_b)
    n_layers, n_heads = a.cfg.n_layers, a.cfg.n_heads
    if match_heads:
        # NaN (non-finite heads) ranks below every real similarity sum (in [-2, 2])
        total = np.nan_to_num(sim_ov + sim_qk, nan=-4.0)
        matching = [best_matching(total[i].tolist()) for i in range(n_layers)]
    else:
        matching = [list(range(n_heads)) for _ in range(n_layers)]
    report(progress, 0.05)
    keys = SCORE_KEYS if behaviour else WEIGHT_SCORE_NAMES

    def table(model: LoadedModel, part: Progress) -> dict[str, np.ndarray]:
        """``keys`` and ``nonfinite``, ``[L, H]`` each: the sweeps (and stored parts) of
        ``heads --no-behaviour`` / ``heads``; z-scores are not compared (no calibration)."""
        from headscope.engine.sweeps.scores import score_table, weight_scores

        entry = None if store is None else store.for_model(model)
        if not behaviour:
            return weight_scores(model, part, store=entry)
        found = score_table(model, seed, part, store=entry, cluster=cluster)
        return {name: getattr(found, name) for name in (*keys, "nonfinite")}

    table_a = table(a, progress_span(progress, 0.05, 0.3))
    table_b = table(b, progress_span(progress, 0.3, 0.55))
    cosines = _subspace_cosines(a, b, matching, arrays_a, arrays_b) if a.cfg.d_model == b.cfg.d_model else None
    heads = []
    for layer in range(n_layers):
        for head in range(n_heads):
            hb = matching[layer][head]
            row: dict[str, Any] = {
                "layer": layer,
                "head": head,
                "matched_head": hb,
                "ov_similarity": float(sim_ov[layer, head, hb]),
                "qk_similarity": float(sim_qk[layer, head, hb]),
            }
            for key in keys:
                va, vb = float(table_a[key][layer, head]), float(table_b[key][layer, hb])
                row[f"{key}_a"] = va
                row[f"{key}_b"] = vb
                row[f"{key}_delta"] = vb - va
            if cosines is not None:
                row["read_subspace_cos"] = float(cosines[0][layer, head])
                row["write_subspace_cos"] = float(cosines[1][layer, head])
            # NaN/inf or overflowing weights in either head: its numbers are flagged
            row["nonfinite"] = bool(table_a["nonfinite"][layer, head] or table_b["nonfinite"][layer, hb]) or not (
                math.isfinite(row["ov_similarity"]) and math.isfinite(row["qk_similarity"])
            )
            row["change"] = _change_size(row, keys)  # how much the head changed: ranks and colours
            heads.append(row)
    composition = {
        kind: _composition_diff(a, b, kind, matching, threshold, seed, store,
                                progress_span(progress, 0.55 + 0.15 * i, 0.7 + 0.15 * i), cluster)
        for i, kind in enumerate("qkv")
    }
    # Changes equal to 1e-6 are float noise: keep those in layer/head order (stable output);
    # an undefined (NaN) change sorts last.
    biggest = sorted(heads, key=lambda r: (math.isnan(r["change"]), -round(r["change"], 6)
                                           if math.isfinite(r["change"]) else 0.0,
                                           r["layer"], r["head"]))[:10]
    report(progress, 1.0)
    return ModelDiff(
        heads=heads,
        matching=matching if match_heads else None,
        composition=composition,
        biggest_changes=[
            {"layer": r["layer"], "head": r["head"], "change": r["change"], **_summary(r, keys)}
            for r in biggest
        ],
    )


def _subspace_cosines(a: LoadedModel, b: LoadedModel, matching: list[list[int]], arrays_a: Any,
                      arrays_b: Any) -> tuple[np.ndarray, np.ndarray]:
    """``[L, H]`` mean principal cosines of each head's read (``W_V``) and write (``W_Oᵀ``)
    subspaces with its matched head of B (models of the same ``d_model``)."""
    from headscope.engine.circuits.similarity import principal_cosines

    n_layers, n_heads = a.cfg.n_layers, a.cfg.n_heads
    read, write = np.zeros((n_layers, n_heads)), np.zeros((n_layers, n_heads))
    for layer in range(n_layers):
        pre, hb = f"blocks.{layer}.attn", matching[layer]
        read[layer] = principal_cosines(arrays_a.get(f"{pre}.W_V"), arrays_b.get(f"{pre}.W_V")[hb])
        write[layer] = principal_cosines(arrays_a.get(f"{pre}.W_O").swapaxes(-2, -1),
                                         arrays_b.get(f"{pre}.W_O")[hb].swapaxes(-2, -1))
    return read, write


def _change_size(row: dict[str, Any], keys: tuple[str, ...] = SCORE_KEYS) -> float:
    """How much a head changed: lost circuit similarity, or the largest score delta; only
    the finite ones count (NaN if none is)."""
    sims = [row[k] for k in ("ov_similarity", "qk_similarity") if math.isfinite(row[k])]
    deltas = [abs(row[f"{k}_delta"]) for k in keys if math.isfinite(row[f"{k}_delta"])]
    parts = ([1.0 - min(sims)] if sims else []) + deltas
    return max(parts) if parts else math.nan


def _summary(row: dict[str, Any], keys: tuple[str, ...] = SCORE_KEYS) -> dict[str, Any]:
    return {
        "ov_similarity": row["ov_similarity"],
        "qk_similarity": row["qk_similarity"],
        **{f"{k}_delta": row[f"{k}_delta"] for k in keys},
    }


def _composition_diff(
    a: LoadedModel, b: LoadedModel, kind: str, matching: list[list[int]], threshold: float, seed: int,
    store: ResultStore | None = None, progress: Progress = None, cluster: Cluster | None = None,
) -> dict[str, Any]:
    from headscope.engine.core.progress import progress_span
    from headscope.engine.sweeps.scores import composition

    def scores_of(model: LoadedModel, part: Progress) -> Any:
        # The `composition` command's own sweep (same stored tiles, same numbers).
        entry = None if store is None else store.for_model(model)
        return composition(model, kind, seed=seed, progress=part, store=entry, cluster=cluster)

    ra, rb = scores_of(a, progress_span(progress, 0.0, 0.5)), scores_of(b, progress_span(progress, 0.5, 1.0))
    # A pruned (all-zero) or non-finite head has an undefined (NaN) ratio; for the graph
    # diff it composes with nothing: score 0, so its edges show up as lost or gained.
    above_a = np.nan_to_num(ra.scores, nan=0.0) - ra.baseline
    above_b = np.nan_to_num(rb.scores, nan=0.0) - rb.baseline
    return {
        "baseline_a": float(ra.baseline),
        "baseline_b": float(rb.baseline),
        "threshold": threshold,
        **edge_changes(above_a, above_b, matching, threshold),
    }


def edge_changes(
    above_a: Any, above_b: Any, matching: list[list[int]], threshold: float
) -> dict[str, list[dict[str, Any]]]:
    """The composition-graph diff: ``gained``, ``lost`` and ``changed`` edges, biggest
    ``|b − a|`` first, from the scores above baseline ``[L, H, L, H]`` of A and of B (any
    array indexable by four ints); B's heads are taken through ``matching``."""
    n_layers, n_heads = len(matching), len(matching[0]) if matching else 0
    gained, lost, changed = [], [], []
    for l1 in range(n_layers):
        for h1 in range(n_heads):
            for l2 in range(l1 + 1, n_layers):
                for h2 in range(n_heads):
                    va = float(above_a[l1, h1, l2, h2])
                    vb = float(above_b[l1, matching[l1][h1], l2, matching[l2][h2]])
                    edge = {
                        "source": [l1, h1],
                        "target": [l2, h2],
                        "a": va,
                        "b": vb,
                        "delta": vb - va,
                    }
                    if va > threshold >= vb:
                        lost.append(edge)
                    elif vb > threshold >= va:
                        gained.append(edge)
                    elif abs(vb - va) > threshold:
                        changed.append(edge)
    for edges in (gained, lost, changed):
        edges.sort(key=lambda e: -abs(e["delta"]))
    return {"gained": gained, "lost": lost, "changed": changed}
