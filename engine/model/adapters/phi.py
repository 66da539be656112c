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
    optional_bool,
    optional_float,
    require_int,
)

ARCHITECTURES = ("PhiForCausalLM", "PhiModel")
MODEL_TYPES = ("phi",)


def adapt(config: Mapping[str, Any], arch: str, names: set[str], path: str | None) -> Adapted:
    qk_layernorm = optional_bool(config, path, "qk_layernorm", False)
    prefix = first_prefix(names, ("model.", ""), "embed_tokens.weight")
    tied = "lm_head.weight" not in names
    cfg = decoder_config(
        config, arch, names, path,
        family="phi",
        n_kv_heads=require_int(config, path, "num_key_value_heads", "num_attention_heads"),
        act_fn=get_key(config, "hidden_act", default="gelu_new"),
        norm_eps=optional_float(config, path, "layer_norm_eps", default=1e-5),
        rope=0.5,
        parallel_attn_mlp=True,
        tied_unembed=tied,
        extra={"qk_norm": "layer" if qk_layernorm else None},
    )  # fmt: skip
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
    dm = cfg.d_model
    out: SpecMap = {
        **embed_specs(cfg, f"{p}embed_tokens.weight", tied, unembed_bias=unembed_bias),
        **norm_specs("ln_final", f"{p}final_layernorm", dm),
    }
    for layer in range(cfg.n_layers):
        b, a = f"{p}layers.{layer}.", f"blocks.{layer}."
        att = f"{b}self_attn."
        out |= attention_specs(a, cfg, f"{att}q_proj", f"{att}k_proj", f"{att}v_proj", f"{att}dense",
                               qkv_bias=True, o_bias=True, grouped=True)
        # one LayerNorm read by both branches
        out |= norm_specs(f"{a}ln1", f"{b}input_layernorm", dm) | norm_specs(f"{a}ln2", f"{b}input_layernorm", dm)
        out |= mlp_specs(a, cfg, f"{b}mlp.fc1", f"{b}mlp.fc2")
    return out
