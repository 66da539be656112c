"""The spectral scores of a head (docs/math.md, "Scores"): the copying score and QK
positivity, ``Σ Re λ / Σ |λ|`` over the eigenvalues of its full OV and token QK circuits,
per head (``copying_score``, ``qk_positivity`` on a ``FactoredMatrix``) and as a model-wide
sweep in pieces (``layer_spectral_scores``, ``spectral_scores``; docs/internals.md, "Sweeps in
pieces"), with the non-finite and overflow flags of every head.

The full OV circuit ``(W_E W_V)(W_O W_U)`` has the non-zero eigenvalues of the ``d_head ×
d_head`` matrix ``W_O (W_U W_E) W_V``; the token QK circuit ``(W_E W_Q)(W_E W_K)ᵀ`` those of
``W_Kᵀ (W_Eᵀ W_E) W_Q``. The two ``d_model × d_model`` middles are formed once per model
(``spectral.kept_spectral_middles``); then each layer is one batched product and one batched
``eigvals`` on one LAPACK thread.

Heads with a NaN/inf weight get NaN scores and never reach LAPACK; heads whose weights are
finite but huge are rescaled by a power of two first (``numeric.tame``: the scores are
scale-free), and flagged when their float32 products would overflow (``overflow``).
"""

from __future__ import annotations

import contextlib
import math
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from headscope.engine.circuits.factored import FactoredMatrix
from headscope.engine.core.errors import NonFiniteError
from headscope.engine.core.memory import returned_when_freed
from headscope.engine.core.numeric import finite_matrices, is_finite, max_abs, tame
from headscope.engine.core.progress import Cancelled, Memo, Progress, check_cancelled, report
from headscope.engine.core.threads import core_pool, one_lapack_thread
from headscope.engine.model.nonfinite import HEAD_WEIGHTS, biases_nonfinite
from headscope.engine.model.weights import file_sorted, stored_kv

if TYPE_CHECKING:
    from headscope.engine.model.weights import CircuitWeights

__all__ = ["SPECTRAL_SCORES", "SpectralPass", "attention_weight", "copying_score", "file_order", "layer_flags",
           "layer_spectral_scores", "nonfinite_heads", "qk_positivity", "spectral_score",
           "spectral_scores"]

SPECTRAL_SCORES = ("copying_score", "qk_positivity")


# -- one head ------------------------------------------------------------------------------------


def spectral_score(eigenvalues: np.ndarray) -> np.ndarray:
    """``Σ Re λ / Σ |λ|`` over the last axis: +1 when every eigenvalue is positive real."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return eigenvalues.real.sum(-1) / np.abs(eigenvalues).sum(-1)


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


# -- flags ---------------------------------------------------------------------------------------


def _overflow(w: Any, peaks: dict[str, np.ndarray]) -> np.ndarray:
    """``[H]`` bool: ``d_head · max|W_Q| · max|W_K|`` or ``d_head · max|W_V| · max|W_O|``
    exceeds float32's maximum (docs/math.md, "Scores")."""
    limit = float(np.finfo(np.float32).max) / w.cfg.d_head
    p64 = {name: peak.astype(np.float64) for name, peak in peaks.items()}
    with np.errstate(invalid="ignore", over="ignore"):
        return (p64["W_Q"] * p64["W_K"] > limit) | (p64["W_V"] * p64["W_O"] > limit)


def attention_weight(w: Any, name: str) -> np.ndarray:
    """One of a layer's four attention weights as the passes read it: ``W_Q``, ``W_O`` whole,
    ``W_K``, ``W_V`` once per stored K/V head (``stored_kv``)."""
    return stored_kv(w, name) if name.endswith(("W_K", "W_V")) else w.get(name)


def _head_weights(w: Any, layer: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A layer's four attention weights, ``W_K`` and ``W_V`` with one head per stored K/V head
    (``stored_kv``: grouped-query attention repeats them per query head, and each stored head
    is needed once), their per-head peaks (``numeric.max_abs``) and those peaks per query head
    (``[H]``, for the flags)."""
    mats = {name: attention_weight(w, f"blocks.{layer}.attn.{name}") for name in HEAD_WEIGHTS}
    peaks = {name: max_abs(x) for name, x in mats.items()}
    per_head = {name: np.repeat(peak, w.cfg.n_heads // peak.shape[0]) if peak.shape[0] != w.cfg.n_heads
                else peak for name, peak in peaks.items()}
    return mats, peaks, per_head


def layer_flags(w: Any, layer: int) -> np.ndarray:
    """``[H]`` bool: ``nonfinite | overflow`` of ``layer_spectral_scores`` without the scores."""
    _, _, peaks = _head_weights(w, layer)
    bad = biases_nonfinite(w, layer)
    for peak in peaks.values():
        bad |= ~np.isfinite(peak)
    return bad | _overflow(w, peaks)


def nonfinite_heads(w: Any) -> list[tuple[int, int]]:
    """``(layer, head)`` of every head with NaN/inf attention weights or biases, or weights
    whose float32 products overflow (``layer_flags``)."""
    return [(layer, int(head)) for layer in range(w.cfg.n_layers)
            for head in np.flatnonzero(layer_flags(w, layer))]


# -- the sweep -------------------------------------------------------------------------------------


def _batched_spectral_score(small: np.ndarray) -> np.ndarray:
    """``spectral_score`` of each ``small [H, k, k]`` (float64 eigenvalues), NaN if non-finite."""
    finite = finite_matrices(small)
    safe = np.where(finite[:, None, None], small, 0).astype(np.float64)
    with one_lapack_thread():
        ev = np.linalg.eigvals(safe)
    score = spectral_score(ev).astype(np.float32)
    return np.where(finite, score, np.nan).astype(np.float32)


def layer_spectral_scores(w: Any, layer: int, middles: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One layer's piece of the sweep: ``{"copying_score", "qk_positivity": [H], "nonfinite",
    "overflow": [H] bool}`` for the kinds in ``middles`` (``W_U W_E``, ``W_Eᵀ W_E``).

    Each of the layer's four attention weights is read once for both scores; their per-head
    peaks give the non-finite flag, the overflow flag and the taming scale."""
    mats, stored_peaks, peaks = _head_weights(w, layer)
    bad = biases_nonfinite(w, layer)
    for peak in peaks.values():
        bad |= ~np.isfinite(peak)
    out: dict[str, np.ndarray] = {"nonfinite": bad}
    smalls: dict[str, np.ndarray] = {}
    for kind, middle in middles.items():
        # grouped-query: W_K and W_V hold each stored head once (``_head_weights``), and each
        # meets its group's query heads: a stored K head's rows meet the middle once (at 70B
        # widths 1/8 of that product and of its [H·d_head, d] result)
        if kind == "copying_score":  # W_O (W_U W_E) W_V
            lhs, rhs = tame(mats["W_O"], peaks["W_O"]), tame(mats["W_V"], stored_peaks["W_V"])
        else:  # W_Kᵀ (W_Eᵀ W_E) W_Q
            lhs = tame(mats["W_K"], stored_peaks["W_K"]).swapaxes(-2, -1)
            rhs = tame(mats["W_Q"], peaks["W_Q"])
        n, k, d = lhs.shape
        with np.errstate(all="ignore"):
            wide = (lhs.reshape(n * k, d) @ middle).reshape(n, k, d)  # W_O: a transposed view, as stored
            with one_lapack_thread():  # H small products: threads only contend here
                smalls[kind] = _per_query_head(wide, rhs)
            del wide
    # the kinds' eigenvalues side by side, each on one LAPACK thread (they ran one after the
    # other, the second core idle); the products above stay as they were: the same numbers
    scores = dict(zip(smalls, core_pool().map(_batched_spectral_score, smalls.values()), strict=True))
    for kind, score in scores.items():
        out[kind] = np.where(bad, np.float32(np.nan), score)
    out["overflow"] = _overflow(w, peaks)
    return out


def _per_query_head(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """``left @ right`` per query head, ``[H, k, e]``, where one side holds a head per stored
    K/V head: each stored head with its group's query heads (``ModelConfig.kv_head_of``)."""
    n, m = left.shape[0], right.shape[0]
    if n == m:
        return left @ right
    if n < m:  # [n, 1, k, d] @ [n, group, d, e]: each K head with its group's queries
        grouped = right.reshape(n, m // n, *right.shape[1:])
        return (left[:, None] @ grouped).reshape(m, left.shape[1], right.shape[-1])
    grouped = left.reshape(m, n // m, *left.shape[1:])  # [m, group, k, d] @ [m, 1, d, e]: W_O's heads with their V head
    return (grouped @ right[:, None]).reshape(n, left.shape[1], right.shape[-1])


class SpectralPass:
    """``spectral_scores`` one layer at a time: ``layer(l)`` fills layer ``l``'s scores and
    flags (read back from ``memos`` where both are stored, else computed by
    ``layer_spectral_scores`` and put in them), ``result()`` gives the ``[L, H]`` tables.

    ``spectral_scores`` drives it over the layers in file order; a forward pass over the
    layers can drive it instead (``sweeps.scores``: ``layer(l)`` as the pass reaches layer
    ``l``), so each layer's attention weights are read and processed once for both: the
    forward pass finds them in the weight cache (docs/internals.md, "The read plan").
    ``flags`` (``nonfinite | overflow``, ``[L, H]``) is filled in row by row as the layers go.
    """

    def __init__(self, w: Any, *, memos: dict[str, Memo] | None = None,
                 known_flags: np.ndarray | None = None) -> None:
        cfg = w.cfg
        self.w, self.memos, self.known_flags = w, memos or {}, known_flags
        self.out = {name: np.empty((cfg.n_layers, cfg.n_heads), np.float32) for name in SPECTRAL_SCORES}
        self.out["nonfinite"] = np.zeros((cfg.n_layers, cfg.n_heads), bool)
        self.out["overflow"] = np.zeros((cfg.n_layers, cfg.n_heads), bool)
        self.flags = np.zeros((cfg.n_layers, cfg.n_heads), bool)
        self._middles: dict[str, np.ndarray] | None = None
        self._peeked: dict[int, dict[str, np.ndarray] | None] = {}  # each part loaded (and counted) once
        self._done: set[int] = set()

    def stored(self, layer: int) -> bool:
        """Whether both of ``layer``'s scores are in the memos (loaded once, kept for ``layer``)."""
        if layer not in self._peeked:
            n_heads = (self.w.cfg.n_heads,)
            known = {name: memo.get(layer, n_heads) for name, memo in self.memos.items()}
            complete = (self.memos and set(known) == set(SPECTRAL_SCORES)
                        and all(v is not None for v in known.values()))
            self._peeked[layer] = known if complete else None  # type: ignore[assignment]
        return self._peeked[layer] is not None

    def prepare(self) -> None:
        """Form the ``d_model × d_model`` middles now if a layer will need them (a caller can
        do it before its pass starts, while torch imports)."""
        todo = (layer for layer in range(self.w.cfg.n_layers) if layer not in self._done)
        if self._middles is None and not all(self.stored(layer) for layer in todo):
            self._middles = kept_spectral_middles(self.w)

    def layer(self, layer: int) -> None:
        """Layer ``layer``'s scores and flags: read back, or computed and put in the memos."""
        known = self._peeked.pop(layer) if self.stored(layer) else None
        if known is not None:
            for name, value in known.items():
                self.out[name][layer] = value
            self.out["nonfinite"][layer] = (self.known_flags[layer] if self.known_flags is not None
                                            else layer_flags(self.w, layer))
        else:
            self._peeked.pop(layer, None)
            if self._middles is None:
                self._middles = kept_spectral_middles(self.w)
            for name, value in layer_spectral_scores(self.w, layer, self._middles).items():
                self.out[name][layer] = value
            for name, memo in self.memos.items():
                memo.put(layer, self.out[name][layer])
        self.flags[layer] = self.out["nonfinite"][layer] | self.out["overflow"][layer]
        self._done.add(layer)

    def result(self) -> dict[str, np.ndarray]:
        """The ``[L, H]`` tables; a layer the driver did not visit is visited now."""
        for layer in range(self.w.cfg.n_layers):
            if layer not in self._done:
                self.layer(layer)
        return self.out


def spectral_scores(w: Any, progress: Progress = None, cancelled: Cancelled = None, *,
                    memos: dict[str, Memo] | None = None, known_flags: np.ndarray | None = None
                    ) -> dict[str, np.ndarray]:
    """Copying score, QK positivity, the non-finite and overflow flags, ``[L, H]`` each.

    ``memos`` (``{"copying_score": memo, "qk_positivity": memo}``, one part per layer): a
    layer both hold is read back, not computed (the ``d_model × d_model`` middles are formed
    only if one is missing); each layer computed is put in both. A read-back layer's flags
    come from ``known_flags`` (the stored ``nonfinite`` part, ``nonfinite | overflow``) when
    given, else from one pass over its weights (``layer_flags``). The next layer's weights
    are read on a thread while this one's eigenvalues run (``_read_ahead``).

    Layers are visited in the order their weights lie in the checkpoint's files (``file_order``;
    the scores of one layer do not depend on another's), and no two reads overlap in time: each
    byte of the attention weights is read once, in file order (docs/internals.md, "The read
    plan")."""
    cfg = w.cfg
    check_cancelled(cancelled)
    sweep = SpectralPass(w, memos=memos, known_flags=known_flags)
    reading: threading.Thread | None = None
    order = file_order(w, cfg.n_layers)
    for done, layer in enumerate(order, 1):
        if not sweep.stored(layer):
            check_cancelled(cancelled)
            if reading is not None:
                reading.join()
            else:  # not read ahead: read now, before the next layer's read starts
                sweep.prepare()
                _read_layer(w, layer)
            # the next layer's weights are read (one core: preadv, widening, processing) while
            # this one's eigenvalues run on one LAPACK thread: the reads fill the idle core
            nxt = order[done] if done < cfg.n_layers else None
            ahead = nxt is not None and not sweep.stored(nxt) and _reads_ahead(w)
            reading = _read_ahead(w, nxt) if ahead else None  # type: ignore[arg-type]
        sweep.layer(layer)
        report(progress, done / cfg.n_layers)
    if reading is not None:
        reading.join()
    w.release()  # the last layers' weights: a 7B model's are 0.5 GB that a forward pass needs more
    return sweep.result()


def file_order(w: Any, n_layers: int) -> list[int]:
    """The layers in the order their attention weights lie in the checkpoint's files (a
    single-file checkpoint sorts its tensors by name: layer 10 before layer 2); numeric order
    for weights held in memory."""
    firsts = file_sorted(w, [f"blocks.{layer}.attn.W_Q" for layer in range(n_layers)])
    return [int(name.split(".")[1]) for name in firsts]


# The next layer's attention weights are read while this one's eigenvalues run unless one
# layer's (float32, K/V repeated per query head, as ``get`` gives them) is larger than this:
# two layers side by side are then ~2× it, at 70B widths 2 × 1.07 GB next to the middles'
# 0.5 GB, over the 3 GB goal; 7B's and 13B's (0.27, 0.42 GB) are read ahead as before.
READ_AHEAD_BYTES = 512 << 20


def _reads_ahead(w: Any) -> bool:
    """Whether ``spectral_scores`` reads the next layer during this one (``READ_AHEAD_BYTES``)."""
    cfg = w.cfg
    return 4 * 4 * cfg.n_heads * cfg.d_model * cfg.d_head <= READ_AHEAD_BYTES


def _read_layer(w: Any, layer: int) -> None:
    """Read ``layer``'s four attention weights into ``w``'s cache, in file order (``W_K``,
    ``W_V``: their stored heads, ``attention_weight``)."""
    for name in file_sorted(w, [f"blocks.{layer}.attn.{name}" for name in HEAD_WEIGHTS]):
        attention_weight(w, name)


def _read_ahead(w: Any, layer: int) -> threading.Thread:
    """``_read_layer`` on a daemon thread (no BLAS: the OpenBLAS thread count
    ``one_lapack_thread`` sets is process-wide). A failure is left for the sweep's own read of
    the same tensor to raise."""

    def read() -> None:
        with contextlib.suppress(Exception):
            _read_layer(w, layer)

    thread = threading.Thread(target=read, name="headscope-read-ahead", daemon=True)
    thread.start()
    return thread


# -- the middles, formed once per model ---------------------------------------------------------


def _center_rows(x: np.ndarray) -> np.ndarray:
    """``C x`` for the centring projector ``C = I - 11ᵀ/n`` (each column loses its mean)."""
    return x - x.mean(0, keepdims=True)


def _center_cols(x: np.ndarray) -> np.ndarray:
    """``x C``: each row loses its mean."""
    return x - x.mean(1, keepdims=True)


def kept_spectral_middles(w: CircuitWeights) -> dict[str, np.ndarray]:
    """``spectral_middles(w)``, formed once per model and kept (``2 · d_model²`` floats): the
    weight sweep and the random-head null (``sweeps.scores.score_null``) share them."""
    with w.middles_lock:  # formed once even when two workers ask (2 TFLOP at 7B)
        if w.middles is None:
            with returned_when_freed():  # vocabulary-sized temporaries: not kept in the heap
                w.middles = spectral_middles(w)
        return w.middles


# Untied embeddings whose float32 ``W_E`` is larger than this are multiplied in vocabulary
# blocks of ``VOCAB_BLOCK_BYTES``: at 70B widths ``W_E`` and ``W_U`` are 1.05 GB each, and both
# whole next to the reader's staging buffer exceed the 3 GB goal; at 7B and 13B (0.5, 0.65 GB)
# the two whole matrices fit and the single products stand.
VOCAB_WHOLE_BYTES = 768 << 20
VOCAB_BLOCK_BYTES = 256 << 20


def _untied_middles(w: CircuitWeights) -> dict[str, np.ndarray]:
    """``W_U W_E = Σ_b W_U[:, b] W_E[b, :]`` and ``W_Eᵀ W_E = Σ_b W_E[b, :]ᵀ W_E[b, :]`` over
    blocks ``b`` of the vocabulary (``embed_rows``, ``unembed_cols``: only those rows and columns
    processed) when ``W_E`` is larger than ``VOCAB_WHOLE_BYTES``; else the two products of the
    whole matrices. Equal to float32 rounding (the sums split at the block edges)."""
    v, d = w.cfg.d_vocab, w.cfg.d_model
    with np.errstate(all="ignore"):
        if 4 * v * d <= VOCAB_WHOLE_BYTES:
            w_e = w.get("embed.W_E")
            return {"copying_score": w.get("unembed.W_U") @ w_e, "qk_positivity": w_e.T @ w_e}
        copying, qk = np.zeros((d, d), np.float32), np.zeros((d, d), np.float32)
        step = max(1, VOCAB_BLOCK_BYTES // (4 * d))
        for start in range(0, v, step):
            ids = np.arange(start, min(v, start + step))
            e = w.embed_rows(ids)
            copying += w.unembed_cols(ids) @ e
            qk += e.T @ e
        return {"copying_score": copying, "qk_positivity": qk}


def spectral_middles(w: CircuitWeights) -> dict[str, np.ndarray]:
    """``W_U W_E`` and ``W_Eᵀ W_E``, the middles of ``spectral.layer_spectral_scores``, of the
    processed weights.

    With a tied unembedding (``W_U`` the transpose of the stored embedding ``E``, up to a
    scale), both come from one Gram matrix ``G = EᵀE`` (a symmetric product, half a GEMM's
    work) instead of a vocabulary-sized GEMM and a Gram: processing only centres (``C``,
    rank-one corrections) and scales by the final norm's gain, so ``W_U W_E = ab P diag(g)
    (G − V μμᵀ) Q`` and ``W_Eᵀ W_E = b² Q G Q`` (``μ`` the mean row of ``E``; ``P``, ``Q``,
    ``V μμᵀ`` only where centre-reading, centre-writing, centre-unembed apply).
    """
    tied = w.tied_embedding()
    if tied is None:
        return _untied_middles(w)
    e, a, b = tied
    p = w.plan
    with np.errstate(all="ignore"):
        gram = e.T @ e  # [d_model, d_model]
        qk = gram
        cv = gram
        if p is not None and p.center_unembed:
            mu = e.mean(0, dtype=np.float64)
            cv = (gram - (e.shape[0] * np.outer(mu, mu))).astype(np.float32)
        if p is not None and p.center_writing:  # W_E = b E C
            qk, cv = _center_cols(_center_rows(qk)), _center_cols(cv)
        gain, _ = w.fold_gains("ln_final")
        if gain is not None:
            cv = gain[:, None] * cv
        if p is not None and p.center_reading:
            cv = _center_rows(cv)
        return {"copying_score": np.float32(a * b) * cv, "qk_positivity": np.float32(b * b) * qk}
