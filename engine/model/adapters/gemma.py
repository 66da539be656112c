"""Gemma 1, 2 and 3 (text): the Llama layout with Gemma's conventions.

- RMSNorm gains are stored as ``w`` and applied as ``1 + w``: the specs add the 1, so the
  canonical ``ln*.w`` are the real gains and fold like any RMSNorm gain (exact).
- The embeddings are multiplied by √d_model on the way in: canonical ``W_E`` is the scaled
  matrix (as in TransformerLens); the tied unembedding ``W_U`` is the unscaled ``W_Eᵀ``.
- GeGLU MLP (``gelu_pytorch_tanh`` gate).
- Gemma 2/3: a norm after each sublayer too (``post_attention_layernorm`` -> ``ln1_post``,
  ``pre_feedforward_layernorm`` -> ``ln2``, ``post_feedforward_layernorm`` -> ``ln2_post``),
  scores scaled by ``1/√query_pre_attn_scalar``, a sliding window on the layers
  ``layer_types`` marks ``sliding_attention``; Gemma 2 soft-caps the attention scores and the
  final logits (``c · tanh(x / c)``).
- Gemma 3: per-head q/k RMSNorm (``1 + w`` gains) before RoPE, and local layers rotate with
  their own base (``rope_parameters.sliding_attention`` / ``rope_local_base_freq``).

Soft-capping and q/k norms make attention scores non-bilinear in the residual stream; the
QK circuits leave them out (docs/math.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from headscope.engine.core.config import ModelConfig
from headscope.engine.core.errors import ConfigError
from headscope.engine.model.adapters import llama, qwen3
from headscope.engine.model.adapters.base import (
    Adapted,
    SpecMap,
    Whole,
    get_key,
    optional_float,
    vec,
)

ARCHITECTURES = (
    "GemmaForCausalLM",
    "GemmaModel",
    "Gemma2ForCausalLM",
    "Gemma2Model",
    "Gemma3ForCausalLM",
    "Gemma3TextModel",
)
MODEL_TYPES = ("gemma", "gemma2", "gemma3_text")


def _version(config: Mapping[str, Any], arch: str) -> int:
    kind = config.get("model_type")
    if arch.startswith("Gemma3") or kind == "gemma3_text":
        return 3
    if arch.startswith("Gemma2") or kind == "gemma2":
        return 2
    return 1


def adapt(config: Mapping[str, Any], arch: str, names: set[str], path: str | None) -> Adapted:
    version = _version(config, arch)
    if config.get("use_bidirectional_attention"):
        raise ConfigError(path, "use_bidirectional_attention=true (Gemma 3 encoder) is not supported")
    cfg, specs = llama.adapt(config, arch, names, path)
    extra = dict(cfg.extra)
    changes: dict[str, Any] = {"family": f"gemma{version if version > 1 else ''}", "act_fn": _act(config, version)}
    if version >= 2:
        changes["attn_scale"] = math.sqrt(
            _positive_float(config, path, "query_pre_attn_scalar", float(cfg.d_head))
        )
        extra["layer_types"] = _local_layers(config, cfg.n_layers, version, path)
        extra["post_attn_norm"] = True
        for key, name in (("attn_softcap", "attn_logit_softcapping"), ("final_softcap", "final_logit_softcapping")):
            extra[key] = _positive_float(config, path, name, None) if config.get(name) is not None else None
    if version == 3:
        full, local = _gemma3_rope(config, path)
        changes["rotary_base"] = float(full["rope_theta"])
        extra.update(rope_type=full.get("rope_type") or "default", rope_scaling=full, rope_local=local,
                     qk_norm="head")
    cfg = cfg.replace(extra=extra, **changes)
    return cfg, _gemma_specs(cfg, specs, llama.prefix_of(names), version)


def _positive_float(config: Mapping[str, Any], path: str | None, key: str, default: float | None) -> float:
    value = optional_float(config, path, key, default=default if default is not None else 0.0)
    if value <= 0:
        raise ConfigError(path, f"config field {key} must be > 0, got {value!r}")
    return value


def _act(config: Mapping[str, Any], version: int) -> str:
    if version == 1:
        act = get_key(config, "hidden_act", default="gelu_pytorch_tanh")
        return "gelu_pytorch_tanh" if act == "gelu" else act  # as transformers reads old configs
    return get_key(config, "hidden_activation", default="gelu_pytorch_tanh")


def _local_layers(config: Mapping[str, Any], n_layers: int, version: int, path: str | None) -> list[str]:
    types = qwen3.layer_types(config, n_layers, path)
    if types is not None:
        return types
    # transformers' defaults: Gemma 2 alternates local/global, Gemma 3 has one global in 6
    every = 2 if version == 2 else config.get("sliding_window_pattern") or 6
    every = every if isinstance(every, int) and every > 0 else 6
    return ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(n_layers)]


def _gemma3_rope(config: Mapping[str, Any], path: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(global, local) RoPE parameters, from ``rope_parameters`` per layer kind (transformers
    ≥ 5) or the older ``rope_theta`` / ``rope_scaling`` / ``rope_local_base_freq``."""
    params = config.get("rope_parameters")
    full: dict[str, Any] = {}
    local: dict[str, Any] = {}
    if isinstance(params, Mapping) and isinstance(params.get("full_attention"), Mapping):
        full = dict(params["full_attention"])
        local = dict(params.get("sliding_attention") or {})
    elif isinstance(config.get("rope_scaling"), Mapping):
        full = dict(config["rope_scaling"])
    full.setdefault("rope_theta", optional_float(config, path, "rope_theta", default=1_000_000.0))
    local.setdefault(
        "rope_theta", optional_float(config, path, "rope_local_base_freq", default=10_000.0)
    )
    for kind, p in (("global", full), ("local", local)):
        theta = p.get("rope_theta")
        if isinstance(theta, bool) or not isinstance(theta, int | float) or not theta > 0:
            raise ConfigError(path, f"Gemma 3 {kind} rope_theta must be a positive number, got {theta!r}")
        if p.get("type") and not p.get("rope_type"):
            p["rope_type"] = p["type"]
    return full, local


def _plus_one(spec: Any) -> Whole:
    return dataclasses.replace(spec, add=1.0)


def _gemma_specs(cfg: ModelConfig, specs: SpecMap, p: str, version: int) -> SpecMap:
    dm, dh = cfg.d_model, cfg.d_head
    specs["embed.W_E"] = dataclasses.replace(specs["embed.W_E"], scale=math.sqrt(dm))
    specs["ln_final.w"] = _plus_one(specs["ln_final.w"])
    for layer in range(cfg.n_layers):
        b, a = f"{p}layers.{layer}.", f"blocks.{layer}."
        specs[f"{a}ln1.w"] = _plus_one(specs[f"{a}ln1.w"])
        if version == 1:
            specs[f"{a}ln2.w"] = _plus_one(specs[f"{a}ln2.w"])
            continue
        specs[f"{a}ln1_post.w"] = _plus_one(vec(f"{b}post_attention_layernorm.weight", dm))
        specs[f"{a}ln2.w"] = _plus_one(vec(f"{b}pre_feedforward_layernorm.weight", dm))
        specs[f"{a}ln2_post.w"] = _plus_one(vec(f"{b}post_feedforward_layernorm.weight", dm))
        if version == 3:
            specs[f"{a}attn.q_norm.w"] = _plus_one(vec(f"{b}self_attn.q_norm.weight", dh))
            specs[f"{a}attn.k_norm.w"] = _plus_one(vec(f"{b}self_attn.k_norm.weight", dh))
    return specs
