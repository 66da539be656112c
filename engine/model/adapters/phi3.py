"""Phi-3 (``Phi3ForCausalLM``): Llama's block with fused projections.

``self_attn.qkv_proj`` is one ``nn.Linear`` ``[(n_heads + 2 n_kv_heads) d_head, d_model]``
whose output rows are all queries (head by head), then all keys, then all values (grouped
query attention: ``n_kv_heads`` K/V heads). ``mlp.gate_up_proj`` is ``[2 d_mlp, d_model]``:
the gate rows first, then the up rows; the MLP is ``down(up(x) * silu(gate(x)))``. RMSNorm,
rotate-half RoPE on the first ``partial_rotary_factor * d_head`` dims, no biases, an optional
sliding window (Phi-3-mini: 2047). ``longrope`` scaling (the 128k models: short and long
per-frequency factors, the original context beside ``rope_scaling``) is computed by
engine.model.rotary.rotary_inv_freq / rotary_scale.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headscope.engine.core.config import ModelConfig
from headscope.engine.model.adapters import llama
from headscope.engine.model.adapters.base import (
    Adapted,
    Heads,
    Rows,
    SpecMap,
    Zeros,
    decoder_config,
    embed_specs,
    get_key,
    linear,
    linear_out_heads,
    norm_specs,
)

ARCHITECTURES = ("Phi3ForCausalLM", "Phi3Model")
MODEL_TYPES = ("phi3",)


def adapt(config: Mapping[str, Any], arch: str, names: set[str], path: str | None) -> Adapted:
    tied = "lm_head.weight" not in names
    cfg = decoder_config(
        config, arch, names, path,
        family="phi3",
        **llama.llama_block(config, path, norm_eps=1e-5),
        tied_unembed=tied,
        extra={"rope_type": _rope_type(config), "sliding_window": get_key(config, "sliding_window")},
    )  # fmt: skip
    return cfg, specs(cfg, llama.prefix_of(names), tied)


def _rope_type(config: Mapping[str, Any]) -> Any:
    """As transformers' Phi3Config: the early long-context configs' ``"su"`` and ``"yarn"``
    both name what is now ``"longrope"`` (per-frequency factors)."""
    kind = get_key(config, "rope_parameters.rope_type", "rope_scaling.rope_type", "rope_scaling.type",
                   default="default")
    return "longrope" if kind in ("su", "yarn") else kind


def specs(cfg: ModelConfig, p: str, tied: bool) -> SpecMap:
    dm, dh, n, kv = cfg.d_model, cfg.d_head, cfg.n_heads, cfg.kv_heads
    mlp = cfg.d_mlp or 4 * dm
    qkv_rows = (n + 2 * kv) * dh
    out: SpecMap = {
        **embed_specs(cfg, f"{p}embed_tokens.weight", tied),
        **norm_specs("ln_final", f"{p}norm", dm, bias=False),
    }
    for layer in range(cfg.n_layers):
        b, a = f"{p}layers.{layer}.", f"blocks.{layer}."
        qkv = f"{b}self_attn.qkv_proj.weight"
        for x, offset, is_kv in (("Q", 0, False), ("K", n * dh, True), ("V", (n + kv) * dh, True)):
            out[f"{a}attn.W_{x}"] = Heads(
                qkv, (qkv_rows, dm), axis=0, offset=offset, stride=dh, size=dh,
                transpose=True, kv=is_kv,
            )  # fmt: skip
            out[f"{a}attn.b_{x}"] = Zeros((n, dh))
        out[f"{a}attn.W_O"] = linear_out_heads(f"{b}self_attn.o_proj.weight", cfg)
        out[f"{a}attn.b_O"] = Zeros((dm,))
        out |= norm_specs(f"{a}ln1", f"{b}input_layernorm", dm, bias=False)
        out |= norm_specs(f"{a}ln2", f"{b}post_attention_layernorm", dm, bias=False)
        gate_up = f"{b}mlp.gate_up_proj.weight"
        out[f"{a}mlp.W_gate"] = Rows(gate_up, (2 * mlp, dm), transpose=True, offset=0, size=mlp)
        out[f"{a}mlp.W_in"] = Rows(gate_up, (2 * mlp, dm), transpose=True, offset=mlp, size=mlp)
        out[f"{a}mlp.W_out"] = linear(f"{b}mlp.down_proj.weight", mlp, dm)
        out[f"{a}mlp.b_in"] = Zeros((mlp,))
        out[f"{a}mlp.b_out"] = Zeros((dm,))
    return out
