"""The graph of edge attribution (engine/core/edge_graph.py): its nodes and edges counted as MIB counts them, pruning."""

from __future__ import annotations

import numpy as np
import pytest

from headscope.engine.core.edge_graph import edge_graph
from headscope.engine.core.errors import InvalidRequestError
from tests.hf_fixtures import (  # noqa: F401  (session-scoped pytest fixtures)
    gpt2_dir,
    llama_dir,
    neox_dir,
    qwen2_dir,
)


def test_the_graph_counts_as_eap_ig() -> None:
    """EAP-IG's n_forward, n_backward and edge count (its real_edge_mask) for a model with MLPs."""
    for parallel in (False, True):
        g = edge_graph(3, 4, attn_only=False, parallel=parallel)
        assert g.n_sources == 1 + 3 * 5 and g.n_destinations == 3 * 13 + 1
        per_layer = [(1 + 5 * layer) * 12 + (1 + 5 * layer + (0 if parallel else 4)) for layer in range(3)]
        assert g.n_edges == sum(per_layer) + g.n_sources
        assert len(set(g.edges)) == g.n_edges
    attn = edge_graph(2, 3, attn_only=True, parallel=False)
    assert attn.sources == ("input", "a0.h0", "a0.h1", "a0.h2", "a1.h0", "a1.h1", "a1.h2")
    assert attn.edges[:4] == ("input->a0.h0<q>", "input->a0.h0<k>", "input->a0.h0<v>", "input->a0.h1<q>")
    assert attn.edges[-1] == "a1.h2->logits" and "a1.h0->a1.h1<q>" not in attn.index


def test_edge_count_is_the_graphs_counted_without_building_it() -> None:
    """One count: ``n_edges`` (from the shape, the edge list never built: a 7B graph has over
    a million names) is the built list's length, and ``requests.edge_count`` of a structure
    is its graph's ``n_edges``, for every kind of model."""
    from headscope.engine.core.requests import edge_count

    for layers, heads in ((1, 1), (2, 3), (4, 2)):
        for attn_only, parallel in ((True, False), (False, False), (False, True)):
            g = edge_graph(layers, heads, attn_only=attn_only, parallel=parallel)
            n = g.n_edges
            assert "_edges" not in g.__dict__  # counted, not built
            assert n == len(g.edges)
            structure = {"n_layers": layers, "n_heads": heads, "d_mlp": None if attn_only else 8,
                         "parallel_attn_mlp": parallel}
            assert edge_count(structure) == n
            assert edge_count({**structure, "d_mlp": 8, "attn_only": attn_only}) == n


def test_edge_counts_are_mibs() -> None:
    """The MIB circuit track's ``EDGE_COUNTS`` of its models (hannamw/MIB-circuit-track),
    from their shapes: GPT-2 small, Qwen2.5-0.5B, Gemma 2 2B, Llama 3.1 8B."""
    shapes = {"gpt2": (12, 12, 32491), "qwen2.5": (24, 14, 179749), "gemma2": (26, 8, 74218),
              "llama3": (32, 32, 1592881)}
    for name, (layers, heads, count) in shapes.items():
        assert edge_graph(layers, heads, attn_only=False, parallel=False).n_edges == count, name


def test_pruning_drops_dangling_nodes() -> None:
    g = edge_graph(2, 2, attn_only=True, parallel=False)
    scores = np.zeros(g.n_edges)
    # a1.h0 -> logits alone: a1.h0 has no incoming edge, so nothing is left
    scores[g.index["a1.h0->logits"]] = 5.0
    assert not g.circuit(scores, 1).any()
    scores[g.index["a0.h1->a1.h0<k>"]] = -4.0
    scores[g.index["input->a0.h1<v>"]] = 3.0
    kept = g.circuit(scores, 3)
    assert {g.edges[i] for i in np.nonzero(kept)[0]} == {"a1.h0->logits", "a0.h1->a1.h0<k>", "input->a0.h1<v>"}
    with pytest.raises(InvalidRequestError, match="not between 0 and the graph's"):
        g.top(scores, g.n_edges + 1)
