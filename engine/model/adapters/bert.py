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
    Adapted,
    SpecMap,
    Whole,
    Zeros,
    attention_specs,
    decoder_config,
    first_prefix,
    get_key,
    linear,
    mlp_specs,
    norm_specs,
    optional_float,
    require_int,
    vec,
)

ARCHITECTURES = ("BertForMaskedLM", "BertForPreTraining", "BertModel")
MODEL_TYPES = ("bert",)

_MLM = "cls.predictions."


def adapt(config: Mapping[str, Any], arch: str, names: set[str], path: str | None) -> Adapted:
    position_type = get_key(config, "position_embedding_type", default="absolute")
    if position_type != "absolute":
        raise ConfigError(
            path,
            f"BERT position_embedding_type {position_type!r} is not supported (only 'absolute')",
        )
    prefix = first_prefix(names, ("bert.", ""), "embeddings.word_embeddings.weight")
    has_mlm = f"{_MLM}transform.dense.weight" in names
    n_types = (
        require_int(config, path, "type_vocab_size", minimum=1)
        if "type_vocab_size" in config
        else 2
    )
    cfg = decoder_config(  # an encoder: the decoder default without the causal mask
        config, arch, names, path,
        family="bert",
        act_fn=get_key(config, "hidden_act", default="gelu"),
        norm_eps=optional_float(config, path, "layer_norm_eps", default=1e-12),
        causal=False,
        post_ln=True,
        # The MLM decoder is tied to the word embeddings too; without the head W_Eᵀ merely
        # stands in for an unembedding (extra["unembed_standin"]).
        tied_unembed=f"{_MLM}decoder.weight" not in names,
        has_mlm_head=has_mlm,
        extra={"n_types": n_types, "unembed_standin": not has_mlm},
    )  # fmt: skip
    return cfg, specs(cfg, prefix if prefix is not None else "bert.", names, n_types)


def specs(cfg: ModelConfig, p: str, names: set[str], n_types: int) -> SpecMap:
    dm = cfg.d_model
    e = f"{p}embeddings."
    out: SpecMap = {
        "embed.W_E": Whole(f"{e}word_embeddings.weight", (cfg.d_vocab, dm)),
        "pos_embed.W_pos": Whole(f"{e}position_embeddings.weight", (cfg.n_ctx, dm)),
        "embed.W_token_type": Whole(f"{e}token_type_embeddings.weight", (n_types, dm)),
        **norm_specs("embed.ln", f"{e}LayerNorm", dm),
    }
    for layer in range(cfg.n_layers):
        b, a = f"{p}encoder.layer.{layer}.", f"blocks.{layer}."
        att = f"{b}attention."
        out |= attention_specs(a, cfg, f"{att}self.query", f"{att}self.key", f"{att}self.value",
                               f"{att}output.dense", qkv_bias=True, o_bias=True)
        out |= norm_specs(f"{a}ln1", f"{att}output.LayerNorm", dm)
        out |= mlp_specs(a, cfg, f"{b}intermediate.dense", f"{b}output.dense")
        out |= norm_specs(f"{a}ln2", f"{b}output.LayerNorm", dm)
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
        out |= norm_specs("mlm.ln", f"{_MLM}transform.LayerNorm", dm)
        bias = next(
            (t for t in (f"{_MLM}bias", f"{_MLM}decoder.bias") if t in names), f"{_MLM}bias"
        )
        out["unembed.b_U"] = vec(bias, cfg.d_vocab)
    return out
