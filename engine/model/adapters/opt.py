"""OPT (``OPTForCausalLM`` / ``OPTModel``).

Learned positions with an offset: ``embed_positions`` has ``max_position_embeddings + 2``
rows and position ``p`` of an unpadded prompt reads row ``p + 2``, so the canonical ``W_pos``
is rows ``[2, 2 + n_ctx)`` (a ``Rows`` spec). Attention has biases on ``q/k/v/out_proj``;
the MLP is ``fc2(relu(fc1(x)))`` with biases; the LM head is tied to the embeddings.

``do_layer_norm_before`` chooses the block: pre-LN (most OPT models:
``x + attn(LN1(x))``, then ``x + mlp(LN2(x))``, and a final LayerNorm) or post-LN
(opt-350m: ``LN1(x + attn(x))``, ``LN2(x + mlp(x))``, no final LayerNorm), the latter computed
and processed like BERT's post-LN blocks (``cfg.post_ln``) but causal.

Checkpoints whose embeddings have another width (``word_embed_proj_dim != hidden_size``,
opt-350m: 512 and 1024) map them in and out with bias-free ``project_in`` / ``project_out``:
the canonical ``W_E`` is ``E P_inᵀ`` ``[d_vocab, d_model]`` and ``W_U`` is ``P_outᵀ Eᵀ``
(``Product`` specs; exact, as each is two linear maps in a row).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headscope.engine.core.config import ModelConfig
from headscope.engine.core.errors import ConfigError
from headscope.engine.model.adapters.base import (
    Adapted,
    Product,
    Rows,
    SpecMap,
    Whole,
    Zeros,
    attention_specs,
    decoder_config,
    first_prefix,
    get_key,
    mlp_specs,
    norm_specs,
    optional_bool,
    require_int,
)

ARCHITECTURES = ("OPTForCausalLM", "OPTModel")
MODEL_TYPES = ("opt",)
POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding.offset


def adapt(config: Mapping[str, Any], arch: str, names: set[str], path: str | None) -> Adapted:
    proj = require_int(config, path, "word_embed_proj_dim", "hidden_size")
    if not optional_bool(config, path, "layer_norm_elementwise_affine", True):
        raise ConfigError(path, "layer_norm_elementwise_affine=false is not supported")
    pre_ln = optional_bool(config, path, "do_layer_norm_before", True)
    if pre_ln and optional_bool(config, path, "_remove_final_layer_norm", False):
        raise ConfigError(path, "_remove_final_layer_norm=true is not supported")
    prefix = first_prefix(names, ("model.decoder.", "decoder.", ""), "embed_tokens.weight")
    tied = "lm_head.weight" not in names
    cfg = decoder_config(
        config, arch, names, path,
        family="opt",
        d_mlp=require_int(config, path, "ffn_dim"),
        act_fn=get_key(config, "activation_function", default="relu"),
        norm_eps=1e-5,  # nn.LayerNorm's default: OPT's config has no epsilon
        post_ln=not pre_ln,
        tied_unembed=tied,
    )  # fmt: skip
    bias = optional_bool(config, path, "enable_bias", True)
    return cfg, specs(cfg, prefix or "model.decoder.", tied, bias, proj)


def specs(cfg: ModelConfig, p: str, tied: bool, bias: bool, proj: int | None = None) -> SpecMap:
    dm = cfg.d_model
    width = proj or dm  # of the stored embeddings
    embed = Whole(f"{p}embed_tokens.weight", (cfg.d_vocab, width))
    unembed = Whole(f"{p}embed_tokens.weight" if tied else "lm_head.weight", (cfg.d_vocab, width), transpose=True)
    out: SpecMap = {
        "embed.W_E": embed,
        "pos_embed.W_pos": Rows(
            f"{p}embed_positions.weight", (cfg.n_ctx + POSITION_OFFSET, dm),
            offset=POSITION_OFFSET, size=cfg.n_ctx,
        ),
        "unembed.W_U": unembed,
        "unembed.b_U": Zeros((cfg.d_vocab,)),
    }
    if width != dm:  # project_in [d_model, width], project_out [width, d_model] (nn.Linear)
        out["embed.W_E"] = Product(embed, Whole(f"{p}project_in.weight", (dm, width), transpose=True))
        out["unembed.W_U"] = Product(Whole(f"{p}project_out.weight", (width, dm), transpose=True), unembed)
    if not cfg.post_ln:
        out |= norm_specs("ln_final", f"{p}final_layer_norm", dm)
    for layer in range(cfg.n_layers):
        b, a = f"{p}layers.{layer}.", f"blocks.{layer}."
        att = f"{b}self_attn."
        out |= attention_specs(a, cfg, f"{att}q_proj", f"{att}k_proj", f"{att}v_proj", f"{att}out_proj",
                               qkv_bias=bias, o_bias=bias)
        out |= norm_specs(f"{a}ln1", f"{b}self_attn_layer_norm", dm)
        out |= norm_specs(f"{a}ln2", f"{b}final_layer_norm", dm)
        out |= mlp_specs(a, cfg, f"{b}fc1", f"{b}fc2", bias=bias)
    return out
