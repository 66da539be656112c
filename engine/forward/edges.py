"""Edge attribution: EAP and EAP-IG scores of every edge, faithfulness of top-N circuits, and
exact checks of single edges (docs/math.md, "Edge attribution"). Conventions are
hannamw/EAP-IG's (``eap/graph.py``, ``attribute.py``, ``evaluate.py``); the graph, its names
and its order are ``core.edge_graph``'s.

Everything runs on one layer function, ``_layer``, which gives every destination its own input:
each head's queries, keys and values read their own copy of the residual stream entering the
layer plus an additive ``delta`` (``[b, p, 3, h, d_model]``), the MLP its input plus its own
(``[b, p, d_model]``); the layer returns what each source writes (each head's ``z W_O``, the
MLP's output) beside the stream it leaves. Scores take gradients through zero deltas (leaves
added to each destination's input: the total derivative through every later layer, never a
detached copy); faithfulness puts ``S_corrupt - S_this run`` of the patched edges into them.

Cost: ``edge_scores`` is one forward pass over the weights for the clean, the corrupt and
(EAP-IG) the ``steps - 1`` interpolated runs side by side, keeping each layer's input, then one
backward pass layer by layer from the top, each layer recomputed from its kept input (memory:
one layer's graph, its rows in chunks that fit ``_SPLIT_BYTES``, the layer's weights held for
them). The source differences are kept, ``[n_sources, b, p, d_model]`` float32 (GPT-2 small,
20 tokens: 9.6 MB; a 7B model: 17 MB per token), and each destination layer's scores are
``Δ · grad`` summed over positions and ``d_model`` as they are made, one product of a
contiguous block of ``Δ``: never a ``[p, n_src, n_dst, d_model]`` tensor. ``faithfulness`` runs one forward pass of the clean and
corrupt inputs and one of every circuit at once, in chunks of copies whose per-copy sources
fit ``_COPY_BYTES``. ``exact_edges`` is path patching in noising (``patching.patch_paths``):
the plain pass, then one pass for every edge at once, each copy joining at its destination's
layer, over the positions from the first where the inputs differ: an edge alone needs no
record of what its copy's sources write (they are upstream of the patch: the clean run's).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from headscope.engine.core.edge_graph import EdgeGraph, edge_graph
from headscope.engine.core.edge_results import (
    CURVE_FRACTIONS,
    EdgeMethod,
    EdgeScores,
    ExactEdge,
    Faithfulness,
    FaithfulnessCurve,
    curve_area,
    edge_scores_result,
    metrics_differ,
)
from headscope.engine.core.errors import InvalidRequestError, NonFiniteError
from headscope.engine.core.progress import Cancelled, Progress, check_cancelled, report
from headscope.engine.core.results import readonly
from headscope.engine.core.threads import one_lapack_thread
from headscope.engine.forward.patch_tasks import Metric, check_inputs, check_metric
from headscope.engine.forward.patching import patch_paths
from headscope.engine.forward.torch_weights import HeldLayerWeights, torch_weights
from headscope.engine.forward.transformer import (
    attention_input,
    attention_pattern,
    embed,
    mlp,
    norm,
    pre_norm,
    projections,
    qk_norm,
    read_next,
)
from headscope.engine.model.weights import WeightSource, will_need

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["METHODS", "edge_scores", "exact_edges", "faithfulness", "faithfulness_curve", "graph_of"]

METHODS: tuple[EdgeMethod, ...] = ("eap", "eap-ig")
# what the copies' sources write, kept at once in faithfulness' patched runs
_COPY_BYTES = 256 << 20
# what a layer's recomputed graph keeps of its heads' own copies of the stream in the backward
# pass of ``edge_scores`` (about 8 tensors of ``[rows, p, 3, h, d_model]`` float32): EAP-IG's
# ``steps`` rows go through a layer in chunks that fit (a 7B model on 20 tokens: 250 MB a row,
# 2 rows a chunk), the layer's weights held while its chunks run
_SPLIT_BYTES = 512 << 20


def graph_of(w: WeightSource) -> EdgeGraph:
    """The edge graph of the model ``w``; refuses what the graph cannot describe: a norm
    after the sublayers (Gemma 2/3, OLMo2, BERT's post-LN) divides the *sum* of the
    sources, so no source's difference can be added to a destination on its own."""
    cfg, path = w.cfg, getattr(w, "path", None)
    tw = torch_weights(w)
    if cfg.post_ln or not cfg.extra.get("pre_norm", True) or tw.has("blocks.0.ln1_post.w"):
        raise InvalidRequestError(path, f"edge attribution needs a pre-norm model; {cfg.architecture} normalises "
                                  "after its sublayers, so the heads' outputs do not add up in the residual stream")
    return edge_graph(cfg.n_layers, cfg.n_heads, attn_only=cfg.attn_only, parallel=cfg.parallel_attn_mlp)


# -- one layer, every destination its own input ------------------------------------------------


@dataclass(frozen=True)
class _LayerOut:
    out: Tensor  # the stream leaving the layer [b, p, d]
    heads: Tensor  # each head's z W_O [b, h, p, d] (no b_O)
    mlp: Tensor | None  # the MLP's output [b, p, d]


def _layer(w: WeightSource, layer: int, x: Tensor, d_qkv: Tensor | None = None,
           d_mlp: Tensor | None = None, mlp_delta: Callable[[Tensor], Tensor | None] | None = None) -> _LayerOut:
    """Block ``layer`` on the stream ``x [b, p, d]`` entering it. ``d_qkv [b, p, 3, h, d]`` is
    added to each head's own copy of ``x`` for its queries, keys and values (None: they share
    ``x``); ``d_mlp [b, p, d]`` to the MLP's input, or ``mlp_delta(heads)`` gives it once the
    heads' outputs are known (a patched run's MLP reads this layer's heads)."""
    w = torch_weights(w)
    cfg = w.cfg
    pre = f"blocks.{layer}.attn"
    inputs = x if d_qkv is None else x[:, :, None, None, :] + d_qkv
    q, k, v = projections(w, layer, attention_input(w, layer, inputs))
    q, k = qk_norm(w, layer, q, k)
    z = attention_pattern(w, layer, q, k) @ v
    heads = torch.einsum("bhqe,hem->bhqm", z, w.get(f"{pre}.W_O"))
    a = heads.sum(dim=1) + w.get(f"{pre}.b_O")
    if cfg.attn_only:
        return _LayerOut(x + a, heads, None)
    if mlp_delta is not None:
        d_mlp = mlp_delta(heads)
    ln2 = f"blocks.{layer}.ln2"
    if cfg.parallel_attn_mlp:  # NeoX: the MLP reads the stream entering the layer
        m_in = x if d_mlp is None else x + d_mlp
        m = mlp(w, layer, norm(w, ln2, m_in))
        return _LayerOut(x + a + m, heads, m)
    mid = x + a
    m = mlp(w, layer, pre_norm(w, ln2, mid if d_mlp is None else mid + d_mlp))
    return _LayerOut(mid + m, heads, m)


def _sources_of(out: _LayerOut) -> Tensor:
    """What a layer writes, ``[b, p, n, d]`` in source order (its heads, its MLP)."""
    parts = [out.heads.transpose(1, 2)]
    if out.mlp is not None:
        parts.append(out.mlp[:, :, None])
    return torch.cat(parts, dim=2)


def _check_finite(w: WeightSource, x: Tensor, what: str) -> None:
    if not torch.isfinite(x).all():
        raise NonFiniteError(getattr(w, "path", None), f"non-finite activations in {what}: no edge to score")


def _two_metrics(w: WeightSource, metric: Metric, final: Tensor) -> tuple[float, float]:
    """The metric of the clean and the corrupt run (``final [2·b, p, d]``), checked finite."""
    _check_finite(w, final, "the clean or corrupt run")
    values = [float(v) for v in metric(w, final, 2)]
    for value, name in zip(values, ("clean", "corrupt"), strict=True):
        if not math.isfinite(value):
            raise NonFiniteError(getattr(w, "path", None), f"the {name} run's {metric.name} is not finite")
    return values[0], values[1]


# -- scores ------------------------------------------------------------------------------------


def edge_scores(w: WeightSource, clean: Tensor | Sequence, corrupt: Tensor | Sequence, metric: Metric, *,
                method: EdgeMethod = "eap", steps: int = 5, progress: Progress = None,
                cancelled: Cancelled = None) -> EdgeScores:
    """The score of every edge ``S->D``: ``Σ_{positions, d_model} (S_corrupt - S_clean) · ∂m/∂D``,
    the gradient on the clean run (``eap``) or averaged over ``steps`` runs whose token
    embeddings are ``e_corrupt + (k/steps)(e_clean - e_corrupt)``, ``k = 0 .. steps-1``
    (``eap-ig``, EAP-IG's "inputs" variant). ``m`` is the metric's batch mean."""
    if method not in METHODS:
        raise InvalidRequestError(None, f"method must be one of {', '.join(METHODS)}, not {method!r}")
    if method == "eap-ig" and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise InvalidRequestError(None, f"--steps must be a whole number of at least 1, not {steps!r}")
    check_metric(w, metric)
    clean_t, corrupt_t = check_inputs(w, clean, corrupt)
    graph = graph_of(w)
    tw = torch_weights(w)
    cfg = w.cfg
    n = steps if method == "eap-ig" else 1
    b, p = clean_t.shape
    total = 2 * cfg.n_layers + 1
    check_cancelled(cancelled)
    with torch.no_grad(), one_lapack_thread():
        # the runs side by side: clean, corrupt (= IG's step 0), IG's steps 1 .. n-1
        e_clean, e_corrupt = tw.embed_rows(clean_t), tw.embed_rows(corrupt_t)
        x_clean, x_corrupt = embed(tw, clean_t), embed(tw, corrupt_t)
        runs = [x_clean, x_corrupt] + [x_corrupt + (k / n) * (e_clean - e_corrupt) for k in range(1, n)]
        x = torch.cat(runs)
        # S_corrupt - S_clean, source-major: the first k sources are a contiguous [k, b·p·d_model]
        # block, so a destination layer's scores are one product with no copy of it
        delta = x.new_empty((graph.n_sources, b, p, cfg.d_model))
        delta[0] = e_corrupt - e_clean
        # the rows whose gradient is taken: clean (eap), or corrupt and the steps (eap-ig)
        rows = slice(0, b) if method == "eap" else slice(b, (n + 1) * b)
        kept: list[Tensor] = []
        for layer in range(cfg.n_layers):
            check_cancelled(cancelled)
            read_next(tw, layer)
            kept.append(x[rows])
            out = _layer(tw, layer, x)
            written = _sources_of(out)
            first = graph.head_source(layer)
            delta[first:first + written.shape[2]] = (written[b:2 * b] - written[:b]).permute(2, 0, 1, 3)
            x = out.out
            report(progress, (layer + 1) / total)
        m_clean, m_corrupt = _two_metrics(tw, metric, x[:2 * b])
        final = x[rows]
    scores = torch.zeros(graph.n_sources, graph.n_destinations, dtype=torch.float64)

    def block(first: int, g: Tensor) -> Tensor:
        """``Σ_{b,p,d} Δ[:first] · g / n`` of ``g [b, p, j, d]``, the gradient summed over the
        runs: ``[first, j]``, the scores of the first ``first`` sources into ``j``
        destinations, averaged over the runs."""
        g = g.permute(0, 1, 3, 2).reshape(-1, g.shape[2]) / n  # [b·p·d, j]
        return (delta[:first].reshape(first, -1) @ g).double()

    # rows of a layer's recomputed graph at once: each row's heads read 3·n_heads copies of
    # the stream, kept through the norm and the projections for the backward pass
    chunk = max(1, _SPLIT_BYTES // (8 * 4 * p * 3 * cfg.n_heads * cfg.d_model))
    held = HeldLayerWeights(tw) if chunk < final.shape[0] else tw
    with torch.enable_grad(), one_lapack_thread():
        leaf = final.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(metric(tw, leaf, n).sum(), leaf)
        scores[:, graph.logits_destination] = block(graph.n_sources, grad.reshape(n, b, p, 1, -1).sum(0))[:, 0]
        report(progress, (cfg.n_layers + 1) / total)
        for layer in reversed(range(cfg.n_layers)):
            check_cancelled(cancelled)
            if layer:  # the backward pass reads the layers downwards: the one below next
                will_need(tw, f"blocks.{layer - 1}.")
            if held is not tw:
                held.hold(layer)  # read once for all its chunks of rows
            grad, g_qkv, g_mlp = _layer_grads(held, graph, layer, kept.pop(), grad, b, chunk)
            at = graph.head_destination(layer)
            scores[:graph.reads_heads(layer), at:at + 3 * cfg.n_heads] = block(graph.reads_heads(layer), g_qkv)
            if g_mlp is not None:
                scores[:graph.reads_mlp(layer), graph.mlp_destination(layer)] = block(
                    graph.reads_mlp(layer), g_mlp)[:, 0]
            report(progress, (2 * cfg.n_layers + 1 - layer) / total)
    if held is not tw:
        held.hold(None)
    values_per_edge = scores[graph.edge_src, graph.edge_dst].numpy()
    report(progress, 1.0)
    return edge_scores_result(method=method, steps=n if method == "eap-ig" else 0, metric=metric.name,
                              clean=m_clean, corrupt=m_corrupt, graph=graph, scores=values_per_edge,
                              tokens=p, batch=b)


def _layer_grads(w: WeightSource, graph: EdgeGraph, layer: int, x: Tensor, grad: Tensor, b: int, chunk: int
                 ) -> tuple[Tensor, Tensor, Tensor | None]:
    """Block ``layer`` recomputed from its kept input ``x [rows, p, d]`` with zero leaves at
    its destinations and ``grad`` (``∂m/∂`` its output) pulled back through it, ``chunk`` rows
    at a time: ``∂m/∂x``, and the gradients at its heads' q/k/v inputs ``[b, p, 3·h, d]`` and
    at its MLP's input ``[b, p, 1, d]`` (None without MLPs) summed over the runs (row ``r``
    is sequence ``r mod b`` of its run)."""
    cfg = w.cfg
    rows, p = x.shape[:2]
    grad_in = torch.empty_like(x)
    g_qkv = x.new_zeros((b, p, 3 * cfg.n_heads, cfg.d_model))
    g_mlp = x.new_zeros((b, p, 1, cfg.d_model)) if graph.has_mlp else None
    for at in range(0, rows, chunk):
        part = slice(at, min(at + chunk, rows))
        x_in = x[part].detach().requires_grad_(True)
        d_qkv = x_in.new_zeros((*x_in.shape[:2], 3, cfg.n_heads, cfg.d_model), requires_grad=True)
        leaves = [x_in, d_qkv]
        d_mlp = None
        if g_mlp is not None:
            d_mlp = x_in.new_zeros(x_in.shape, requires_grad=True)
            leaves.append(d_mlp)
        found = torch.autograd.grad(_layer(w, layer, x_in, d_qkv, d_mlp).out, leaves, grad[part])
        grad_in[part] = found[0]
        seq = torch.arange(part.start, part.stop) % b
        g_qkv.index_add_(0, seq, found[1].flatten(2, 3))
        if g_mlp is not None:
            g_mlp.index_add_(0, seq, found[2][:, :, None])
    return grad_in, g_qkv, g_mlp


# -- patched runs: each destination gets S_corrupt - S_this run of its patched edges ----------


@dataclass(frozen=True)
class _Corrupt:
    """The two plain runs: what the corrupt run writes (every source, ``[b, p, n_sources,
    d]``) and both metrics."""

    sources: Tensor
    clean: float
    corrupt: float


def _corrupt_run(w: WeightSource, graph: EdgeGraph, clean: Tensor, corrupt: Tensor, metric: Metric) -> _Corrupt:
    """One pass over ``[clean; corrupt]`` keeping the corrupt run's sources."""
    tw = torch_weights(w)
    b, p = clean.shape
    toks = torch.cat((clean, corrupt))
    sources = torch.empty((b, p, graph.n_sources, w.cfg.d_model))
    sources[:, :, 0] = tw.embed_rows(corrupt)
    x = embed(tw, toks)
    for layer in range(w.cfg.n_layers):
        read_next(tw, layer)
        out = _layer(tw, layer, x)
        written = _sources_of(out)
        first = graph.head_source(layer)
        sources[:, :, first:first + written.shape[2]] = written[b:]
        x = out.out
    m_clean, m_corrupt = _two_metrics(tw, metric, x)
    return _Corrupt(sources, m_clean, m_corrupt)


def _patched_metrics(w: WeightSource, graph: EdgeGraph, clean: Tensor, corrupt: _Corrupt, metric: Metric,
                     patched: np.ndarray, progress: Progress, cancelled: Cancelled) -> list[float]:
    """The metric of a clean run per row of ``patched [c, n_edges]`` (bool): each destination's
    input gets ``Σ (S_corrupt - S_this run)`` over its patched edges, ``S_this run`` what the
    source writes in that same run (EAP-IG's ``evaluate_graph`` with patching). All copies
    go through the layers together, in chunks (``_COPY_BYTES``). Progress: the corrupt run
    was the first of the passes over the layers, then one per chunk, reported per layer."""
    tw = torch_weights(w)
    b, p = clean.shape
    per_copy = 4 * b * p * graph.n_sources * w.cfg.d_model
    size = max(1, _COPY_BYTES // per_copy)
    starts = range(0, len(patched), size)
    layers = w.cfg.n_layers * (len(starts) + 1)
    out: list[float] = []
    for i, at in enumerate(starts):
        def layer_done(layer: int, i: int = i) -> None:
            report(progress, (w.cfg.n_layers * (i + 1) + layer + 1) / layers)

        out += _patched_chunk(tw, graph, clean, corrupt, metric, patched[at:at + size], cancelled, layer_done)
    report(progress, 1.0)
    return out


def _patched_chunk(w: WeightSource, graph: EdgeGraph, clean: Tensor, corrupt: _Corrupt, metric: Metric,
                   patched: np.ndarray, cancelled: Cancelled, layer_done: Callable[[int], None]) -> list[float]:
    cfg = w.cfg
    c = len(patched)
    b, p = clean.shape
    # [c, n_sources, n_destinations]: 1 where the edge is patched
    mask = torch.from_numpy(np.stack([graph.matrix(row.astype(np.float32)) for row in patched]))
    x = embed(w, clean).repeat(c, 1, 1)  # [c·b, p, d]
    this = torch.empty((c, b, p, graph.n_sources, cfg.d_model))  # S in each copy's run
    this[:, :, :, 0] = w.embed_rows(clean)

    def delta(first: int, dst: slice) -> Tensor:
        """``Σ_s mask[c, s, j] (S_corrupt - S_this)[c, ..., s, :]`` of the first ``first``
        sources into destinations ``dst``: ``[c·b, p, j, d]``."""
        diff = corrupt.sources[None, :, :, :first] - this[:, :, :, :first]
        return torch.einsum("cbpsd,csj->cbpjd", diff, mask[:, :first, dst]).flatten(0, 1)

    for layer in range(cfg.n_layers):
        check_cancelled(cancelled)
        read_next(w, layer)
        at = graph.head_destination(layer)
        d_qkv = delta(graph.reads_heads(layer), slice(at, at + 3 * cfg.n_heads))
        d_qkv = d_qkv.reshape(c * b, p, 3, cfg.n_heads, cfg.d_model)
        first = graph.head_source(layer)

        def mlp_delta(heads: Tensor, layer: int = layer, first: int = first) -> Tensor:
            this[:, :, :, first:first + cfg.n_heads] = heads.transpose(1, 2).reshape(c, b, p, cfg.n_heads, -1)
            d = graph.mlp_destination(layer)
            return delta(graph.reads_mlp(layer), slice(d, d + 1))[:, :, 0]

        out = _layer(w, layer, x, d_qkv, mlp_delta=mlp_delta if graph.has_mlp else None)
        written = _sources_of(out)
        this[:, :, :, first:first + written.shape[2]] = written.reshape(c, b, p, *written.shape[2:])
        x = out.out
        layer_done(layer)
    d = graph.logits_destination
    x = x + delta(graph.n_sources, slice(d, d + 1))[:, :, 0]
    return [float(v) for v in metric(w, x, c)]


def _prepare(w: WeightSource, clean: Tensor | Sequence, corrupt: Tensor | Sequence, metric: Metric
             ) -> tuple[EdgeGraph, Tensor, Tensor]:
    check_metric(w, metric)
    clean_t, corrupt_t = check_inputs(w, clean, corrupt)
    return graph_of(w), clean_t, corrupt_t


def faithfulness(w: WeightSource, clean: Tensor | Sequence, corrupt: Tensor | Sequence, metric: Metric,
                 scores: EdgeScores, tops: Sequence[int], *, progress: Progress = None,
                 cancelled: Cancelled = None) -> list[Faithfulness]:
    """The faithfulness of each top-``N`` circuit of ``scores`` (``tops``), all from one
    attribution: ``graph.circuit(scores, N)`` (EAP-IG's ``apply_topn(N, absolute=True)``,
    pruned), evaluated by patching every other edge; ``(m_circuit - m_corrupt) / (m_clean -
    m_corrupt)``. Refuses when the clean and corrupt runs give the same metric."""
    graph, clean_t, corrupt_t = _prepare(w, clean, corrupt, metric)
    if graph != scores.graph:
        raise InvalidRequestError(getattr(w, "path", None), "the scores are of another model's graph")
    tops = [int(n) for n in tops]
    for n in tops:
        if not 0 <= n <= graph.n_edges:
            raise InvalidRequestError(getattr(w, "path", None),
                                      f"--top {n} is larger than the graph's {graph.n_edges} edges" if n > 0
                                      else f"--top must be at least 0, not {n}")
    usable = ~scores.nonfinite
    circuits = [graph.circuit(scores.scores, n, usable) for n in tops]
    check_cancelled(cancelled)
    with torch.inference_mode(), one_lapack_thread():
        corrupt_run = _corrupt_run(w, graph, clean_t, corrupt_t, metric)
        _check_differ(w, metric, corrupt_run)
        found = _patched_metrics(w, graph, clean_t, corrupt_run, metric, np.stack([~c for c in circuits]),
                                 progress, cancelled) if circuits else []
    span = corrupt_run.clean - corrupt_run.corrupt
    return [Faithfulness(top=n, edges=int(c.sum()), clean=corrupt_run.clean, corrupt=corrupt_run.corrupt,
                         circuit=m, faithfulness=(m - corrupt_run.corrupt) / span, in_circuit=readonly(c, bool))
            for n, c, m in zip(tops, circuits, found, strict=True)]


def faithfulness_curve(w: WeightSource, clean: Tensor | Sequence, corrupt: Tensor | Sequence, metric: Metric,
                       scores: EdgeScores, fractions: Sequence[float] = CURVE_FRACTIONS, *,
                       progress: Progress = None, cancelled: Cancelled = None) -> FaithfulnessCurve:
    """Faithfulness at each fraction of the edges (``int(fraction × n_edges)`` of them, as
    MIB) and the areas under the curve and between it and 1 (``edge_results.curve_area``)."""
    fractions = tuple(float(f) for f in fractions)
    if not fractions or any(not 0 <= f <= 1 for f in fractions) or list(fractions) != sorted(fractions):
        raise InvalidRequestError(None, f"the curve's fractions must increase within 0 .. 1, not {fractions}")
    tops = [int(f * scores.graph.n_edges) for f in fractions]
    points = faithfulness(w, clean, corrupt, metric, scores, tops, progress=progress, cancelled=cancelled)
    values = tuple(pt.faithfulness for pt in points)
    return FaithfulnessCurve(fractions=fractions, points=tuple(points), area=curve_area(fractions, values),
                             area_from_1=curve_area(fractions, tuple(abs(1.0 - v) for v in values)))


def exact_edges(w: WeightSource, clean: Tensor | Sequence, corrupt: Tensor | Sequence, metric: Metric,
                edges: Sequence[str], scores: EdgeScores | None = None, *, progress: Progress = None,
                cancelled: Cancelled = None) -> list[ExactEdge]:
    """Each edge corrupted alone on the clean run, exactly: its destination's input gets
    ``S_corrupt - S_clean`` (the change its score estimates); every other input and what the
    destination then writes flow through the rest of the model as usual. This is path
    patching in noising, ``patching.patch_paths`` (one implementation: ``path-patch
    --noising`` of the same sender and receiver gives the same number)."""
    graph, clean_t, corrupt_t = _prepare(w, clean, corrupt, metric)
    for name in edges:
        if name not in graph.index:
            raise InvalidRequestError(getattr(w, "path", None), f"no edge {name!r} in this model's graph")
    paths = [tuple(name.split("->")) for name in edges]
    if not paths:  # still the plain runs' checks
        check_cancelled(cancelled)
        with torch.inference_mode(), one_lapack_thread():
            _corrupt_run(w, graph, clean_t, corrupt_t, metric)
        return []
    found = patch_paths(w, clean_t, corrupt_t, metric, paths, noising=True, progress=progress, cancelled=cancelled)
    return [ExactEdge(edge=name, estimate=None if scores is None else scores.score(name), patched=m,
                      exact=m - found.clean) for name, m in zip(edges, found.patched, strict=True)]


def _check_differ(w: WeightSource, metric: Metric, run: _Corrupt) -> None:
    if not metrics_differ(run.clean, run.corrupt):
        raise InvalidRequestError(getattr(w, "path", None), f"the clean and corrupt inputs give the same {metric.name} "
                                  f"({run.clean:.6g}): faithfulness is undefined")



