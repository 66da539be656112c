"""Weight-only scores without torch: numpy's BLAS/LAPACK (docs/internals.md, "Weight-only
commands").

The copying score, QK positivity and the Q/K/V composition scores only need products of
the attention weights and embeddings, ``d_head``-sized eigenvalues and Gram matrices. Here
they are computed from the model's weights object itself (``ProcessedWeights`` or
``CheckpointWeights``, numpy float32 arrays: ``engine.model.weights.CircuitWeights``), so
``headscope heads --no-behaviour``, ``composition`` and the like never wait for ``import
torch`` (1-3 s, more than the algebra on GPT-2-small shapes).

``numpy_weights(model)`` returns that object, for every model (GGUF, float8 and OPT-350m's
product embeddings included).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from headscope.engine.core.errors import CancelledError, InvalidRequestError
from headscope.engine.model.weights import CircuitWeights

if TYPE_CHECKING:
    from headscope.engine.circuits.scores import Memo
    from headscope.engine.model.loading import Model

Progress = Callable[[float], None] | None
Cancelled = Callable[[], bool] | None

__all__ = ["NumpyWeights", "circuit_block", "composition_baseline", "composition_scores",
           "numpy_weights", "rotary_matrix", "spectral_scores"]

# The numpy weights the algebra below reads: one weights object per model now
# (engine.model.weights.CircuitWeights), processed or raw.
NumpyWeights = CircuitWeights

_HEAD_WEIGHTS = ("W_Q", "W_K", "W_V", "W_O")
_HEAD_BIASES = ("b_Q", "b_K", "b_V")
_TAME_ABOVE = 2.0**20  # as engine.factored.tame


def _center_rows(x: np.ndarray) -> np.ndarray:
    """``C x`` for the centring projector ``C = I - 11ᵀ/n`` (each column loses its mean)."""
    return x - x.mean(0, keepdims=True)


def _center_cols(x: np.ndarray) -> np.ndarray:
    """``x C``: each row loses its mean."""
    return x - x.mean(1, keepdims=True)


def kept_spectral_middles(w: NumpyWeights) -> dict[str, np.ndarray]:
    """``spectral_middles(w)``, formed once per model and kept (``2 · d_model²`` floats): the
    weight sweep and the random-head null (``compute.score_null``) share them."""
    with w._middles_lock:  # formed once even when two workers ask (2 TFLOP at 7B)
        if w.middles is None:
            w.middles = spectral_middles(w)
        return w.middles


def spectral_middles(w: NumpyWeights) -> dict[str, np.ndarray]:
    """``W_U W_E`` and ``W_Eᵀ W_E`` (``engine.scores.spectral_middles``) of the processed weights.

    With a tied unembedding (``W_U`` the transpose of the stored embedding ``E``, up to a
    scale), both come from one Gram matrix ``G = EᵀE`` (a symmetric product, half a GEMM's
    work) instead of a vocabulary-sized GEMM and a Gram: processing only centres (``C``,
    rank-one corrections) and scales by the final norm's gain, so ``W_U W_E = ab P diag(g)
    (G − V μμᵀ) Q`` and ``W_Eᵀ W_E = b² Q G Q`` (``μ`` the mean row of ``E``; ``P``, ``Q``,
    ``V μμᵀ`` only where centre-reading, centre-writing, centre-unembed apply).
    """
    tied = w.tied_embedding()
    if tied is None:
        w_e = w.get("embed.W_E")
        with np.errstate(all="ignore"):
            return {"copying_score": w.get("unembed.W_U") @ w_e, "qk_positivity": w_e.T @ w_e}
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
        gain, _ = w._gain("ln_final")
        if gain is not None:
            cv = gain[:, None] * cv
        if p is not None and p.center_reading:
            cv = _center_rows(cv)
        return {"copying_score": np.float32(a * b) * cv, "qk_positivity": np.float32(b * b) * qk}


def numpy_weights(model: Model) -> NumpyWeights:
    """``model``'s weights as the circuits read them: numpy arrays, every model (the weights
    object itself, processed or raw, with the surface of ``engine.model.weights.CircuitWeights``)."""
    return model.weights  # type: ignore[return-value]


# -- threads -----------------------------------------------------------------------------------


@functools.cache
def _openblas_threads() -> tuple[Callable[[int], None], Callable[[], int]] | None:
    """numpy's OpenBLAS thread setters (None if numpy uses another BLAS)."""
    try:
        with open("/proc/self/maps") as maps:
            libs = sorted({line.split()[-1] for line in maps if "openblas" in line and ".so" in line})
    except OSError:
        return None
    for path in libs:
        lib = ctypes.CDLL(path)
        for suffix in ("64_", ""):
            for prefix in ("scipy_openblas_", "openblas_"):
                setter = getattr(lib, f"{prefix}set_num_threads{suffix}", None)
                getter = getattr(lib, f"{prefix}get_num_threads{suffix}", None)
                if setter is not None and getter is not None:
                    return setter, getter
    return None


_LOCK = threading.Lock()
_USERS = 0
_SAVED = 1


@contextlib.contextmanager
def one_lapack_thread() -> Iterator[None]:
    """numpy's LAPACK on one thread for ``d_head``-sized ``eigvals``/``cholesky``: threaded
    ``geev`` on 128 × 128 matrices is 5-10× slower on a busy 2-core box (as
    ``engine.scores.one_lapack_thread`` says for torch's MKL)."""
    global _USERS, _SAVED
    calls = _openblas_threads()
    if calls is None:
        yield
        return
    setter, getter = calls
    with _LOCK:
        if _USERS == 0:
            _SAVED = int(getter())
            setter(1)
        _USERS += 1
    try:
        yield
    finally:
        with _LOCK:
            _USERS -= 1
            if _USERS == 0:
                setter(_SAVED)


# -- shared helpers ---------------------------------------------------------------------------


def _check(cancelled: Cancelled) -> None:
    if cancelled is not None and cancelled():
        raise CancelledError("sweep cancelled")


def _report(progress: Progress, fraction: float) -> None:
    if progress is not None:
        progress(min(1.0, max(0.0, fraction)))


def _peak(x: np.ndarray) -> np.ndarray:
    """``[H]``: largest ``|entry|`` of each head's matrix; NaN/inf where the head has one."""
    flat = x.reshape(x.shape[0], -1)
    with np.errstate(invalid="ignore"):
        return np.maximum(flat.max(1), -flat.min(1))


def _tame(x: np.ndarray, peak: np.ndarray) -> np.ndarray:
    """``engine.factored.tame``: heads whose peak exceeds 2**20 divided by a power of two."""
    with np.errstate(invalid="ignore"):
        big = np.isfinite(peak) & (peak > _TAME_ABOVE)
    if not big.any():
        return x
    scale = np.ones_like(peak)
    scale[big] = np.exp2(-np.ceil(np.log2(peak[big])))
    return x * scale[:, None, None]


def _finite(x: np.ndarray) -> np.ndarray:
    """``[...]`` bool: which matrices of ``x [..., m, n]`` are entirely finite (one sum)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.isfinite(x.sum((-2, -1)))


def _biases_nonfinite(w: NumpyWeights, layer: int) -> np.ndarray:
    bad = np.zeros(w.cfg.n_heads, bool)
    for name in _HEAD_BIASES:
        if w.has(f"blocks.{layer}.attn.{name}"):
            with np.errstate(invalid="ignore", over="ignore"):
                bad |= ~np.isfinite(w.get(f"blocks.{layer}.attn.{name}").sum(-1))
    return bad


def layer_nonfinite(w: NumpyWeights, layer: int) -> np.ndarray:
    """``[H]`` bool: heads of ``layer`` with a NaN/inf in a weight or bias."""
    bad = _biases_nonfinite(w, layer)
    for name in _HEAD_WEIGHTS:
        bad |= ~np.isfinite(_peak(w.get(f"blocks.{layer}.attn.{name}")))
    return bad


# -- spectral scores ---------------------------------------------------------------------------


def _batched_spectral_score(small: np.ndarray) -> np.ndarray:
    """``Σ Re λ / Σ |λ|`` of each ``small [H, k, k]`` (float64 eigenvalues), NaN if non-finite."""
    finite = _finite(small)
    safe = np.where(finite[:, None, None], small, 0).astype(np.float64)
    with one_lapack_thread():
        ev = np.linalg.eigvals(safe)
    with np.errstate(invalid="ignore", divide="ignore"):
        score = (ev.real.sum(-1) / np.abs(ev).sum(-1)).astype(np.float32)
    return np.where(finite, score, np.nan).astype(np.float32)


def layer_spectral_scores(w: NumpyWeights, layer: int, middles: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``engine.scores.layer_spectral_scores`` in numpy: one layer's piece of the sweep."""
    mats = {name: w.get(f"blocks.{layer}.attn.{name}") for name in _HEAD_WEIGHTS}
    peaks = {name: _peak(x) for name, x in mats.items()}
    bad = _biases_nonfinite(w, layer)
    for peak in peaks.values():
        bad |= ~np.isfinite(peak)
    out: dict[str, np.ndarray] = {"nonfinite": bad}
    for kind, middle in middles.items():
        if kind == "copying_score":  # W_O (W_U W_E) W_V
            lhs, rhs = _tame(mats["W_O"], peaks["W_O"]), _tame(mats["W_V"], peaks["W_V"])
        else:  # W_Kᵀ (W_Eᵀ W_E) W_Q
            lhs, rhs = _tame(mats["W_K"], peaks["W_K"]).swapaxes(-2, -1), _tame(mats["W_Q"], peaks["W_Q"])
        n, k, d = lhs.shape
        with np.errstate(all="ignore"):
            wide = (np.ascontiguousarray(lhs).reshape(n * k, d) @ middle).reshape(n, k, d)
            with one_lapack_thread():  # H small products: threads only contend here
                small = wide @ rhs
        out[kind] = np.where(bad, np.float32(np.nan), _batched_spectral_score(small))
    limit = float(np.finfo(np.float32).max) / w.cfg.d_head
    p64 = {name: peak.astype(np.float64) for name, peak in peaks.items()}
    with np.errstate(invalid="ignore", over="ignore"):
        out["overflow"] = (p64["W_Q"] * p64["W_K"] > limit) | (p64["W_V"] * p64["W_O"] > limit)
    return out


def layer_flags(w: NumpyWeights, layer: int) -> np.ndarray:
    """``[H]`` bool: ``nonfinite | overflow`` of ``layer_spectral_scores`` without the scores
    (the heads ``engine.scores.nonfinite_heads`` lists)."""
    peaks = {name: _peak(w.get(f"blocks.{layer}.attn.{name}")).astype(np.float64) for name in _HEAD_WEIGHTS}
    bad = _biases_nonfinite(w, layer)
    for peak in peaks.values():
        bad |= ~np.isfinite(peak)
    limit = float(np.finfo(np.float32).max) / w.cfg.d_head
    with np.errstate(invalid="ignore", over="ignore"):
        return bad | (peaks["W_Q"] * peaks["W_K"] > limit) | (peaks["W_V"] * peaks["W_O"] > limit)


def spectral_scores(w: NumpyWeights, progress: Progress = None, cancelled: Cancelled = None, *,
                    memos: dict[str, Memo] | None = None, known_flags: np.ndarray | None = None
                    ) -> dict[str, np.ndarray]:
    """``engine.scores.spectral_scores`` in numpy: copying score, QK positivity, the
    non-finite and overflow flags, ``[L, H]`` each.

    ``memos`` (``{"copying_score": memo, "qk_positivity": memo}``, the parts
    ``engine.scores.all_copying_scores`` / ``all_qk_positivity`` store): a layer both hold is
    read back, not computed (the ``d_model × d_model`` middles are formed only if one is
    missing); each layer computed is put in both. A read-back layer's flags come from
    ``known_flags`` (the stored ``nonfinite`` part, ``nonfinite | overflow``) when given,
    else from one pass over its weights (``layer_flags``)."""
    cfg = w.cfg
    _check(cancelled)
    memos = memos or {}
    middles: dict[str, np.ndarray] | None = None
    out = {name: np.empty((cfg.n_layers, cfg.n_heads), np.float32) for name in _SPECTRAL}
    out["nonfinite"] = np.zeros((cfg.n_layers, cfg.n_heads), bool)
    out["overflow"] = np.zeros((cfg.n_layers, cfg.n_heads), bool)
    def stored(layer: int) -> dict[str, np.ndarray] | None:
        known = {name: memo.get(layer, (cfg.n_heads,)) for name, memo in memos.items()}
        if memos and all(v is not None for v in known.values()) and set(known) == set(_SPECTRAL):
            return known  # type: ignore[return-value]
        return None

    reading: threading.Thread | None = None
    peeked: dict[int, dict[str, np.ndarray] | None] = {}  # each part loaded (and counted) once
    for layer in range(cfg.n_layers):
        known = peeked.pop(layer) if layer in peeked else stored(layer)
        if known is not None:
            for name, value in known.items():
                out[name][layer] = value
            out["nonfinite"][layer] = known_flags[layer] if known_flags is not None else layer_flags(w, layer)
            _report(progress, (layer + 1) / cfg.n_layers)
            continue
        _check(cancelled)
        if middles is None:
            middles = kept_spectral_middles(w)
        if reading is not None:
            reading.join()
        # the next layer's weights are read (one core: preadv, widening, processing) while
        # this one's eigenvalues run on one LAPACK thread: the reads fill the idle core
        nxt = layer + 1
        if nxt < cfg.n_layers:
            peeked[nxt] = stored(nxt)
        reading = _read_ahead(w, nxt) if nxt < cfg.n_layers and peeked[nxt] is None else None
        for name, value in layer_spectral_scores(w, layer, middles).items():
            out[name][layer] = value
        for name, memo in memos.items():
            memo.put(layer, out[name][layer])
        _report(progress, (layer + 1) / cfg.n_layers)
    if reading is not None:
        reading.join()
    w.release()  # the last layers' weights: a 7B model's are 0.5 GB that a forward pass needs more
    return out


def _read_ahead(w: NumpyWeights, layer: int) -> threading.Thread:
    """Read ``layer``'s four attention weights into ``w``'s cache on a daemon thread (no BLAS:
    the OpenBLAS thread count ``one_lapack_thread`` sets is process-wide). A failure is left
    for the sweep's own read of the same tensor to raise."""

    def read() -> None:
        with contextlib.suppress(Exception):
            for name in _HEAD_WEIGHTS:
                w.get(f"blocks.{layer}.attn.{name}")

    thread = threading.Thread(target=read, name="headscope-read-ahead", daemon=True)
    thread.start()
    return thread


_SPECTRAL = ("copying_score", "qk_positivity")


# -- circuit blocks ----------------------------------------------------------------------------


# The RoPE scalings rotary_inv_freq computes in numpy. YaRN and LongRoPE (also a cos/sin
# factor, engine.forward.rotary_scale) stay on the torch path: compute.circuit_block steps
# aside for them (rotary_in_numpy).
ROPE_TYPES = ("default", "linear", "llama3")


def rotary_in_numpy(cfg: Any, layer: int) -> bool:
    """Whether ``circuit_block`` computes ``layer``'s rotary circuits here: no rotary, or a
    RoPE scaling of ``ROPE_TYPES``."""
    from headscope.engine.forward.transformer import layer_config

    layer_cfg = layer_config(cfg, layer)
    return layer_cfg.positional != "rotary" or (layer_cfg.extra.get("rope_type") or "default") in ROPE_TYPES


def rotary_inv_freq(cfg: Any, path: str | None = None) -> np.ndarray:
    """Rotation frequencies (float32 ``[r/2]``) for the scalings of ``ROPE_TYPES``: the one
    computation of them, which ``engine.forward.rotary_inv_freq`` also returns (as a tensor)."""
    from headscope.engine.core.errors import ConfigError

    r = cfg.rotary_dim or cfg.d_head
    inv_freq = (1.0 / (cfg.rotary_base ** (np.arange(0, r, 2, dtype=np.float32) / np.float32(r)))
                ).astype(np.float32)
    style = cfg.extra.get("rotary_style", "half")
    if style != "half":
        raise ConfigError(path, f"rotary style {style!r} is not supported (only NeoX/Llama 'half')")
    kind = cfg.extra.get("rope_type") or "default"
    if kind == "default":
        return inv_freq
    params = cfg.extra.get("rope_scaling") or {}
    try:
        if kind == "linear":
            return (inv_freq / np.float32(params["factor"])).astype(np.float32)
        if kind == "llama3":
            factor, low = float(params["factor"]), float(params["low_freq_factor"])
            high, old_ctx = float(params["high_freq_factor"]), float(params["original_max_position_embeddings"])
            wavelen = np.float32(2 * np.pi) / inv_freq
            scaled = np.where(wavelen > old_ctx / low, inv_freq / np.float32(factor), inv_freq)
            smooth = (np.float32(old_ctx) / wavelen - np.float32(low)) / np.float32(high - low)
            smoothed = (1 - smooth) * scaled / np.float32(factor) + smooth * scaled
            medium = ~(wavelen < old_ctx / high) & ~(wavelen > old_ctx / low)
            return np.where(medium, smoothed, scaled).astype(np.float32)
    except KeyError as missing:
        raise ConfigError(path, f"RoPE scaling {kind!r} needs parameter {missing}") from None
    raise ConfigError(path, f"RoPE scaling {kind!r} is not supported here ({', '.join(ROPE_TYPES)})")


def rotary_matrix(cfg: Any, offset: int, path: str | None = None) -> np.ndarray:
    """``engine.circuits.rotary_matrix`` in numpy: ``R(Δ) [d_head, d_head]``, the rotation
    ``rope(x, Δ) = x @ R(Δ)`` (``rotate_half`` pairs ``(i, i + r/2)``; the rest pass through)."""
    if cfg.positional != "rotary":
        raise InvalidRequestError(
            path, f"rotary circuits need rotary positions; this model's are {cfg.positional!r}")
    angles = float(offset) * rotary_inv_freq(cfg, path).astype(np.float64)  # [r/2]
    cos = np.concatenate([np.cos(angles)] * 2).astype(np.float32)
    sin = np.concatenate([np.sin(angles)] * 2).astype(np.float32)
    eye = np.eye(cfg.d_head, dtype=np.float32)
    r = 2 * angles.shape[-1]
    x_rot = eye[:, :r]
    rotated = np.concatenate([-x_rot[:, r // 2:], x_rot[:, : r // 2]], axis=-1)
    return np.concatenate([x_rot * cos + rotated * sin, eye[:, r:]], axis=-1)


def circuit_block(w: NumpyWeights, layer: int, head: int, kind: str, basis: str,
                  rows: Any, cols: Any, offset: int = 0) -> np.ndarray:
    """``engine.circuits.circuit_block`` in numpy: the ``rows × cols`` block of a head's token
    QK (rotary: at offset Δ), full OV or positional QK circuit, the same products in the
    same order (only the requested rows and columns are multiplied out)."""
    from headscope.engine.forward.transformer import layer_config

    cfg = w.cfg
    cfg.check_head(layer, head, w.path)
    rows, cols = np.asarray(rows, dtype=np.intp), np.asarray(cols, dtype=np.intp)

    def attn(name: str) -> np.ndarray:
        return w.get(f"blocks.{layer}.attn.{name}")[head]

    with np.errstate(all="ignore"):
        if basis == "position":
            if cfg.positional != "learned":
                raise InvalidRequestError(
                    w.path, f"positional QK needs learned position embeddings; this model's are "
                    f"{cfg.positional!r} (rotary models: use rotary_qk at an offset)")
            w_pos = w.get("pos_embed.W_pos")
            return (w_pos[rows] @ attn("W_Q")) @ (w_pos[cols] @ attn("W_K")).T
        if kind == "ov":
            out = w.unembed_cols(cols)
            return (w.embed_rows(rows) @ attn("W_V")) @ (attn("W_O") @ out)
        w_q = attn("W_Q")
        if cfg.positional == "rotary":
            w_q = w_q @ rotary_matrix(layer_config(cfg, layer), offset, w.path)
        return (w.embed_rows(rows) @ w_q) @ (w.embed_rows(cols) @ attn("W_K")).T


# -- composition ---------------------------------------------------------------------------------


def _r_factor(x: np.ndarray) -> np.ndarray:
    """``engine.scores._r_factor``: ``R`` with ``RᵀR = xᵀx`` from a float64 Cholesky factor
    (``diag(√λ) Vᵀ`` of ``eigh`` where it fails: rank-deficient Grams)."""
    with one_lapack_thread():  # small batched products too: threads only contend here
        x64 = x.astype(np.float64)
        gram = x64.swapaxes(-2, -1) @ x64
        gram = np.where(_finite(gram)[:, None, None], gram, 0)
        root = np.empty_like(gram)
        for i, g in enumerate(gram):
            try:
                root[i] = np.linalg.cholesky(g).T
            except np.linalg.LinAlgError:
                vals, vecs = np.linalg.eigh(g)
                root[i] = np.sqrt(np.clip(vals, 0, None))[:, None] * vecs.T
    return root.astype(x.dtype)


def _zero_bad(x: np.ndarray, bad: np.ndarray) -> np.ndarray:
    if not bad.any():
        return x
    x = x.copy()
    x[bad] = 0
    return x


def _tamed(x: np.ndarray) -> np.ndarray:
    return _tame(x, _peak(x))


@dataclass(frozen=True)
class Tile:
    """``engine.scores.CompositionTile`` as numpy: one layer pair's ``scores [H, H]``."""

    kind: str
    source: int
    target: int
    scores: np.ndarray


class _Factors:
    def __init__(self, w: NumpyWeights, kind: str) -> None:
        self.w, self.kind = w, kind
        self._bad: dict[int, np.ndarray] = {}

    def bad(self, layer: int) -> np.ndarray:
        if layer not in self._bad:
            self._bad[layer] = layer_nonfinite(self.w, layer)
        return self._bad[layer]

    def _attn(self, layer: int, name: str) -> np.ndarray:
        return self.w.get(f"blocks.{layer}.attn.{name}")

    def source(self, layer: int) -> np.ndarray:
        bad = self.bad(layer)
        w_v = _zero_bad(_tamed(self._attn(layer, "W_V")), bad)
        w_o = _zero_bad(_tamed(self._attn(layer, "W_O")), bad)
        with one_lapack_thread():  # H small products
            return _r_factor(w_v) @ w_o  # [H, k, d]

    def target(self, layer: int) -> np.ndarray:
        a_name, b_name = {"q": ("W_Q", "W_K"), "k": ("W_K", "W_Q"), "v": ("W_V", "W_O")}[self.kind]
        a, b_t = self._attn(layer, a_name), self._attn(layer, b_name)
        if self.kind == "v":
            b_t = b_t.swapaxes(-2, -1)
        bad = self.bad(layer)
        a, b_t = _zero_bad(_tamed(a), bad), _zero_bad(_tamed(b_t), bad)
        with one_lapack_thread():
            return a @ _r_factor(b_t).swapaxes(-2, -1)  # [H, d, k]

    def tile(self, source: int, target: int, scores: np.ndarray) -> Tile:
        mask = self.bad(source)[:, None] | self.bad(target)[None, :]
        return Tile(self.kind, source, target, np.where(mask, np.float32(np.nan), scores))


def _pair_scores(x: np.ndarray, x_norm: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``engine.scores._pair_scores``: ``[B, H, k, d]``, ``[B, H]``, ``[H2, d, k2]`` -> ``[B, H, H2]``."""
    n_src, n_heads, k, d = x.shape
    n_tgt, _, k2 = y.shape
    with np.errstate(all="ignore"):
        prod = x.reshape(-1, d) @ np.ascontiguousarray(y.transpose(1, 0, 2)).reshape(d, n_tgt * k2)
        np.square(prod, out=prod)
        sq = prod.reshape(n_src, n_heads, k, n_tgt, k2).sum((2, 4))
        y_norm = np.sqrt(np.square(y).sum((-2, -1)))
        return (np.sqrt(sq) / (x_norm[:, :, None] * y_norm[None, None, :])).astype(np.float32)


TILE_BYTES = 768 << 20  # source factors stacked at once by a composition sweep


def iter_composition_tiles(w: NumpyWeights, kind: str, progress: Progress = None,
                           cancelled: Cancelled = None, *, skip: frozenset[tuple[int, int]] = frozenset(),
                           tile_bytes: int = TILE_BYTES) -> Iterator[Tile]:
    """``engine.scores.iter_composition_tiles`` in numpy (same blocks, same order; pairs in
    ``skip`` are not computed)."""
    n_layers, cfg = w.cfg.n_layers, w.cfg
    wanted = {(s, t) for t in range(n_layers) for s in range(t)} - skip
    total = max(1, len(wanted))
    done = 0
    f = _Factors(w, kind)
    hk = cfg.n_heads * cfg.d_head
    block = max(1, tile_bytes // (4 * hk * (cfg.d_model + hk)))
    for first in range(0, n_layers - 1, block):
        sources = [s for s in range(first, min(first + block, n_layers - 1))
                   if any((s, t) in wanted for t in range(s + 1, n_layers))]
        if not sources:
            continue
        _check(cancelled)
        xs = np.stack([f.source(s) for s in sources])
        with np.errstate(all="ignore"):
            x_norms = np.sqrt(np.square(xs).sum((-2, -1)))
        for target in range(sources[0] + 1, n_layers):
            rows = [i for i, s in enumerate(sources) if s < target and (s, target) in wanted]
            if not rows:
                continue
            _check(cancelled)
            lo, hi = rows[0], rows[-1] + 1
            part = _pair_scores(xs[lo:hi], x_norms[lo:hi], f.target(target))
            for i in rows:
                yield f.tile(sources[i], target, part[i - lo])
                done += 1
            _report(progress, done / total)
    _report(progress, 1.0)


@functools.lru_cache(maxsize=32)
def composition_baseline(d_model: int, d_head: int, seed: int = 0, samples: int = 32) -> float:
    """Expected composition score of i.i.d. standard Gaussian factors of the model's shapes
    (``engine.scores.composition_baseline``, which is this function): the mean over
    ``samples`` draws from numpy's ``default_rng(seed)`` of ``‖OV₁ M₂‖ / (‖OV₁‖ ‖M₂‖)``,
    through ``d_head``-sized Gram matrices (no ``d_model × d_model`` product)."""
    rng = np.random.default_rng(seed)
    v, o = rng.standard_normal((samples, d_model, d_head)), rng.standard_normal((samples, d_head, d_model))
    q, k = rng.standard_normal((samples, d_model, d_head)), rng.standard_normal((samples, d_model, d_head))
    # ‖V O Q Kᵀ‖² = tr((VᵀV)(O Q)(KᵀK)(O Q)ᵀ); ‖V O‖² = tr((VᵀV)(O Oᵀ)); ‖Q Kᵀ‖² = tr((QᵀQ)(KᵀK))
    with one_lapack_thread():
        gv, gk, gq = (np.swapaxes(m, -2, -1) @ m for m in (v, k, q))
        oq = o @ q
        num = ((gv @ oq @ gk) * oq).sum((-2, -1))
        ov = ((gv @ o) * o).sum((-2, -1))
        qk = (gq * gk).sum((-2, -1))  # Gram matrices are symmetric
    return float(np.mean(np.sqrt(num) / (np.sqrt(ov) * np.sqrt(qk))))


def composition_scores(w: NumpyWeights, kind: str, seed: int = 0, progress: Progress = None,
                       cancelled: Cancelled = None, *, on_tile: Callable[[Tile], None] | None = None,
                       baseline_samples: int = 32, memo: Memo | None = None,
                       tile_bytes: int = TILE_BYTES) -> tuple[np.ndarray, float]:
    """``engine.scores.composition_scores`` in numpy: ``(scores [L, H, L, H], baseline)``.

    ``memo`` as there: one part per target layer ``t``, ``scores[:t, :, t, :]``; stored
    targets are skipped (``on_tile`` still gets their tiles, first), each computed target is
    put once its last pair ``(t - 1, t)`` is done. ``tile_bytes`` bounds the source factors
    held at once (``iter_composition_tiles``); it changes the blocking, not the numbers."""
    if kind not in ("q", "k", "v"):
        raise InvalidRequestError(w.path, f"composition kind must be q, k or v, not {kind!r}")
    cfg = w.cfg
    scores = np.zeros((cfg.n_layers, cfg.n_heads, cfg.n_layers, cfg.n_heads), np.float32)
    skip: set[tuple[int, int]] = set()
    for target in range(1, cfg.n_layers):
        known = None if memo is None else memo.get(target, (target, cfg.n_heads, cfg.n_heads))
        if known is None:
            continue
        scores[:target, :, target, :] = known
        skip.update((source, target) for source in range(target))
        if on_tile is not None:
            for source in range(target):
                on_tile(Tile(kind, source, target, scores[source, :, target, :].copy()))
    for tile in iter_composition_tiles(w, kind, progress, cancelled, skip=frozenset(skip),
                                       tile_bytes=tile_bytes):
        scores[tile.source, :, tile.target, :] = tile.scores
        if memo is not None and tile.source == tile.target - 1:
            memo.put(tile.target, scores[:tile.target, :, tile.target, :].copy())
        if on_tile is not None:
            on_tile(tile)
    return scores, composition_baseline(cfg.d_model, cfg.d_head, seed, baseline_samples)


def nan_to_flags(values: dict[str, np.ndarray]) -> np.ndarray:
    """``nonfinite | overflow`` of a spectral sweep: the heads ``nonfinite_heads`` lists."""
    return values["nonfinite"] | values["overflow"]

