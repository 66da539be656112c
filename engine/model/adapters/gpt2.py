"""GPT-2 (``GPT2LMHeadModel`` / ``GPT2Model``).

GPT-2 stores its projections as ``Conv1D``: weights are ``[d_in, d_out]`` already in
row-vector orientation. ``c_attn`` fuses Q, K and V along the output axis
(``[d_model, 3 * d_model]``: all Q heads, then all K heads, then all V heads), so head
``h`` of Q is columns ``h * d_head : (h + 1) * d_head`` and of K the same shifted by
``d_model``. Hub checkpoints store the names without the ``transformer.`` prefix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headscope.engine.core.config import ModelConfig
from headscope.engine.core.errors import ConfigError
from headscope.engine.model.adapters.base import (
    Adapted,
    Heads,
    SpecMap,
    Whole,
    decoder_config,
    embed_specs,
    first_prefix,
    get_key,
    norm_specs,
    optional_bool,
    optional_float,
    require_int,
    vec,
)

ARCHITECTURES = ("GPT2LMHeadModel", "GPT2Model")
MODEL_TYPES = ("gpt2",)


def adapt(config: Mapping[str, Any], arch: str, names: set[str], path: str | None) -> Adapted:
    d_model = require_int(config, path, "n_embd", "hidden_size")
    n_heads = require_int(config, path, "n_head", "num_attention_heads")
    if config.get("scale_attn_by_inverse_layer_idx"):
        raise ConfigError(path, "scale_attn_by_inverse_layer_idx is not supported")
    prefix = first_prefix(names, ("transformer.", ""), "wte.weight")
    tied = not (prefix is not None and "lm_head.weight" in names)
    cfg = decoder_config(
        config, arch, names, path,
        family="gpt2",
        n_layers=require_int(config, path, "n_layer", "num_hidden_layers"),
        n_heads=n_heads,
        d_model=d_model,
        n_ctx=require_int(config, path, "n_positions", "n_ctx", "max_position_embeddings"),
        d_mlp=get_key(config, "n_inner") or 4 * d_model,
        act_fn=get_key(config, "activation_function", default="gelu_new"),
        norm_eps=optional_float(config, path, "layer_norm_epsilon", default=1e-5),
        attn_scale=None if optional_bool(config, path, "scale_attn_weights", True) else 1.0,
        tied_unembed=tied,
    )  # fmt: skip
    return cfg, specs(cfg, prefix or "transformer.", tied)


def specs(cfg: ModelConfig, p: str, tied: bool) -> SpecMap:
    dm, dh, n = cfg.d_model, cfg.d_head, cfg.n_heads
    mlp = cfg.d_mlp or 4 * dm
    out: SpecMap = {
        **embed_specs(cfg, f"{p}wte.weight", tied),
        "pos_embed.W_pos": Whole(f"{p}wpe.weight", (cfg.n_ctx, dm)),
        **norm_specs("ln_final", f"{p}ln_f", dm),
    }
    for layer in range(cfg.n_layers):
        b, a = f"{p}h.{layer}.", f"blocks.{layer}."
        for i, x in enumerate("QKV"):
            out[f"{a}attn.W_{x}"] = Heads(
                f"{b}attn.c_attn.weight", (dm, 3 * dm), axis=1, offset=i * dm, stride=dh, size=dh
            )
            out[f"{a}attn.b_{x}"] = Heads(
                f"{b}attn.c_attn.bias", (3 * dm,), axis=0, offset=i * dm, stride=dh, size=dh
            )
        out[f"{a}attn.W_O"] = Heads(
            f"{b}attn.c_proj.weight", (n * dh, dm), axis=0, offset=0, stride=dh, size=dh
        )
        out[f"{a}attn.b_O"] = vec(f"{b}attn.c_proj.bias", dm)
        out |= norm_specs(f"{a}ln1", f"{b}ln_1", dm) | norm_specs(f"{a}ln2", f"{b}ln_2", dm)
        # Conv1D: weights stored [d_in, d_out], already the canonical orientation
        out[f"{a}mlp.W_in"] = Whole(f"{b}mlp.c_fc.weight", (dm, mlp))
        out[f"{a}mlp.b_in"] = vec(f"{b}mlp.c_fc.bias", mlp)
        out[f"{a}mlp.W_out"] = Whole(f"{b}mlp.c_proj.weight", (mlp, dm))
        out[f"{a}mlp.b_out"] = vec(f"{b}mlp.c_proj.bias", dm)
    return out
