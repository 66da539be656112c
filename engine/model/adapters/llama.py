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
    Adapted,
    SpecMap,
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

ARCHITECTURES = (
    "LlamaForCausalLM",
    "LlamaModel",
    "MistralForCausalLM",
    "MistralModel",
    "Qwen2ForCausalLM",
    "Qwen2Model",
)
MODEL_TYPES = ("llama", "mistral", "qwen2")


def adapt(config: Mapping[str, Any], arch: str, names: set[str], path: str | None) -> Adapted:
    qwen = arch.startswith("Qwen2") or config.get("model_type") == "qwen2"
    window = (
        get_key(config, "sliding_window") if config.get("use_sliding_window", not qwen) else None
    )
    cfg = decoder_config(
        config, arch, names, path,
        family="qwen2" if qwen else "llama",
        **llama_block(config, path, norm_eps=1e-6),
        tied_unembed="lm_head.weight" not in names,
        extra={"sliding_window": window},
    )  # fmt: skip
    types = window_layers(config, cfg.n_layers, window, path)
    if types is not None:
        cfg = cfg.replace(extra={**cfg.extra, "layer_types": types})
    attn_bias = qwen or optional_bool(config, path, "attention_bias", False)
    o_bias = not qwen and optional_bool(config, path, "attention_bias", False)
    if optional_bool(config, path, "mlp_bias", False):
        # The canonical gated MLP has no gate bias: refuse rather than drop it silently.
        raise ConfigError(path, "mlp_bias=true (biases in a gated MLP) is not supported")
    return cfg, specs(cfg, prefix_of(names), cfg.tied_unembed, attn_bias, o_bias)


def llama_block(config: Mapping[str, Any], path: str | None, *, norm_eps: float) -> dict[str, Any]:
    """What a Llama-style block changes in the decoder default (``decoder_config``):
    grouped-query attention, a gated SiLU MLP, RMSNorm (epsilon ``norm_eps`` unless the config
    gives one), rotate-half RoPE on whole heads. Phi-3 reads the same."""
    return {
        "n_kv_heads": require_int(config, path, "num_key_value_heads", "num_attention_heads"),
        "act_fn": get_key(config, "hidden_act", default="silu"),
        "gated_mlp": True,
        "normalization": "RMS",
        "norm_eps": optional_float(config, path, "rms_norm_eps", default=norm_eps),
        "rope": 1.0,
    }


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
    dm = cfg.d_model
    out: SpecMap = {
        **embed_specs(cfg, f"{p}embed_tokens.weight", tied),
        **norm_specs("ln_final", f"{p}norm", dm, bias=False),
    }
    for layer in range(cfg.n_layers):
        b, a = f"{p}layers.{layer}.", f"blocks.{layer}."
        att = f"{b}self_attn."
        out |= attention_specs(a, cfg, f"{att}q_proj", f"{att}k_proj", f"{att}v_proj", f"{att}o_proj",
                               qkv_bias=attn_bias, o_bias=o_bias, grouped=True)
        out |= norm_specs(f"{a}ln1", f"{b}input_layernorm", dm, bias=False)
        out |= norm_specs(f"{a}ln2", f"{b}post_attention_layernorm", dm, bias=False)
        out |= mlp_specs(a, cfg, f"{b}mlp.up_proj", f"{b}mlp.down_proj", gate=f"{b}mlp.gate_proj", bias=False)
    return out
