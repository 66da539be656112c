"""The BERT adapter (engine/model/adapters/bert.py): the MLM head against transformers; without one, the unembedding is flagged tied."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from headscope.engine.forward.torch_weights import torch_weights
from headscope.engine.model.loading import load_model


def test_bert_mlm_head_matches_transformers(bert_mlm_dir: tuple[Path, Any]) -> None:
    path, model = bert_mlm_dir
    w = torch_weights(load_model(path, raw=True).weights)
    assert w.cfg.has_mlm_head and w.cfg.tied_unembed and not w.cfg.extra["unembed_standin"]
    x = torch.randn(5, w.cfg.d_model, generator=torch.Generator().manual_seed(1))
    h = torch.nn.functional.gelu(x @ w.get("mlm.W") + w.get("mlm.b"))
    h = torch.nn.functional.layer_norm(
        h, (w.cfg.d_model,), w.get("mlm.ln.w"), w.get("mlm.ln.b"), w.cfg.norm_eps
    )
    with torch.no_grad():
        torch.testing.assert_close(
            h @ w.get("unembed.W_U") + w.get("unembed.b_U"), model.cls(x), atol=1e-4, rtol=0
        )
    for name in ("embed.W_token_type", "embed.ln.w", "embed.ln.b", "pos_embed.W_pos"):
        assert w.has(name)
    assert not w.has("ln_final.w")


def test_bert_without_head_is_flagged_tied(bert_base_dir: tuple[Path, Any]) -> None:
    path, model = bert_base_dir
    m = load_model(path, raw=True)
    s = m.structure()
    assert s["tied_unembed"] and not s["has_mlm_head"] and not s["causal"]
    assert m.raw_cfg.extra["unembed_standin"]
    torch.testing.assert_close(
        torch_weights(m.weights).get("unembed.W_U"), model.get_input_embeddings().weight.T.detach()
    )
    assert not m.weights.has("mlm.W")
