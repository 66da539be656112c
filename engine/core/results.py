"""What the `Engine` hands to the UI: frozen dataclasses of read-only numpy arrays.

No torch here: the TUI imports these types without paying torch's import, and a result can
be cached and shared between awaiting callers because nothing in it can be mutated.
``nbytes(result)`` is what the per-head cache charges for keeping a result.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from headscope.engine.core.validation import SCORE_NAMES

Kind = Literal["qk", "ov"]
Basis = Literal["token", "position"]
CompositionKind = Literal["q", "k", "v"]
Edge = tuple[int, int, int, int, float]  # (l1, h1, l2, h2, score - baseline)


def readonly(values: Any, dtype: Any = None) -> np.ndarray:
    """A private, read-only copy of ``values`` (numpy array, torch tensor or sequence)."""
    if hasattr(values, "detach"):  # a torch tensor: leave torch without importing it
        values = values.detach().cpu().numpy()
    array = np.array(values, dtype=dtype, copy=True)
    array.setflags(write=False)
    return array


@dataclass(frozen=True)
class CircuitBlock:
    """A block of a per-head circuit: ``values[i, j]`` = circuit[row_ids[i], col_ids[j]]."""

    values: np.ndarray  # [r, c] float32
    row_labels: tuple[str, ...]
    col_labels: tuple[str, ...]
    row_ids: tuple[int, ...]
    col_ids: tuple[int, ...]
    kind: Kind
    basis: Basis
    layer: int
    head: int
    vmin: float
    vmax: float
    note: str = ""  # e.g. "W_U is tied W_Eᵀ"
    offset: int = 0  # rotary models: the query-key offset Δ the QK circuit is shown at


@dataclass(frozen=True)
class TopTokens:
    """The output tokens a head's full OV circuit pushes up most for one source token."""

    layer: int
    head: int
    source_token: int
    source_label: str
    ids: tuple[int, ...]
    labels: tuple[str, ...]
    values: np.ndarray  # [k] float32, largest first
    note: str = ""


@dataclass(frozen=True)
class Spectrum:
    """Eigenvalues of the full OV (or token QK) circuit, from the small ``BA`` matrix."""

    eigenvalues: np.ndarray  # [d_head] complex64, largest |λ| first
    score: float  # copying score (ov) or QK positivity (qk): Σ Re λ / Σ |λ|
    kind: Kind
    layer: int
    head: int


@dataclass(frozen=True)
class Profile:
    """Rotary models: mean QK score of a head as a function of the query-key offset Δ."""

    layer: int
    head: int
    offsets: tuple[int, ...]
    values: np.ndarray  # [len(offsets)] float32


@dataclass(frozen=True)
class HeadScores:
    """Every score of one head, under the public names of ``core.validation.SCORE_NAMES``."""

    layer: int
    head: int
    copying_score: float
    qk_positivity: float
    prev_token_score: float
    duplicate_token_score: float
    induction_score: float
    attention_sink_score: float  # attention parked on the first token
    delimiter_sink_score: float  # ... on delimiters (punctuation, newlines); NaN without a tokenizer
    nonfinite: bool  # NaN/inf in this head's weights: scores are NaN, flag it in the UI


@dataclass(frozen=True)
class ScoreTable:
    """Every score of every head; arrays are ``[n_layers, n_heads]``, named as ``HeadScores``."""

    copying_score: np.ndarray
    qk_positivity: np.ndarray
    prev_token_score: np.ndarray
    duplicate_token_score: np.ndarray
    induction_score: np.ndarray
    attention_sink_score: np.ndarray
    delimiter_sink_score: np.ndarray
    nonfinite: np.ndarray  # bool

    @property
    def n_layers(self) -> int:
        return int(self.nonfinite.shape[0])

    @property
    def n_heads(self) -> int:
        return int(self.nonfinite.shape[1])

    def head(self, layer: int, head: int) -> HeadScores:
        return HeadScores(
            layer=layer,
            head=head,
            **{name: float(getattr(self, name)[layer, head]) for name in SCORE_NAMES},
            nonfinite=bool(self.nonfinite[layer, head]),
        )


@dataclass(frozen=True)
class Composition:
    """Q/K/V composition scores between every pair of heads in different layers."""

    kind: CompositionKind
    scores: np.ndarray  # [L, H, L, H]; zero where source layer >= target layer
    baseline: float  # expected score of random factors of the same shapes
    top_edges: tuple[Edge, ...]  # (l1, h1, l2, h2, score - baseline), from rank_edges


def rank_edges(scores: np.ndarray, baseline: float, top: int) -> tuple[Edge, ...]:
    """The ``top`` composition edges furthest above ``baseline``, strongest first.

    Only pairs whose source layer is before the target layer count; non-finite scores (a
    pruned or NaN head) are left out. Ties keep layer/head order (a stable sort).
    """
    scores = np.asarray(scores)
    n_layers = scores.shape[0]
    earlier = np.arange(n_layers)[:, None, None, None] < np.arange(n_layers)[None, None, :, None]
    with np.errstate(invalid="ignore"):
        excess = np.where(earlier & np.isfinite(scores), scores.astype(np.float64) - baseline, -np.inf)
    flat = np.argsort(-excess, axis=None, kind="stable")[: max(0, int(top))]
    edges = []
    for index in flat:
        value = float(excess.flat[index])
        if not np.isfinite(value):
            break
        l1, h1, l2, h2 = (int(i) for i in np.unravel_index(index, scores.shape))
        edges.append((l1, h1, l2, h2, value))
    return tuple(edges)


@dataclass(frozen=True)
class PromptView:
    """One prompt through the model, seen from one head."""

    tokens: tuple[str, ...]
    ids: tuple[int, ...]
    pattern: np.ndarray  # [q, k] attention of (layer, head)
    dla: np.ndarray  # [pos] this head's direct logit attribution to each position's prediction
    predicted: tuple[int, ...]  # [pos] the model's next-token prediction at each position
    top_predictions: tuple[tuple[int, str, float], ...]  # last position: (id, label, prob)
    truncated: bool  # the prompt was longer than n_ctx and was cut
    layer: int
    head: int


@dataclass(frozen=True)
class TokenDirection:
    """One singular direction of a token circuit, read as tokens (docs/math.md, "Reading a
    head"): the ``top`` tokens of largest ``|value|`` on each side, largest first."""

    index: int
    sigma: float
    in_ids: tuple[int, ...]
    in_labels: tuple[str, ...]
    in_values: np.ndarray  # [top] float32, signed
    out_ids: tuple[int, ...]
    out_labels: tuple[str, ...]
    out_values: np.ndarray  # [top] float32, signed
    overlap: float  # signed overlap of the in- and out-token lists, in [-1, 1]


@dataclass(frozen=True)
class SingularDirections:
    """The top-k singular directions of a head's full OV (in = source token, out = predicted
    token) or token QK circuit (in = query token, out = key token)."""

    layer: int
    head: int
    kind: Kind
    singular_values: np.ndarray  # [k] float32, descending
    directions: tuple[TokenDirection, ...]
    overlap: float  # mean of the directions' overlaps: near 1 for a copying head


@dataclass(frozen=True)
class VirtualPath:
    """Two heads in different layers read as one (docs/math.md, "Virtual heads").

    V-composition: the virtual full OV ``W_E OV_A OV_B W_U``. K-composition: the path
    ``W_E QK_B (W_E OV_A)ᵀ`` [query token, token moved by A], a block of it and its scores.
    """

    source: tuple[int, int]
    target: tuple[int, int]
    v_copying_score: float
    v_eigenvalues: np.ndarray  # [d_head] complex64, largest |λ| first
    v_singular_values: np.ndarray  # [d_head] float32, descending
    k_positivity: float  # Σ Re λ / Σ |λ| of the K-path
    k_diagonal: float  # fraction of sampled query tokens whose largest sampled key is themselves
    k_eigenvalues: np.ndarray  # [d_head] complex64
    k_block: np.ndarray  # [r, c] float32: rows = query tokens, cols = key-side tokens
    row_ids: tuple[int, ...]
    col_ids: tuple[int, ...]
    row_labels: tuple[str, ...]
    col_labels: tuple[str, ...]


@dataclass(frozen=True)
class ScoreNull:
    """Each score on random heads of the model's shapes and norms (docs/math.md, "Calibrated
    scores"): ``mean``/``std`` are ``[n_layers]`` per score name; ``z`` calibrates a table."""

    names: tuple[str, ...]
    mean: np.ndarray  # [len(names), n_layers] float32
    std: np.ndarray  # [len(names), n_layers] float32
    samples: int
    seed: int

    def z(self, name: str, values: np.ndarray) -> np.ndarray:
        """``(values - mean) / std`` for ``values [n_layers, n_heads]`` of score ``name``."""
        i = self.names.index(name)
        with np.errstate(divide="ignore", invalid="ignore"):
            return ((np.asarray(values, np.float64) - self.mean[i][:, None])
                    / self.std[i][:, None]).astype(np.float32)

    def head_z(self, name: str, layer: int, value: float) -> float:
        """``z`` of one head's score ``value`` in ``layer`` (the same number as ``z``'s)."""
        i = self.names.index(name)
        with np.errstate(divide="ignore", invalid="ignore"):
            return float(np.float32((np.float64(value) - np.float64(self.mean[i, layer]))
                                    / np.float64(self.std[i, layer])))


PatchSite = Literal["out", "q", "k", "v", "pattern"]
PatchMethod = Literal["exact", "attribution", "path"]


def head_label(heads: tuple[tuple[int, int], ...]) -> str:
    """``L1.H2``, or ``L1.H1+L1.H2`` for heads patched together."""
    return "+".join(f"L{layer}.H{head}" for layer, head in heads)


@dataclass(frozen=True)
class PatchRow:
    """One patch: a head, heads patched together, or a path (sender, receiver).

    ``patched`` is the metric after patching (attribution: ``corrupt + estimate`` in
    denoising, ``clean + estimate`` in noising, the first-order estimate of that metric);
    ``recovered = (patched - corrupt) / (clean - corrupt)``. Both are ``None``, never NaN,
    when they are undefined (the clean and corrupt runs give the same metric) or non-finite.
    """

    heads: tuple[tuple[int, int], ...]  # (layer, head) each; a path: (sender, receiver)
    patched: float | None
    recovered: float | None
    # --by-position: the metric with the heads patched at that position alone, [pos]
    positions: tuple[float | None, ...] | None = None
    positions_recovered: tuple[float | None, ...] | None = None
    # attribution: the first-order estimate of ``patched - corrupt`` (noising: ``- clean``);
    # with --verify, the exact patch's metric and recovered for the top K heads
    estimate: float | None = None
    exact: float | None = None
    exact_recovered: float | None = None

    @property
    def layer(self) -> int:
        return self.heads[0][0]

    @property
    def head(self) -> int:
        return self.heads[0][1]

    @property
    def label(self) -> str:
        return head_label(self.heads)


@dataclass(frozen=True)
class PatchResult:
    """Activation, attribution or path patching of attention heads (docs/math.md,
    "Patching"), as ``headscope patch`` / ``path`` print it and ``Model.patch`` returns it.

    Denoising (the default) runs the corrupt input and patches in clean activations;
    ``noising`` runs the clean input and patches in corrupt ones. ``recovered`` is
    ``(m - m_corrupt) / (m_clean - m_corrupt)`` either way; when ``m_clean == m_corrupt`` it
    is undefined: every row's ``recovered`` is ``None`` and ``note`` says why."""

    method: PatchMethod
    site: str  # out | q | k | v | pattern; a path: the receiver's input q | k | v
    metric: str  # "logit_diff" | "induction" | "first-occurrence" (validation.PATCH_TASKS)
    noising: bool
    clean: float
    corrupt: float
    rows: tuple[PatchRow, ...]
    n_layers: int
    n_heads: int
    tokens: int  # positions per sequence
    batch: int
    note: str = ""

    @property
    def recovered_defined(self) -> bool:
        return recovered(self.clean, self.corrupt, self.clean) is not None

    def table(self) -> np.ndarray:
        """``[n_layers, n_heads]`` float32 of the single-head rows' ``recovered`` (the
        estimate's, for attribution), NaN where there is no row or it is undefined: the
        heatmap of the explorer's Patch tab."""
        out = np.full((self.n_layers, self.n_heads), np.nan, dtype=np.float32)
        for row in self.rows:
            if len(row.heads) == 1 and row.recovered is not None:
                out[row.layer, row.head] = row.recovered
        return out


# |m_clean - m_corrupt| at or below this fraction of their scale: the two runs give the same
# metric (float32 rounding of equal inputs), and ``recovered`` is undefined.
SAME_METRIC_RTOL = 1e-6


def recovered(clean: float, corrupt: float, value: float | None) -> float | None:
    """``(value - corrupt) / (clean - corrupt)``, or ``None`` when undefined: the runs give
    the same metric, or a value is not finite."""
    if value is None or not all(np.isfinite((clean, corrupt, value))):
        return None
    span = clean - corrupt
    if abs(span) <= SAME_METRIC_RTOL * max(1.0, abs(clean), abs(corrupt)):
        return None
    return float((value - corrupt) / span)


def verify_order(estimates: Sequence[float]) -> list[int]:
    """Rows in the order ``--verify K`` patches the first K of exactly: largest ``|estimate|``
    first, non-finite estimates last."""
    return sorted(range(len(estimates)),
                  key=lambda i: -abs(estimates[i]) if math.isfinite(estimates[i]) else math.inf)


def patch_result(*, method: PatchMethod, site: str, metric: str, noising: bool, clean: float,
                 corrupt: float, sets: Any, values: Any, n_layers: int, n_heads: int,
                 tokens: int, batch: int, positions: Any = None, exact: Any = None,
                 verified: int = 0) -> PatchResult:
    """The ``PatchResult`` of raw numbers, computed now or read back from the results store
    (one builder for both, so a stored result is the computed one). ``sets``: each row's
    heads; ``values [rows]``: each row's metric after patching (attribution: the estimate of
    its change); ``positions [rows, pos]`` (by position) and ``exact [rows]`` (attribution's
    ``verified`` heads, the first of ``verify_order``; NaN for the others) if any.
    Non-finite numbers become ``None``, and the note names their rows."""
    def number(v: Any) -> float | None:
        return float(v) if v is not None and np.isfinite(v) else None

    base = clean if noising else corrupt
    rows = []
    for i, heads in enumerate(sets):
        value = number(values[i])
        estimate = value if method == "attribution" else None
        patched = (None if value is None else base + value) if method == "attribution" else value
        at = None if positions is None else tuple(number(v) for v in positions[i])
        ex = None if exact is None else number(exact[i])
        rows.append(PatchRow(
            heads=tuple((int(layer), int(head)) for layer, head in heads), patched=patched,
            recovered=recovered(clean, corrupt, patched), positions=at,
            positions_recovered=None if at is None else tuple(recovered(clean, corrupt, v) for v in at),
            estimate=estimate, exact=ex, exact_recovered=recovered(clean, corrupt, ex)))
    notes = []
    if recovered(clean, corrupt, clean) is None:
        notes.append(f"the clean and corrupt inputs give the same {metric} ({clean:.6g}): recovered is undefined")
    notes += _non_finite_notes(method, rows, values, positions, exact, verified)
    return PatchResult(method=method, site=site, metric=metric, noising=noising, clean=float(clean),
                       corrupt=float(corrupt), rows=tuple(rows), n_layers=n_layers, n_heads=n_heads,
                       tokens=tokens, batch=batch, note="; ".join(notes))


def _non_finite_notes(method: str, rows: Sequence[PatchRow], values: Any, positions: Any, exact: Any,
                      verified: int) -> list[str]:
    """Which rows came out non-finite (null in JSON, ``?`` in the Patch tab), and why: a
    patched run (or attribution's gradient) overflowed or met a NaN. Without this a null
    reads as "undefined" and, drawn, as no effect."""
    def named(which: Sequence[int]) -> str:
        labels = [" → ".join(f"L{layer}.H{head}" for layer, head in rows[i].heads) if method == "path"
                  else rows[i].label for i in which]
        return ", ".join(labels[:8]) + (f" and {len(labels) - 8} more" if len(labels) > 8 else "")

    notes = []
    what = "estimate" if method == "attribution" else "metric after patching"
    bad = [i for i in range(len(rows)) if not np.isfinite(values[i])
           or (positions is not None and not np.isfinite(np.asarray(positions[i], dtype=np.float64)).all())]
    if bad:
        notes.append(f"the {what} is not finite for {named(bad)} (shown as null): the patched run "
                     "overflows or meets a NaN")
    if exact is not None and verified:
        checked = verify_order([float(v) for v in values])[:verified]
        unverifiable = sorted(i for i in checked if not np.isfinite(exact[i]))
        if unverifiable:
            notes.append(f"--verify's exact patch is not finite for {named(unverifiable)} (exact shown as "
                         "null): the patched run overflows or meets a NaN")
    return notes


@dataclass(frozen=True)
class CacheStats:
    hits: int
    misses: int
    evictions: int
    bytes: int
    capacity: int
    entries: int
    in_flight: int
    activity: str | None = None  # e.g. "composition k 40%" while a sweep runs
    progress: float | None = None  # fraction done of the running sweep
    origin: str = ""  # where the last sweep's numbers came from: "head scores: from the cache"


def nbytes(result: Any) -> int:
    """Bytes a cached result holds: its arrays plus a small fixed overhead per object."""
    total = 256
    if isinstance(result, np.ndarray):
        return total + int(result.nbytes)
    if isinstance(result, dict):
        return total + sum(nbytes(v) for v in result.values())
    if isinstance(getattr(result, "nbytes", None), int):  # objects that know their size
        return total + int(result.nbytes)
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        for f in dataclasses.fields(result):
            value = getattr(result, f.name)
            if isinstance(value, np.ndarray):
                total += int(value.nbytes)
            elif isinstance(value, tuple):
                total += 16 * len(value)
                total += sum(len(v) for v in value if isinstance(v, str))
    return total
