"""GPT-NeoX / Pythia (``GPTNeoXForCausalLM`` / ``GPTNeoXModel``).

``query_key_value`` is an ``nn.Linear`` ``[3 * d_model, d_model]`` whose output rows are
grouped *per head*: ``(head, {q, k, v}, d_head)``. So Q of head ``h`` is rows
``3 * d_head * h + [0, d_head)``, K the next ``d_head`` rows, V the next. Partial rotary
(``rotary_pct``, newer ``rope_parameters.partial_rotary_factor``) rotates the first
``int(d_head * pct)`` dims of each head, in the rotate-half layout; attention and MLP read
the same residual in parallel (``use_parallel_residual``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headscope.engine.core.config import ModelConfig
from headscope.engine.model.adapters.base import (
    Heads,
    SpecMap,
    Whole,
    Zeros,
    checked,
    divide_heads,
    first_prefix,
    get_key,
    linear,
    linear_out_heads,
    optional_bool,
    optional_float,
    require_int,
    rope_scaling_params,
    vec,
)

ARCHITECTURES = ("GPTNeoXForCausalLM", "GPTNeoXModel")
MODEL_TYPES = ("gpt_neox",)


def adapt(
    config: Mapping[str, Any], arch: str, names: set[str], path: str | None
) -> tuple[ModelConfig, SpecMap]:
    d_model = require_int(config, path, "hidden_size")
    n_heads = require_int(config, path, "num_attention_heads")
    d_head = divide_heads(path, d_model, n_heads)
    pct = optional_float(
        config,
        path,
        "rope_parameters.partial_rotary_factor",
        "rotary_pct",
        "partial_rotary_factor",
        default=0.25,
        within=(0.0, 1.0),
    )
    prefix = first_prefix(names, ("gpt_neox.", ""), "embed_in.weight")
    tied = "embed_out.weight" not in names
    cfg = ModelConfig(
        family="neox",
        architecture=arch,
        n_layers=require_int(config, path, "num_hidden_layers"),
        n_heads=n_heads,
        d_model=d_model,
        d_head=d_head,
        d_vocab=require_int(config, path, "vocab_size"),
        n_ctx=require_int(config, path, "max_position_embeddings"),
        d_mlp=require_int(config, path, "intermediate_size"),
        act_fn=get_key(config, "hidden_act", default="gelu"),
        normalization="LN",
        norm_eps=optional_float(config, path, "layer_norm_eps", default=1e-5),
        positional="rotary",
        rotary_dim=int(d_head * pct),  # as transformers computes rotary_ndims
        rotary_base=optional_float(
            config,
            path,
            "rope_parameters.rope_theta",
            "rope_theta",
            "rotary_emb_base",
            default=10000.0,
        ),
        parallel_attn_mlp=optional_bool(config, path, "use_parallel_residual", True),
        tied_unembed=tied,
        extra={
            "rotary_style": "half",
            # The scaling parameters (factor, low/high_freq_factor, ...) that
            # engine.model.rotary.rotary_inv_freq needs for "linear"/"llama3" RoPE.
            "rope_scaling": rope_scaling_params(config),
            "rope_type": get_key(
                config, "rope_parameters.rope_type", "rope_scaling.rope_type", default="default"
            ),
        },
    )
    checked(cfg, names, path)
    bias = optional_bool(config, path, "attention_bias", True)
    return cfg, specs(cfg, prefix or "gpt_neox.", tied, bias)


def specs(cfg: ModelConfig, p: str, tied: bool, bias: bool) -> SpecMap:
    dm, dh, n = cfg.d_model, cfg.d_head, cfg.n_heads
    mlp = cfg.d_mlp or 4 * dm
    out: SpecMap = {
        "embed.W_E": Whole(f"{p}embed_in.weight", (cfg.d_vocab, dm)),
        "ln_final.w": vec(f"{p}final_layer_norm.weight", dm),
        "ln_final.b": vec(f"{p}final_layer_norm.bias", dm),
        "unembed.W_U": Whole(f"{p}embed_in.weight", (cfg.d_vocab, dm), transpose=True)
        if tied
        else Whole("embed_out.weight", (cfg.d_vocab, dm), transpose=True),
        "unembed.b_U": Zeros((cfg.d_vocab,)),
    }
    for layer in range(cfg.n_layers):
        b, a = f"{p}layers.{layer}.", f"blocks.{layer}."
        qkv = f"{b}attention.query_key_value"
        for i, x in enumerate("QKV"):
            out[f"{a}attn.W_{x}"] = Heads(
                f"{qkv}.weight",
                (3 * dm, dm),
                axis=0,
                offset=i * dh,
                stride=3 * dh,
                size=dh,
                transpose=True,
            )
            out[f"{a}attn.b_{x}"] = (
                Heads(f"{qkv}.bias", (3 * dm,), axis=0, offset=i * dh, stride=3 * dh, size=dh)
                if bias
                else Zeros((n, dh))
            )
        out[f"{a}attn.W_O"] = linear_out_heads(f"{b}attention.dense.weight", cfg)
        out[f"{a}attn.b_O"] = vec(f"{b}attention.dense.bias", dm) if bias else Zeros((dm,))
        out[f"{a}ln1.w"] = vec(f"{b}input_layernorm.weight", dm)
        out[f"{a}ln1.b"] = vec(f"{b}input_layernorm.bias", dm)
        out[f"{a}ln2.w"] = vec(f"{b}post_attention_layernorm.weight", dm)
        out[f"{a}ln2.b"] = vec(f"{b}post_attention_layernorm.bias", dm)
        out[f"{a}mlp.W_in"] = linear(f"{b}mlp.dense_h_to_4h.weight", dm, mlp)
        out[f"{a}mlp.b_in"] = vec(f"{b}mlp.dense_h_to_4h.bias", mlp)
        out[f"{a}mlp.W_out"] = linear(f"{b}mlp.dense_4h_to_h.weight", mlp, dm)
        out[f"{a}mlp.b_out"] = vec(f"{b}mlp.dense_4h_to_h.bias", dm)
    return out
