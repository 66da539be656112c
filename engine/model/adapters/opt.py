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
    Product,
    Rows,
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
    require_int,
    vec,
)

ARCHITECTURES = ("OPTForCausalLM", "OPTModel")
MODEL_TYPES = ("opt",)
POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding.offset


def adapt(
    config: Mapping[str, Any], arch: str, names: set[str], path: str | None
) -> tuple[ModelConfig, SpecMap]:
    d_model = require_int(config, path, "hidden_size")
    proj = require_int(config, path, "word_embed_proj_dim", "hidden_size")
    if not optional_bool(config, path, "layer_norm_elementwise_affine", True):
        raise ConfigError(path, "layer_norm_elementwise_affine=false is not supported")
    pre_ln = optional_bool(config, path, "do_layer_norm_before", True)
    if pre_ln and optional_bool(config, path, "_remove_final_layer_norm", False):
        raise ConfigError(path, "_remove_final_layer_norm=true is not supported")
    n_heads = require_int(config, path, "num_attention_heads")
    prefix = first_prefix(names, ("model.decoder.", "decoder.", ""), "embed_tokens.weight")
    tied = "lm_head.weight" not in names
    cfg = ModelConfig(
        family="opt",
        architecture=arch,
        n_layers=require_int(config, path, "num_hidden_layers"),
        n_heads=n_heads,
        d_model=d_model,
        d_head=divide_heads(path, d_model, n_heads),
        d_vocab=require_int(config, path, "vocab_size"),
        n_ctx=require_int(config, path, "max_position_embeddings"),
        d_mlp=require_int(config, path, "ffn_dim"),
        act_fn=get_key(config, "activation_function", default="relu"),
        normalization="LN",
        norm_eps=1e-5,  # nn.LayerNorm's default: OPT's config has no epsilon
        positional="learned",
        post_ln=not pre_ln,
        tied_unembed=tied,
    )
    checked(cfg, names, path)
    bias = optional_bool(config, path, "enable_bias", True)
    return cfg, specs(cfg, prefix or "model.decoder.", tied, bias, proj)


def specs(cfg: ModelConfig, p: str, tied: bool, bias: bool, proj: int | None = None) -> SpecMap:
    dm, dh, n = cfg.d_model, cfg.d_head, cfg.n_heads
    mlp = cfg.d_mlp or 4 * dm
    width = proj or dm  # of the stored embeddings
    embed = Whole(f"{p}embed_tokens.weight", (cfg.d_vocab, width))
    unembed = (Whole(f"{p}embed_tokens.weight", (cfg.d_vocab, width), transpose=True) if tied
               else Whole("lm_head.weight", (cfg.d_vocab, width), transpose=True))
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
        out["ln_final.w"] = vec(f"{p}final_layer_norm.weight", dm)
        out["ln_final.b"] = vec(f"{p}final_layer_norm.bias", dm)
    for layer in range(cfg.n_layers):
        b, a = f"{p}layers.{layer}.", f"blocks.{layer}."
        for x, proj in (("Q", "q_proj"), ("K", "k_proj"), ("V", "v_proj")):
            out[f"{a}attn.W_{x}"] = linear_heads(f"{b}self_attn.{proj}.weight", cfg, n)
            out[f"{a}attn.b_{x}"] = (
                linear_bias_heads(f"{b}self_attn.{proj}.bias", cfg, n) if bias else Zeros((n, dh))
            )
        out[f"{a}attn.W_O"] = linear_out_heads(f"{b}self_attn.out_proj.weight", cfg)
        out[f"{a}attn.b_O"] = vec(f"{b}self_attn.out_proj.bias", dm) if bias else Zeros((dm,))
        out[f"{a}ln1.w"] = vec(f"{b}self_attn_layer_norm.weight", dm)
        out[f"{a}ln1.b"] = vec(f"{b}self_attn_layer_norm.bias", dm)
        out[f"{a}ln2.w"] = vec(f"{b}final_layer_norm.weight", dm)
        out[f"{a}ln2.b"] = vec(f"{b}final_layer_norm.bias", dm)
        out[f"{a}mlp.W_in"] = linear(f"{b}fc1.weight", dm, mlp)
        out[f"{a}mlp.b_in"] = vec(f"{b}fc1.bias", mlp) if bias else Zeros((mlp,))
        out[f"{a}mlp.W_out"] = linear(f"{b}fc2.weight", mlp, dm)
        out[f"{a}mlp.b_out"] = vec(f"{b}fc2.bias", dm) if bias else Zeros((dm,))
    return out
