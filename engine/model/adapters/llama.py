"""Llama, Mistral and Qwen2 (RoPE, RMSNorm, SwiGLU MLP, grouped-query attention).

``q_proj`` is ``nn.Linear`` ``[n_heads * d_head, d_model]``; ``k_proj``/``v_proj`` hold only
``n_kv_heads`` heads (query head ``h`` reads K/V head ``h // (n_heads // n_kv_heads)``).
Qwen2 always has Q/K/V biases; Llama has them (and an O bias) when ``attention_bias``.
A sliding window (Mistral; Qwen2 with ``use_sliding_window``) applies to every layer, or to
those ``layer_types`` / Qwen2's ``max_window_layers`` name (``window_layers``).
The unembedding is ``lm_head`` unless the embeddings are tied (``tie_word_embeddings``,
e.g. small Qwen2 models), in which case the checkpoint has no ``lm_head.weight``.
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
    linear_bias_heads,
    linear_heads,
    linear_out_heads,
    optional_bool,
    optional_float,
    require_int,
    rope_scaling_params,
    vec,
)

ARCHITECTURES = (
    "LlamaForCausalLM",
    "LlamaModel",
    "MistralForCausalLM",
    "MistralModel",
    "Qwen2ForCausalLM",
    "Qwen2Model",
)
MODEL_TYPES = ("llama", "mistral", "qwen2")


def adapt(
    config: Mapping[str, Any], arch: str, names: set[str], path: str | None
) -> tuple[ModelConfig, SpecMap]:
    qwen = arch.startswith("Qwen2") or config.get("model_type") == "qwen2"
    d_model = require_int(config, path, "hidden_size")
    n_heads = require_int(config, path, "num_attention_heads")
    n_kv = require_int(config, path, "num_key_value_heads", "num_attention_heads")
    d_head = (
        require_int(config, path, "head_dim")
        if get_key(config, "head_dim") is not None
        else divide_heads(path, d_model, n_heads)
    )
    pct = optional_float(
        config, path, "rope_parameters.partial_rotary_factor", "partial_rotary_factor", default=1.0,
        within=(0.0, 1.0),
    )
    prefix = first_prefix(names, ("model.", ""), "embed_tokens.weight")
    tied = "lm_head.weight" not in names
    window = (
        get_key(config, "sliding_window") if config.get("use_sliding_window", not qwen) else None
    )
    cfg = ModelConfig(
        family="qwen2" if qwen else "llama",
        architecture=arch,
        n_layers=require_int(config, path, "num_hidden_layers"),
        n_heads=n_heads,
        n_kv_heads=n_kv,
        d_model=d_model,
        d_head=d_head,
        d_vocab=require_int(config, path, "vocab_size"),
        n_ctx=require_int(config, path, "max_position_embeddings"),
        d_mlp=require_int(config, path, "intermediate_size"),
        act_fn=get_key(config, "hidden_act", default="silu"),
        gated_mlp=True,
        normalization="RMS",
        norm_eps=optional_float(config, path, "rms_norm_eps", default=1e-6),
        positional="rotary",
        rotary_dim=int(d_head * pct),
        rotary_base=optional_float(
            config, path, "rope_parameters.rope_theta", "rope_theta", default=10000.0
        ),
        tied_unembed=tied,
        extra={
            "rotary_style": "half",
            # The scaling parameters (factor, low/high_freq_factor, ...) that
            # engine.model.rotary.rotary_inv_freq needs for "linear"/"llama3" RoPE.
            "rope_scaling": rope_scaling_params(config),
            "rope_type": get_key(
                config,
                "rope_parameters.rope_type",
                "rope_scaling.rope_type",
                "rope_scaling.type",
                default="default",
            ),
            "sliding_window": window,
        },
    )
    checked(cfg, names, path)  # before a list of n_layers entries is built
    types = window_layers(config, cfg.n_layers, window, path)
    if types is not None:
        cfg = cfg.replace(extra={**cfg.extra, "layer_types": types})
    attn_bias = qwen or optional_bool(config, path, "attention_bias", False)
    o_bias = not qwen and optional_bool(config, path, "attention_bias", False)
    if optional_bool(config, path, "mlp_bias", False):
        # The canonical gated MLP has no gate bias: refuse rather than drop it silently.
        raise ConfigError(path, "mlp_bias=true (biases in a gated MLP) is not supported")
    return cfg, specs(cfg, prefix or "model.", tied, attn_bias, o_bias)


def window_layers(config: Mapping[str, Any], n_layers: int, window: Any, path: str | None) -> list[str] | None:
    """Which layers use the sliding window (None: all of them, Mistral): the config's
    ``layer_types``, else Qwen2/Qwen3's ``max_window_layers`` (layers from that index on
    slide, as transformers derives ``layer_types``; Qwen2.5 configs with
    ``use_sliding_window`` have it)."""
    if window is None:
        return None
    types = config.get("layer_types")
    if types is not None:
        if not (isinstance(types, list) and len(types) == n_layers and all(isinstance(t, str) for t in types)):
            raise ConfigError(path, f"config field layer_types must name the attention kind of each of the {n_layers} layers")
        return list(types)
    if config.get("max_window_layers") is None:
        return None
    first = require_int(config, path, "max_window_layers", minimum=0)
    return ["sliding_attention" if i >= first else "full_attention" for i in range(n_layers)]


def prefix_of(names: set[str]) -> str:
    """Where the model's tensors live: ``model.`` or no prefix (as ``adapt`` decides)."""
    return first_prefix(names, ("model.", ""), "embed_tokens.weight") or "model."


def specs(cfg: ModelConfig, p: str, tied: bool, attn_bias: bool, o_bias: bool) -> SpecMap:
    dm, dh, n, kv = cfg.d_model, cfg.d_head, cfg.n_heads, cfg.kv_heads
    mlp = cfg.d_mlp or 4 * dm
    out: SpecMap = {
        "embed.W_E": Whole(f"{p}embed_tokens.weight", (cfg.d_vocab, dm)),
        "ln_final.w": vec(f"{p}norm.weight", dm),
        "unembed.W_U": Whole(f"{p}embed_tokens.weight", (cfg.d_vocab, dm), transpose=True)
        if tied
        else Whole("lm_head.weight", (cfg.d_vocab, dm), transpose=True),
        "unembed.b_U": Zeros((cfg.d_vocab,)),
    }
    for layer in range(cfg.n_layers):
        b, a = f"{p}layers.{layer}.", f"blocks.{layer}."
        for x, proj, stored in (("Q", "q_proj", n), ("K", "k_proj", kv), ("V", "v_proj", kv)):
            is_kv = x != "Q"
            out[f"{a}attn.W_{x}"] = linear_heads(
                f"{b}self_attn.{proj}.weight", cfg, stored, kv=is_kv
            )
            out[f"{a}attn.b_{x}"] = (
                linear_bias_heads(f"{b}self_attn.{proj}.bias", cfg, stored, kv=is_kv)
                if attn_bias
                else Zeros((n, dh))
            )
        out[f"{a}attn.W_O"] = linear_out_heads(f"{b}self_attn.o_proj.weight", cfg)
        out[f"{a}attn.b_O"] = vec(f"{b}self_attn.o_proj.bias", dm) if o_bias else Zeros((dm,))
        out[f"{a}ln1.w"] = vec(f"{b}input_layernorm.weight", dm)
        out[f"{a}ln2.w"] = vec(f"{b}post_attention_layernorm.weight", dm)
        out[f"{a}mlp.W_gate"] = linear(f"{b}mlp.gate_proj.weight", dm, mlp)
        out[f"{a}mlp.W_in"] = linear(f"{b}mlp.up_proj.weight", dm, mlp)
        out[f"{a}mlp.W_out"] = linear(f"{b}mlp.down_proj.weight", mlp, dm)
        out[f"{a}mlp.b_in"] = Zeros((mlp,))
        out[f"{a}mlp.b_out"] = Zeros((dm,))
    return out
