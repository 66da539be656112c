"""``edge_scores``' backward pass in chunks of rows (``_SPLIT_BYTES``: a 7B model's EAP-IG runs
do not all fit one layer's recomputed graph): the same scores as all rows at once, the layer's
weights read once for all its chunks. The scores themselves are held to the TransformerLens
reference in test_edges.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from headscope.engine.forward import edges, patch_tasks, torch_weights
from headscope.engine.model.loading import load_model
from tests.hf_fixtures import llama_dir  # noqa: F401  (session-scoped pytest fixture)
from tests.leftovers import from_this_test

CLEAN = [[1, 5, 9, 2, 33, 7, 5, 9], [3, 4, 5, 6, 7, 8, 9, 10]]
CORRUPT = [[1, 5, 9, 2, 40, 7, 11, 9], [3, 4, 50, 6, 7, 8, 9, 11]]


@pytest.mark.parametrize("method", ["eap", "eap-ig"])
def test_chunks_of_rows_give_the_scores_of_all_rows_at_once(llama_dir: tuple[Path, object], method: str,  # noqa: F811
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    w = load_model(llama_dir[0]).weights  # GQA, gated MLP: every destination kind
    metric = patch_tasks.LogitDiff(3, 4)
    whole = edges.edge_scores(w, CLEAN, CORRUPT, metric, method=method, steps=3)
    holds = []
    real_hold = torch_weights.HeldLayerWeights.hold
    held = from_this_test(holds.append)
    monkeypatch.setattr(torch_weights.HeldLayerWeights, "hold", lambda self, layer: (held(layer),
                                                                             real_hold(self, layer))[1])
    monkeypatch.setattr(edges, "_SPLIT_BYTES", 1)  # one row a chunk: 2 (eap) or 6 (eap-ig) chunks a layer
    chunked = edges.edge_scores(w, CLEAN, CORRUPT, metric, method=method, steps=3)
    n_layers = w.cfg.n_layers
    assert holds == [*reversed(range(n_layers)), None]  # each layer held once for its chunks
    # float32 products of other shapes: rounding of the order of 1e-6 of the largest score
    np.testing.assert_allclose(chunked.scores, whole.scores, rtol=0, atol=1e-5 * np.abs(whole.scores).max())
    assert np.abs(whole.scores).max() > 0
