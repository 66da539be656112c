"""The result of QK attribution (docs/math.md, "QK attribution"): no torch, read-only arrays.

``engine.forward.qk_attribution`` computes it; the UI and the CLI read it through the helpers
below (one key's column, its terms ranked by size).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from headscope.engine.core.errors import IndexOutOfRangeError

__all__ = ["QKAttribution"]


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


def _span(keys: tuple[int, ...]) -> str:
    if not keys:
        return "none"
    if list(keys) == list(range(keys[0], keys[-1] + 1)):
        return f"{keys[0]}..{keys[-1]}"
    return ", ".join(map(str, keys))
