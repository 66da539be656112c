"""BERT-style encoders (``BertForMaskedLM``, ``BertForPreTraining``, ``BertModel``).

Post-LayerNorm blocks without a causal mask: ``x = LN1(x + attn(x))``,
``x = LN2(x + mlp(x))``, after ``embed.ln(W_E[t] + W_pos[p] + W_token_type[0])``.
With the masked-LM head (``cls.predictions.*``) logits are
``LN(gelu(x @ mlm.W + mlm.b)) @ W_U + b_U`` with the decoder tied to ``W_E``; without it
(``BertModel``, sentence encoders) the unembedding is ``W_Eᵀ`` as a stand-in, flagged by
``tied_unembed`` with ``has_mlm_head`` false.
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
    optional_float,
    require_int,
    vec,
)

ARCHITECTURES = ("BertForMaskedLM", "BertForPreTraining", "BertModel")
MODEL_TYPES = ("bert",)

_MLM = "cls.predictions."


def adapt(
    config: Mapping[str, Any], arch: str, names: set[str], path: str | None
) -> tuple[ModelConfig, SpecMap]:
    position_type = get_key(config, "position_embedding_type", default="absolute")
    if position_type != "absolute":
        raise ConfigError(
            path,
            f"BERT position_embedding_type {position_type!r} is not supported (only 'absolute')",
        )
    d_model = require_int(config, path, "hidden_size")
    n_heads = require_int(config, path, "num_attention_heads")
    prefix = first_prefix(names, ("bert.", ""), "embeddings.word_embeddings.weight")
    has_mlm = f"{_MLM}transform.dense.weight" in names
    n_types = (
        require_int(config, path, "type_vocab_size", minimum=1)
        if "type_vocab_size" in config
        else 2
    )
    cfg = ModelConfig(
        family="bert",
        architecture=arch,
        n_layers=require_int(config, path, "num_hidden_layers"),
        n_heads=n_heads,
        d_model=d_model,
        d_head=divide_heads(path, d_model, n_heads),
        d_vocab=require_int(config, path, "vocab_size"),
        n_ctx=require_int(config, path, "max_position_embeddings"),
        d_mlp=require_int(config, path, "intermediate_size"),
        act_fn=get_key(config, "hidden_act", default="gelu"),
        normalization="LN",
        norm_eps=optional_float(config, path, "layer_norm_eps", default=1e-12),
        positional="learned",
        causal=False,
        post_ln=True,
        # The MLM decoder is tied to the word embeddings too; without the head W_Eᵀ merely
        # stands in for an unembedding (extra["unembed_standin"]).
        tied_unembed=f"{_MLM}decoder.weight" not in names,
        has_mlm_head=has_mlm,
        extra={"n_types": n_types, "unembed_standin": not has_mlm},
    )
    checked(cfg, names, path)
    return cfg, specs(cfg, prefix if prefix is not None else "bert.", names, n_types)


def specs(cfg: ModelConfig, p: str, names: set[str], n_types: int) -> SpecMap:
    dm, n = cfg.d_model, cfg.n_heads
    mlp = cfg.d_mlp or 4 * dm
    e = f"{p}embeddings."
    out: SpecMap = {
        "embed.W_E": Whole(f"{e}word_embeddings.weight", (cfg.d_vocab, dm)),
        "pos_embed.W_pos": Whole(f"{e}position_embeddings.weight", (cfg.n_ctx, dm)),
        "embed.W_token_type": Whole(f"{e}token_type_embeddings.weight", (n_types, dm)),
        "embed.ln.w": vec(f"{e}LayerNorm.weight", dm),
        "embed.ln.b": vec(f"{e}LayerNorm.bias", dm),
    }
    for layer in range(cfg.n_layers):
        b, a = f"{p}encoder.layer.{layer}.", f"blocks.{layer}."
        for x, proj in (("Q", "query"), ("K", "key"), ("V", "value")):
            out[f"{a}attn.W_{x}"] = linear_heads(f"{b}attention.self.{proj}.weight", cfg, n)
            out[f"{a}attn.b_{x}"] = linear_bias_heads(f"{b}attention.self.{proj}.bias", cfg, n)
        out[f"{a}attn.W_O"] = linear_out_heads(f"{b}attention.output.dense.weight", cfg)
        out[f"{a}attn.b_O"] = vec(f"{b}attention.output.dense.bias", dm)
        out[f"{a}ln1.w"] = vec(f"{b}attention.output.LayerNorm.weight", dm)
        out[f"{a}ln1.b"] = vec(f"{b}attention.output.LayerNorm.bias", dm)
        out[f"{a}mlp.W_in"] = linear(f"{b}intermediate.dense.weight", dm, mlp)
        out[f"{a}mlp.b_in"] = vec(f"{b}intermediate.dense.bias", mlp)
        out[f"{a}mlp.W_out"] = linear(f"{b}output.dense.weight", mlp, dm)
        out[f"{a}mlp.b_out"] = vec(f"{b}output.dense.bias", dm)
        out[f"{a}ln2.w"] = vec(f"{b}output.LayerNorm.weight", dm)
        out[f"{a}ln2.b"] = vec(f"{b}output.LayerNorm.bias", dm)
    decoder = f"{_MLM}decoder.weight"
    out["unembed.W_U"] = Whole(
        decoder if decoder in names else f"{e}word_embeddings.weight",
        (cfg.d_vocab, dm),
        transpose=True,
    )
    out["unembed.b_U"] = Zeros((cfg.d_vocab,))
    if cfg.has_mlm_head:
        out["mlm.W"] = linear(f"{_MLM}transform.dense.weight", dm, dm)
        out["mlm.b"] = vec(f"{_MLM}transform.dense.bias", dm)
        out["mlm.ln.w"] = vec(f"{_MLM}transform.LayerNorm.weight", dm)
        out["mlm.ln.b"] = vec(f"{_MLM}transform.LayerNorm.bias", dm)
        bias = next(
            (t for t in (f"{_MLM}bias", f"{_MLM}decoder.bias") if t in names), f"{_MLM}bias"
        )
        out["unembed.b_U"] = vec(bias, cfg.d_vocab)
    return out
