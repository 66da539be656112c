"""The numpy weights reader (docs/internals.md, "Weight-only commands without torch") and
``numpy_weights(model)``, the weights surface every weight-only computation in
``engine.circuits`` consumes.

``NumpyWeights`` reads the processed attention weights and embeddings of a safetensors
checkpoint as float32 numpy arrays straight from the files (the same ``pread`` reads and
adapter specs as ``CheckpointWeights``), processed as ``ProcessedWeights`` processes them
(only the tensors the weight algebra reads). So ``headscope heads --no-behaviour``,
``composition``, ``circuit`` and the like never wait for ``import torch``.

The algebra itself is in ``factored``, ``head_circuits``, ``spectral``, ``composition``,
``directions`` and ``similarity``.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from headscope.engine.core.cache import ByteLRU
from headscope.engine.core.errors import (
    CorruptFileError,
    MissingTensorError,
)
from headscope.engine.model.adapters.base import Heads, Product, Rows, Whole, Zeros
from headscope.engine.model.processing import plan_for, processed_config

if TYPE_CHECKING:
    from headscope.engine.model.loading import Model
    from headscope.engine.model.weights import CheckpointWeights

__all__ = ["NumpyWeights", "TorchWeightsAsNumpy", "kept_spectral_middles", "numpy_weights",
           "rotary_inv_freq", "spectral_middles"]

_NUMPY_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": "bf16"}
_HEAD_BIASES = ("b_Q", "b_K", "b_V")


class _Unsupported(Exception):
    pass


# -- reading ---------------------------------------------------------------------------------


def _widen(raw: np.ndarray, dtype: Any) -> np.ndarray:
    """Stored bytes as float32 (bf16: the upper half of a float32, exact)."""
    if dtype == "bf16":
        wide = raw.view(np.uint16).astype(np.uint32)
        wide <<= 16  # in place: one float32-sized array, not two
        return wide.view(np.float32)
    return raw.view(dtype).astype(np.float32, copy=False)


class NumpyWeights:
    """The processed attention weights and embeddings of a safetensors checkpoint as float32
    numpy arrays: ``get(name)`` for ``embed.W_E``, ``unembed.W_U`` and ``blocks.{l}.attn.*``,
    with the values ``ProcessedWeights`` (or, for a raw model, ``CheckpointWeights``) gives."""

    def __init__(self, raw: CheckpointWeights, processed: bool, cache_bytes: int = 512 << 20) -> None:
        self.raw = raw
        self.path = raw.path
        self.cfg = processed_config(raw.cfg) if processed else raw.cfg
        self.plan = plan_for(raw.cfg) if processed else None
        self._cache = ByteLRU(cache_bytes, lambda a: int(a.nbytes), max_entry=cache_bytes // 2)
        self._lock = threading.Lock()
        self.middles: dict[str, np.ndarray] | None = None  # kept_spectral_middles'
        self._middles_lock = threading.Lock()  # the sweep and the null may both ask at once

    def has(self, name: str) -> bool:
        return self.raw.has(name)

    def release(self) -> None:
        """Drop the cached tensors (a sweep that read every layer keeps only its last ones)."""
        with self._lock:
            self._cache.clear()

    def tied_embedding(self) -> tuple[np.ndarray, float, float] | None:
        """``(E, a, b)`` when ``W_U = a Eᵀ`` and ``W_E = b E`` for one stored tensor ``E``."""
        u, e = self.raw.specs.get("unembed.W_U"), self.raw.specs.get("embed.W_E")
        if not (type(u) is Whole and type(e) is Whole and u.tensor == e.tensor):
            return None
        if not u.transpose or e.transpose or u.add != 0.0 or e.add != 0.0:
            return None
        return self._read(e.tensor), u.scale, e.scale

    # raw canonical tensors, as CheckpointWeights._build makes them

    def _read(self, tensor: str, rows: slice | None = None) -> np.ndarray:
        file = self.raw.files.get(tensor)
        if file is None:
            raise MissingTensorError(self.path, f"missing tensor {tensor!r}")
        handle, info, data_start = self.raw._locate(file, tensor)
        # the identity checks of CheckpointWeights._read: a file rewritten since the model
        # was opened (or during this read) is refused, not read
        self.raw._check_unchanged(file)
        dtype = _NUMPY_DTYPES.get(info.dtype)
        if dtype is None:
            raise _Unsupported(info.dtype)
        shape = list(info.shape)
        row_bytes = info.nbytes // shape[0] if shape and shape[0] else info.nbytes
        first, count = 0, (shape[0] if shape else 1)
        if rows is not None:
            first, stop, _ = rows.indices(shape[0])
            count = max(0, stop - first)
            shape[0] = count
        buffer = np.empty(count * row_bytes, np.uint8)
        view, done = memoryview(buffer), 0
        while done < len(view):
            got = os.preadv(handle.fileno(), [view[done:]], data_start + info.begin + first * row_bytes + done)
            if got <= 0:
                raise CorruptFileError(file, f"cannot read tensor {tensor!r}: the file ends early")
            done += got
        self.raw._check_unchanged(file)
        return _widen(buffer, dtype).reshape(shape)

    def raw_get(self, name: str) -> np.ndarray:
        spec = self.raw.specs.get(name)
        if spec is None:
            raise MissingTensorError(self.path, f"no tensor {name!r} in this {self.cfg.architecture} model")
        if isinstance(spec, Zeros):
            return np.zeros(spec.shape, np.float32)
        if isinstance(spec, Rows):
            t = self._read(spec.tensor, slice(spec.offset, spec.offset + spec.size))
            return np.ascontiguousarray(t.T if spec.transpose else t)
        if isinstance(spec, Whole):
            t = self._read(spec.tensor)
            t = np.ascontiguousarray(t.T) if spec.transpose else t
            if spec.scale != 1.0:
                t = t * np.float32(spec.scale)
            if spec.add != 0.0:
                t = t + np.float32(spec.add)
            return t
        return self._heads(spec)

    def _heads(self, spec: Heads) -> np.ndarray:
        cfg = self.raw.cfg
        stored = cfg.kv_heads if spec.kv else cfg.n_heads
        t = np.ascontiguousarray(self._read(spec.tensor))
        shape, strides = list(t.shape), list(t.strides)
        shape[spec.axis] = spec.size
        heads = np.lib.stride_tricks.as_strided(
            t[(slice(None),) * spec.axis + (slice(spec.offset, None),)],
            (stored, *shape), (spec.stride * strides[spec.axis], *strides), writeable=False)
        if spec.squeeze:
            heads = heads.squeeze(spec.axis + 1)
        if spec.transpose:
            heads = heads.swapaxes(-2, -1)
        if spec.deinterleave:
            r = spec.deinterleave
            order = np.concatenate([np.arange(0, r, 2), np.arange(1, r, 2), np.arange(r, heads.shape[-1])])
            heads = heads[..., order]
        if spec.kv and stored != cfg.n_heads:
            heads = np.repeat(heads, cfg.n_heads // stored, axis=0)
        return np.ascontiguousarray(heads)

    def embed_rows(self, ids: np.ndarray) -> np.ndarray:
        """``get("embed.W_E")[ids]``, reading only those rows (runs of consecutive ids) when
        the embedding is stored whole and untransposed: each row is processed on its own
        (centring writes along ``d_model``), so a circuit block of a few tokens does not
        read and centre a vocabulary-sized matrix."""
        spec = self.raw.specs.get("embed.W_E")
        with self._lock:
            whole = self._cache.get("embed.W_E")
        if whole is not None or type(spec) is not Whole or spec.transpose:
            return (whole if whole is not None else self.get("embed.W_E"))[ids]
        uniq = np.unique(ids)
        breaks = np.flatnonzero(np.diff(uniq) != 1) + 1
        runs = np.split(uniq, breaks) if uniq.size else []
        t = np.concatenate([self._read(spec.tensor, slice(int(r[0]), int(r[-1]) + 1)) for r in runs]) \
            if runs else np.zeros((0, self.cfg.d_model), np.float32)
        with np.errstate(all="ignore"):
            if spec.scale != 1.0:
                t = t * np.float32(spec.scale)
            if spec.add != 0.0:
                t = t + np.float32(spec.add)
            if self.plan is not None and self.plan.center_writing:
                t = t - t.mean(-1, keepdims=True)
        return t[np.searchsorted(uniq, ids)]

    def unembed_cols(self, cols: np.ndarray) -> np.ndarray:
        """``get("unembed.W_U")[:, cols]`` without processing the whole unembedding: the
        reading-side steps (final-norm gain, centring along ``d_model``) act on each column
        alone, and centring the unembedding subtracts the (processed) mean column, so only
        ``cols`` and the stored tensor's mean are processed (one read of it, no copies)."""
        spec = self.raw.specs.get("unembed.W_U")
        with self._lock:
            whole = self._cache.get("unembed.W_U")
        if whole is not None or type(spec) is not Whole:
            return (whole if whole is not None else self.get("unembed.W_U"))[:, cols]
        stored = self._read(spec.tensor)  # [vocab, d_model] when transposed, else [d_model, vocab]
        block = stored[cols].T if spec.transpose else stored[:, cols]
        p = self.plan
        with np.errstate(all="ignore"):
            mean = stored.mean(0 if spec.transpose else 1, dtype=np.float64)[:, None]
            del stored
            if spec.scale != 1.0:
                block, mean = block * np.float32(spec.scale), mean * spec.scale
            if spec.add != 0.0:
                block, mean = block + np.float32(spec.add), mean + spec.add
            if p is None:
                return np.ascontiguousarray(block, dtype=np.float32)
            gain, _ = self._gain("ln_final")

            def reading(x: np.ndarray) -> np.ndarray:  # per column: gain, centre along d_model
                if gain is not None:
                    x = x * gain[:, None]
                return x - x.mean(0, keepdims=True) if p.center_reading else x

            out = reading(block)
            if p.center_unembed:
                out = out - reading(mean)
        return np.ascontiguousarray(out, dtype=np.float32)

    # processed tensors (ProcessedWeights' rules for the tensors the weight scores read)

    def get(self, name: str, *, keep: bool = True) -> np.ndarray:
        """The processed tensor; ``keep=False``: not kept in the cache if it was not there
        (a vocabulary-sized tensor a caller reads once, e.g. for a Gram matrix)."""
        with self._lock:
            hit = self._cache.get(name)
        if hit is not None:
            return hit
        value = self._compute(name)
        value.setflags(write=False)
        if keep:
            with self._lock:
                self._cache.put(name, value)
        return value

    def _gain(self, prefix: str) -> tuple[np.ndarray | None, np.ndarray | None]:
        p = self.plan
        w = self.raw_get(f"{prefix}.w") if p and p.fold_norm_gain and self.raw.has(f"{prefix}.w") else None
        b = self.raw_get(f"{prefix}.b") if p and p.fold_norm_bias and self.raw.has(f"{prefix}.b") else None
        return w, b

    def _compute(self, name: str) -> np.ndarray:
        p = self.plan
        if p is None:
            return self.raw_get(name)
        parts = name.split(".")
        if name in ("embed.W_E", "pos_embed.W_pos"):
            t = self.raw_get(name)
            return t - t.mean(-1, keepdims=True) if p.center_writing else t
        if name == "unembed.W_U":
            t = self.raw_get(name)
            w, _ = self._gain("ln_final")
            if w is not None:
                t = t * w[:, None]
            if p.center_reading:
                t = t - t.mean(0, keepdims=True)
            return t - t.mean(-1, keepdims=True) if p.center_unembed else t
        if len(parts) == 4 and parts[2] == "attn":
            return self._attn(int(parts[1]), parts[3])
        raise MissingTensorError(self.path, f"{name!r} is not read by the weight-only scores")

    def _attn(self, layer: int, leaf: str) -> np.ndarray:
        p = self.plan
        pre = f"blocks.{layer}.attn"
        w, ln_b = self._gain(f"blocks.{layer}.ln1")
        if leaf in ("W_Q", "W_K", "W_V"):
            t = self.raw_get(f"{pre}.{leaf}")
            if w is not None:
                t = t * w[:, None]
            return t - t.mean(-2, keepdims=True) if p.center_reading else t
        if leaf == "W_O":
            t = self.raw_get(f"{pre}.W_O")
            return t - t.mean(-1, keepdims=True) if p.center_writing else t
        if leaf in _HEAD_BIASES:
            if leaf == "b_V" and p.fold_value_biases:
                return np.zeros((self.cfg.n_heads, self.cfg.d_head), np.float32)
            b = self.raw_get(f"{pre}.{leaf}")
            return b if ln_b is None else b + ln_b @ self.raw_get(f"{pre}.W_{leaf[-1]}")
        raise MissingTensorError(self.path, f"{pre}.{leaf} is not read by the weight-only scores")


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


class TorchWeightsAsNumpy:
    """TEMPORARY (until the model layer returns numpy arrays itself, issue #26): the numpy
    weights surface over a torch ``WeightSource`` (``model.weights``) for the models
    ``NumpyWeights`` does not read (GGUF, float8, OPT-350m's product embeddings). Each tensor
    is converted with ``.numpy()`` (float32, shares the tensor's memory)."""

    plan = None  # spectral_middles: no tied-embedding shortcut

    def __init__(self, weights: Any) -> None:
        self.weights = weights
        self.cfg = weights.cfg
        self.path = getattr(weights, "path", None)
        self.middles: dict[str, np.ndarray] | None = None  # kept_spectral_middles'
        self._middles_lock = threading.Lock()

    def has(self, name: str) -> bool:
        return bool(self.weights.has(name))

    def get(self, name: str, *, keep: bool = True) -> np.ndarray:
        value = self.weights.get(name)
        return value if isinstance(value, np.ndarray) else value.detach().float().numpy()

    def release(self) -> None:
        """Nothing to drop: the torch source keeps its own cache."""

    def tied_embedding(self) -> None:
        return None

    def embed_rows(self, ids: np.ndarray) -> np.ndarray:
        return self.get("embed.W_E")[np.asarray(ids, dtype=np.intp)]

    def unembed_cols(self, cols: np.ndarray) -> np.ndarray:
        return self.get("unembed.W_U")[:, np.asarray(cols, dtype=np.intp)]


def numpy_weights(model: Model) -> NumpyWeights | TorchWeightsAsNumpy:
    """``model``'s weights as the numpy surface of ``engine.circuits``: ``NumpyWeights`` read
    straight from the safetensors files, or (GGUF, a dtype numpy cannot widen, product
    embeddings) the temporary ``TorchWeightsAsNumpy`` over ``model.weights``. One view per
    raw/processed mode, shared by ``with_raw()`` copies."""

    raw = model.raw_weights
    views = raw.__dict__.setdefault("_numpy_views", {})  # shared by with_raw() copies
    if model.raw in views:
        return views[model.raw]
    if _reads_numpy(model):
        views[model.raw] = NumpyWeights(raw, processed=not model.raw)
    else:
        views[model.raw] = TorchWeightsAsNumpy(model.weights)
    return views[model.raw]


def _reads_numpy(model: Model) -> bool:
    """Whether ``NumpyWeights`` reads ``model``'s checkpoint: safetensors, no product specs,
    dtypes numpy widens."""
    from headscope.engine.model.weights import CheckpointWeights

    raw = model.raw_weights
    if type(raw) is not CheckpointWeights or getattr(model.checkpoint, "gguf", None) is not None:
        return False
    headers = model.checkpoint.headers
    if any(isinstance(spec, Product) for spec in raw.specs.values()):
        return False  # OPT-350m's projected embeddings
    for spec in raw.specs.values():
        tensor = getattr(spec, "tensor", None)
        file = raw.files.get(tensor) if tensor else None
        info = headers[file].tensors.get(tensor) if file in headers else None
        if info is not None and info.dtype not in _NUMPY_DTYPES:
            return False
    return True


# -- rotary position embeddings (moving to engine/model/rotary.py) -----------------------------

# The RoPE scalings rotary_inv_freq computes here; YaRN and LongRoPE:
# engine.circuits.head_circuits.rotary_inv_freq.
ROPE_TYPES = ("default", "linear", "llama3")


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
