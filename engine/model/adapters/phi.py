"""Phi-1 / Phi-1.5 / Phi-2 (``PhiForCausalLM``).

One LayerNorm (``input_layernorm``) feeds attention and the MLP in parallel:
``x + attn(LN(x)) + mlp(LN(x))``; canonically ``ln1`` and ``ln2`` both name that LayerNorm, so
the forward pass and the weight processing need nothing new (its gain and bias are folded into
``W_Q/W_K/W_V`` and ``W_in`` alike). ``q_proj/k_proj/v_proj`` and the output projection
``dense`` have biases (``dense``'s is ``b_O``); the MLP is ``fc2(gelu_new(fc1(x)))`` with
biases; ``lm_head`` has a bias (``b_U``). Rotate-half RoPE on the first
``partial_rotary_factor * d_head`` dims (0.5 for Phi-1/2). ``qk_layernorm`` (off in the
released models): a LayerNorm with gain and bias over ``d_head`` on each head's query and key
before RoPE (``attn.q_norm.w/b``, ``attn.k_norm.w/b``, ``extra["qk_norm"] = "layer"``), which
the QK circuits leave out (flagged, docs/math.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headscope.engine.core.config import ModelConfig
from headscope.engine.model.adapters.base import (
    SpecMap,
    Whole,
    Zeros,
    checked,
    divide_heads,
    first_prefix,
    get_key,
    linear,
    linear_bias_heads,
    linear_heads,
    linear_out_heads,
    optional_bool,
    optional_float,
    require_int,
    rope_scaling_params,
    vec,
)

ARCHITECTURES = ("PhiForCausalLM", "PhiModel")
MODEL_TYPES = ("phi",)


def adapt(
    config: Mapping[str, Any], arch: str, names: set[str], path: str | None
) -> tuple[ModelConfig, SpecMap]:
    qk_layernorm = optional_bool(config, path, "qk_layernorm", False)
    d_model = require_int(config, path, "hidden_size")
    n_heads = require_int(config, path, "num_attention_heads")
    d_head = divide_heads(path, d_model, n_heads)
    pct = optional_float(
        config, path, "rope_parameters.partial_rotary_factor", "partial_rotary_factor", default=0.5
    )
    prefix = first_prefix(names, ("model.", ""), "embed_tokens.weight")
    tied = "lm_head.weight" not in names
    cfg = ModelConfig(
        family="phi",
        architecture=arch,
        n_layers=require_int(config, path, "num_hidden_layers"),
        n_heads=n_heads,
        n_kv_heads=require_int(config, path, "num_key_value_heads", "num_attention_heads"),
        d_model=d_model,
        d_head=d_head,
        d_vocab=require_int(config, path, "vocab_size"),
        n_ctx=require_int(config, path, "max_position_embeddings"),
        d_mlp=require_int(config, path, "intermediate_size"),
        act_fn=get_key(config, "hidden_act", default="gelu_new"),
        normalization="LN",
        norm_eps=optional_float(config, path, "layer_norm_eps", default=1e-5),
        positional="rotary",
        rotary_dim=int(d_head * pct),
        rotary_base=optional_float(
            config, path, "rope_parameters.rope_theta", "rope_theta", default=10000.0
        ),
        parallel_attn_mlp=True,
        tied_unembed=tied,
        extra={
            "rotary_style": "half",
            "qk_norm": "layer" if qk_layernorm else None,
            "rope_scaling": rope_scaling_params(config),
            "rope_type": get_key(
                config, "rope_parameters.rope_type", "rope_scaling.rope_type", "rope_scaling.type",
                default="default",
            ),
        },
    )
    checked(cfg, names, path)
    out = specs(cfg, prefix or "model.", tied, "lm_head.bias" in names)
    if qk_layernorm:
        p = prefix or "model."
        for layer in range(cfg.n_layers):
            for n in ("q", "k"):
                for leaf, short in (("weight", "w"), ("bias", "b")):
                    out[f"blocks.{layer}.attn.{n}_norm.{short}"] = Whole(
                        f"{p}layers.{layer}.self_attn.{n}_layernorm.{leaf}", (cfg.d_head,))
    return cfg, out


def specs(cfg: ModelConfig, p: str, tied: bool, unembed_bias: bool) -> SpecMap:
    dm, n, kv = cfg.d_model, cfg.n_heads, cfg.kv_heads
    mlp = cfg.d_mlp or 4 * dm
    out: SpecMap = {
        "embed.W_E": Whole(f"{p}embed_tokens.weight", (cfg.d_vocab, dm)),
        "ln_final.w": vec(f"{p}final_layernorm.weight", dm),
        "ln_final.b": vec(f"{p}final_layernorm.bias", dm),
        "unembed.W_U": Whole(f"{p}embed_tokens.weight", (cfg.d_vocab, dm), transpose=True)
        if tied
        else Whole("lm_head.weight", (cfg.d_vocab, dm), transpose=True),
        "unembed.b_U": vec("lm_head.bias", cfg.d_vocab) if unembed_bias else Zeros((cfg.d_vocab,)),
    }
    for layer in range(cfg.n_layers):
        b, a = f"{p}layers.{layer}.", f"blocks.{layer}."
        for x, proj, stored in (("Q", "q_proj", n), ("K", "k_proj", kv), ("V", "v_proj", kv)):
            is_kv = x != "Q"
            out[f"{a}attn.W_{x}"] = linear_heads(f"{b}self_attn.{proj}.weight", cfg, stored, kv=is_kv)
            out[f"{a}attn.b_{x}"] = linear_bias_heads(f"{b}self_attn.{proj}.bias", cfg, stored, kv=is_kv)
        out[f"{a}attn.W_O"] = linear_out_heads(f"{b}self_attn.dense.weight", cfg)
        out[f"{a}attn.b_O"] = vec(f"{b}self_attn.dense.bias", dm)
        for ln in ("ln1", "ln2"):  # one LayerNorm read by both branches
            out[f"{a}{ln}.w"] = vec(f"{b}input_layernorm.weight", dm)
            out[f"{a}{ln}.b"] = vec(f"{b}input_layernorm.bias", dm)
        out[f"{a}mlp.W_in"] = linear(f"{b}mlp.fc1.weight", dm, mlp)
        out[f"{a}mlp.b_in"] = vec(f"{b}mlp.fc1.bias", mlp)
        out[f"{a}mlp.W_out"] = linear(f"{b}mlp.fc2.weight", mlp, dm)
        out[f"{a}mlp.b_out"] = vec(f"{b}mlp.fc2.bias", dm)
    return out
