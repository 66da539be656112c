"""`headscope composition`: the JSON's shape and its top edges."""

from __future__ import annotations

import pytest
import torch

from headscope.engine.model.loading import load_model
from tests import weight_algebra as algebra
from tests.e2e.test_cli import run_json


def test_composition_json_shape_and_top_edges(capsys, gpt2_dir) -> None:
    path, _ = gpt2_dir
    report = run_json(capsys, "composition", str(path), "--kind", "k", "--top", "3")
    w = load_model(path).weights
    expected = algebra.composition_scores(w, "k", seed=0)
    s = torch.tensor(report["scores"])
    L, H = w.cfg.n_layers, w.cfg.n_heads
    assert s.shape == (L, H, L, H)
    assert torch.allclose(s, expected.scores.float(), atol=1e-6)
    assert report["baseline"] == pytest.approx(float(expected.baseline))
    for l1 in range(L):  # zero where the source layer is not earlier
        assert torch.all(s[l1, :, : l1 + 1] == 0)
    tops = report["top_edges"]
    assert len(tops) == 3
    assert [e["above_baseline"] for e in tops] == sorted((e["above_baseline"] for e in tops), reverse=True)
    best = max(float(s[a, b, c, d]) for a in range(L) for b in range(H) for c in range(a + 1, L) for d in range(H))
    assert tops[0]["score"] == pytest.approx(best)
