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
    Adapted,
    Heads,
    SpecMap,
    Whole,
    Zeros,
    decoder_config,
    embed_specs,
    first_prefix,
    get_key,
    linear_out_heads,
    mlp_specs,
    norm_specs,
    optional_bool,
    optional_float,
    vec,
)

ARCHITECTURES = ("GPTNeoXForCausalLM", "GPTNeoXModel")
MODEL_TYPES = ("gpt_neox",)


def adapt(config: Mapping[str, Any], arch: str, names: set[str], path: str | None) -> Adapted:
    prefix = first_prefix(names, ("gpt_neox.", ""), "embed_in.weight")
    tied = "embed_out.weight" not in names
    cfg = decoder_config(
        config, arch, names, path,
        family="neox",
        act_fn=get_key(config, "hidden_act", default="gelu"),
        norm_eps=optional_float(config, path, "layer_norm_eps", default=1e-5),
        rope=0.25,
        parallel_attn_mlp=optional_bool(config, path, "use_parallel_residual", True),
        tied_unembed=tied,
    )  # fmt: skip
    bias = optional_bool(config, path, "attention_bias", True)
    return cfg, specs(cfg, prefix or "gpt_neox.", tied, bias)


def specs(cfg: ModelConfig, p: str, tied: bool, bias: bool) -> SpecMap:
    dm, dh, n = cfg.d_model, cfg.d_head, cfg.n_heads
    out: SpecMap = {
        **embed_specs(cfg, f"{p}embed_in.weight", tied),
        **norm_specs("ln_final", f"{p}final_layer_norm", dm),
    }
    if not tied:
        out["unembed.W_U"] = Whole("embed_out.weight", (cfg.d_vocab, dm), transpose=True)
    for layer in range(cfg.n_layers):
        b, a = f"{p}layers.{layer}.", f"blocks.{layer}."
        qkv = f"{b}attention.query_key_value"
        for i, x in enumerate("QKV"):
            out[f"{a}attn.W_{x}"] = Heads(
                f"{qkv}.weight", (3 * dm, dm), axis=0, offset=i * dh, stride=3 * dh, size=dh,
                transpose=True,
            )  # fmt: skip
            out[f"{a}attn.b_{x}"] = (
                Heads(f"{qkv}.bias", (3 * dm,), axis=0, offset=i * dh, stride=3 * dh, size=dh)
                if bias
                else Zeros((n, dh))
            )
        out[f"{a}attn.W_O"] = linear_out_heads(f"{b}attention.dense.weight", cfg)
        out[f"{a}attn.b_O"] = vec(f"{b}attention.dense.bias", dm) if bias else Zeros((dm,))
        out |= norm_specs(f"{a}ln1", f"{b}input_layernorm", dm)
        out |= norm_specs(f"{a}ln2", f"{b}post_attention_layernorm", dm)
        out |= mlp_specs(a, cfg, f"{b}mlp.dense_h_to_4h", f"{b}mlp.dense_4h_to_h")
    return out
