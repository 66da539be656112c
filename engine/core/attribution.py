"""The result of QK attribution (docs/math.md, "QK attribution"): no torch, read-only arrays.

``engine.forward.qk_attribution`` computes it; the UI and the CLI read it through the helpers
below (one key's column, its terms ranked by size).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from headscope.engine.core.errors import IndexOutOfRangeError

__all__ = ["QKAttribution", "QKRemoval", "top_sources"]


def top_sources(totals: np.ndarray, top: int) -> np.ndarray:
    """The indices of the ``top`` components of largest |total| along axis 0 (``totals [C]``
    or ``[C, keys]`` of one side, ``component_names`` order), ``bias`` (the last) left out: no
    part of the stream, it has no removal. NaN last, ties in component order."""
    size = np.abs(np.asarray(totals, dtype=np.float64)[:-1])
    size = np.where(np.isnan(size), -1.0, size)
    return np.argsort(-size, axis=0, kind="stable")[: max(0, int(top))]


@dataclass(frozen=True)
class QKRemoval:
    """The exact check of one side's totals: each of ``sources`` removed from the head's
    ``side`` input alone (a path patch of that component into the query or the key side,
    zeroed), the score's drop at each key. ``frozen``: the norm divides by the run's scale, so
    the drop equals the side's total (the terms' linear picture); ``recomputed``: by the
    edited stream's own scale (the real intervention)."""

    side: str  # "query" | "key"
    sources: tuple[str, ...]  # component names, in component order
    frozen: np.ndarray  # [n_sources, n_keys] float32: score − score without the source
    recomputed: np.ndarray  # [n_sources, n_keys] float32: likewise, the scale recomputed


@dataclass(frozen=True)
class QKAttribution:
    """Head ``layer``.``head``'s pre-softmax score from query position ``query`` to each key
    position of ``keys``, split into one term per (query-side component, key-side component)
    of the residual stream entering ``layer``.

    ``names`` are TransformerLens' (``embed``, ``pos``, ``a{l}.h{h}``, ``a{l}.bias``, ``m{l}``,
    ``bias``), every one listed even when its terms are zero. For each key (last axis):
    ``terms.sum((0, 1)) == score``, ``query_totals == terms.sum(1)``, ``key_totals ==
    terms.sum(0)`` up to float rounding; ``key_totals[c]`` is the score's drop when ``c`` alone
    leaves the key side with the norm's scale frozen (``query_totals`` likewise, query side).
    """

    layer: int
    head: int
    query: int
    keys: tuple[int, ...]  # key positions, ascending
    names: tuple[str, ...]  # the components, [n]
    score: np.ndarray  # [n_keys] float32: the model's score (TL hook_attn_scores[0, head, query, key])
    terms: np.ndarray  # [n, n, n_keys] float32: term(query component, key component, key)
    query_totals: np.ndarray  # [n, n_keys] float64: Σ over key components
    key_totals: np.ndarray  # [n, n_keys] float64: Σ over query components
    nonfinite: bool  # a NaN/inf activation (or weight) reached the score or a term
    path: str | None = None  # the checkpoint, for errors
    note: str = ""  # e.g. layer 0's "only embed/pos/bias"
    # the top sources of each side removed exactly (``confirm``): empty unless asked for
    removals: tuple[QKRemoval, ...] = ()

    def column(self, key: int) -> int:
        """The index of key position ``key`` along the last axis (IndexOutOfRangeError naming
        the keys computed otherwise)."""
        if key in self.keys:
            return self.keys.index(key)
        if key > self.query:
            why = f"key {key} is after query {self.query} (causal attention)"
        else:
            why = f"key {key} out of range"
        raise IndexOutOfRangeError(self.path, f"{why}; keys computed: {_span(self.keys)}")

    def ranked_terms(self, key: int, top: int | None = None) -> list[tuple[str, str, float]]:
        """``(query component, key component, value)`` at ``key``, largest ``|value|`` first
        (ties: in component order), the first ``top`` of them (None: all n²)."""
        cell = self.terms[:, :, self.column(key)]
        order = np.argsort(-np.abs(cell), axis=None, kind="stable")
        if top is not None:
            order = order[: max(0, int(top))]
        n = len(self.names)
        return [(self.names[i // n], self.names[i % n], float(cell.flat[i])) for i in order]

    def totals(self, key: int) -> tuple[dict[str, float], dict[str, float]]:
        """``(query_totals, key_totals)`` at ``key`` by component name."""
        j = self.column(key)
        return ({c: float(v) for c, v in zip(self.names, self.query_totals[:, j], strict=True)},
                {c: float(v) for c, v in zip(self.names, self.key_totals[:, j], strict=True)})


    def exact(self, key: int, top: int | None = None) -> dict[str, dict[str, dict[str, float]]]:
        """The exact removals at ``key``: ``{"query": {source: {"frozen": drop, "recomputed":
        drop}}, "key": {...}}``, every source removed (``top``: only those among the side's
        top ``top`` at this key, ``top_sources``); empty sides when none were."""
        j = self.column(key)
        out: dict[str, dict[str, dict[str, float]]] = {"query": {}, "key": {}}
        for removal in self.removals:
            totals = self.query_totals if removal.side == "query" else self.key_totals
            shown = None if top is None else {self.names[i] for i in top_sources(totals[:, j], top)}
            out[removal.side] = {c: {"frozen": float(removal.frozen[i, j]), "recomputed": float(removal.recomputed[i, j])}
                                 for i, c in enumerate(removal.sources) if shown is None or c in shown}
        return out


def _span(keys: tuple[int, ...]) -> str:
    if not keys:
        return "none"
    if list(keys) == list(range(keys[0], keys[-1] + 1)):
        return f"{keys[0]}..{keys[-1]}"
    return ", ".join(map(str, keys))
