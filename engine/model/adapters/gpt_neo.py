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
    SpecMap,
    Whole,
    Zeros,
    checked,
    divide_heads,
    first_prefix,
    get_key,
    linear,
    linear_heads,
    linear_out_heads,
    optional_float,
    require_int,
    vec,
)

ARCHITECTURES = ("GPTNeoForCausalLM", "GPTNeoModel")
MODEL_TYPES = ("gpt_neo",)


def adapt(
    config: Mapping[str, Any], arch: str, names: set[str], path: str | None
) -> tuple[ModelConfig, SpecMap]:
    d_model = require_int(config, path, "hidden_size")
    n_heads = require_int(config, path, "num_heads", "num_attention_heads")
    n_layers = require_int(config, path, "num_layers", "num_hidden_layers")
    prefix = first_prefix(names, ("transformer.", ""), "wte.weight")
    tied = not (prefix is not None and "lm_head.weight" in names)
    cfg = ModelConfig(
        family="gpt_neo",
        architecture=arch,
        n_layers=n_layers,
        n_heads=n_heads,
        d_model=d_model,
        d_head=divide_heads(path, d_model, n_heads),
        d_vocab=require_int(config, path, "vocab_size"),
        n_ctx=require_int(config, path, "max_position_embeddings"),
        d_mlp=get_key(config, "intermediate_size") or 4 * d_model,
        act_fn=get_key(config, "activation_function", default="gelu_new"),
        normalization="LN",
        norm_eps=optional_float(config, path, "layer_norm_epsilon", default=1e-5),
        positional="learned",
        attn_scale=1.0,
        tied_unembed=tied,
        extra={
            "layer_types": _layer_types(config, n_layers, path),
            "sliding_window": require_int(config, path, "window_size") if "window_size" in config else 256,
        },
    )
    checked(cfg, names, path)
    return cfg, specs(cfg, prefix or "transformer.", tied)


def _layer_types(config: Mapping[str, Any], n_layers: int, path: str | None) -> list[str]:
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
    dm, dh, n = cfg.d_model, cfg.d_head, cfg.n_heads
    mlp = cfg.d_mlp or 4 * dm
    out: SpecMap = {
        "embed.W_E": Whole(f"{p}wte.weight", (cfg.d_vocab, dm)),
        "pos_embed.W_pos": Whole(f"{p}wpe.weight", (cfg.n_ctx, dm)),
        "ln_final.w": vec(f"{p}ln_f.weight", dm),
        "ln_final.b": vec(f"{p}ln_f.bias", dm),
        "unembed.W_U": Whole(f"{p}wte.weight", (cfg.d_vocab, dm), transpose=True)
        if tied
        else Whole("lm_head.weight", (cfg.d_vocab, dm), transpose=True),
        "unembed.b_U": Zeros((cfg.d_vocab,)),
    }
    for layer in range(cfg.n_layers):
        b, a = f"{p}h.{layer}.", f"blocks.{layer}."
        for x in "QKV":
            out[f"{a}attn.W_{x}"] = linear_heads(f"{b}attn.attention.{x.lower()}_proj.weight", cfg, n)
            out[f"{a}attn.b_{x}"] = Zeros((n, dh))
        out[f"{a}attn.W_O"] = linear_out_heads(f"{b}attn.attention.out_proj.weight", cfg)
        out[f"{a}attn.b_O"] = vec(f"{b}attn.attention.out_proj.bias", dm)
        for ln, hf in (("ln1", "ln_1"), ("ln2", "ln_2")):
            out[f"{a}{ln}.w"] = vec(f"{b}{hf}.weight", dm)
            out[f"{a}{ln}.b"] = vec(f"{b}{hf}.bias", dm)
        out[f"{a}mlp.W_in"] = linear(f"{b}mlp.c_fc.weight", dm, mlp)
        out[f"{a}mlp.b_in"] = vec(f"{b}mlp.c_fc.bias", mlp)
        out[f"{a}mlp.W_out"] = linear(f"{b}mlp.c_proj.weight", mlp, dm)
        out[f"{a}mlp.b_out"] = vec(f"{b}mlp.c_proj.bias", dm)
    return out
