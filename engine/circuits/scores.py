"""Head scores (docs/math.md, "Scores"): spectral scores, composition, behaviour, ablation.

Weight-only scores are batched tensor code over the heads of a layer (no Python loop over
heads or head pairs); model-wide sweeps report ``progress(fraction)`` and stop with
:class:`~engine.errors.CancelledError` when ``cancelled()`` turns true (checked between
layers). Heads with non-finite weights get NaN scores, never a crash: their matrices are
replaced by zeros before any eigen/QR call (``torch.linalg.eigvals`` on a NaN matrix kills
the process) and the NaN is put back afterwards; any other matrix that comes out non-finite
is caught before its eigen call too. Heads with finite weights so large that float32
products overflow (entries near 1e19) have their factors rescaled by a power of two before
the weight-based scores, which are scale-free ratios: those come out right. Their forward
pass overflows, so their behavioural scores are NaN. ``nonfinite_heads`` lists both kinds.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
import torch

from headscope.engine.circuits.factored import _TAME_ABOVE, FactoredMatrix, is_finite, max_abs, tame
from headscope.engine.core.errors import CancelledError, InvalidRequestError, NonFiniteError
from headscope.engine.core.memory import release_free_heap as _release_free_heap  # the sweeps' end
from headscope.engine.core.validation import check_composition_kind
from headscope.engine.model.weights import WeightSource

if TYPE_CHECKING:
    from torch import Tensor

    from headscope.engine.core.config import ModelConfig

Progress = Callable[[float], None] | None
Cancelled = Callable[[], bool] | None
Kind = Literal["q", "k", "v"]


class Memo(Protocol):
    """Where a sweep keeps its per-layer parts (``engine.store.LayerMemo``): ``get(i)`` a part
    already finished (or None), ``put(i, value)`` one just finished. Sweeps given a memo
    compute only the parts it lacks and store each as soon as it is done, so an interrupted
    sweep resumes (docs/internals.md, "The results store")."""

    def get(self, index: int, shape: tuple[int, ...] | None = None) -> np.ndarray | None: ...

    def put(self, index: int, value: Any) -> None: ...


def _known(memo: Memo | None, index: int, shape: tuple[int, ...] | None = None) -> Tensor | None:
    if memo is None:
        return None
    found = memo.get(index, shape)
    return None if found is None else torch.from_numpy(np.array(found, dtype=np.float32))

__all__ = [
    "COMPOSITION_TILE_BYTES",
    "BehaviourSums",
    "CompositionScores",
    "CompositionTile",
    "ablation_effect",
    "ablation_effects",
    "all_copying_scores",
    "all_qk_positivity",
    "behaviour_scores",
    "composition_baseline",
    "composition_pairs",
    "composition_score",
    "composition_scores",
    "composition_tile",
    "copying_score",
    "detection_patterns",
    "iter_composition_tiles",
    "layer_spectral_scores",
    "nonfinite_heads",
    "per_layer",
    "qk_positivity",
    "repeated_tokens",
    "spectral_middles",
    "spectral_score",
    "spectral_scores",
]


def _attn(w: WeightSource, layer: int, name: str) -> Tensor:
    return w.get(f"blocks.{layer}.attn.{name}")


def _check(cancelled: Cancelled) -> None:
    if cancelled is not None and cancelled():
        raise CancelledError("sweep cancelled")


def _report(progress: Progress, fraction: float) -> None:
    if progress is not None:
        progress(min(1.0, max(0.0, fraction)))


def _finite_per_matrix(x: Tensor) -> Tensor:
    """``[...]`` bool: which of the matrices ``x [..., m, n]`` are entirely finite.

    One reduction pass: a sum is NaN or ±inf if any entry is (it could also overflow, but
    only for entries near 1e33, which no float32 computation survives anyway). It is many
    times faster on CPU than ``isfinite(x).all()``, which materialises a bool tensor first.
    """
    return torch.isfinite(x.sum((-2, -1)))


# -- spectral scores -------------------------------------------------------------------------


def spectral_score(eigenvalues: Tensor) -> Tensor:
    """``Σ Re λ / Σ |λ|`` over the last dim (in [-1, 1]; NaN for an all-zero spectrum)."""
    return eigenvalues.real.sum(-1) / eigenvalues.abs().sum(-1)


_THREADS_LOCK = threading.Lock()
_THREADS_USERS = 0
_THREADS_SAVED = 0


@contextlib.contextmanager
def one_lapack_thread() -> Iterator[None]:
    """Run small LAPACK calls (``eigvals``/``cholesky``/``eigh`` of ``d_head``-sized matrices)
    on one thread.

    MKL's threaded ``geev`` on 128 × 128 matrices is 5-15× *slower* with 2 threads than with
    one on a busy 2-core box (measured: 32 matrices, 0.3 s vs 1.5-5.5 s; numpy's OpenBLAS is
    as slow): the threads spin waiting on each other. That made ``eigvals`` 94 s of a 7B copying
    sweep. The setting is process-wide, so it is restored when the last user leaves; other
    threads' products run single-threaded meanwhile (same numbers, briefly slower).
    """
    global _THREADS_USERS, _THREADS_SAVED
    with _THREADS_LOCK:
        if _THREADS_USERS == 0:
            _THREADS_SAVED = torch.get_num_threads()
            torch.set_num_threads(1)
        _THREADS_USERS += 1
    try:
        yield
    finally:
        with _THREADS_LOCK:
            _THREADS_USERS -= 1
            if _THREADS_USERS == 0:
                torch.set_num_threads(_THREADS_SAVED)


def _batched_spectral_score(small: Tensor) -> Tensor:
    """``spectral_score`` of each square matrix in ``small [..., k, k]``, NaN where non-finite."""
    finite = _finite_per_matrix(small)
    safe = torch.where(finite[..., None, None], small, torch.zeros_like(small))
    # float64: more accurate, and LAPACK's dgeev is several times faster here than sgeev.
    with one_lapack_thread():
        eigenvalues = torch.linalg.eigvals(safe.double())
    score = spectral_score(eigenvalues).to(small.dtype)
    return torch.where(finite, score, torch.full_like(score, math.nan))


def copying_score(fm: FactoredMatrix) -> float:
    """Copying score of a (full OV) circuit: ``Σ Re λ / Σ |λ|``; NaN if non-finite.

    The eigenvalues come from float64 (``eigenvalues_double``): factors near 1e19, whose
    float32 product overflows, still get their (scale-free) score.
    """
    if not (is_finite(fm.A) and is_finite(fm.B)):
        return math.nan
    try:
        return float(spectral_score(fm.eigenvalues_double()))
    except NonFiniteError:
        return math.nan


def qk_positivity(fm: FactoredMatrix) -> float:
    """The same statistic on a (token) QK circuit: near +1 when heads attend to similar tokens."""
    return copying_score(fm)


def copying_middle(w: WeightSource) -> Tensor:
    """``W_U W_E [d_model, d_model]``: the copying sweep's one contraction over the vocabulary."""
    return w.get("unembed.W_U") @ w.get("embed.W_E")


def qk_middle(w: WeightSource) -> Tensor:
    """``W_Eᵀ W_E [d_model, d_model]``: the QK-positivity sweep's contraction over the vocabulary."""
    w_e = w.get("embed.W_E")
    return w_e.T @ w_e


def all_copying_scores(w: WeightSource, progress: Progress = None,
                       cancelled: Cancelled = None, memo: Memo | None = None,
                       middle: Callable[[], Tensor] | None = None) -> Tensor:
    """Copying score of every head, ``[n_layers, n_heads]``.

    Full OV ``= (W_E W_V)(W_O W_U)``, so the ``d_head × d_head`` matrix with its non-zero
    eigenvalues is ``BA = W_O (W_U W_E) W_V``. ``W_U W_E [d_model, d_model]`` is computed
    once per model (the one large contraction, over the vocabulary); then each layer is one
    batched product and one batched ``eigvals`` on ``[n_heads, d_head, d_head]``.
    ``memo``: layers already done are taken from it, those computed are put in it.
    ``middle``: where to get ``W_U W_E`` from instead of ``copying_middle(w)`` (a cluster
    worker computing one layer per task keeps it across tasks).
    """
    return _spectral_sweep(w, middle or (lambda: copying_middle(w)), "W_O", "W_V", progress,
                           cancelled, memo)


def all_qk_positivity(w: WeightSource, progress: Progress = None,
                      cancelled: Cancelled = None, memo: Memo | None = None,
                      middle: Callable[[], Tensor] | None = None) -> Tensor:
    """QK positivity of every head on the token QK circuit, ``[n_layers, n_heads]``.

    Token QK ``= (W_E W_Q)(W_Kᵀ W_Eᵀ)``: ``BA = W_Kᵀ (W_Eᵀ W_E) W_Q``. ``middle`` as in
    ``all_copying_scores`` (``qk_middle(w)`` by default).
    """
    return _spectral_sweep(w, middle or (lambda: qk_middle(w)), "W_K^T", "W_Q", progress,
                           cancelled, memo)


def _spectral_sweep(w: WeightSource, make_middle: Callable[[], Tensor], left: str, right: str,
                    progress: Progress, cancelled: Cancelled, memo: Memo | None = None) -> Tensor:
    """One row per layer (``layer_spectral_scores``); the ``d_model × d_model`` middle is
    formed only if a layer is missing from ``memo`` (a fully stored sweep reads no weights),
    and each layer computed is put in ``memo`` as soon as it is done."""
    cfg = w.cfg
    kind = "copying_score" if left == "W_O" else "qk_positivity"
    middles: dict[str, Tensor] | None = None
    out = torch.empty(cfg.n_layers, cfg.n_heads)
    for layer in range(cfg.n_layers):
        known = _known(memo, layer, (cfg.n_heads,))
        if known is not None:
            out[layer] = known
            _report(progress, (layer + 1) / cfg.n_layers)
            continue
        _check(cancelled)
        if middles is None:
            middles = {kind: make_middle()}
        out[layer] = layer_spectral_scores(w, layer, middles)[kind]
        if memo is not None:
            memo.put(layer, out[layer])
        _report(progress, (layer + 1) / cfg.n_layers)
    del middles
    _release_free_heap()
    return out


SPECTRAL_SCORES = ("copying_score", "qk_positivity")


def spectral_middles(w: WeightSource, kinds: tuple[str, ...] = SPECTRAL_SCORES) -> dict[str, Tensor]:
    """The ``[d_model, d_model]`` matrix between each spectral score's factors, formed once per
    model: ``W_U W_E`` (copying) and ``W_Eᵀ W_E`` (QK positivity). See ``all_copying_scores``."""
    out = {}
    if "copying_score" in kinds:
        out["copying_score"] = w.get("unembed.W_U") @ w.get("embed.W_E")
    if "qk_positivity" in kinds:
        w_e = w.get("embed.W_E")
        out["qk_positivity"] = w_e.T @ w_e
    return out


def layer_spectral_scores(w: WeightSource, layer: int, middles: dict[str, Tensor]) -> dict[str, Tensor]:
    """One layer's spectral scores, ``[n_heads]`` each: the unit a sweep computes (and a store
    can keep) at a time.

    ``middles`` from ``spectral_middles`` (the keys say which scores). Each of the layer's four
    attention weights is read once; one pass over each gives both its non-finite flag and its
    taming scale; each score is one ``[H·d_head, d_model] @ [d_model, d_model]`` product, a
    batched ``d_head``-sized product and a batched single-threaded ``eigvals``. The result also
    has ``"nonfinite"`` (bool): a head with any non-finite weight or bias is NaN in every score,
    not just in those its broken matrix enters, so the table and the nonfinite list agree.
    """
    mats = {name: _attn(w, layer, name) for name in _HEAD_WEIGHTS}
    peaks = {name: _peak(x) for name, x in mats.items()}
    bad = torch.zeros(w.cfg.n_heads, dtype=torch.bool)
    for peak in peaks.values():
        bad |= ~torch.isfinite(peak)
    bad |= _biases_nonfinite(w, layer)
    out = {"nonfinite": bad}
    for kind, middle in middles.items():
        # Tamed factors (exact power-of-two rescaling, the score is scale-free): finite
        # weights near 1e19 would otherwise overflow the float32 product.
        if kind == "copying_score":  # BA = W_O (W_U W_E) W_V
            lhs, rhs = _tame(mats["W_O"], peaks["W_O"]), _tame(mats["W_V"], peaks["W_V"])
        else:  # BA = W_Kᵀ (W_Eᵀ W_E) W_Q
            lhs = _tame(mats["W_K"], peaks["W_K"]).transpose(-2, -1)
            rhs = _tame(mats["W_Q"], peaks["W_Q"])
        n, k, d = lhs.shape
        small = (lhs.reshape(n * k, d) @ middle).reshape(n, k, d) @ rhs  # [H, d_head, d_head]
        out[kind] = torch.where(bad, math.nan, _batched_spectral_score(small))
    # ``_layer_overflow`` from the peaks already taken: nonfinite | overflow = nonfinite_heads
    limit = torch.finfo(torch.float32).max / w.cfg.d_head
    p64 = {name: peak.double() for name, peak in peaks.items()}
    out["overflow"] = (p64["W_Q"] * p64["W_K"] > limit) | (p64["W_V"] * p64["W_O"] > limit)
    return out


def spectral_scores(w: WeightSource, progress: Progress = None, cancelled: Cancelled = None
                    ) -> dict[str, Tensor]:
    """Copying score, QK positivity, the non-finite and the overflow flags of every head,
    ``[L, H]`` each, in one pass over the layers (``layer_spectral_scores``): each layer's
    weights are read once for both scores. Equal to ``all_copying_scores`` and
    ``all_qk_positivity``; ``nonfinite | overflow`` are the heads of ``nonfinite_heads``."""
    cfg = w.cfg
    _check(cancelled)
    middles = spectral_middles(w)
    out = {name: torch.empty(cfg.n_layers, cfg.n_heads) for name in SPECTRAL_SCORES}
    out["nonfinite"] = torch.empty(cfg.n_layers, cfg.n_heads, dtype=torch.bool)
    out["overflow"] = torch.empty(cfg.n_layers, cfg.n_heads, dtype=torch.bool)
    for layer in range(cfg.n_layers):
        _check(cancelled)
        for name, value in layer_spectral_scores(w, layer, middles).items():
            out[name][layer] = value
        _report(progress, (layer + 1) / cfg.n_layers)
    del middles
    _release_free_heap()
    return out


def _peak(x: Tensor) -> Tensor:
    """``[H]``: the largest ``|entry|`` of each head's matrix in ``x [H, m, n]``: NaN if it has a
    NaN, inf if an inf (so it is also the non-finite flag). One pass (``aminmax``)."""
    lo, hi = torch.aminmax(x.reshape(x.shape[0], -1), dim=-1)
    return torch.maximum(hi, -lo)


def _tame(x: Tensor, peak: Tensor) -> Tensor:
    """``tame(x)`` from the already known ``peak = max_abs(x)``."""
    big = torch.isfinite(peak) & (peak > _TAME_ABOVE)
    if not bool(big.any()):
        return x
    return tame(x)


def _biases_nonfinite(w: WeightSource, layer: int) -> Tensor:
    bad = torch.zeros(w.cfg.n_heads, dtype=torch.bool)
    for name in _HEAD_BIASES:
        if w.has(f"blocks.{layer}.attn.{name}"):
            bad |= ~torch.isfinite(_attn(w, layer, name).sum(-1))
    return bad


# -- non-finite heads --------------------------------------------------------------------------

_HEAD_WEIGHTS = ("W_Q", "W_K", "W_V", "W_O")
_HEAD_BIASES = ("b_Q", "b_K", "b_V")


def _layer_nonfinite(w: WeightSource, layer: int) -> Tensor:
    """``[n_heads]`` bool: heads of ``layer`` with a NaN/inf in a weight or bias."""
    bad = torch.zeros(w.cfg.n_heads, dtype=torch.bool)
    for name in _HEAD_WEIGHTS:
        bad |= ~_finite_per_matrix(_attn(w, layer, name))
    for name in _HEAD_BIASES:
        if w.has(f"blocks.{layer}.attn.{name}"):
            bad |= ~torch.isfinite(_attn(w, layer, name).sum(-1))
    return bad


def _nonfinite_mask(w: WeightSource) -> Tensor:
    return torch.stack([_layer_nonfinite(w, layer) for layer in range(w.cfg.n_layers)])


def _layer_overflow(w: WeightSource, layer: int) -> Tensor:
    """``[n_heads]`` bool: heads whose QK or OV circuit can exceed float32's range.

    ``|(W_Q W_Kᵀ)[i, j]| <= d_head · max|W_Q| · max|W_K|`` (and the same for ``W_V W_O``);
    the bound is taken in float64. Realistic weights are many orders of magnitude below it;
    a head with weights near 1e19 (finite in float32) overflows every float32 product of them.
    """
    peak = {n: max_abs(_attn(w, layer, n)).double() for n in _HEAD_WEIGHTS}
    limit = torch.finfo(torch.float32).max / w.cfg.d_head
    return (peak["W_Q"] * peak["W_K"] > limit) | (peak["W_V"] * peak["W_O"] > limit)


def nonfinite_heads(w: WeightSource) -> list[tuple[int, int]]:
    """``(layer, head)`` of every head with a NaN/inf in its Q/K/V/O weights or biases, or
    with weights so large that its QK or OV circuit overflows float32 (``_layer_overflow``):
    the heads whose numbers are flagged (their forward pass, hence behavioural scores, is NaN).
    """
    bad = torch.stack([_layer_nonfinite(w, layer) | _layer_overflow(w, layer)
                       for layer in range(w.cfg.n_layers)])
    return [(int(layer), int(head)) for layer, head in bad.nonzero().tolist()]


# -- composition ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompositionScores:
    """``scores[l1, h1, l2, h2]``: how much head (l1, h1) writes into what (l2, h2) reads.

    Zero where ``l1 >= l2``; NaN where either head has non-finite weights (or a zero circuit).
    ``baseline`` is the expected score of random Gaussian factors of the same shapes.
    """

    kind: Kind
    scores: Tensor  # [L, H, L, H]
    baseline: float
    seed: int


def composition_score(left: FactoredMatrix, right: FactoredMatrix) -> Tensor:
    """The composition score, by its definition: ``‖W_A W_B‖_F / (‖W_A‖_F ‖W_B‖_F)`` for the
    circuit ``W_A`` an earlier head writes through (its OV) and the circuit ``W_B`` a later
    head reads through (QK for Q-, QKᵀ for K-, OV for V-composition); docs/math.md.

    As TransformerLens' ``composition_scores``: ``left.collapse_l()`` (``S Vh``) and
    ``right.collapse_r()`` (``U S``) drop orthogonal factors that change none of the three
    norms. Leading dims broadcast. ``composition_scores`` is the fast batched path of the
    same number (tested against this one).
    """
    a, b = left.collapse_l(), right.collapse_r()
    return torch.linalg.matrix_norm(a @ b) / (torch.linalg.matrix_norm(a) * torch.linalg.matrix_norm(b))


def _r_factor(x: Tensor) -> Tensor:
    """A square root ``R [.., k, k]`` of the Gram matrix, ``RᵀR = xᵀx``, for ``x [.., n, k]``.

    ``x = QR`` for some ``Q`` with orthonormal columns, so ``‖x M‖_F = ‖R M‖_F``: the same
    ``R`` a QR decomposition gives (up to signs), from a Cholesky factor of the ``k × k``
    Gram matrix in float64, which is far cheaper than Householder QR of the tall ``x``.
    Rank-deficient Grams (e.g. a zero head) fall back to ``diag(√λ) Vᵀ`` from ``eigh``.
    """
    x64 = x.double()
    gram = x64.transpose(-2, -1) @ x64
    # Callers zero non-finite heads first; never hand a NaN to cholesky/eigh regardless (a
    # zero Gram gives a zero root, hence a NaN ratio, as for a pruned head).
    finite = _finite_per_matrix(gram)
    if not bool(finite.all()):
        gram = torch.where(finite[..., None, None], gram, torch.zeros_like(gram))
    with one_lapack_thread():
        chol, info = torch.linalg.cholesky_ex(gram)
    root = chol.transpose(-2, -1)
    failed = info != 0
    if bool(failed.any()):
        with one_lapack_thread():
            vals, vecs = torch.linalg.eigh(gram[failed])
        root[failed] = vals.clamp_min(0).sqrt()[..., :, None] * vecs.transpose(-2, -1)
    return root.to(x.dtype)


def _reduced_source(w_v: Tensor, w_o: Tensor) -> Tensor:
    """``X = R(W_V) W_O [.., k, d_model]``: ``‖OV₁ M‖_F = ‖X M‖_F`` for any ``M``."""
    return _r_factor(w_v) @ w_o


def _reduced_target(a: Tensor, b_t: Tensor) -> Tensor:
    """``Y = A R(Bᵀ)ᵀ [.., d_model, k]`` for the target circuit ``A B``: ``‖M A B‖_F = ‖M Y‖_F``."""
    return a @ _r_factor(b_t).transpose(-2, -1)


def _target_factors(w: WeightSource, layer: int, kind: Kind) -> tuple[Tensor, Tensor]:
    """``(A, Bᵀ)`` of the circuit the later head reads through, ``[H, d_model, d_head]`` each."""
    if kind == "q":  # QK = W_Q W_Kᵀ
        return _attn(w, layer, "W_Q"), _attn(w, layer, "W_K")
    if kind == "k":  # QKᵀ = W_K W_Qᵀ
        return _attn(w, layer, "W_K"), _attn(w, layer, "W_Q")
    return _attn(w, layer, "W_V"), _attn(w, layer, "W_O").transpose(-2, -1)  # OV = W_V W_O


def _zero_bad(x: Tensor, bad: Tensor) -> Tensor:
    """``x [H, ...]`` with the matrices of bad heads zeroed (no copy when none is bad)."""
    if not bool(bad.any()):
        return x
    x = x.clone()
    x[bad] = 0
    return x


# Bytes a composition sweep's source block may hold: the stacked ``X`` of its source layers
# plus their product with one target layer (64 + 64 MB per source layer on a 7B model: 6
# source layers at a time). Bounds the sweep's memory whatever the model's depth.
COMPOSITION_TILE_BYTES = 768 << 20


@dataclass(frozen=True)
class CompositionTile:
    """The scores of one layer pair, ``scores[h1, h2]`` for source head ``(source, h1)`` and target
    head ``(target, h2)``, ``source < target``: the unit a composition sweep computes, streams
    and a store can keep. NaN where either head has non-finite weights (or a zero circuit)."""

    kind: Kind
    source: int
    target: int
    scores: Tensor  # [H, H]


class _Factors:
    """Per-layer reduced factors and non-finite flags of one composition sweep (memoised flags:
    each layer's four weights are checked once)."""

    def __init__(self, w: WeightSource, kind: Kind) -> None:
        self.w, self.kind = w, kind
        self._bad: dict[int, Tensor] = {}

    def bad(self, layer: int) -> Tensor:
        if layer not in self._bad:
            self._bad[layer] = _layer_nonfinite(self.w, layer)
        return self._bad[layer]

    def source(self, layer: int) -> Tensor:
        """``X [H, k, d_model]`` of a source layer (``_reduced_source``), bad heads zeroed."""
        # tamed: the score is scale-free per head, float32 products of 1e19 are not
        bad = self.bad(layer)
        return _reduced_source(_zero_bad(tame(_attn(self.w, layer, "W_V")), bad),
                               _zero_bad(tame(_attn(self.w, layer, "W_O")), bad))

    def target(self, layer: int) -> Tensor:
        """``Y [H, d_model, k]`` of a target layer (``_reduced_target``), bad heads zeroed."""
        a, b_t = _target_factors(self.w, layer, self.kind)
        bad = self.bad(layer)
        return _reduced_target(_zero_bad(tame(a), bad), _zero_bad(tame(b_t), bad))

    def tile(self, source: int, target: int, scores: Tensor) -> CompositionTile:
        mask = self.bad(source)[:, None] | self.bad(target)[None, :]
        return CompositionTile(self.kind, source, target,
                               torch.where(mask, torch.full_like(scores, math.nan), scores))


def composition_tile(w: WeightSource, kind: Kind, source: int, target: int) -> CompositionTile:
    """One layer pair's ``kind``-composition scores on their own (what ``iter_composition_tiles``
    yields for the pair, computed without the rest of the sweep)."""
    check_composition_kind(kind, getattr(w, "path", None))
    if not 0 <= source < target < w.cfg.n_layers:
        raise InvalidRequestError(getattr(w, "path", None),
                                  f"composition needs 0 <= source < target < {w.cfg.n_layers}, "
                                  f"not {source}, {target}")
    f = _Factors(w, kind)
    x = f.source(source)
    scores = _pair_scores(x[None], torch.linalg.matrix_norm(x)[None], f.target(target))[0]
    return f.tile(source, target, scores)


def composition_pairs(n_layers: int) -> list[tuple[int, int]]:
    """Every ``(source, target)`` layer pair of a composition sweep, ``source < target``."""
    return [(s, t) for t in range(n_layers) for s in range(t)]


def _source_block(cfg: ModelConfig, tile_bytes: int) -> int:
    """How many source layers one block of the sweep holds (``COMPOSITION_TILE_BYTES``)."""
    hk = cfg.n_heads * cfg.d_head
    per_layer = 4 * hk * (cfg.d_model + hk)  # float32 X [H, k, d_model] and its product [H·k, H·k]
    return max(1, tile_bytes // per_layer)


def iter_composition_tiles(w: WeightSource, kind: Kind, progress: Progress = None,
                           cancelled: Cancelled = None, *, skip: frozenset[tuple[int, int]] = frozenset(),
                           tile_bytes: int = COMPOSITION_TILE_BYTES) -> Iterator[CompositionTile]:
    """Every layer pair's ``CompositionTile`` as soon as it is computed, in bounded memory.

    Source layers are taken in blocks that fit ``tile_bytes`` (``X`` of each, ``[H, k,
    d_model]``); for each later target layer, its ``Y`` is formed once and multiplied with
    the whole block in one product ``[block·H·k, d_model] @ [d_model, H·k]``, whose ``k × k``
    blocks are the pairs' ``X₁ Y₂`` (``composition_scores``). Memory holds one block and one
    product, never all the layers' factors (2 GB on a 7B model). Pairs in ``skip`` (already
    stored) are not computed. ``progress`` is the fraction of pairs done (each pair is the
    same work, so a linear ETA holds); ``cancelled()`` is checked before each product.
    """
    check_composition_kind(kind, getattr(w, "path", None))
    n_layers = w.cfg.n_layers
    todo = [pair for pair in composition_pairs(n_layers) if pair not in skip]
    total, done = len(todo) or 1, 0
    wanted = set(todo)
    f = _Factors(w, kind)
    block = _source_block(w.cfg, tile_bytes)
    for first in range(0, n_layers - 1, block):
        sources = [s for s in range(first, min(first + block, n_layers - 1))
                   if any((s, t) in wanted for t in range(s + 1, n_layers))]
        if not sources:
            continue
        _check(cancelled)
        xs = torch.stack([f.source(s) for s in sources])  # [B, H, k, d_model]
        x_norms = torch.linalg.matrix_norm(xs)
        for target in range(sources[0] + 1, n_layers):
            rows = [i for i, s in enumerate(sources) if s < target and (s, target) in wanted]
            if not rows:
                continue
            _check(cancelled)
            part = _pair_scores(xs[rows[0]: rows[-1] + 1], x_norms[rows[0]: rows[-1] + 1], f.target(target))
            for i in rows:
                yield f.tile(sources[i], target, part[i - rows[0]])
                done += 1
            _report(progress, done / total)
        del xs
    _report(progress, 1.0)


def composition_scores(w: WeightSource, kind: Kind, seed: int = 0, progress: Progress = None,
                       cancelled: Cancelled = None, *, baseline_samples: int = 32,
                       on_tile: Callable[[CompositionTile], None] | None = None,
                       tile_bytes: int = COMPOSITION_TILE_BYTES,
                       memo: Memo | None = None) -> CompositionScores:
    """``kind``-composition score of every head pair with ``layer(h1) < layer(h2)``.

    ``score = ‖OV₁ M₂‖_F / (‖OV₁‖_F ‖M₂‖_F)`` (``composition_score``) with ``M₂ = QK₂`` (q),
    ``QK₂ᵀ`` (k) or ``OV₂`` (v), batched. With ``OV₁ = W_V W_O`` and ``M₂ = A B``, the orthogonal ``Q`` factors of
    ``W_V = Q R`` and ``Bᵀ = Q' R'`` do not change Frobenius norms, so
    ``‖OV₁ M₂‖ = ‖(R W_O)(A R'ᵀ)‖ = ‖X₁ Y₂‖`` with ``X₁ [d_head, d_model]`` and
    ``Y₂ [d_model, d_head]``. Pairs are computed layer pair by layer pair in blocks of source
    layers (``iter_composition_tiles``: memory bounded by ``tile_bytes``); ``on_tile`` gets
    each ``CompositionTile`` as it finishes (the edges of a graph or a ``--top`` list can fill
    in while the sweep runs).

    ``memo``: one part per target layer ``t``, the tile ``scores[:t, :, t, :]``. Targets
    already stored are not recomputed (their pairs are skipped; ``on_tile`` still gets their
    tiles, first); a target's part is put as soon as its last pair, ``(t - 1, t)``, is done
    (source blocks run in order, so every earlier source of ``t`` is done by then).
    """
    check_composition_kind(kind, getattr(w, "path", None))
    cfg = w.cfg
    n_layers, n_heads = cfg.n_layers, cfg.n_heads
    scores = torch.zeros(n_layers, n_heads, n_layers, n_heads)
    skip: set[tuple[int, int]] = set()
    for target in range(1, n_layers):
        known = _known(memo, target, (target, n_heads, n_heads))
        if known is None:
            continue
        scores[:target, :, target, :] = known
        skip.update((source, target) for source in range(target))
        if on_tile is not None:
            for source in range(target):
                on_tile(CompositionTile(kind, source, target, known[source]))
    for tile in iter_composition_tiles(w, kind, progress, cancelled, skip=frozenset(skip),
                                       tile_bytes=tile_bytes):
        scores[tile.source, :, tile.target, :] = tile.scores
        if memo is not None and tile.source == tile.target - 1:
            memo.put(tile.target, scores[:tile.target, :, tile.target, :].clone())
        if on_tile is not None:
            on_tile(tile)
    baseline = composition_baseline(cfg.d_model, cfg.d_head, seed, baseline_samples)
    _release_free_heap()
    return CompositionScores(kind=kind, scores=scores, baseline=baseline, seed=seed)


def _pair_scores(x: Tensor, x_norm: Tensor, y: Tensor) -> Tensor:
    """``‖X₁ Y₂‖ / (‖X₁‖ ‖Y₂‖)`` for ``x [L1, H, k, d]``, ``y [H2, d, k2]`` -> ``[L1, H, H2]``."""
    n_src, n_heads, k, d = x.shape
    n_tgt, _, k2 = y.shape
    prod = x.reshape(-1, d) @ y.permute(1, 0, 2).reshape(d, n_tgt * k2)
    # squared in place: prod is the sweep's largest temporary (350 MB on a 1B model)
    sq = prod.square_().reshape(n_src, n_heads, k, n_tgt, k2).sum((2, 4))
    y_norm = torch.linalg.matrix_norm(y)  # [H2]
    return sq.sqrt() / (x_norm[:, :, None] * y_norm[None, None, :])


def composition_baseline(d_model: int, d_head: int, seed: int = 0, samples: int = 32) -> float:
    """Expected composition score of random factors of the model's shapes.

    The mean, over ``samples`` draws of i.i.d. standard Gaussian ``W_V, W_Q, W_K
    [d_model, d_head]`` and ``W_O [d_head, d_model]`` from numpy's ``default_rng(seed)``, of
    ``‖OV₁ M₂‖ / (‖OV₁‖ ‖M₂‖)``. The Gaussian law is rotation invariant, so the value is
    the same for Q-, K- and V-composition (and for any scale of the factors). Computed in
    numpy (``engine.fast.composition_baseline``) so that the torch-free path gives the same
    number.
    """
    from headscope.engine.circuits.fast import composition_baseline as baseline

    return baseline(d_model, d_head, seed, samples)


# -- behaviour (attention patterns on seeded random sequences) ---------------------------------


def repeated_tokens(vocab: int, n_ctx: int, seed: int = 0, seq_len: int | None = None,
                    batch: int = 4) -> Tensor:
    """``[batch, 2T]`` seeded random sequences, each a length-``T`` sequence written twice.

    ``T = seq_len`` or ``min(32, n_ctx // 2)``. Within one copy the ids are distinct when the
    vocabulary allows it (drawn without replacement), so the only duplicates are the
    repetition itself and the induction target of position ``t`` is exactly ``t - T + 1``.
    """
    half = seq_len if seq_len is not None else min(32, n_ctx // 2)
    if half < 1 or 2 * half > n_ctx:
        raise InvalidRequestError(
            None, f"a repeated sequence of 2×{half} tokens does not fit the context of {n_ctx}"
        )
    g = torch.Generator().manual_seed(seed)
    if vocab >= half:
        first = torch.stack([torch.randperm(vocab, generator=g)[:half] for _ in range(batch)])
    else:
        first = torch.randint(vocab, (batch, half), generator=g)
    return torch.cat((first, first), dim=1)


def detection_patterns(tokens: Tensor) -> dict[str, Tensor]:
    """TransformerLens' head-detector patterns ``[batch, q, k]`` (1 where attention counts).

    prev_token: ``(i, i-1)``. duplicate_token: ``(i, j)``, ``j < i``, same token.
    induction: the duplicate pattern shifted one key to the right, ``(i, j+1)``: the token
    after an earlier occurrence of the current one.
    """
    b, n = tokens.shape
    prev = torch.ones(n, n).tril(-1).triu(-1).expand(b, n, n)
    same = tokens[:, :, None] == tokens[:, None, :]
    dup = (same & torch.ones(n, n, dtype=torch.bool).tril(-1)).float()
    ind = torch.zeros_like(dup)
    ind[:, :, 1:] = dup[:, :, :-1]
    return {"prev_token": prev, "duplicate_token": dup, "induction": ind}


def _excluded(n: int, exclude_bos: bool, exclude_current_token: bool) -> Tensor | None:
    """``[n, n]`` float mask: 0 on the attention TransformerLens' ``detect_head`` leaves out
    (key 0 with ``exclude_bos``, the diagonal with ``exclude_current_token``), else 1."""
    if not (exclude_bos or exclude_current_token):
        return None
    keep = torch.ones(n, n)
    if exclude_bos:
        keep[:, 0] = 0
    if exclude_current_token:
        keep.fill_diagonal_(0)
    return keep


def _detect(patterns: Tensor, detection: Tensor, *, exclude_bos: bool = False,
            exclude_current_token: bool = False) -> Tensor:
    """TransformerLens ``error_measure="mul"``: attention mass on the pattern / total mass.

    patterns ``[b, ..., q, k]`` (e.g. one layer's ``[b, H, q, k]``), detection ``[b, q, k]``
    -> ``[...]``. The total mass is taken over the query rows where the pattern has an entry
    (TransformerLens divides by all rows, which caps e.g. a perfect induction head at 0.5
    on a twice-repeated sequence); the result is averaged over the batch, one sequence at a
    time as TransformerLens does for a list of prompts. For the repeated sequences of
    ``repeated_tokens`` this is the induction score of docs/math.md: the mean attention from
    the second copy's ``t`` to ``t - T + 1``. ``exclude_bos`` / ``exclude_current_token`` are
    TransformerLens' options: the attention to key 0 / to the query's own position is set to
    zero first, in the numerator and the denominator alike.
    """
    b, q, k = detection.shape
    middle = (1,) * (patterns.ndim - 3)
    keep = _excluded(q, exclude_bos, exclude_current_token)
    if keep is not None:
        patterns = patterns * keep
    rows = (detection.sum(-1) > 0).float().reshape(b, *middle, q)
    on_pattern = (patterns * detection.reshape(b, *middle, q, k)).sum((-2, -1))
    total = (patterns.sum(-1) * rows).sum(-1)
    return (on_pattern / total).mean(0)


def behaviour_scores(w: WeightSource, seed: int = 0, *, seq_len: int | None = None,
                     batch: int = 4, progress: Progress = None, cancelled: Cancelled = None,
                     exclude_bos: bool = False, exclude_current_token: bool = False,
                     ) -> dict[str, Tensor]:
    """``prev_token``, ``duplicate_token`` and ``induction`` scores ``[L, H]``.

    One forward pass on ``repeated_tokens(vocab, n_ctx, seed, seq_len, batch)`` (see there and
    ``_detect``): by default ``batch=4`` sequences of ``T = min(32, n_ctx // 2)`` distinct
    random tokens written twice (``2T = 64`` positions). Each layer's scores are computed
    from its pattern as soon as the layer's attention has run (``BehaviourSums``), so memory
    holds one layer's ``[batch, n_heads, 2T, 2T]`` pattern, never all of them, and the
    unembedding is skipped. ``progress`` and ``cancelled()`` are reported/checked after each
    layer. Non-finite heads get NaN. ``exclude_bos`` / ``exclude_current_token``: as
    TransformerLens' ``detect_head`` (see ``_detect``); the sequences have no BOS token, so
    "BOS" is position 0. (``engine.compute.behaviour`` runs the same reduction in one pass
    with the attention sinks and the random-head null.)
    """
    from headscope.engine.forward.transformer import blocks_together, embed

    _check(cancelled)
    tokens = repeated_tokens(w.cfg.d_vocab, w.cfg.n_ctx, seed, seq_len, batch)
    found = BehaviourSums(w, tokens, exclude_bos=exclude_bos, exclude_current_token=exclude_current_token)
    with torch.inference_mode():
        blocks_together(w, [embed(w, tokens)], on_block=lambda _i, layer, _x, pattern: found(layer, pattern),
                        after_layer=per_layer(w.cfg.n_layers, progress, cancelled))
    _release_free_heap()
    return found.result()


class BehaviourSums:
    """``behaviour_scores``' reduction of the patterns of one token batch (``tokens [b, 2T]``),
    layer by layer: ``found(layer, pattern)`` as each layer's attention has run, ``result()``
    at the end: NaN for the heads with non-finite weights. ``nonfinite [L, H]``: the heads
    to give NaN if the caller knows them (the weight sweep's flags, which add the heads whose
    float32 products overflow: their forward pass does too); else each layer's weights are
    checked as it goes (they were just read for the attention and are still cached)."""

    def __init__(self, w: WeightSource, tokens: Tensor, *, exclude_bos: bool = False,
                 exclude_current_token: bool = False, nonfinite: Any = None) -> None:
        from headscope.engine.forward.torch_weights import torch_weights

        cfg = w.cfg
        self.w, self.exclude = torch_weights(w), {"exclude_bos": exclude_bos, "exclude_current_token": exclude_current_token}
        self.detections = detection_patterns(tokens)
        self.out = {name: torch.full((cfg.n_layers, cfg.n_heads), math.nan) for name in self.detections}
        self.known = nonfinite is not None
        self.bad = (torch.as_tensor(np.asarray(nonfinite, dtype=bool)) if self.known
                    else torch.zeros(cfg.n_layers, cfg.n_heads, dtype=torch.bool))

    def __call__(self, layer: int, pattern: Tensor) -> None:
        if not self.known:
            self.bad[layer] = _layer_nonfinite(self.w, layer)
        pattern = pattern.float()
        for name, det in self.detections.items():
            self.out[name][layer] = _detect(pattern, det, **self.exclude)

    def result(self) -> dict[str, Tensor]:
        return {name: torch.where(self.bad, torch.full_like(score, math.nan), score)
                for name, score in self.out.items()}


def per_layer(n_layers: int, progress: Progress, cancelled: Cancelled) -> Callable[[int], None]:
    """An ``after_layer(layer)`` for a pass: reports ``(layer + 1) / n_layers`` and checks
    ``cancelled()`` before every layer but the first."""

    def after_layer(layer: int) -> None:
        _report(progress, (layer + 1) / n_layers)
        if layer + 1 < n_layers:
            _check(cancelled)

    return after_layer


# -- ablation --------------------------------------------------------------------------------

# Activation memory one batched ablation pass may use (bytes, roughly): the heads of a layer
# are ablated in chunks of this size. Measured on GPT-2-small shapes (default sequences):
# 6 heads per batch add ~0.1 GB to the peak and take ~15 % longer than all 12 (+0.35 GB).
_ABLATION_BATCH_BYTES = 128 << 20


def _second_copy_loss(logits: Tensor, tokens: Tensor) -> float:
    """Mean next-token cross-entropy of the second copy of a ``[batch, 2T]`` repeated sequence.

    ``logits [batch, T-1, d_vocab]`` at positions ``T .. 2T-2``, predicting tokens
    ``T+1 .. 2T-1``: the predictions the first copy determines. The first copy is random, so
    no head can lower its loss; including it would only add noise (and penalise heads that,
    like induction heads, guess from context).
    """
    half = tokens.shape[1] // 2
    logp = torch.log_softmax(logits.float(), dim=-1)
    return float(-logp.gather(-1, tokens[:, half + 1 :, None]).mean())


def _stream_loss(w: WeightSource, x: Tensor, tokens: Tensor) -> float:
    """``_second_copy_loss`` of the final residual stream ``x [batch, 2T, d_model]``.

    The unembedding is position-wise, so only the ``T-1`` positions the loss reads are
    unembedded (the ``d_vocab``-wide product is the most expensive step of a pass).
    """
    from headscope.engine.forward.transformer import unembed

    half = tokens.shape[1] // 2
    return _second_copy_loss(unembed(w, x[:, half:-1]), tokens)


def _heads_per_pass(w: WeightSource, tokens: Tensor) -> int:
    """How many single-head ablations of a layer to run as one batch (memory-bounded)."""
    cfg = w.cfg
    b, p = tokens.shape
    # float32 per-head outputs [b, H, p, d_model] (and their ablated copy) plus the MLP's
    # hidden activations: the largest tensors of one ablated copy of the batch.
    per_head = 4 * b * p * (cfg.n_heads * cfg.d_model + 3 * (cfg.d_mlp or 0))
    most = max(1, min(cfg.n_heads, _ABLATION_BATCH_BYTES // per_head))
    return math.ceil(cfg.n_heads / math.ceil(cfg.n_heads / most))  # equal chunks: 12 -> 6 + 6


def _check_ablation(w: WeightSource, ablation: str) -> None:
    if ablation not in ("zero", "mean"):
        raise ValueError(f"ablation must be 'zero' or 'mean', not {ablation!r}")


def ablation_effects(w: WeightSource, seed: int = 0, *, seq_len: int | None = None,
                     batch: int = 4, ablation: str = "zero", progress: Progress = None,
                     cancelled: Cancelled = None, memo: Memo | None = None) -> Tensor:
    """Loss increase ``[L, H]`` on ``repeated_tokens(..., seed)`` when each head is ablated.

    The loss is the mean next-token cross-entropy on the second copy (``_second_copy_loss``),
    by default over ``batch=4`` sequences of ``T = min(32, n_ctx // 2)`` random tokens written
    twice; the head's output is zeroed (``ablation="zero"``) or replaced by its mean over
    positions. The value for head ``(l, h)`` is by definition that of
    ``run(w, tokens, ablate=[(l, h)], ablation=ablation)`` minus the clean loss; it is
    computed without re-running what the ablation cannot change: one clean pass keeps the
    residual stream entering each layer, and for layer ``l`` its heads' ablations resume
    from there, batched (``forward.run_ablations``; ``_heads_per_pass`` heads at a time, 6
    on GPT-2-small). Only the scored positions are unembedded. On GPT-2-small shapes this is
    1.4× (quiet 2-core box) to 3–4× (loaded box) faster than one full pass per head
    (bench/README.md). ``progress`` and ``cancelled()``
    are reported/checked between layers. ``memo``: layers already done are taken from it
    (when all are, no forward pass runs), those computed are put in it.
    """
    import torch

    from headscope.engine.forward.torch_weights import torch_weights
    from headscope.engine.forward.transformer import blocks, embed, run_ablations

    w = torch_weights(w)  # the flags below read the weights as tensors
    _check_ablation(w, ablation)
    cfg = w.cfg
    n_layers, n_heads = cfg.n_layers, cfg.n_heads
    tokens = repeated_tokens(cfg.d_vocab, cfg.n_ctx, seed, seq_len, batch)
    chunk = _heads_per_pass(w, tokens)
    out = torch.empty(n_layers, n_heads)
    known = {layer: _known(memo, layer, (n_heads,)) for layer in range(n_layers)}
    if all(v is not None for v in known.values()):
        _report(progress, 1.0)
        return torch.stack([v for v in known.values() if v is not None])
    # Work per layer: the blocks after it plus the unembedding (about one block's worth).
    cost = [n_layers - layer + 1 for layer in range(n_layers)]
    done = 0
    _check(cancelled)
    with torch.inference_mode():
        entering: list[Tensor] = []  # the clean residual stream entering each block
        clean = blocks(w, embed(w, tokens), on_block=lambda _layer, x, _pattern: entering.append(x))
        base = _stream_loss(w, clean, tokens)
        for layer in range(n_layers):
            stored = known[layer]
            if stored is not None:
                out[layer] = stored
                done += cost[layer]
                _report(progress, done / sum(cost))
                continue
            _check(cancelled)
            for first in range(0, n_heads, chunk):
                heads = list(range(first, min(n_heads, first + chunk)))
                final = run_ablations(w, entering[layer], layer, heads, ablation)
                for i, head in enumerate(heads):
                    out[layer, head] = _stream_loss(w, final[i], tokens) - base
            if memo is not None:
                # NaN for non-finite heads, as in the whole table below
                memo.put(layer, torch.where(_layer_nonfinite(w, layer), math.nan, out[layer]))
            done += cost[layer]
            _report(progress, done / sum(cost))
    entering.clear()  # the streams are not needed any more: free them before the trim
    del clean
    bad = _nonfinite_mask(w)
    _release_free_heap()
    return torch.where(bad, torch.full_like(out, math.nan), out)


def ablation_effect(w: WeightSource, layer: int, head: int, seed: int = 0, *,
                    seq_len: int | None = None, batch: int = 4, ablation: str = "zero") -> float:
    """``ablation_effects(...)[layer, head]`` for one head: one clean pass, plus the blocks
    from ``layer`` on again with the head ablated."""
    import torch

    from headscope.engine.forward.transformer import blocks, embed, run_ablations

    cfg = w.cfg
    cfg.check_head(layer, head, getattr(w, "path", None))
    _check_ablation(w, ablation)
    tokens = repeated_tokens(cfg.d_vocab, cfg.n_ctx, seed, seq_len, batch)
    with torch.inference_mode():
        entering = blocks(w, embed(w, tokens), 0, layer)
        base = _stream_loss(w, blocks(w, entering, layer), tokens)
        final = run_ablations(w, entering, layer, [head], ablation)
        return _stream_loss(w, final[0], tokens) - base
