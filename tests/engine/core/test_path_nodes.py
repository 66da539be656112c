"""The ends of a path: the edge graph's names parsed, checked against a shape, and kept as the
(layer, head) pairs of a path's row."""

from __future__ import annotations

import pytest

from headscope.engine.core.edge_graph import edge_graph
from headscope.engine.core.errors import IndexOutOfRangeError, InvalidRequestError
from headscope.engine.core.path_nodes import (
    PathNode,
    check_path,
    key_name,
    key_node,
    node_key,
    path_node,
)

SHAPE = dict(n_layers=2, n_heads=3, has_mlp=True)


@pytest.mark.parametrize("parallel", [False, True])
def test_every_edge_of_the_graph_is_a_path_and_its_names_round_trip(parallel: bool) -> None:
    graph = edge_graph(2, 3, attn_only=False, parallel=parallel)
    for name in graph.edges:
        sender, receiver = (path_node(end) for end in name.split("->"))
        check_path(sender, receiver, **SHAPE, parallel=parallel)
        assert f"{sender.name}->{receiver.name}" == name
        for node in (sender, receiver):
            assert key_node(node_key(node), node.part) == node
            assert key_name(node_key(node), node.part) == node.name


def test_heads_keep_their_pairs_and_the_other_nodes_theirs() -> None:
    assert node_key(path_node("a1.h2<k>")) == (1, 2) and path_node("L1.H2") == PathNode("head", 1, 2)
    assert [node_key(path_node(n)) for n in ("input", "m1", "logits")] == [(-1, -1), (1, -1), (-2, -1)]


@pytest.mark.parametrize(("sender", "receiver", "error", "message"), [
    ("a1.h0", "a1.h2<k>", InvalidRequestError, "earlier layer to a later one: a1.h0 is not below a1.h2<k>"),
    ("m1", "a1.h0<q>", InvalidRequestError, "not below"),
    ("a0.h0", "a1.h2", InvalidRequestError, "a1.h2 is not a receiver"),
    ("logits", "m1", InvalidRequestError, "a path's sender is input, a head or an MLP"),
    ("a0.h1<q>", "m1", InvalidRequestError, "a path's sender"),
    ("a0.h3", "logits", IndexOutOfRangeError, "head 3 out of range"),
    ("m2", "logits", IndexOutOfRangeError, "layer 2 out of range"),
])
def test_impossible_paths_are_refused_in_one_line(sender: str, receiver: str, error: type, message: str) -> None:
    with pytest.raises(error, match=message) as err:
        check_path(path_node(sender), path_node(receiver), **SHAPE, parallel=False)
    assert "\n" not in str(err.value)


def test_an_mlp_reads_its_layers_heads_unless_parallel_and_attention_only_has_none() -> None:
    check_path(path_node("a1.h0"), path_node("m1"), **SHAPE, parallel=False)
    with pytest.raises(InvalidRequestError, match="not below"):
        check_path(path_node("a1.h0"), path_node("m1"), **SHAPE, parallel=True)
    with pytest.raises(InvalidRequestError, match="no MLPs"):
        check_path(path_node("m0"), path_node("logits"), n_layers=2, n_heads=3, has_mlp=False)
    with pytest.raises(InvalidRequestError, match="is not a node"):
        path_node("mlp0")
