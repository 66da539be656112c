"""The OPT adapter (engine/model/adapters/opt.py): projected embeddings are the products."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from headscope.engine.model.loading import load_model
from tests.engine.model.test_adapters import build_opt_projected
from tests.hf_fixtures import D_MODEL, N_HEADS, N_LAYERS


def test_opt_projected_embeddings_are_the_products(tmp_path: Path) -> None:
    """W_E = E P_inᵀ and W_U = P_outᵀ Eᵀ (the reader builds the products, as numpy arrays),
    and the scores work."""
    import torch

    from headscope.engine.api.report import head_table
    from headscope.engine.forward.torch_weights import torch_weights

    path, model = build_opt_projected(tmp_path)
    m = load_model(path, raw=True)
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    embed = sd["model.decoder.embed_tokens.weight"]
    tw = torch_weights(m.weights)
    torch.testing.assert_close(tw.get("embed.W_E"), embed @ sd["model.decoder.project_in.weight"].T)
    torch.testing.assert_close(tw.get("unembed.W_U"), sd["model.decoder.project_out.weight"].T @ embed.T)
    # the processed product embeddings are numpy arrays too (no torch adapter for the circuits)
    assert m.cfg.d_model == D_MODEL and isinstance(load_model(path).weights.get("embed.W_E"), np.ndarray)
    rows = head_table(load_model(path))
    assert len(rows) == N_LAYERS * N_HEADS and all(not r["nonfinite"] for r in rows)
