"""GPT-J (``GPTJForCausalLM`` / ``GPTJModel``).

A parallel block on one LayerNorm: ``x + attn(ln_1(x)) + mlp(ln_1(x))`` (canonical ``ln1`` and
``ln2`` both name ``ln_1``). ``q_proj/k_proj/v_proj/out_proj`` are bias-free ``nn.Linear``;
the MLP is ``fc_out(gelu_new(fc_in(x)))`` with biases; ``lm_head`` has a bias (``b_U``).

Rotary embeddings act on the first ``rotary_dim`` dims of each head (all of them if
``rotary_dim`` is null) in GPT-J's *interleaved* layout: dims ``(2i, 2i+1)`` form a pair
rotated by ``p·θ_i``. The Q and K heads are read with those dims reordered to the
rotate-half layout the engine uses (``Heads.deinterleave``): the same reordering of the
dims of every query and key leaves each score ``q·k`` unchanged, so patterns, QK circuits
and rotary profiles are those of the original model (docs/math.md, "Rotary layouts").
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
    Zeros,
    decoder_config,
    divide_heads,
    embed_specs,
    first_prefix,
    get_key,
    linear_out_heads,
    mlp_specs,
    norm_specs,
    optional_float,
    require_int,
)

ARCHITECTURES = ("GPTJForCausalLM", "GPTJModel")
MODEL_TYPES = ("gptj",)


def adapt(config: Mapping[str, Any], arch: str, names: set[str], path: str | None) -> Adapted:
    d_model = require_int(config, path, "n_embd", "hidden_size")
    n_heads = require_int(config, path, "n_head", "num_attention_heads")
    d_head = divide_heads(path, d_model, n_heads)
    rotary_dim = (
        require_int(config, path, "rotary_dim") if get_key(config, "rotary_dim") is not None else d_head
    )
    if rotary_dim % 2 or rotary_dim > d_head:
        raise ConfigError(path, f"rotary_dim must be even and <= d_head={d_head}, got {rotary_dim}")
    d_mlp = require_int(config, path, "n_inner") if get_key(config, "n_inner") is not None else 4 * d_model
    prefix = first_prefix(names, ("transformer.", ""), "wte.weight")
    tied = "lm_head.weight" not in names
    cfg = decoder_config(
        config, arch, names, path,
        family="gptj",
        n_layers=require_int(config, path, "n_layer", "num_hidden_layers"),
        n_heads=n_heads,
        d_model=d_model,
        d_head=d_head,
        n_ctx=require_int(config, path, "n_positions", "max_position_embeddings"),
        d_mlp=d_mlp,
        act_fn=get_key(config, "activation_function", default="gelu_new"),
        norm_eps=optional_float(config, path, "layer_norm_epsilon", default=1e-5),
        positional="rotary",
        rotary_dim=rotary_dim,
        rotary_base=10000.0,  # fixed in GPT-J's create_sinusoidal_positions
        parallel_attn_mlp=True,
        tied_unembed=tied,
        extra={"rotary_style": "half", "rotary_source_layout": "interleaved"},
    )  # fmt: skip
    return cfg, specs(cfg, prefix or "transformer.", tied, "lm_head.bias" in names)


def specs(cfg: ModelConfig, p: str, tied: bool, unembed_bias: bool) -> SpecMap:
    dm, dh, n = cfg.d_model, cfg.d_head, cfg.n_heads
    r = cfg.rotary_dim or dh
    out: SpecMap = {
        **embed_specs(cfg, f"{p}wte.weight", tied, unembed_bias=unembed_bias),
        **norm_specs("ln_final", f"{p}ln_f", dm),
    }
    for layer in range(cfg.n_layers):
        b, a = f"{p}h.{layer}.", f"blocks.{layer}."
        for x, proj in (("Q", "q_proj"), ("K", "k_proj"), ("V", "v_proj")):
            out[f"{a}attn.W_{x}"] = Heads(
                f"{b}attn.{proj}.weight", (n * dh, dm), axis=0, offset=0, stride=dh, size=dh,
                transpose=True, deinterleave=r if x != "V" else 0,
            )  # fmt: skip
            out[f"{a}attn.b_{x}"] = Zeros((n, dh))
        out[f"{a}attn.W_O"] = linear_out_heads(f"{b}attn.out_proj.weight", cfg)
        out[f"{a}attn.b_O"] = Zeros((dm,))
        # one LayerNorm read by both branches
        out |= norm_specs(f"{a}ln1", f"{b}ln_1", dm) | norm_specs(f"{a}ln2", f"{b}ln_1", dm)
        out |= mlp_specs(a, cfg, f"{b}mlp.fc_in", f"{b}mlp.fc_out")
    return out
