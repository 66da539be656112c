"""Mixtral (``MixtralForCausalLM``): Mistral's attention with a sparse mixture-of-experts MLP.

Attention is exactly Llama/Mistral's (RoPE, grouped-query attention, sliding window), so the
circuits and scores are those of ``llama.py``. The MLP routes each token: a router
``block_sparse_moe.gate.weight`` ``[n_experts, d_model]`` gives logits, the top
``num_experts_per_tok`` experts (softmax probabilities renormalised over the chosen ones)
each compute a SwiGLU MLP (``w1`` gate, ``w3`` up, ``w2`` down) and their outputs are summed
with those weights. Canonical names: ``blocks.{l}.mlp.W_router`` ``[d_model, n_experts]`` and
``blocks.{l}.mlp.experts.{e}.W_gate`` / ``W_in`` ``[d_model, d_mlp]``, ``W_out``
``[d_mlp, d_model]``. This is the layout of Hub checkpoints and of ``save_pretrained``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headscope.engine.core.errors import ConfigError
from headscope.engine.model.adapters import llama
from headscope.engine.model.adapters.base import Adapted, linear, require_int

ARCHITECTURES = ("MixtralForCausalLM", "MixtralModel")
MODEL_TYPES = ("mixtral",)


def adapt(config: Mapping[str, Any], arch: str, names: set[str], path: str | None) -> Adapted:
    cfg, specs = llama.adapt(config, arch, names, path)
    n_experts = require_int(config, path, "num_local_experts")
    top_k = require_int(config, path, "num_experts_per_tok")
    if top_k > n_experts:
        raise ConfigError(path, f"num_experts_per_tok {top_k} exceeds num_local_experts {n_experts}")
    if n_experts > max(len(names), 1):
        raise ConfigError(path, f"num_local_experts {n_experts} but the checkpoint holds only {len(names)} tensors")
    cfg = cfg.replace(family="mixtral", extra={**cfg.extra, "n_experts": n_experts, "experts_per_token": top_k})
    p = llama.prefix_of(names)
    dm, mlp = cfg.d_model, cfg.d_mlp or 4 * cfg.d_model
    for layer in range(cfg.n_layers):
        b, a = f"{p}layers.{layer}.block_sparse_moe.", f"blocks.{layer}.mlp."
        for leaf in ("W_gate", "W_in", "W_out", "b_in", "b_out"):
            del specs[a + leaf]
        specs[a + "W_router"] = linear(f"{b}gate.weight", dm, n_experts)
        for e in range(n_experts):
            x = f"{b}experts.{e}."
            specs[f"{a}experts.{e}.W_gate"] = linear(f"{x}w1.weight", dm, mlp)
            specs[f"{a}experts.{e}.W_in"] = linear(f"{x}w3.weight", dm, mlp)
            specs[f"{a}experts.{e}.W_out"] = linear(f"{x}w2.weight", mlp, dm)
    return cfg, specs
