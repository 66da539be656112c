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
from dataclasses import dataclass
from typing import TYPE_CHECKING

from headscope.engine.core.cache import ByteLRU
from headscope.engine.core.config import ModelConfig
from headscope.engine.core.errors import MissingTensorError
from headscope.engine.model.weights import HEAD_TENSORS, WeightSource, tensor_bytes

if TYPE_CHECKING:
    import torch

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
    attn = 4 * cfg.n_heads * cfg.d_model * cfg.d_head  # W_Q, W_K, W_V (GQA expanded), W_O
    mlp = (3 if cfg.gated_mlp else 2) * cfg.d_model * (cfg.d_mlp or 0)
    outer = 2 * cfg.d_vocab * cfg.d_model + (cfg.n_ctx * cfg.d_model if cfg.positional == "learned" else 0)
    return 4 * (cfg.n_layers * (attn + mlp) + outer), 4 * attn


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


def _center(t: torch.Tensor, dim: int) -> torch.Tensor:
    return t - t.mean(dim, keepdim=True)


def _center_(t: torch.Tensor, dim: int) -> torch.Tensor:
    """In place, for tensors this module just allocated (saves a W_U-sized temporary)."""
    return t.sub_(t.mean(dim, keepdim=True))


class ProcessedWeights:
    """A ``WeightSource`` applying TransformerLens' default weight processing lazily."""

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
    def __init__(self, raw: WeightSource, *, cache_bytes: int = 1 << 30) -> None:
        self.raw = raw
        self.raw_cfg = raw.cfg
        self.cfg = processed_config(raw.cfg)
        self.path = getattr(raw, "path", None)
        self.plan = plan_for(raw.cfg)
        # whole-layer tensors ("blocks.N.*", all heads) share the smaller layer budget
        self._cache = ByteLRU(
            cache_bytes,
            tensor_bytes,
            group=_is_layer_tensor,  # type: ignore[arg-type]
            group_capacity=_layer_budget(self.cfg, cache_bytes),
        )

    # -- WeightSource -------------------------------------------------------------------

    def has(self, name: str) -> bool:
        if self._is_folded_norm(name):
            return False
        return self.raw.has(name)

    def get(self, name: str) -> torch.Tensor:
        return self._cached(name, None)

    def get_head(self, name: str, head: int) -> torch.Tensor:
        if _split(name)[2] not in HEAD_TENSORS:
            raise MissingTensorError(self.path, f"{name!r} is not a per-head tensor")
        self.cfg.check_head(_split(name)[0] or 0, head, self.path)
        return self._cached(name, head)

    # -- cache --------------------------------------------------------------------------

    def _cached(self, name: str, head: int | None) -> torch.Tensor:
        key = (name, head)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        value = self._compute(name, head)
        self._cache.put(key, value)
        return value

    def clear_cache(self) -> None:
        self._cache.clear()

    # -- the processing itself ----------------------------------------------------------

    def _is_folded_norm(self, name: str) -> bool:
        if not self.plan.fold_norm_gain:
            return False
        return name in ("ln_final.w", "ln_final.b") or (
            _split(name)[1] in ("ln1", "ln2") and _split(name)[2] in ("w", "b")
        )

    def _raw(self, name: str, head: int | None) -> torch.Tensor:
        return self.raw.get(name) if head is None else self.raw.get_head(name, head)

    def _raw_fresh(self, name: str) -> torch.Tensor:
        """``raw.get(name)`` that this module may edit in place (processing a whole tensor
        then needs no second copy of it: 0.4 GB less peak for a 50k × 2048 ``W_U``)."""
        fresh = getattr(self.raw, "get_fresh", None)
        return fresh(name) if fresh is not None else self.raw.get(name).clone()

    def _norm(self, prefix: str) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The (gain, bias) of the norm named ``prefix`` that processing folds away."""
        p = self.plan
        # OLMo2 has no norm before its sublayers: nothing to fold there.
        w = self._cached(f"~{prefix}.w", None) if p.fold_norm_gain and self.raw.has(f"{prefix}.w") else None
        b = None
        if p.fold_norm_bias and self.raw.has(f"{prefix}.b"):
            b = self._cached(f"~{prefix}.b", None)
        return w, b

    def _compute(self, name: str, head: int | None) -> torch.Tensor:
        import torch

        if name.startswith("~"):  # the raw norm vectors, cached like everything else
            return self.raw.get(name[1:])
        if self._is_folded_norm(name):
            raise MissingTensorError(self.path, f"{name!r} is folded into the next weights (processed model)")
        layer, module, leaf = _split(name)
        p = self.plan

        with torch.no_grad():
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

    def _attn(self, layer: int | None, leaf: str, head: int | None) -> torch.Tensor:
        """Attention weights of one layer (``head`` None: all heads stacked on dim 0)."""
        import torch

        p = self.plan
        pre = f"blocks.{layer}.attn"
        if leaf in ("W_Q", "W_K", "W_V"):
            # LN(x) W = n(x) diag(w) W + b W: scale the rows, then drop their d_model mean.
            W = self._raw(f"{pre}.{leaf}", head)
            w, _ = self._norm(f"blocks.{layer}.ln1")
            if w is not None:
                W = W * w[:, None]
            return _center(W, -2) if p.center_reading else W
        if leaf in ("b_Q", "b_K", "b_V"):
            if leaf == "b_V" and p.fold_value_biases:  # moved into b_O (below)
                shape = (self.cfg.d_head,) if head is not None else (self.cfg.n_heads, self.cfg.d_head)
                return torch.zeros(shape)
            return self._folded_bias(layer, leaf, head)
        if leaf == "W_O":
            W_O = self._raw(f"{pre}.W_O", head)
            return _center(W_O, -1) if p.center_writing else W_O
        if leaf == "b_O":
            b_O = self._raw(f"{pre}.b_O", None)
            if p.center_writing:
                b_O = _center(b_O, -1)
            if p.fold_value_biases:
                # Pattern rows sum to 1, so head h always adds b_V[h] W_O[h]: move it to b_O.
                b_V = self._folded_bias(layer, "b_V", None)  # [n_heads, d_head]
                W_O = self._cached(f"{pre}.W_O", None)  # processed: [n_heads, d_head, d_model]
                b_O = b_O + torch.einsum("he,hem->m", b_V, W_O)
            return b_O
        return self._raw(f"{pre}.{leaf}", head)

    def _folded_bias(self, layer: int | None, leaf: str, head: int | None) -> torch.Tensor:
        """b_Q/b_K/b_V with the ln1 bias folded in: b + ln1.b @ W (W before scaling)."""
        pre = f"blocks.{layer}.attn"
        b = self._raw(f"{pre}.{leaf}", head)
        _, ln_b = self._norm(f"blocks.{layer}.ln1")
        if ln_b is None:
            return b
        W = self._raw(f"{pre}.W_{leaf[-1]}", head)  # [(h,) d_model, d_head]
        return b + ln_b @ W

    def _mlp_reader(self, layer: int | None, leaf: str) -> torch.Tensor:
        p = self.plan
        pre = f"blocks.{layer}.mlp"
        w, ln_b = self._norm(f"blocks.{layer}.ln2")
        if leaf == "b_in":
            b_in = self._raw(f"{pre}.b_in", None)
            return b_in if ln_b is None else b_in + ln_b @ self._raw(f"{pre}.W_in", None)
        W = self._raw(f"{pre}.{leaf}", None)  # [d_model, d_mlp]
        if w is not None:
            W = W * w[:, None]
        # TransformerLens centres W_in only (never W_gate): match it.
        return _center(W, 0) if (p.center_reading and leaf == "W_in") else W

    def _moe_reader(self, name: str) -> torch.Tensor:
        """Mixtral's router and experts read the ln2 output: its (RMSNorm) gain scales their
        rows, exactly as for a dense gated MLP."""
        W = self._raw(name, None)
        w, _ = self._norm(f"blocks.{name.split('.')[1]}.ln2")
        return W * w[:, None] if w is not None else W

    def _unembed(self, leaf: str) -> torch.Tensor:
        p = self.plan
        w, ln_b = self._norm("ln_final")
        if leaf == "W_U":
            # [d_model, d_vocab], the largest tensor: one fresh copy, edited in place
            W_U = self._raw_fresh("unembed.W_U")
            if w is not None:
                W_U.mul_(w[:, None])
            if p.center_reading:
                _center_(W_U, 0)
            return _center_(W_U, -1) if p.center_unembed else W_U
        if leaf == "b_U":
            b_U = self._raw("unembed.b_U", None)
            if ln_b is not None:
                b_U = b_U + ln_b @ self._raw("unembed.W_U", None)
            return _center(b_U, -1) if p.center_unembed else b_U
        return self._raw(f"unembed.{leaf}", None)
