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
    optional_float,
    require_int,
    vec,
)

ARCHITECTURES = ("GPTJForCausalLM", "GPTJModel")
MODEL_TYPES = ("gptj",)


def adapt(
    config: Mapping[str, Any], arch: str, names: set[str], path: str | None
) -> tuple[ModelConfig, SpecMap]:
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
    cfg = ModelConfig(
        family="gptj",
        architecture=arch,
        n_layers=require_int(config, path, "n_layer", "num_hidden_layers"),
        n_heads=n_heads,
        d_model=d_model,
        d_head=d_head,
        d_vocab=require_int(config, path, "vocab_size"),
        n_ctx=require_int(config, path, "n_positions", "max_position_embeddings"),
        d_mlp=d_mlp,
        act_fn=get_key(config, "activation_function", default="gelu_new"),
        normalization="LN",
        norm_eps=optional_float(config, path, "layer_norm_epsilon", default=1e-5),
        positional="rotary",
        rotary_dim=rotary_dim,
        rotary_base=10000.0,  # fixed in GPT-J's create_sinusoidal_positions
        parallel_attn_mlp=True,
        tied_unembed=tied,
        extra={"rotary_style": "half", "rotary_source_layout": "interleaved"},
    )
    checked(cfg, names, path)
    return cfg, specs(cfg, prefix or "transformer.", tied, "lm_head.bias" in names)


def specs(cfg: ModelConfig, p: str, tied: bool, unembed_bias: bool) -> SpecMap:
    dm, dh, n = cfg.d_model, cfg.d_head, cfg.n_heads
    mlp = cfg.d_mlp or 4 * dm
    r = cfg.rotary_dim or dh
    out: SpecMap = {
        "embed.W_E": Whole(f"{p}wte.weight", (cfg.d_vocab, dm)),
        "ln_final.w": vec(f"{p}ln_f.weight", dm),
        "ln_final.b": vec(f"{p}ln_f.bias", dm),
        "unembed.W_U": Whole(f"{p}wte.weight", (cfg.d_vocab, dm), transpose=True)
        if tied
        else Whole("lm_head.weight", (cfg.d_vocab, dm), transpose=True),
        "unembed.b_U": vec("lm_head.bias", cfg.d_vocab) if unembed_bias else Zeros((cfg.d_vocab,)),
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
        for ln in ("ln1", "ln2"):  # one LayerNorm read by both branches
            out[f"{a}{ln}.w"] = vec(f"{b}ln_1.weight", dm)
            out[f"{a}{ln}.b"] = vec(f"{b}ln_1.bias", dm)
        out[f"{a}mlp.W_in"] = linear(f"{b}mlp.fc_in.weight", dm, mlp)
        out[f"{a}mlp.b_in"] = vec(f"{b}mlp.fc_in.bias", mlp)
        out[f"{a}mlp.W_out"] = linear(f"{b}mlp.fc_out.weight", mlp, dm)
        out[f"{a}mlp.b_out"] = vec(f"{b}mlp.fc_out.bias", dm)
    return out
