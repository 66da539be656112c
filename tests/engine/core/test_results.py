"""Result types (engine/core/results.py): how composition edges are ranked."""

from __future__ import annotations

import numpy as np
import pytest

from headscope.engine.core.results import rank_edges


def test_rank_edges_is_earlier_to_later_layers_strongest_first_finite_only() -> None:
    rng = np.random.default_rng(0)
    scores = rng.uniform(0, 1, size=(3, 2, 3, 2)).astype(np.float32)
    scores[0, 1, 2, 0] = np.nan
    edges = rank_edges(scores, 0.25, top=100)
    want = sorted(((l1, h1, l2, h2) for l1 in range(3) for h1 in range(2) for l2 in range(l1 + 1, 3)
                   for h2 in range(2) if (l1, h1, l2, h2) != (0, 1, 2, 0)),
                  key=lambda e: -float(scores[e]))
    assert [e[:4] for e in edges] == want
    assert all(e[4] == pytest.approx(float(scores[e[:4]]) - 0.25) for e in edges)
    assert rank_edges(scores, 0.25, top=3) == edges[:3]
