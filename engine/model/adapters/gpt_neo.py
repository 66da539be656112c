"""GPT-Neo (``GPTNeoForCausalLM`` / ``GPTNeoModel``).

Like GPT-2 (learned positions, LayerNorm, GELU MLP, tied unembedding) but with separate
``q_proj``/``k_proj``/``v_proj`` ``nn.Linear`` projections without bias, an ``out_proj``
with bias, attention scores *not* divided by √d_head (``attn_scale`` 1), and local layers
(``config.attention_layers``: ``"local"``) that see only the last ``window_size`` tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headscope.engine.core.config import ModelConfig
from headscope.engine.core.errors import ConfigError
from headscope.engine.model.adapters.base import (
    Adapted,
    SpecMap,
    Whole,
    attention_specs,
    decoder_config,
    embed_specs,
    first_prefix,
    get_key,
    mlp_specs,
    norm_specs,
    optional_float,
    require_int,
)

ARCHITECTURES = ("GPTNeoForCausalLM", "GPTNeoModel")
MODEL_TYPES = ("gpt_neo",)


def adapt(config: Mapping[str, Any], arch: str, names: set[str], path: str | None) -> Adapted:
    d_model = require_int(config, path, "hidden_size")
    n_layers = require_int(config, path, "num_layers", "num_hidden_layers")
    prefix = first_prefix(names, ("transformer.", ""), "wte.weight")
    tied = not (prefix is not None and "lm_head.weight" in names)
    cfg = decoder_config(
        config, arch, names, path,
        family="gpt_neo",
        n_layers=n_layers,
        n_heads=require_int(config, path, "num_heads", "num_attention_heads"),
        d_model=d_model,
        d_mlp=get_key(config, "intermediate_size") or 4 * d_model,
        act_fn=get_key(config, "activation_function", default="gelu_new"),
        norm_eps=optional_float(config, path, "layer_norm_epsilon", default=1e-5),
        attn_scale=1.0,
        tied_unembed=tied,
        extra={
            "layer_types": _attention_layers(config, n_layers, path),
            "sliding_window": require_int(config, path, "window_size") if "window_size" in config else 256,
        },
    )  # fmt: skip
    return cfg, specs(cfg, prefix or "transformer.", tied)


def _attention_layers(config: Mapping[str, Any], n_layers: int, path: str | None) -> list[str]:
    """``attention_layers`` (``"global"``/``"local"`` per layer), or its compressed form
    ``attention_types`` (``[[["global", "local"], 12]]``), as Hugging Face names the kinds."""
    layers = config.get("attention_layers")
    if not isinstance(layers, list) or not layers:
        layers = []
        for item in config.get("attention_types") or []:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], list)
                    and isinstance(item[1], int) and 0 <= item[1] <= n_layers):
                raise ConfigError(path, f"config field attention_types is malformed: {item!r}")
            layers.extend(item[0] * item[1])
    if len(layers) != n_layers or any(kind not in ("global", "local") for kind in layers):
        raise ConfigError(
            path, f"attention_layers must give 'global' or 'local' for each of the {n_layers} layers"
        )
    return ["sliding_attention" if kind == "local" else "full_attention" for kind in layers]


def specs(cfg: ModelConfig, p: str, tied: bool) -> SpecMap:
    dm = cfg.d_model
    out: SpecMap = {
        **embed_specs(cfg, f"{p}wte.weight", tied),
        "pos_embed.W_pos": Whole(f"{p}wpe.weight", (cfg.n_ctx, dm)),
        **norm_specs("ln_final", f"{p}ln_f", dm),
    }
    for layer in range(cfg.n_layers):
        b, a = f"{p}h.{layer}.", f"blocks.{layer}."
        att = f"{b}attn.attention."
        out |= attention_specs(a, cfg, f"{att}q_proj", f"{att}k_proj", f"{att}v_proj", f"{att}out_proj",
                               qkv_bias=False, o_bias=True)
        out |= norm_specs(f"{a}ln1", f"{b}ln_1", dm) | norm_specs(f"{a}ln2", f"{b}ln_2", dm)
        out |= mlp_specs(a, cfg, f"{b}mlp.c_fc", f"{b}mlp.c_proj")
    return out
