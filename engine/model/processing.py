"""Weight processing: TransformerLens' ``from_pretrained`` defaults, applied lazily.

``ProcessedWeights(raw)`` is a ``WeightSource`` whose tensors are those of ``raw`` after

- ``fold_ln``: each norm's gain ``w`` (and LayerNorm bias ``b``) is folded into the weights
  that read its output: ``W ← diag(w) W``, ``b_W ← b_W + b W``. For LayerNorm the reading
  weights are then centred along ``d_model`` (LayerNorm's output has zero mean, so that
  component of ``W`` never mattered). RMSNorm: scale only, no bias, no centring.
- ``center_writing_weights`` (LayerNorm models only): ``W_E``, ``W_pos``, ``W_O``, ``b_O``,
  ``W_out``, ``b_out`` centred along ``d_model`` — the next LayerNorm removes that mean anyway.
- ``center_unembed`` (always): ``W_U`` and ``b_U`` centred along the vocabulary; softmax is
  shift-invariant, so log-probabilities do not change.
- ``fold_value_biases`` (always): ``b_O ← b_O + Σ_h b_V[h] W_O[h]``, ``b_V ← 0``. Exact
  because each attention pattern row sums to one.

in this order, exactly as ``HookedTransformer.load_and_process_state_dict`` does, so every
number matches TransformerLens. The folded norms become parameter-free: ``cfg.normalization``
turns ``"LN"`` into ``"LNPre"`` and ``"RMS"`` into ``"RMSPre"``, and their ``.w``/``.b`` are no
longer part of the source (``has`` is false, as in TransformerLens' state dict).

Post-LN encoders (BERT, ``cfg.post_ln``): TransformerLens' ``HookedEncoder`` folds nothing, and
a post-LN block's norm cannot be folded into the *next* layer's reading weights exactly (the
residual stream itself is the normalised value). We apply only what stays exact:
``fold_value_biases`` and ``center_unembed`` (log-probabilities unchanged); norms keep their
gains and biases and ``cfg`` is unchanged.

Gated MLPs are only ever RMS-normed in the supported families; like TransformerLens we scale
``W_gate`` by the norm gain and do not centre it (a LayerNorm bias has no gate bias to fold into).

Everything is computed on demand: ``get_head`` touches only that head's slices (plus the
layer's norm vectors), and results are kept in a small byte-bounded LRU cache.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from dataclasses import dataclass

import numpy as np

from headscope.engine.core.cache import ByteLRU
from headscope.engine.core.config import ModelConfig
from headscope.engine.core.errors import MissingTensorError
from headscope.engine.model.weights import (
    HEAD_TENSORS,
    KV_TENSORS,
    WeightSource,
    read_only,
    tensor_bytes,
)

__all__ = ["Plan", "ProcessedWeights", "plan_for", "processed_config"]


@dataclass(frozen=True)
class Plan:
    """Which TransformerLens processing steps apply to a model (derived from its config)."""

    fold_norm_gain: bool  # W ← diag(w) W for the pre-norm's readers
    fold_norm_bias: bool  # b_W ← b_W + b W (LayerNorm only)
    center_reading: bool  # readers of a LayerNorm(Pre) output centred along d_model
    center_writing: bool  # writers to the residual stream centred along d_model
    center_unembed: bool = True
    fold_value_biases: bool = True


def plan_for(cfg: ModelConfig) -> Plan:
    """The processing TransformerLens' ``from_pretrained`` defaults apply to ``cfg``, minus
    ``center_unembed`` under a final logit soft-cap (``_softcap_plan``)."""
    return _softcap_plan(_norm_plan(cfg), cfg)


def _softcap_plan(plan: Plan, cfg: ModelConfig) -> Plan:
    """Gemma 2 caps the logits, ``c · tanh(l / c)``: shifting ``l`` by a per-position constant
    (what centring ``W_U`` over the vocabulary does) changes the log-probabilities, so it is
    not applied (docs/math.md)."""
    if cfg.extra.get("final_softcap"):
        return dataclasses.replace(plan, center_unembed=False)
    return plan


def _norm_plan(cfg: ModelConfig) -> Plan:
    if cfg.post_ln:
        return Plan(False, False, False, False)
    norm = cfg.normalization
    if norm == "LN":
        return Plan(True, True, True, True)
    if norm == "LNPre":  # already folded: re-centring is a no-op on processed weights
        return Plan(False, False, True, True)
    if norm == "RMS":
        return Plan(True, False, False, False)
    return Plan(False, False, False, False)  # RMSPre / no normalisation


def processed_config(cfg: ModelConfig) -> ModelConfig:
    """``cfg`` as seen after processing: folded norms become LNPre/RMSPre."""
    if cfg.post_ln:
        return cfg
    if cfg.normalization == "LN":
        return cfg.replace(normalization="LNPre")
    if cfg.normalization == "RMS":
        return cfg.replace(normalization="RMSPre")
    return cfg


def _is_layer_tensor(key: tuple[str, int | None]) -> bool:
    """A whole-layer tensor (all heads), the kind a sweep over the layers reads in order."""
    name, head = key
    return head is None and name.startswith("blocks.")


def _float32_bytes(cfg: ModelConfig) -> tuple[int, int]:
    """(whole model, one layer's attention weights): float32 bytes of the processed weights."""
    # W_Q, W_O, and W_K, W_V once per stored K/V head: what the passes read and cache
    # (``_W_K``: grouped-query attention's heads are repeated only where a caller asks)
    attn = 2 * (cfg.n_heads + cfg.kv_heads) * cfg.d_model * cfg.d_head
    mlp = (3 if cfg.gated_mlp else 2) * cfg.d_model * (cfg.d_mlp or 0)
    outer = 2 * cfg.d_vocab * cfg.d_model + (cfg.n_ctx * cfg.d_model if cfg.positional == "learned" else 0)
    return 4 * (cfg.n_layers * (attn + mlp) + outer), 4 * attn


# The weight cache's default bound (``ProcessedWeights``), and the room it keeps beside one
# layer's attention weights when they are larger (their biases, the norm vectors, the folded
# biases: a few MB even at 70B widths).
DEFAULT_CACHE_BYTES = 1 << 30
LAYER_SLACK = 64 << 20


def default_cache_bytes(cfg: ModelConfig) -> int:
    """``DEFAULT_CACHE_BYTES``, or one layer's attention weights (float32, K/V once per stored
    head) and room beside them where they are larger: `heads` reads them for the weight sweep's
    piece of the layer, then again for the pass's attention (``spectral.SpectralPass``). With
    K/V expanded a 70B layer's were exactly 1 GiB, and a 1 GiB LRU cycled every one of them
    out before its second read; stored, they are 0.6 GB."""
    return max(DEFAULT_CACHE_BYTES, _float32_bytes(cfg)[1] + 2 * LAYER_SLACK)


def _layer_budget(cfg: ModelConfig, cache_bytes: int) -> int:
    """Bytes of whole-layer tensors worth caching (see ``ProcessedWeights``)."""
    model, attn = _float32_bytes(cfg)
    if model <= cache_bytes:
        return cache_bytes
    # one layer's attention weights and their biases, with room to spare (a 1B model: 128 MB)
    return min(cache_bytes, max(128 << 20, 2 * attn))


# Mixtral: the router and each expert's input weights read the ln2 output.
_MOE_READER = re.compile(r"blocks\.\d+\.mlp\.(W_router|experts\.\d+\.(W_in|W_gate))")

# Non-attention tensors that write into the residual stream (last dim is d_model).
_WRITERS = (("embed", "W_E"), ("pos_embed", "W_pos"), ("mlp", "W_out"), ("mlp", "b_out"))


def _split(name: str) -> tuple[int | None, str, str]:
    """``blocks.3.attn.W_Q`` -> (3, "attn", "W_Q"); ``unembed.W_U`` -> (None, "unembed", "W_U")."""
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blocks" and parts[1].isdigit():
        return int(parts[1]), parts[2], parts[3]
    if len(parts) == 2:
        return None, parts[0], parts[1]
    return None, "", name


def _center(t: np.ndarray, dim: int) -> np.ndarray:
    return t - t.mean(dim, keepdims=True)


def _editable(t: np.ndarray) -> np.ndarray:
    """``t`` itself where it is writable float32 (a reader's new array, no one else's), else a
    float32 copy (a view of a kept, read-only array): what this module edits in place."""
    return t if t.flags.writeable and t.dtype == np.float32 else np.array(t, dtype=np.float32)


def _center_(t: np.ndarray, dim: int) -> np.ndarray:
    """In place, for arrays this module just allocated (saves a W_U-sized temporary)."""
    t -= t.mean(dim, keepdims=True)
    return t


# the cache key of a whole layer's b_Q/b_K/b_V with the ln1 bias folded in (``_folded_bias``),
# formed while its W is processed
_FOLDED = "{pre}.{leaf}~folded"


class ProcessedWeights:
    """A ``WeightSource`` applying TransformerLens' default weight processing lazily, as
    read-only float32 numpy arrays.

    Besides ``has``/``get``/``get_head``, the surface the weight-only circuits read (the
    same on ``CheckpointWeights`` for a raw model): ``get(name, keep=False)`` (not kept if
    not already cached), ``release()`` (drop the whole-layer arrays a sweep read),
    ``tied_embedding()``, ``embed_rows(ids)`` and ``unembed_cols(cols)`` (a few processed rows
    or columns without processing a vocabulary-sized matrix), ``fold_gains(prefix)``,
    ``plan``, and ``middles`` under ``middles_lock`` (products formed once per model).
    """

    # The default bound holds a GPT-2-small-sized model's processed weights (~650 MB), so that
    # repeated forward passes do not recompute W_E/W_U each time (a full pass reads every
    # tensor in order: the worst case for an LRU that is too small). Nothing is computed, so
    # nothing is held, until it is asked for.
    #
    # When the whole model does not fit (a 1B model is 4-5 GB in float32), a pass or a sweep
    # over the layers can never be served from the cache: an LRU smaller than the scan evicts
    # each layer before it comes round again. Whole-layer tensors then share a small budget
    # (enough for one layer's attention weights to be reused within the layer, as the scores
    # do), instead of filling the cache with 1 GiB that no later read hits and that pins the
    # allocator's free memory around it. Per-head slices, norms, W_E/W_U keep the full budget.
    def __init__(self, raw: WeightSource, *, cache_bytes: int | None = None) -> None:
        self.raw = raw
        self.raw_cfg = raw.cfg
        self.cfg = processed_config(raw.cfg)
        cache_bytes = default_cache_bytes(self.cfg) if cache_bytes is None else cache_bytes
        self.path = getattr(raw, "path", None)
        self.plan = plan_for(raw.cfg)
        # whole-layer tensors ("blocks.N.*", all heads) share the smaller layer budget
        self._cache = ByteLRU(
            cache_bytes,
            tensor_bytes,
            group=_is_layer_tensor,  # type: ignore[arg-type]
            group_capacity=_layer_budget(self.cfg, cache_bytes),
        )
        self.middles: dict[str, np.ndarray] | None = None  # the circuits' kept products
        self.middles_lock = threading.Lock()  # the sweep and the null may both ask at once


    # -- WeightSource -------------------------------------------------------------------

    def has(self, name: str) -> bool:
        if self._is_folded_norm(name):
            return False
        return self.raw.has(name)

    def get(self, name: str, *, keep: bool = True) -> np.ndarray:
        """The processed array (read-only); ``keep=False``: not kept in the cache if it was
        not there (a vocabulary-sized array a caller reads once, e.g. for a Gram matrix)."""
        if keep:
            return self._cached(name, None)
        hit = self._cache.get((name, None))
        return hit if hit is not None else read_only(self._compute(name, None))

    def get_columns(self, name: str, start: int, stop: int) -> np.ndarray:
        """``get(name)[:, start:stop]`` of an MLP matrix, processing only those columns where
        the raw source reads them alone (``CheckpointWeights.get_columns``; not cached): a 70B
        layer's ``W_gate`` is 0.94 GB in float32. Processing acts on each column of a reader
        (``W_in``, ``W_gate``) alone: the norm gain scales its rows, the centring is along
        ``d_model`` within it. ``W_out`` is centred along its columns (``center_writing``,
        LayerNorm models): there, and for everything else, the block is cut from the whole."""
        layer, module, leaf = _split(name)
        whole = self._cache.get((name, None))
        read = getattr(self.raw, "get_columns", None)
        blockwise = module == "mlp" and (leaf in ("W_in", "W_gate") or (leaf == "W_out" and not self.plan.center_writing))
        if whole is not None or read is None or not blockwise:
            return (whole if whole is not None else self.get(name))[:, start:stop]
        block = read(name, start, stop)
        if leaf == "W_out":
            return block
        w, _ = self._norm(f"blocks.{layer}.ln2")
        center = self.plan.center_reading and leaf == "W_in"  # as _mlp_reader
        if w is None and not center:
            return block
        # the reader's own new memory (``CheckpointWeights.get_columns``) is edited in place in
        # its stored layout (a transposed view; torch multiplies it as one): a re-layout copy of
        # it was a fifth of a 70B-wide layer's forward pass
        block = _editable(block)
        with np.errstate(all="ignore"):
            if w is not None:
                block *= w[:, None]
            return _center_(block, 0) if center else block

    def get_head(self, name: str, head: int) -> np.ndarray:
        if _split(name)[2] not in HEAD_TENSORS:
            raise MissingTensorError(self.path, f"{name!r} is not a per-head tensor")
        self.cfg.check_head(_split(name)[0] or 0, head, self.path)
        return self._cached(name, head)

    # -- cache --------------------------------------------------------------------------

    def _cached(self, name: str, head: int | None) -> np.ndarray:
        key = (name, head)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        value = read_only(self._compute(name, head))
        self._cache.put(key, value)
        return value

    def release(self) -> None:
        """Drop the cached whole-layer arrays (a sweep that read every layer keeps only its
        last ones: a 7B model's are 0.5 GB); the raw source drops its own."""
        self._cache.clear_group()
        release = getattr(self.raw, "release", None)
        if release is not None:
            release()

    # -- a few rows or columns, for the weight-only circuits --------------------------------

    def fold_gains(self, prefix: str) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The (gain, bias) of the norm ``prefix`` that processing folds into its readers
        (None where it folds none)."""
        return self._norm(prefix)


    def tied_embedding(self) -> tuple[np.ndarray, float, float] | None:
        """The raw ``(E, a, b)`` with ``W_U = a Eᵀ`` and ``W_E = b E`` (before processing; see
        ``CheckpointWeights.tied_embedding``), or None."""
        tied = getattr(self.raw, "tied_embedding", None)
        return tied() if tied is not None else None

    def embed_rows(self, ids: np.ndarray) -> np.ndarray:
        """``get("embed.W_E")[ids]``, reading only those rows where the raw source can: each
        row is processed on its own (centring writes along ``d_model``), so a circuit block
        of a few tokens does not read and centre a vocabulary-sized matrix."""
        ids = np.asarray(ids, dtype=np.intp)
        whole = self._cache.get(("embed.W_E", None))
        rows = getattr(self.raw, "embed_rows", None)
        if whole is not None or rows is None:
            return (whole if whole is not None else self.get("embed.W_E"))[ids]
        t = rows(ids)
        if not self.plan.center_writing:
            return t
        with np.errstate(all="ignore"):
            return t - t.mean(-1, keepdims=True)

    def unembed_cols(self, cols: np.ndarray, *, centred: bool = True) -> np.ndarray:
        """``get("unembed.W_U")[:, cols]`` without processing the whole unembedding: the
        reading-side steps (final-norm gain, centring along ``d_model``) act on each column
        alone, and centring the unembedding subtracts the (processed) mean column, so only
        ``cols`` and the stored tensor's mean are processed (one read of it, no copies).
        ``centred=False``: for a caller that reads only differences between columns, the
        centring over the vocabulary (one column subtracted from each: every logit of a
        position shifted alike) may be left out, and is where that saves reading the whole
        stored tensor for its mean."""
        cols = np.asarray(cols, dtype=np.intp)
        centred = centred and self.plan.center_unembed
        # the column path whether or not the whole processed W_U is cached, so a block's
        # numbers do not depend on what was asked before (the CLI and the explorer agree bit for
        # bit); it reads only the columns' rows once the stored mean is known
        block = getattr(self.raw, "unembed_block", None)
        found = None if block is None else block(cols, with_mean=centred)
        if found is None:
            return np.ascontiguousarray(self.get("unembed.W_U")[:, cols])
        block, mean = found
        p = self.plan
        with np.errstate(all="ignore"):
            gain, _ = self._norm("ln_final")

            def reading(x: np.ndarray) -> np.ndarray:  # per column: gain, centre along d_model
                if gain is not None:
                    x = x * gain[:, None]
                return x - x.mean(0, keepdims=True) if p.center_reading else x

            out = reading(block)
            if centred:
                out = _editable(out)
                # the difference in float64 (the mean's precision), rounded once to float32,
                # element by element into ``out``: no float64 block (a 70B vocabulary block's
                # was 0.5 GB) and no re-layout copy (the columns stay a transposed view of the
                # stored rows; a product takes them as they are)
                np.subtract(out, reading(mean), out=out, casting="unsafe")
        return np.asarray(out, dtype=np.float32)

    def unembed_bias_cols(self, cols: np.ndarray, *, centred: bool = True) -> np.ndarray:
        """``get("unembed.b_U")[cols]`` without processing the whole unembedding, as
        ``unembed_cols`` (and its ``centred``): the folded final-norm bias reads only the
        columns ``cols`` of the stored ``W_U``, and centring over the vocabulary subtracts its
        mean, ``mean(b_U) + ln_b · (mean column)``, from the stored tensor's mean column."""
        cols = np.asarray(cols, dtype=np.intp)
        centred = centred and self.plan.center_unembed
        block = getattr(self.raw, "unembed_block", None)
        found = None if block is None else block(cols, with_mean=centred)
        if found is None:
            return np.ascontiguousarray(self.get("unembed.b_U")[cols])
        w_cols, mean = found
        b_U = self._raw("unembed.b_U", None)
        _, ln_b = self._norm("ln_final")
        with np.errstate(all="ignore"):
            out, centre = b_U[cols].astype(np.float64), b_U.mean(dtype=np.float64)
            if ln_b is not None:
                out = out + ln_b.astype(np.float64) @ w_cols
            if centred:
                if ln_b is not None:
                    centre = centre + float(ln_b.astype(np.float64) @ mean[:, 0])
                out = out - centre
        return out.astype(np.float32)

    # -- the processing itself ----------------------------------------------------------

    def _is_folded_norm(self, name: str) -> bool:
        if not self.plan.fold_norm_gain:
            return False
        return name in ("ln_final.w", "ln_final.b") or (
            _split(name)[1] in ("ln1", "ln2") and _split(name)[2] in ("w", "b")
        )

    def _raw(self, name: str, head: int | None) -> np.ndarray:
        return self.raw.get(name) if head is None else self.raw.get_head(name, head)

    def _raw_fresh(self, name: str) -> np.ndarray:
        """``raw.get(name)`` that this module may edit in place (processing a whole tensor
        then needs no second copy of it: 0.4 GB less peak for a 50k × 2048 ``W_U``)."""
        fresh = getattr(self.raw, "get_fresh", None)
        return fresh(name) if fresh is not None else self.raw.get(name).copy()

    def _norm(self, prefix: str) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The (gain, bias) of the norm named ``prefix`` that processing folds away."""
        p = self.plan
        # OLMo2 has no norm before its sublayers: nothing to fold there.
        w = self._cached(f"~{prefix}.w", None) if p.fold_norm_gain and self.raw.has(f"{prefix}.w") else None
        b = None
        if p.fold_norm_bias and self.raw.has(f"{prefix}.b"):
            b = self._cached(f"~{prefix}.b", None)
        return w, b

    def _compute(self, name: str, head: int | None) -> np.ndarray:
        if name.startswith("~"):  # the raw norm vectors, cached like everything else
            return self.raw.get(name[1:])
        if self._is_folded_norm(name):
            raise MissingTensorError(self.path, f"{name!r} is folded into the next weights (processed model)")
        layer, module, leaf = _split(name)
        p = self.plan

        # non-finite weights give non-finite results, silently (docs/math.md)
        with np.errstate(all="ignore"):
            if _MOE_READER.match(name):
                return self._moe_reader(name)
            if module == "attn":
                return self._attn(layer, leaf, head)
            if module == "mlp" and leaf in ("W_in", "W_gate", "b_in"):
                return self._mlp_reader(layer, leaf)
            if (module, leaf) in _WRITERS:
                if not p.center_writing:
                    return self._raw(name, None)
                return _center_(self._raw_fresh(name), -1)
            if module == "unembed":
                return self._unembed(leaf)
            return self._raw(name, head)

    def _attn(self, layer: int | None, leaf: str, head: int | None) -> np.ndarray:
        """Attention weights of one layer (``head`` None: all heads stacked on dim 0)."""
        p = self.plan
        pre = f"blocks.{layer}.attn"
        group = self.cfg.n_heads // self.cfg.kv_heads
        if group > 1 and head is None and leaf in KV_TENSORS and self.raw.has(f"{pre}._{leaf}"):
            # grouped-query: the stored heads processed (each head's processing is its own),
            # then repeated for their groups; a forward pass reads ``_W_K`` alone (``stored_kv``)
            return np.repeat(self._cached(f"{pre}._{leaf}", None), group, axis=0)
        if leaf in ("W_Q", "W_K", "W_V", "_W_K", "_W_V"):
            # LN(x) W = n(x) diag(w) W + b W: scale the rows, then drop their d_model mean.
            w, _ = self._norm(f"blocks.{layer}.ln1")
            if w is None and not p.center_reading:
                return self._raw(f"{pre}.{leaf}", head)
            # a whole layer: one fresh copy edited in place (no second layer-sized array)
            W = self._raw_fresh(f"{pre}.{leaf}") if head is None else self._raw(f"{pre}.{leaf}", head).copy()
            _, ln_b = self._norm(f"blocks.{layer}.ln1")
            bias = (_FOLDED.format(pre=pre, leaf=leaf.replace("W_", "b_")), None)
            if head is None and ln_b is not None and self._cache.get(bias) is None:
                # the folded bias reads this same raw W: form it from this read (a forward pass
                # asks for W first) instead of building and keeping the raw W a second time
                self._cache.put(bias, read_only(self._raw(f"{pre}.{leaf.replace('W_', 'b_')}", None) + ln_b @ W))
            if w is not None:
                W *= w[:, None]
            return _center_(W, -2) if p.center_reading else W
        if leaf in ("b_Q", "b_K", "b_V", "_b_K", "_b_V"):
            if leaf in ("b_V", "_b_V") and p.fold_value_biases:  # moved into b_O (below)
                heads = self.cfg.kv_heads if leaf == "_b_V" else self.cfg.n_heads
                shape = (self.cfg.d_head,) if head is not None else (heads, self.cfg.d_head)
                return np.zeros(shape, np.float32)
            return self._folded_bias(layer, leaf, head)
        if leaf == "W_O":
            if not p.center_writing:
                return self._raw(f"{pre}.W_O", head)
            return _center_(self._raw_fresh(f"{pre}.W_O") if head is None else self._raw(f"{pre}.W_O", head).copy(), -1)
        if leaf == "b_O":
            b_O = self._raw(f"{pre}.b_O", None)
            if p.center_writing:
                b_O = _center(b_O, -1)
            if p.fold_value_biases:
                # Pattern rows sum to 1, so head h always adds b_V[h] W_O[h]: move it to b_O.
                b_V = self._folded_bias(layer, "b_V", None)  # [n_heads, d_head]
                W_O = self._cached(f"{pre}.W_O", None)  # processed: [n_heads, d_head, d_model]
                b_O = b_O + np.tensordot(b_V, W_O, axes=([0, 1], [0, 1]))
            return b_O
        return self._raw(f"{pre}.{leaf}", head)

    def _folded_bias(self, layer: int | None, leaf: str, head: int | None) -> np.ndarray:
        """b_Q/b_K/b_V with the ln1 bias folded in: b + ln1.b @ W (W before scaling)."""
        pre = f"blocks.{layer}.attn"
        kept = self._cache.get((_FOLDED.format(pre=pre, leaf=leaf), None)) if head is None else None
        if kept is not None:
            return kept
        b = self._raw(f"{pre}.{leaf}", head)
        _, ln_b = self._norm(f"blocks.{layer}.ln1")
        if ln_b is None:
            return b
        W = self._raw(f"{pre}.{leaf.replace('b_', 'W_')}", head)  # [(h,) d_model, d_head]
        return b + ln_b @ W

    def _mlp_reader(self, layer: int | None, leaf: str) -> np.ndarray:
        p = self.plan
        pre = f"blocks.{layer}.mlp"
        w, ln_b = self._norm(f"blocks.{layer}.ln2")
        if leaf == "b_in":
            b_in = self._raw(f"{pre}.b_in", None)
            return b_in if ln_b is None else b_in + ln_b @ self._raw(f"{pre}.W_in", None)
        center = p.center_reading and leaf == "W_in"  # TransformerLens never centres W_gate
        if w is None and not center:
            return self._raw(f"{pre}.{leaf}", None)
        W = self._raw_fresh(f"{pre}.{leaf}")  # [d_model, d_mlp], edited in place: no second copy
        if leaf == "W_in" and ln_b is not None and self._cache.get((f"{pre}.b_in", None)) is None:
            # the folded b_in reads this same raw W_in: form it from this read (a forward pass
            # asks for W_in first) instead of reading and keeping the raw W_in a second time
            self._cache.put((f"{pre}.b_in", None), read_only(self._raw(f"{pre}.b_in", None) + ln_b @ W))
        if w is not None:
            W *= w[:, None]
        return _center_(W, 0) if center else W

    def _moe_reader(self, name: str) -> np.ndarray:
        """Mixtral's router and experts read the ln2 output: its (RMSNorm) gain scales their
        rows, exactly as for a dense gated MLP."""
        W = self._raw(name, None)
        w, _ = self._norm(f"blocks.{name.split('.')[1]}.ln2")
        return W * w[:, None] if w is not None else W

    def _unembed(self, leaf: str) -> np.ndarray:
        p = self.plan
        w, ln_b = self._norm("ln_final")
        if leaf == "W_U":
            # [d_model, d_vocab], the largest tensor: one fresh copy, edited in place
            W_U = self._raw_fresh("unembed.W_U")
            if w is not None:
                W_U *= w[:, None]
            if p.center_reading:
                _center_(W_U, 0)
            return _center_(W_U, -1) if p.center_unembed else W_U
        if leaf == "b_U":
            b_U = self._raw("unembed.b_U", None)
            if ln_b is not None:
                b_U = b_U + ln_b @ self._raw("unembed.W_U", None)
            return _center(b_U, -1) if p.center_unembed else b_U
        return self._raw(f"unembed.{leaf}", None)
