"""Qwen3 and OLMo2: the Llama layout plus an RMSNorm of the queries and keys.

- Qwen3 normalises each head's query and key over ``d_head`` (``self_attn.q_norm.weight``,
  ``k_norm.weight``: ``[d_head]``, shared by the heads) before RoPE; no Q/K/V bias.
- OLMo2 normalises the whole projection at once (``q_norm.weight`` ``[n_heads * d_head]``,
  ``k_norm.weight`` ``[n_kv_heads * d_head]``, cut into per-head gains here) and has no norm
  before its sublayers: ``post_attention_layernorm`` / ``post_feedforward_layernorm`` act on
  the sublayer outputs before the residual add (canonical ``ln1_post`` / ``ln2_post``).

Either way attention scores are no longer bilinear in the residual stream: the QK circuits
use ``W_Q``, ``W_K`` without the q/k norm, as TransformerLens does (docs/math.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headscope.engine.core.errors import ConfigError
from headscope.engine.model.adapters import llama
from headscope.engine.model.adapters.base import Adapted, Whole, linear_bias_heads, vec

ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen3Model", "Olmo2ForCausalLM", "Olmo2Model")
MODEL_TYPES = ("qwen3", "olmo2")


def adapt(config: Mapping[str, Any], arch: str, names: set[str], path: str | None) -> Adapted:
    olmo = arch.startswith("Olmo2") or config.get("model_type") == "olmo2"
    cfg, specs = llama.adapt(config, arch, names, path)
    extra = {**cfg.extra, "layer_types": layer_types(config, cfg.n_layers, path) or cfg.extra.get("layer_types")}
    extra["qk_norm"] = "projection" if olmo else "head"
    if olmo:
        extra.update(pre_norm=False, post_attn_norm=True)
    cfg = cfg.replace(family="olmo2" if olmo else "qwen3", extra=extra)
    p = llama.prefix_of(names)
    for layer in range(cfg.n_layers):
        b, a = f"{p}layers.{layer}.", f"blocks.{layer}."
        if olmo:
            del specs[f"{a}ln1.w"]
            specs[f"{a}ln1_post.w"] = vec(f"{b}post_attention_layernorm.weight", cfg.d_model)
            specs[f"{a}ln2_post.w"] = vec(f"{b}post_feedforward_layernorm.weight", cfg.d_model)
            del specs[f"{a}ln2.w"]
            specs[f"{a}attn.q_norm.w"] = linear_bias_heads(f"{b}self_attn.q_norm.weight", cfg, cfg.n_heads)
            specs[f"{a}attn.k_norm.w"] = linear_bias_heads(
                f"{b}self_attn.k_norm.weight", cfg, cfg.kv_heads, kv=True
            )
        else:
            specs[f"{a}attn.q_norm.w"] = Whole(f"{b}self_attn.q_norm.weight", (cfg.d_head,))
            specs[f"{a}attn.k_norm.w"] = Whole(f"{b}self_attn.k_norm.weight", (cfg.d_head,))
    return cfg, specs


def layer_types(config: Mapping[str, Any], n_layers: int, path: str | None) -> list[str] | None:
    """Hugging Face's per-layer attention kinds (``"sliding_attention"`` / ``"full_attention"``),
    or None when the config has none."""
    types = config.get("layer_types")
    if types is None:
        return None
    if not (isinstance(types, list) and len(types) == n_layers and all(isinstance(t, str) for t in types)):
        raise ConfigError(path, f"config field layer_types must name the attention kind of each of the {n_layers} layers")
    return list(types)
