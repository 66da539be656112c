"""The graph of edge attribution (docs/math.md, "Edge attribution"): nodes, destinations and
edges named and ordered as hannamw/EAP-IG's ``Graph.from_model``; top-N circuits and their
pruning. Pure numpy, so the UI can draw a circuit without torch.

- Sources (EAP-IG's forward nodes), in the order the model writes them: ``input``, then per
  layer ``a{l}.h0 .. a{l}.h{H-1}`` and ``m{l}`` (no ``m{l}`` in an attention-only model).
- Destinations (its backward nodes), in the order of its ``get_dst_nodes``: per layer
  ``a{l}.h{h}<q>`` for every head, then ``<k>``, then ``<v>``, then ``m{l}``; last ``logits``.
- Edges ``S->D`` (``S->a{l}.h{h}<k>`` into a head), for every source written before ``D``
  reads: into layer ``l``'s heads ``input`` and every node of earlier layers; into ``m{l}`` also
  layer ``l``'s heads unless attention and MLP run in parallel (NeoX); into ``logits`` every
  node. Their order is ``from_model``'s insertion order.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from headscope.engine.core.errors import InvalidRequestError

__all__ = ["QKV", "EdgeGraph", "edge_graph"]

QKV = ("q", "k", "v")


@dataclass(frozen=True)
class EdgeGraph:
    """Nodes and edges of one model shape. ``edge_src[i]``, ``edge_dst[i]``: the source and
    destination index of edge ``i`` (``edges[i]``)."""

    n_layers: int
    n_heads: int
    has_mlp: bool
    parallel: bool  # attention and MLP read the same residual stream (NeoX)

    # -- indices ---------------------------------------------------------------------------

    @property
    def per_layer_sources(self) -> int:
        return self.n_heads + int(self.has_mlp)

    @property
    def per_layer_destinations(self) -> int:
        return 3 * self.n_heads + int(self.has_mlp)

    @property
    def n_sources(self) -> int:
        return 1 + self.n_layers * self.per_layer_sources

    @property
    def n_destinations(self) -> int:
        return self.n_layers * self.per_layer_destinations + 1

    def head_source(self, layer: int, head: int = 0) -> int:
        """The source index of ``a{layer}.h{head}``."""
        return 1 + layer * self.per_layer_sources + head

    def mlp_source(self, layer: int) -> int:
        return self.head_source(layer) + self.n_heads

    def head_destination(self, layer: int, which: str = "q", head: int = 0) -> int:
        """The destination index of ``a{layer}.h{head}<which>``."""
        return layer * self.per_layer_destinations + QKV.index(which) * self.n_heads + head

    def mlp_destination(self, layer: int) -> int:
        return self.head_destination(layer) + 3 * self.n_heads

    @property
    def logits_destination(self) -> int:
        return self.n_destinations - 1

    def reads_heads(self, layer: int) -> int:
        """How many sources (a prefix of them) layer ``layer``'s heads read."""
        return self.head_source(layer)

    def reads_mlp(self, layer: int) -> int:
        """How many sources ``m{layer}`` reads."""
        return self.head_source(layer) + (0 if self.parallel else self.n_heads)

    # -- names -----------------------------------------------------------------------------

    @cached_property
    def sources(self) -> tuple[str, ...]:
        names = ["input"]
        for layer in range(self.n_layers):
            names += [f"a{layer}.h{h}" for h in range(self.n_heads)]
            if self.has_mlp:
                names.append(f"m{layer}")
        return tuple(names)

    @cached_property
    def destinations(self) -> tuple[str, ...]:
        names = []
        for layer in range(self.n_layers):
            names += [f"a{layer}.h{h}<{x}>" for x in QKV for h in range(self.n_heads)]
            if self.has_mlp:
                names.append(f"m{layer}")
        return (*names, "logits")

    @cached_property
    def _edges(self) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
        """``from_model``'s insertion order: per layer, each source already in the residual
        stream into each head's q, k, v (and, in parallel, into ``m{l}`` right after), then
        (sequential) each source into ``m{l}``; last each source into ``logits``."""
        src: list[int] = []
        dst: list[int] = []
        stream = [0]  # sources written so far
        for layer in range(self.n_layers):
            heads = [self.head_source(layer, h) for h in range(self.n_heads)]
            for s in stream:
                for h in range(self.n_heads):
                    for x in QKV:
                        src.append(s)
                        dst.append(self.head_destination(layer, x, h))
                if self.has_mlp and self.parallel:
                    src.append(s)
                    dst.append(self.mlp_destination(layer))
            stream += heads
            if self.has_mlp:
                if not self.parallel:
                    for s in stream:
                        src.append(s)
                        dst.append(self.mlp_destination(layer))
                stream.append(self.mlp_source(layer))
        for s in stream:
            src.append(s)
            dst.append(self.logits_destination)
        # a head's destination name already carries its <q>/<k>/<v>
        names = tuple(f"{self.sources[s]}->{self.destinations[d]}" for s, d in zip(src, dst, strict=True))
        return names, np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64)

    @property
    def edges(self) -> tuple[str, ...]:
        return self._edges[0]

    @property
    def edge_src(self) -> np.ndarray:
        return self._edges[1]

    @property
    def edge_dst(self) -> np.ndarray:
        return self._edges[2]

    @property
    def n_edges(self) -> int:
        """How many edges ``edges`` has, counted from the shape without building them (a 7B
        graph has over a million): per layer every source its q, k, v read and, with an MLP,
        what ``m{l}`` reads; into ``logits`` every source."""
        into_layers = sum(3 * self.n_heads * self.reads_heads(layer)
                          + (self.reads_mlp(layer) if self.has_mlp else 0)
                          for layer in range(self.n_layers))
        return into_layers + self.n_sources

    @cached_property
    def index(self) -> dict[str, int]:
        """Edge name -> its index in ``edges``."""
        return {name: i for i, name in enumerate(self.edges)}

    @cached_property
    def dst_node(self) -> np.ndarray:
        """``[n_destinations]``: the source index of the node each destination belongs to
        (a head's q, k, v: the head; ``m{l}``: the MLP), ``-1`` for ``logits``."""
        out = np.full(self.n_destinations, -1, dtype=np.int64)
        for layer in range(self.n_layers):
            for h in range(self.n_heads):
                for x in QKV:
                    out[self.head_destination(layer, x, h)] = self.head_source(layer, h)
            if self.has_mlp:
                out[self.mlp_destination(layer)] = self.mlp_source(layer)
        return out

    def matrix(self, values: np.ndarray, fill: float = 0.0) -> np.ndarray:
        """``values [n_edges]`` as EAP-IG's ``[n_sources, n_destinations]`` score matrix."""
        out = np.full((self.n_sources, self.n_destinations), fill, dtype=np.asarray(values).dtype)
        out[self.edge_src, self.edge_dst] = values
        return out

    # -- circuits --------------------------------------------------------------------------

    def top(self, scores: np.ndarray, n: int, usable: np.ndarray | None = None) -> np.ndarray:
        """EAP-IG's ``apply_topn(n, absolute=True)`` without the pruning: a boolean mask of
        the ``n`` edges of largest ``|score|`` (ties: the earlier in EAP-IG's score matrix,
        source-major). Edges not ``usable`` (non-finite scores) rank last."""
        if not 0 <= n <= self.n_edges:
            raise InvalidRequestError(None, f"top {n} is not between 0 and the graph's {self.n_edges} edges")
        key = np.abs(np.asarray(scores, dtype=np.float64))
        if usable is not None:
            key = np.where(usable, key, -np.inf)
        flat = self.edge_src * self.n_destinations + self.edge_dst  # the matrix order
        order = np.lexsort((flat, -key))
        mask = np.zeros(self.n_edges, dtype=bool)
        mask[order[:n]] = True
        return mask

    def prune(self, in_circuit: np.ndarray) -> np.ndarray:
        """EAP-IG's ``Graph.prune``: until nothing changes, drop every node with no incoming
        circuit edge (``input`` exempt: it reads nothing) or no outgoing one, and every edge
        whose source or destination node is dropped (``logits`` always stays). Returns the
        pruned mask (a copy)."""
        edges = np.array(in_circuit, dtype=bool, copy=True)
        src, dst, node_of = self.edge_src, self.edge_dst, self.dst_node
        while True:
            outgoing = np.zeros(self.n_sources, dtype=bool)
            outgoing[src[edges]] = True
            incoming = np.zeros(self.n_sources, dtype=bool)
            into = node_of[dst[edges]]
            incoming[into[into >= 0]] = True
            incoming[0] = True
            nodes = outgoing & incoming
            dst_alive = np.append(nodes, True)[np.where(node_of >= 0, node_of, self.n_sources)]
            kept = edges & nodes[src] & dst_alive[dst]
            if np.array_equal(kept, edges):
                return kept
            edges = kept

    def circuit(self, scores: np.ndarray, n: int, usable: np.ndarray | None = None) -> np.ndarray:
        """The top-``n`` circuit, pruned until stable (``apply_topn(n, absolute=True)``)."""
        return self.prune(self.top(scores, n, usable))


def edge_graph(n_layers: int, n_heads: int, *, attn_only: bool, parallel: bool) -> EdgeGraph:
    """The graph of a model with ``n_layers`` × ``n_heads`` heads, MLPs unless ``attn_only``."""
    return EdgeGraph(n_layers=n_layers, n_heads=n_heads, has_mlp=not attn_only,
                     parallel=bool(parallel) and not attn_only)
