"""Move between headscope and TransformerLens-style state dicts.

headscope's canonical names *are* TransformerLens' ``HookedTransformer`` parameter names
(``blocks.0.attn.W_Q`` ``[n_heads, d_model, d_head]``, ``ln1.w``, ``unembed.W_U`` ...), so the
adapter is mostly a config translation:

- :func:`to_transformer_lens` gives ``(cfg_dict, state_dict)`` for
  ``HookedTransformer(HookedTransformerConfig(**cfg_dict))`` and
  ``model.load_state_dict(state_dict, strict=False)`` (processed weights come with
  ``normalization_type`` ``"LNPre"``/``"RMSPre"``, exactly what TransformerLens' own
  processing produces).
- :func:`from_transformer_lens` wraps a TransformerLens config + state dict as a
  headscope ``WeightSource``; :func:`save_native` writes any ``WeightSource`` in headscope's
  native safetensors layout so the explorer can open it.

Encoders (BERT) have no ``HookedTransformer`` counterpart and are refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from headscope.engine.core.config import ModelConfig
from headscope.engine.core.errors import InvalidRequestError
from headscope.engine.model.weights import DictWeights, WeightSource

_TO_TL_POS = {"learned": "standard", "rotary": "rotary"}
_FROM_TL_POS = {v: k for k, v in _TO_TL_POS.items()}
_GQA_NAMES = ("W_K", "W_V", "b_K", "b_V")


def tensor_names(cfg: ModelConfig) -> list[str]:
    """Every canonical tensor a decoder with this config has (biases included)."""
    names = ["embed.W_E", "unembed.W_U", "unembed.b_U"]
    if cfg.positional == "learned":
        names.append("pos_embed.W_pos")
    norm_has_params = cfg.normalization in ("LN", "RMS")
    norm_has_bias = cfg.normalization == "LN"
    for layer in range(cfg.n_layers):
        b = f"blocks.{layer}"
        names += [f"{b}.attn.{n}" for n in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")]
        norms = ["ln1"] if cfg.attn_only else ["ln1", "ln2"]
        if not cfg.attn_only:
            names += [f"{b}.mlp.{n}" for n in ("W_in", "b_in", "W_out", "b_out")]
            if cfg.gated_mlp:
                names.append(f"{b}.mlp.W_gate")
        if norm_has_params:
            names += [f"{b}.{n}.w" for n in norms]
        if norm_has_bias:
            names += [f"{b}.{n}.b" for n in norms]
    if norm_has_params:
        names.append("ln_final.w")
    if norm_has_bias:
        names.append("ln_final.b")
    return names


def _unexpanded(w: WeightSource, name: str) -> tuple[str, np.ndarray]:
    """GQA K/V tensors go back to ``_W_K`` ``[n_kv_heads, ...]`` as TransformerLens stores them."""
    cfg = w.cfg
    prefix, _, last = name.rpartition(".")
    if cfg.kv_heads != cfg.n_heads and last in _GQA_NAMES:
        group = cfg.n_heads // cfg.kv_heads
        return f"{prefix}._{last}", np.ascontiguousarray(w.get(name)[::group])
    return name, w.get(name)


def _check_decoder(cfg: ModelConfig) -> None:
    if cfg.post_ln or not cfg.causal:
        kind = "an encoder" if not cfg.causal else "post-LN (a norm after each residual add)"
        raise InvalidRequestError(
            None, f"{cfg.architecture} is {kind}; TransformerLens' HookedTransformer has no equivalent"
        )
    if cfg.positional not in _TO_TL_POS:
        raise InvalidRequestError(None, f"positional embedding {cfg.positional!r} has no TransformerLens equivalent")
    _check_plain_attention(cfg)


# Config features (``cfg.extra``) of Gemma 2/3, Qwen3, OLMo2 and GPT-Neo that neither this
# conversion nor the native layout carries: refuse rather than drop them silently.
_EXTRA_FEATURES = {
    "attn_softcap": "attention soft-capping",
    "final_softcap": "final logit soft-capping",
    "qk_norm": "q/k norms",
    "post_attn_norm": "norms after the sublayers",
    "rope_local": "per-layer RoPE bases",
    "layer_types": "per-layer sliding windows",
    "n_experts": "a mixture-of-experts MLP",
}


def _check_plain_attention(cfg: ModelConfig) -> None:
    found = [name for key, name in _EXTRA_FEATURES.items() if cfg.extra.get(key)
             and (key != "layer_types" or cfg.extra.get("sliding_window"))]
    if cfg.extra.get("pre_norm") is False:
        found.append("no norm before the sublayers")
    if cfg.extra.get("sliding_window") and not cfg.extra.get("layer_types"):
        found.append("a sliding window")
    if cfg.positional == "rotary" and (cfg.extra.get("rope_type") or "default") != "default":
        found.append(f"{cfg.extra['rope_type']} RoPE scaling")
    if found:
        raise InvalidRequestError(
            None, f"{cfg.architecture} uses {', '.join(found)}, which this conversion does not carry"
        )


def to_transformer_lens(w: WeightSource) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """``(HookedTransformerConfig kwargs, state dict)`` of the weights as headscope sees them
    (float32 numpy arrays, read-only: ``torch.tensor(a)`` each for ``load_state_dict``)."""
    cfg = w.cfg
    _check_decoder(cfg)
    tl_cfg: dict[str, Any] = {
        "n_layers": cfg.n_layers,
        "d_model": cfg.d_model,
        "n_ctx": cfg.n_ctx,
        "d_head": cfg.d_head,
        "n_heads": cfg.n_heads,
        "d_vocab": cfg.d_vocab,
        "d_mlp": cfg.d_mlp,
        "attn_only": cfg.attn_only,
        "act_fn": cfg.act_fn if not cfg.attn_only else None,
        "normalization_type": cfg.normalization,
        "eps": cfg.norm_eps,
        "positional_embedding_type": _TO_TL_POS[cfg.positional],
        "parallel_attn_mlp": cfg.parallel_attn_mlp,
        "gated_mlp": cfg.gated_mlp,
        "original_architecture": cfg.architecture,
    }
    if cfg.kv_heads != cfg.n_heads:
        tl_cfg["n_key_value_heads"] = cfg.kv_heads
    if cfg.positional == "rotary":
        tl_cfg["rotary_dim"] = cfg.rotary_dim or cfg.d_head
        tl_cfg["rotary_base"] = cfg.rotary_base
    if cfg.attn_scale is not None:
        tl_cfg["attn_scale"] = cfg.attn_scale
        tl_cfg["use_attn_scale"] = True
    state = dict(_unexpanded(w, name) for name in tensor_names(cfg) if w.has(name))
    return tl_cfg, state


def from_transformer_lens(
    tl_cfg: Mapping[str, Any], state_dict: Mapping[str, Any], *, name: str = "transformer-lens"
) -> DictWeights:
    """Wrap a TransformerLens config + state dict (tensors or arrays) as a headscope
    ``WeightSource``."""
    pos = tl_cfg.get("positional_embedding_type", "standard")
    if pos not in _FROM_TL_POS:
        raise InvalidRequestError(None, f"positional_embedding_type {pos!r} is not supported")
    n_heads = int(tl_cfg["n_heads"])
    attn_only = bool(tl_cfg.get("attn_only", False))
    cfg = ModelConfig(
        family="native",
        architecture=str(tl_cfg.get("original_architecture") or name),
        n_layers=int(tl_cfg["n_layers"]),
        n_heads=n_heads,
        n_kv_heads=tl_cfg.get("n_key_value_heads") or None,
        d_model=int(tl_cfg["d_model"]),
        d_head=int(tl_cfg["d_head"]),
        d_vocab=int(tl_cfg["d_vocab"]),
        n_ctx=int(tl_cfg["n_ctx"]),
        d_mlp=None if attn_only else int(tl_cfg["d_mlp"]),
        act_fn=tl_cfg.get("act_fn"),
        gated_mlp=bool(tl_cfg.get("gated_mlp", False)),
        normalization=tl_cfg.get("normalization_type", "LN"),
        norm_eps=float(tl_cfg.get("eps", 1e-5)),
        positional=_FROM_TL_POS[pos],
        rotary_dim=tl_cfg.get("rotary_dim"),
        rotary_base=float(tl_cfg.get("rotary_base", 10000)),
        parallel_attn_mlp=bool(tl_cfg.get("parallel_attn_mlp", False)),
        attn_scale=tl_cfg.get("attn_scale") if tl_cfg.get("use_attn_scale", True) else 1.0,
    )
    # TransformerLens keeps buffers (masks, rotary tables) in its state dict: drop them.
    wanted = set(tensor_names(cfg)) | {f"{n.rpartition('.')[0]}._{n.rpartition('.')[2]}" for n in tensor_names(cfg)}
    tensors = {k: v for k, v in state_dict.items() if k in wanted}  # DictWeights converts them
    return DictWeights(cfg, tensors, path=name)


def save_native(w: WeightSource, path: str | Path, *, vocab: list[str] | None = None) -> Path:
    """Write ``w`` in headscope's native layout (``model.safetensors`` + ``headscope.json``)."""
    from safetensors.numpy import save_file

    from headscope.engine.core.export import atomic_write_text, file_mode
    from headscope.engine.core.files import atomic_file

    cfg = w.cfg
    _check_decoder(cfg)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {k: np.ascontiguousarray(v) for k, v in (_unexpanded(w, n) for n in tensor_names(cfg) if w.has(n))}
    fields = cfg.to_dict()
    for derived in ("attn_only", "extra"):
        fields.pop(derived, None)
    fields["family"] = "native"  # the layout on disk; `architecture` keeps the origin
    blob = json.dumps(fields)
    with atomic_file(path / "model.safetensors", mode=file_mode()) as tmp:
        save_file(tensors, str(tmp), metadata={"headscope_config": blob})
    atomic_write_text(path / "headscope.json", blob)
    if vocab is not None:
        atomic_write_text(path / "vocab.txt", "\n".join(vocab) + "\n")
    return path
