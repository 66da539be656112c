"""Activation, attribution and path patching of attention heads (docs/math.md, "Patching").

Conventions are TransformerLens' ``patching`` module's, so the numbers compare 1:1:
denoising by default (run the corrupt input, patch in a head's clean activation at every
position), ``noising`` the reverse; sites ``out`` (the head's ``z``, ``hook_z``), ``q``, ``k``,
``v`` (before RoPE, after any q/k norm) and ``pattern`` (after the softmax); the metric is
read from the patched logits. With grouped-query attention a "head" is a query head: its
``k``/``v`` site is its own copy of the shared key/value head (TransformerLens patches the
stored K/V head, which equals patching its group of query heads together).

Cost (``patch_heads``; docs/math.md, "Patching"): one pass over the clean and the corrupt
batch together keeps the residual stream entering each layer. Then all patched copies run
together in one more pass over the layers, each joining the batch at its first patched layer
from the base stream (nothing below it is rerun), exactly but only where a patch can change
something: positions from the first one where the clean and corrupt tokens differ (earlier
keys and values come from the base run: causal attention keeps both runs equal there), and
in the last layer only the positions the metric reads. A layer's attention runs once per
distinct stream; a patched head adds ``(z_new - z) W_O[h]`` to its copy's attention output
(its own attention recomputed side by side with the other patched heads). The pass keeps
every copy's stream (``_STREAM_BYTES`` bounds them: beyond it the copies go in several
passes) and runs each layer over the copies in sub-batches sized by ``_LAYER_BYTES`` for
that layer's transient tensors; the layer's weights are read once and held while its
sub-batches run (``HeldLayerWeights``), so a model whose weights do not fit the cache (1B, 7B)
reads them once per pass, not once per batch of copies.

Attribution (``attribute_heads``, AtP, Kramár et al. 2024) is the first-order estimate
``grad(metric) · (source - base)`` of every head at once from the same two runs and one
backward pass, taken layer by layer from the top (each layer's forward is recomputed with
gradients from its kept input, so memory holds one layer's graph, never the model's). For
``q``/``k`` the softmax is recomputed with the patched queries or keys and the gradient
taken at the pattern (AtP*'s QK fix: a linear estimate through a saturated softmax misses
the head).

Path patching (``patch_paths``; ``path_patch`` for head edges) of an edge sender -> receiver
puts the sender's clean output (as it enters the residual stream) into the receiver's input
only: the receiver's input is the corrupt stream entering its layer plus (clean - corrupt)
sender output, and no other node sees the change; the receiver's new output then flows
through the rest of the model as usual. Any edge of the edge graph (``core.path_nodes``):
senders ``input`` (the token embedding), a head, an MLP; receivers a head's q, k or v (a
patched copy at that site), an MLP's input (the site ``mlp``: ``finish_block``'s
``mlp_in``), the logits (the base run's final stream plus the difference: no layer runs).
In noising this is the exact check of an edge (``edges.exact_edges`` calls it).

Every entry point takes ``progress(fraction)`` and ``cancelled()`` (checked between patched
sub-batches, raising ``CancelledError``) like the other sweeps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from headscope.engine.core.errors import (
    InvalidRequestError,
    NonFiniteError,
)
from headscope.engine.core.path_nodes import PathNode, check_path, key_node, path_node
from headscope.engine.core.progress import Cancelled, Progress, check_cancelled, report
from headscope.engine.core.results import PatchResult, patch_result, verify_order
from headscope.engine.core.threads import one_lapack_thread
from headscope.engine.core.validation import (
    PATH_INPUTS,
    check_head_sets,
)
from headscope.engine.forward.behaviour import (
    equal_parts,
)
from headscope.engine.forward.patch_tasks import (
    Metric,
    check_inputs,
    check_metric,
    check_site,
)
from headscope.engine.forward.torch_weights import HeldLayerWeights, TorchWeights, torch_weights
from headscope.engine.forward.transformer import (
    attention_input,
    attention_pattern,
    blocks,
    embed,
    finish_block,
    post_normed_heads,
    projections,
    qk_norm,
    read_next,
)
from headscope.engine.model.weights import WeightSource

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["HeadSet", "PathValues", "attribute_heads", "patch_heads", "patch_paths", "path_nodes", "path_patch"]

HeadSet = tuple[tuple[int, int], ...]  # heads patched together

# Memory of the patched pass (bytes, roughly; docs/math.md, "Patching", cost). The streams of
# the patched copies, kept from layer to layer (float32 ``[b, p - first, d_model]`` each, in and
# out of a layer): the 1024 heads of a 7B model on a 20-token prompt that differs from position
# 11 on take ~0.35 GB, so that every head of GPT-2 small or of a 7B model goes in one pass.
_STREAM_BYTES = 512 << 20
# One layer's transient tensors (queries, keys and values with the prefix rows, the pattern,
# z, the attention output, the MLP's hidden activations) for the copies run through it at
# once: the layer runs in sub-batches of copies that fit (``_Suffix.runs_per_part``, an upper
# bound: a 1B model's peak RSS grew by ~0.55× the budget). At 7B ~50 of the 1024 copies a
# sub-batch: products of ~450 rows, compute-bound, while the held layer weights (0.8 GB), the
# streams and these stay well under 3 GB. Smaller sub-batches re-stream each weight matrix
# from memory more often: every head of the 1B shape (bench/README.md, "Patching every
# head") took 327 s with 16 MB, 116 s with 256 MB, 99 s with 1 GB (peak RSS 946, 1126,
# 1518 MB; one run each on a loaded box).
_LAYER_BYTES = 256 << 20
# The source run's activations at the patched site, kept from layer to layer
# (``_SourceActivations``): bounded as the streams are; a pattern site is ``[b, h, p, p]`` a
# layer (a 2048-token prompt of a 32-head model: 512 MB each), others ``[b, h, p, d_head]``.
_SOURCE_BYTES = 256 << 20


# -- the two runs ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Runs:
    """The unpatched clean and corrupt runs: the stream entering each layer ``[b, p, d]``
    of the run that is patched (``base``: corrupt when denoising) and of the one the
    activations come from (``source``), and the two metrics."""

    base_in: list[Tensor]
    source_in: list[Tensor]
    base_final: Tensor
    clean: float
    corrupt: float
    noising: bool


def _two_runs(w: WeightSource, clean: Tensor, corrupt: Tensor, metric: Metric, noising: bool) -> _Runs:
    """One pass over ``[clean; corrupt]`` (same shapes) keeping each layer's input.
    Non-finite activations raise ``NonFiniteError`` naming the run and the layer."""
    b = clean.shape[0]
    entering: list[Tensor] = []
    final = blocks(w, embed(w, torch.cat((clean, corrupt))), on_block=lambda _l, x, _p: entering.append(x))
    for i, name in ((0, "clean"), (1, "corrupt")):
        for layer, x in enumerate([*entering[1:], final]):
            if not torch.isfinite(x[i * b:(i + 1) * b]).all():
                raise NonFiniteError(getattr(w, "path", None),
                                     f"non-finite activations in the {name} run from layer {layer} on: nothing to patch")
    values = metric(w, final, 2)
    for i, name in ((0, "clean"), (1, "corrupt")):
        if not math.isfinite(float(values[i])):
            raise NonFiniteError(getattr(w, "path", None), f"the {name} run's {metric.name} is not finite")
    clean_in, corrupt_in = [x[:b] for x in entering], [x[b:] for x in entering]
    base, source = (clean_in, corrupt_in) if noising else (corrupt_in, clean_in)
    return _Runs(base_in=base, source_in=source, base_final=final[:b] if noising else final[b:],
                 clean=float(values[0]), corrupt=float(values[1]), noising=noising)


def _site_activation(w: WeightSource, layer: int, x: Tensor, site: str) -> Tensor:
    """The activation patched at ``site`` of every head of ``layer`` for the stream ``x``
    entering it: ``[b, h, p, d_head]`` (``pattern``: ``[b, h, q, k]``). ``q``/``k`` are taken
    before the q/k norm, as TransformerLens' ``hook_q``/``hook_k`` (the same patch when the
    norm is per head; OLMo2's spans the heads)."""
    q, k, v = projections(w, layer, attention_input(w, layer, x))
    if site in ("q", "k", "v"):
        return {"q": q, "k": k, "v": v}[site]
    q, k = qk_norm(w, layer, q, k)
    pattern = attention_pattern(w, layer, q, k)
    return pattern if site == "pattern" else pattern @ v


def _norm_spans_heads(w: WeightSource, layer: int) -> bool:
    """True when the q/k norm of ``layer`` normalises all heads' projections together
    (OLMo2: a ``[h, d_head]`` gain): patching one head's q or k then rescales the others."""
    name = f"blocks.{layer}.attn.q_norm.w"
    return w.has(name) and w.cfg.extra.get("qk_norm") != "layer" and torch_weights(w).get(name).ndim == 2


# -- patched runs ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Variant:
    """One patched copy of the run: its heads patched together, at one position or all;
    ``site`` its own site (path patching into different inputs at once; ``None``: the pass's),
    ``mlp`` the MLP's input, whose "head" is ``-1``."""

    heads: HeadSet
    pos: int | None = None
    site: str | None = None


# (variant, head, pos): one head of one variant patched at the layer being run (the
# variant's index in the list given to ``_evaluate``)
_Pair = tuple[int, int, "int | None"]
# the activation each pair patches in, [b, P, p, ...] at every position (a pattern: every
# query row), in the order of the pairs
SourceFor = Callable[[int, list[_Pair]], "Tensor"]


@dataclass
class _Suffix:
    """What every patched run shares (docs/math.md, "Patching", cost).

    ``first``: the first position where clean and corrupt tokens differ in any sequence of
    the batch. Attention is causal, so before it the two runs' streams are equal at every
    layer, and so is every activation a patch puts in: a patched run equals the base run
    there. Patched runs therefore carry only positions ``first ..`` (``[n·b, p - first,
    d]``) and read the keys and values of the earlier ones from the base run (``prefix``,
    computed once per layer). ``reads``: how many final positions the metric reads; the last
    layer computes only those queries (and their MLP), its keys and values still at every
    position."""

    w: HeldLayerWeights
    runs: _Runs
    first: int
    reads: int
    _prefix: dict[int, tuple[Tensor, Tensor, Tensor]]

    def prefix(self, layer: int) -> tuple[Tensor, Tensor, Tensor]:
        """The base run's keys before the q/k norm, after it, and values ``[b, h, first,
        d_head]`` of layer ``layer``."""
        if layer not in self._prefix:
            x = self.runs.base_in[layer][:, :self.first]
            k_pre, v = projections(self.w, layer, attention_input(self.w, layer, x))[1:]
            self._prefix[layer] = (k_pre, qk_norm(self.w, layer, k_pre, k_pre)[1], v)
        return self._prefix[layer]

    def queries_from(self, layer: int) -> int:
        """The first position whose query (and MLP) ``layer`` computes."""
        p = self.runs.base_in[0].shape[1]
        if layer < self.w.cfg.n_layers - 1:
            return self.first
        return max(self.first, p - self.reads)

    def copies_per_pass(self, n: int) -> int:
        """How many of ``n`` patched copies one pass carries: as many streams as fit
        ``_STREAM_BYTES`` (each copy's stream into and out of a layer), in equal chunks."""
        b, p, d = self.runs.base_in[0].shape
        return equal_parts(n, _STREAM_BYTES // (2 * 4 * b * max(1, p - self.first) * d))

    def runs_per_part(self, layer: int, n: int) -> int:
        """How many of the ``n`` copies running through ``layer`` go through it at once: as
        many as ``_LAYER_BYTES`` holds of the float32 tensors ``_patched_layer`` makes per copy
        (an upper bound: per stream they are fewer, the copies joining at a layer share one),
        in equal sub-batches. Per copy of ``b`` sequences, ``s`` positions entering the layer,
        ``sq`` queries, ``p`` keys: the normed input, q/k/v and their norms, the residual adds
        (about ``8·s·d_model``); keys and values with the prefix rows and their rotations
        (``8·p·h·d_head``); scores and pattern (``3·h·sq·p``); the MLP's hidden activations
        (``4·sq·d_mlp``, a gated MLP has three)."""
        cfg = self.w.cfg
        b, p, d = self.runs.base_in[0].shape
        s, sq = p - self.first, p - self.queries_from(layer)
        he = cfg.n_heads * cfg.d_head
        per_copy = 4 * b * (8 * s * d + 8 * p * he + 3 * cfg.n_heads * sq * p + 4 * sq * (cfg.d_mlp or 0))
        return equal_parts(n, _LAYER_BYTES // per_copy)


def _suffix(w: WeightSource, runs: _Runs, clean: Tensor, corrupt: Tensor, metric: Metric) -> _Suffix:
    differ = (clean != corrupt).any(dim=0).nonzero()
    first = int(differ[0]) if differ.numel() else clean.shape[1]
    return _Suffix(HeldLayerWeights(w), runs, first, metric.reads(clean.shape[1]), {})


# the pairs patched at one site, with their activations: a layer's patches, site by site
_Patches = Sequence[tuple[str, list[_Pair], "Tensor"]]


def _patched_layer(ctx: _Suffix, layer: int, x: Tensor, slot: Tensor, patches: _Patches) -> Tensor:
    """Block ``layer`` of ``n = len(slot)`` patched runs; returns their streams after it,
    ``[n·b, p - q0, d]`` from position ``q0 = ctx.queries_from(layer)``.

    ``x [m·b, s, d]`` holds ``m`` distinct streams entering the layer at positions ``first ..``
    and ``slot[j]`` is run ``j``'s (runs that start at this layer share the base stream).
    Attention runs once per stream. Each pair's head gets ``source`` at its site (positions
    before ``first`` equal the base run's); its output is recomputed with the other inputs
    it had, and the change ``(z_new - z) W_O[h]`` is added to its run's attention output.
    At site ``mlp`` the pair's ``source [b, p, d_model]`` is added to its run's MLP input."""
    w = ctx.w
    m, n, first, q0 = x.shape[0] // ctx.runs.base_in[0].shape[0], len(slot), ctx.first, ctx.queries_from(layer)
    b, s = x.shape[0] // m, x.shape[1]
    rows = q0 - first  # the suffix rows that are not queries here
    q_pre, k_pre, v = projections(w, layer, attention_input(w, layer, x))
    q_pre = q_pre[:, :, rows:]
    q, k = qk_norm(w, layer, q_pre, k_pre)
    pk_pre, pk, pv = ctx.prefix(layer)

    def whole(pre: Tensor, t: Tensor) -> Tensor:  # the prefix's rows, then the stream's
        return torch.cat((pre.repeat(m, 1, 1, 1), t), dim=2) if first else t

    k, v = whole(pk, k), whole(pv, v)
    pattern = attention_pattern(w, layer, q, k)
    z = pattern @ v  # [m·b, h, sq, e]
    pre = f"blocks.{layer}.attn"
    w_o, b_o = w.get(f"{pre}.W_O"), w.get(f"{pre}.b_O")
    h, e = w.cfg.n_heads, w.cfg.d_head
    sq = z.shape[2]
    # Σ_h z_h W_O[h] + b_O of every stream at once, one product (as blocks_together forms it)
    a = (z.transpose(1, 2).reshape(m * b * sq, h * e) @ w_o.reshape(h * e, -1) + b_o).reshape(m, b, sq, -1)
    x_q = x.reshape(m, b, s, -1)[:, :, rows:]
    if m != n or not torch.equal(slot, torch.arange(n)):
        a, x_q = a[slot], x_q[slot]
    if len(patches) > 1 and _norm_spans_heads(w, layer):
        raise InvalidRequestError(getattr(w, "path", None), "a q/k norm across the heads: patch one site at a time")
    mlp_in: Tensor | None = None
    for site, pairs, source in patches:
        variant = torch.tensor([j for j, _, _ in pairs])
        if site == "mlp":  # the MLP's input of the pair's run, at the query positions
            if mlp_in is None:
                mlp_in = a.new_zeros(a.shape)
            mlp_in.index_add_(0, variant, source[:, :, q0:].transpose(0, 1))
            continue
        heads = torch.tensor([hd for _, hd, _ in pairs])
        at = slot[variant]

        def pick(t: Tensor, at: Tensor = at, heads: Tensor = heads) -> Tensor:
            """``[m·b, h, ...]`` -> the pairs' heads ``[b, P, ...]``."""
            return t.reshape(m, b, *t.shape[1:])[at, :, heads].transpose(0, 1)

        positions = [pos for _, _, pos in pairs]
        if site in ("q", "out", "pattern"):  # one row per query
            source = source[:, :, q0:]
        if site in ("q", "k") and _norm_spans_heads(w, layer):
            # the norm mixes the heads: each run's whole attention, its heads renormalised
            def per_run(t: Tensor) -> Tensor:  # [m·b, h, ...] -> [n, b, h, ...], a copy to edit
                return t.reshape(m, b, *t.shape[1:])[slot]

            q_runs, k_runs = per_run(q_pre), per_run(whole(pk_pre, k_pre))
            edited = q_runs if site == "q" else k_runs
            edited[variant, :, heads] = _at_positions(
                edited[variant, :, heads].transpose(0, 1), source, positions, q0 if site == "q" else 0).transpose(0, 1)
            q_v, k_v = qk_norm(w, layer, q_runs.flatten(0, 1), k_runs.flatten(0, 1))
            z_v = attention_pattern(w, layer, q_v, k_v) @ per_run(v).flatten(0, 1)
            a = (z_v.transpose(1, 2).reshape(n * b * sq, h * e) @ w_o.reshape(h * e, -1) + b_o).reshape(n, b, sq, -1)
        else:
            base = {"q": q_pre, "k": k_pre, "v": v, "pattern": pattern, "out": z}[site]
            if site == "k":
                base = whole(pk_pre, k_pre)
            offset = 0 if site in ("k", "v") else q0
            patched = _at_positions(pick(base), source, positions, offset)
            if site == "out":
                z_new = patched
            elif site == "q":
                z_new = attention_pattern(w, layer, _normed(w, layer, patched, "q"), pick(k)) @ pick(v)
            elif site == "k":
                z_new = attention_pattern(w, layer, pick(q), _normed(w, layer, patched, "k")) @ pick(v)
            elif site == "v":
                z_new = pick(pattern) @ patched
            else:
                z_new = patched @ pick(v)
            a.index_add_(0, variant, torch.einsum("bPqe,Pem->Pbqm", z_new - pick(z), w_o[heads]))
    a = a.reshape(n * b, sq, -1)
    return finish_block(w, layer, x_q.reshape(n * b, sq, -1), a,
                        mlp_in=None if mlp_in is None else mlp_in.reshape(n * b, sq, -1))


def _normed(w: WeightSource, layer: int, x: Tensor, which: str) -> Tensor:
    """The q/k norm of ``layer`` (a per-head one: each head alone) applied to ``x``."""
    q, k = qk_norm(w, layer, x, x)
    return q if which == "q" else k


def _at_positions(base: Tensor, source: Tensor, positions: list[int | None], offset: int = 0) -> Tensor:
    """``source [b, P, rows, ...]`` where each pair patches (every row, or its one position:
    the query row of a pattern), ``base`` elsewhere; row ``i`` is position ``offset + i``
    (a position outside the rows: nothing to patch here)."""
    if all(pos is None for pos in positions):
        return source
    out = base.clone()
    for i, pos in enumerate(positions):
        if pos is None:
            out[:, i] = source[:, i]
        elif 0 <= pos - offset < out.shape[2]:
            out[:, i, pos - offset] = source[:, i, pos - offset]
    return out


def _run_variants(ctx: _Suffix, variants: Sequence[_Variant], ids: Sequence[int], site: str,
                  source_for: SourceFor, cancelled: Cancelled, step: Callable[[int], None]) -> Tensor:
    """The final stream of each variant (``ids``: their indices for ``source_for``) at the
    positions the metric reads, ``[n·b, reads, d]``. One pass from the first layer any of
    them patches: a variant joins the batch at its first patched layer (from the base
    stream), its heads patched layer by layer. Each layer runs in sub-batches of the copies
    (``_layer_in_parts``) with its weights held, so they are read once for all of them;
    ``step(k)`` after each sub-batch of ``k`` copies."""
    runs, first = ctx.runs, ctx.first
    starts = [min(layer for layer, _ in v.heads) for v in variants]
    order: list[int] = []  # the variants running, in the order of the rows of x
    b, p, d = runs.base_in[0].shape
    x = runs.base_in[0].new_empty((0, p - first, d))
    try:
        for layer in range(min(starts), ctx.w.cfg.n_layers):
            check_cancelled(cancelled)
            read_next(ctx.w, layer)  # the next layer's reads overlap this one's work
            ctx.w.hold(layer)
            joining = [i for i, start in enumerate(starts) if start == layer]
            slot = torch.arange(len(order) + len(joining))
            if joining:  # the base stream entering ``layer`` is one more slot, shared
                slot[len(order):] = len(order)
                x = torch.cat((x, runs.base_in[layer][:, first:]))
            order += joining
            pairs = [(j, head, variants[i].pos) for j, i in enumerate(order)
                     for lh, head in variants[i].heads if lh == layer]
            x = _layer_in_parts(ctx, layer, x, slot, pairs, [variants[i].site or site for i in order],
                                source_for, [ids[i] for i in order], cancelled, step)
    finally:
        ctx.w.hold(None)
    final = x.reshape(len(order), b, *x.shape[1:])[torch.tensor(order).argsort()]
    missing = ctx.reads - final.shape[2]  # read positions before ``first``: the base run's
    if missing > 0:
        kept = runs.base_final[None, :, p - ctx.reads:p - ctx.reads + missing]
        final = torch.cat((kept.expand(len(order), *kept.shape[1:]), final), dim=2)
    return final.reshape(len(order) * b, *final.shape[2:])


def _layer_in_parts(ctx: _Suffix, layer: int, x: Tensor, slot: Tensor, pairs: list[_Pair], sites: list[str],
                    source_for: SourceFor, ids: list[int], cancelled: Cancelled,
                    step: Callable[[int], None]) -> Tensor:
    """``_patched_layer`` of the ``n = len(slot)`` runs in sub-batches of consecutive runs
    (``ctx.runs_per_part``), the same streams out, ``[n·b, sq, d]``. ``slot`` is
    non-decreasing (the runs joining at this layer share the last stream), so a sub-batch
    of runs ``j0 .. j1-1`` reads the streams ``slot[j0] .. slot[j1-1]`` (a view of ``x``)
    with its slots shifted to start at 0, and its pairs re-indexed from ``j0``, their
    activations from ``source_for`` (``ids[j]``: run ``j``'s variant for it), one call per
    site (``sites[j]``: run ``j``'s)."""
    n = len(slot)
    b = ctx.runs.base_in[0].shape[0]
    size = ctx.runs_per_part(layer, n)
    out: Tensor | None = None
    for j0 in range(0, n, size):
        check_cancelled(cancelled)
        j1 = min(n, j0 + size)
        s0, s1 = int(slot[j0]), int(slot[j1 - 1]) + 1
        patches = []
        for site in dict.fromkeys(sites[j] for j, _, _ in pairs if j0 <= j < j1):
            mine = [pair for pair in pairs if j0 <= pair[0] < j1 and sites[pair[0]] == site]
            patches.append((site, [(j - j0, head, pos) for j, head, pos in mine],
                            source_for(layer, [(ids[j], head, pos) for j, head, pos in mine])))
        y = _patched_layer(ctx, layer, x[s0 * b:s1 * b], slot[j0:j1] - s0, patches)
        if size >= n:
            out = y
        else:
            if out is None:  # filled in place: no second copy of every stream
                out = y.new_empty((n * b, *y.shape[1:]))
            out[j0 * b:j1 * b] = y
        step(j1 - j0)
    assert out is not None
    return out


def _head_sets(w: WeightSource, heads: Sequence[Sequence[tuple[int, int]]] | None) -> list[HeadSet]:
    """Every head alone (``None``), or the given sets (``validation.check_head_sets``)."""
    cfg = w.cfg
    if heads is None:
        return [((layer, head),) for layer in range(cfg.n_layers) for head in range(cfg.n_heads)]
    return check_head_sets({"n_layers": cfg.n_layers, "n_heads": cfg.n_heads}, heads, getattr(w, "path", None))


def _evaluate(w: WeightSource, ctx: _Suffix, variants: list[_Variant], site: str, metric: Metric,
              source_for: SourceFor, progress: Progress, cancelled: Cancelled) -> list[float]:
    """The metric of every variant: one pass from the first patched layer for all of them
    (``_run_variants``), or several when their streams exceed ``_STREAM_BYTES``
    (``ctx.copies_per_pass``, in the order of the layer they start at). A variant that
    patches only positions before ``ctx.first`` is the base run. Progress counts the
    copy-layers run."""
    runs = ctx.runs
    n_layers = len(runs.base_in)
    p = runs.base_in[0].shape[1]
    base = runs.clean if runs.noising else runs.corrupt
    out = [base] * len(variants)
    todo = [i for i, v in enumerate(variants) if v.pos is None or v.pos >= ctx.first]
    if ctx.first == p:
        todo = []
    starts = {i: min(layer for layer, _ in variants[i].heads) for i in todo}
    todo.sort(key=starts.__getitem__)
    total = sum(n_layers - starts[i] for i in todo) or 1
    done = 0

    def step(k: int) -> None:
        nonlocal done
        done += k
        report(progress, done / total)

    chunk = ctx.copies_per_pass(len(todo))
    for at in range(0, len(todo), chunk):
        part = todo[at:at + chunk]
        final = _run_variants(ctx, [variants[i] for i in part], part, site, source_for, cancelled, step)
        for i, value in zip(part, metric(w, final, len(part)).tolist(), strict=True):
            out[i] = value
    report(progress, 1.0)
    return out


def patch_heads(w: WeightSource, clean: Tensor | Sequence, corrupt: Tensor | Sequence, metric: Metric, *,
                site: str = "out", noising: bool = False,
                heads: Sequence[Sequence[tuple[int, int]]] | None = None, by_position: bool = False,
                progress: Progress = None, cancelled: Cancelled = None) -> PatchResult:
    """Exact activation patching of every head (``heads=None``) or of each given set of heads
    patched together, at every position (as TransformerLens'
    ``get_act_patch_attn_head_{out,q,k,v,pattern}_all_pos``); ``by_position`` adds each
    position patched alone (``..._by_pos``: the query row of a pattern)."""
    check_site(site)
    check_metric(w, metric)
    clean_t, corrupt_t = check_inputs(w, clean, corrupt)
    sets = _head_sets(w, heads)
    check_cancelled(cancelled)
    # numpy's OpenBLAS on one thread while torch runs: the weights the first pass processes on
    # the way are small numpy products, and an idle OpenBLAS pool spins against torch's on 2
    # cores (GPT-2 small, every head: 2.2-2.8 s -> 1.6-1.8 s whole process, CPU time 3.6-4.7 s
    # -> 2.3-2.4 s), as in the sweeps' passes (``sweeps.scores``)
    with torch.inference_mode(), one_lapack_thread():
        runs = _two_runs(w, clean_t, corrupt_t, metric, noising)
        variants = [_Variant(s) for s in sets]
        if by_position:
            variants += [_Variant(s, pos) for s in sets for pos in range(clean_t.shape[1])]
        ctx = _suffix(w, runs, clean_t, corrupt_t, metric)
        # the source activations read their layer's weights while the pass holds them
        values = _evaluate(w, ctx, variants, site, metric, _activation_source(ctx.w, runs, site), progress, cancelled)
    n_pos = clean_t.shape[1]
    positions = None
    if by_position:
        positions = [values[len(sets) + i * n_pos: len(sets) + (i + 1) * n_pos] for i in range(len(sets))]
    return _result(w, "exact", site, metric, noising, runs, clean_t, sets, values[:len(sets)], positions=positions)


def _result(w: WeightSource, method: str, site: str, metric: Metric, noising: bool, runs: _Runs,
            tokens: Tensor, sets: Sequence[HeadSet], values: Sequence[float], **more: object) -> PatchResult:
    return patch_result(method=method, site=site, metric=metric.name, noising=noising,  # type: ignore[arg-type]
                        clean=runs.clean, corrupt=runs.corrupt, sets=sets, values=values,
                        n_layers=w.cfg.n_layers, n_heads=w.cfg.n_heads, tokens=int(tokens.shape[1]),
                        batch=int(tokens.shape[0]), **more)  # type: ignore[arg-type]


class _SourceActivations:
    """The source run's activation at ``site`` for each pair (a ``SourceFor``), computed once
    per layer and kept while the kept layers fit ``_SOURCE_BYTES``: the most recent layer is
    always kept, older ones dropped first (a pass runs the layers in order; a later pass
    recomputes what it needs). A pattern is ``[b, h, p, p]`` per layer: kept for every layer,
    a long prompt's patterns grew without bound. ``peak``: the most bytes kept at once."""

    def __init__(self, w: WeightSource, runs: _Runs, site: str) -> None:
        self.w, self.runs, self.site = w, runs, site
        self.cache: dict[int, Tensor] = {}
        self.peak = 0

    def kept_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.cache.values())

    def __call__(self, layer: int, pairs: list[_Pair]) -> Tensor:
        if layer not in self.cache:
            activation = _site_activation(self.w, layer, self.runs.source_in[layer], self.site)
            size = activation.numel() * activation.element_size()
            while self.cache and self.kept_bytes() + size > _SOURCE_BYTES:
                del self.cache[next(iter(self.cache))]
            self.cache[layer] = activation
            self.peak = max(self.peak, self.kept_bytes())
        return self.cache[layer][:, [head for _, head, _ in pairs]]


def _activation_source(w: WeightSource, runs: _Runs, site: str) -> SourceFor:
    """The source run's activation at ``site`` for each pair (``_SourceActivations``)."""
    return _SourceActivations(w, runs, site)


# -- attribution -----------------------------------------------------------------------------


def attribute_heads(w: WeightSource, clean: Tensor | Sequence, corrupt: Tensor | Sequence, metric: Metric, *,
                    site: str = "out", noising: bool = False, verify: int = 0,
                    progress: Progress = None, cancelled: Cancelled = None) -> PatchResult:
    """Attribution patching of every head at ``site``: the first-order estimate of what
    patching it would change the metric by (module docstring). Each row's ``estimate`` is
    that change, ``patched`` the metric it predicts, ``recovered`` the recovery it predicts.
    ``verify = K`` patches the top K heads by ``|estimate|`` exactly and adds the exact
    metric and recovery to their rows."""
    check_site(site)
    check_metric(w, metric)
    clean_t, corrupt_t = check_inputs(w, clean, corrupt)
    cfg = w.cfg
    tw = torch_weights(w)
    check_cancelled(cancelled)
    steps = cfg.n_layers + 1 + (1 if verify else 0)
    # not inference_mode: the kept streams enter the backward pass; numpy's BLAS: see patch_heads
    with torch.no_grad(), one_lapack_thread():
        runs = _two_runs(w, clean_t, corrupt_t, metric, noising)
    report(progress, 1 / steps)
    with torch.enable_grad():
        final = runs.base_final.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(metric(w, final, 1).sum(), final)
        estimates = torch.zeros(cfg.n_layers, cfg.n_heads)
        for layer in reversed(range(cfg.n_layers)):
            check_cancelled(cancelled)
            x = runs.base_in[layer].detach().requires_grad_(True)
            q_pre, k_pre, v = projections(tw, layer, attention_input(tw, layer, x))
            q, k = qk_norm(tw, layer, q_pre, k_pre)
            pattern = attention_pattern(tw, layer, q, k)
            z = pattern @ v
            a = torch.einsum("bhqe,hem->bhqm", z, tw.get(f"blocks.{layer}.attn.W_O")).sum(dim=1)
            out = finish_block(tw, layer, x, a + tw.get(f"blocks.{layer}.attn.b_O"))
            tap = {"out": z, "v": v, "pattern": pattern, "q": pattern, "k": pattern}[site]
            grad, grad_tap = torch.autograd.grad(out, (x, tap), grad)
            with torch.no_grad():
                source = _site_activation(tw, layer, runs.source_in[layer], site)
                if site in ("q", "k") and _norm_spans_heads(tw, layer):
                    # one head's q (k) renormalises every head's: one full pattern per head
                    for head in range(cfg.n_heads):
                        edited = (q_pre if site == "q" else k_pre).clone()
                        edited[:, head] = source[:, head]
                        q_h, k_h = qk_norm(tw, layer, *((edited, k_pre) if site == "q" else (q_pre, edited)))
                        delta = attention_pattern(tw, layer, q_h, k_h) - pattern
                        estimates[layer, head] = (grad_tap * delta).sum()
                else:
                    if site == "q":  # AtP*: the softmax with the patched queries, then linear in the pattern
                        delta = attention_pattern(tw, layer, _normed(tw, layer, source, "q"), k) - pattern
                    elif site == "k":
                        delta = attention_pattern(tw, layer, q, _normed(tw, layer, source, "k")) - pattern
                    else:
                        delta = source - tap
                    estimates[layer] = (grad_tap * delta).transpose(0, 1).reshape(cfg.n_heads, -1).sum(1)
            grad = grad.detach()
            report(progress, (cfg.n_layers - layer + 1) / steps)
    heads = [h for (h,) in _head_sets(w, None)]
    values = [float(v) for v in estimates.flatten()]
    exact = None
    if verify:
        top = verify_order(values)[:verify]
        with torch.inference_mode():
            ctx = _suffix(w, runs, clean_t, corrupt_t, metric)
            found = _evaluate(w, ctx, [_Variant((heads[i],)) for i in top], site, metric,
                              _activation_source(ctx.w, runs, site), None, cancelled)
        exact = [math.nan] * len(heads)
        for i, value in zip(top, found, strict=True):
            exact[i] = value
    report(progress, 1.0)
    return _result(w, "attribution", site, metric, noising, runs, clean_t, [(h,) for h in heads], values,
                   exact=exact, verified=verify if exact is not None else 0)


# -- path patching ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PathValues:
    """The metric of each path patched (``patch_paths``), beside the two plain runs'."""

    clean: float
    corrupt: float
    patched: tuple[float, ...]


Path = tuple["str | PathNode", "str | PathNode"]


def path_nodes(w: WeightSource, paths: Sequence[Path]) -> list[tuple[PathNode, PathNode]]:
    """Each path's (sender, receiver) nodes, checked against the model (``path_nodes.check_path``;
    an MLP's input is refused on a model that normalises after adding the sublayers, BERT's
    post-LN, where no input is the MLP's alone)."""
    cfg, where = w.cfg, getattr(w, "path", None)
    out = []
    for sender, receiver in paths:
        s, r = (node if isinstance(node, PathNode) else path_node(node, where) for node in (sender, receiver))
        check_path(s, r, n_layers=cfg.n_layers, n_heads=cfg.n_heads, has_mlp=not cfg.attn_only,
                   parallel=cfg.parallel_attn_mlp, where=where)
        if cfg.post_ln and "mlp" in (s.kind, r.kind):
            raise InvalidRequestError(where, f"{cfg.architecture} normalises after each sublayer: no MLP node to patch")
        out.append((s, r))
    return out


def patch_paths(w: WeightSource, clean: Tensor | Sequence, corrupt: Tensor | Sequence, metric: Metric,
                paths: Sequence[Path], *, noising: bool = False, progress: Progress = None,
                cancelled: Cancelled = None) -> PathValues:
    """Path patching of each ``(sender, receiver)`` (node names, ``core.path_nodes``): the
    receiver's input is the base run's plus ``S_source - S_base`` of the sender (what the
    sender writes in the source run minus what it writes in this one; module docstring), and
    no other node sees the change. Noising (the clean run, the sender corrupted) is the
    change an edge attribution score estimates: ``edges.exact_edges`` is this."""
    check_metric(w, metric)
    clean_t, corrupt_t = check_inputs(w, clean, corrupt)
    nodes = path_nodes(w, paths)
    check_cancelled(cancelled)
    runs, values = _path_metrics(w, clean_t, corrupt_t, metric, nodes, noising, progress, cancelled)
    return PathValues(runs.clean, runs.corrupt, tuple(values))


def _path_metrics(w: WeightSource, clean: Tensor, corrupt: Tensor, metric: Metric,
                  nodes: Sequence[tuple[PathNode, PathNode]], noising: bool, progress: Progress,
                  cancelled: Cancelled) -> tuple[_Runs, list[float]]:
    """The two runs and the metric of each path: a receiver in a layer is a patched copy of
    ``_evaluate`` joining at that layer (a head's q/k/v input is its site; the MLP's input
    the site ``mlp``), ``logits`` the base run's final stream plus the difference."""
    with torch.inference_mode(), one_lapack_thread():  # numpy's BLAS: see patch_heads
        runs = _two_runs(w, clean, corrupt, metric, noising)
        ctx = _suffix(w, runs, clean, corrupt, metric)
        tw = ctx.w  # the receivers' projections read their layer's weights while the pass holds them
        base_tokens, source_tokens = (clean, corrupt) if noising else (corrupt, clean)
        written: dict[tuple[str, int, bool], Tensor] = {}

        def writes(kind: str, layer: int, source: bool) -> None:
            """What ``layer`` writes in a run: each head's output ``[b, h, p, d_model]`` as it
            enters the residual stream, or (``kind`` mlp) the MLP's ``[b, p, d_model]``."""
            x = (runs.source_in if source else runs.base_in)[layer]
            z = _site_activation(tw, layer, x, "out")
            result = torch.einsum("bhqe,hem->bhqm", z, tw.get(f"blocks.{layer}.attn.W_O"))
            written["head", layer, source] = post_normed_heads(tw, layer, result)
            if kind == "mlp":
                finish_block(tw, layer, x, result.sum(dim=1) + tw.get(f"blocks.{layer}.attn.b_O"),
                             on_mlp=lambda out: written.__setitem__(("mlp", layer, source), out))

        def sent(node: PathNode, source: bool) -> Tensor:
            """What ``node`` writes in the source or the base run, ``[b, p, d_model]``."""
            if node.kind == "input":
                return tw.embed_rows(source_tokens if source else base_tokens)
            if (node.kind, node.layer, source) not in written:
                writes(node.kind, node.layer, source)
            found = written[node.kind, node.layer, source]
            return found[:, node.head] if node.kind == "head" else found

        def difference(i: int) -> Tensor:
            sender = nodes[i][0]
            return sent(sender, True) - sent(sender, False)

        inside = [i for i, (_, r) in enumerate(nodes) if r.kind != "logits"]

        def source_for(_layer: int, pairs: list[_Pair]) -> Tensor:
            found = []
            for v, _, _ in pairs:
                i = inside[v]
                receiver = nodes[i][1]
                if receiver.kind == "mlp":
                    found.append(difference(i))
                else:  # the receiver's input: the base stream + the sender's difference
                    x = runs.base_in[receiver.layer] + difference(i)
                    found.append(_head_projection(tw, receiver.layer, x, receiver.part or "q", receiver.head))
            return torch.stack(found, dim=1)  # [b, P, p, d_head] ([b, P, p, d_model]: mlp)

        variants = [_Variant(((r.layer, r.head if r.kind == "head" else -1),),
                             site=r.part if r.kind == "head" else "mlp") for _, r in (nodes[i] for i in inside)]
        out = [math.nan] * len(nodes)
        groups = [list(range(len(variants)))]
        if any(_norm_spans_heads(tw, layer) for layer in range(w.cfg.n_layers)):  # one site a pass
            groups = [[j for j, v in enumerate(variants) if v.site == site] for site in dict.fromkeys(
                v.site for v in variants)]
        for group in groups:
            found = _evaluate(w, ctx, [variants[j] for j in group], "q", metric,
                              lambda layer, pairs, group=group: source_for(layer, [(group[v], h, p) for v, h, p in pairs]),
                              progress, cancelled)
            for j, value in zip(group, found, strict=True):
                out[inside[j]] = value
        at_logits = [i for i, (_, r) in enumerate(nodes) if r.kind == "logits"]
        if at_logits:
            final = torch.cat([runs.base_final + difference(i) for i in at_logits])
            for i, value in zip(at_logits, metric(w, final, len(at_logits)).tolist(), strict=True):
                out[i] = value
    return runs, out


def _head_projection(w: WeightSource, layer: int, x: Tensor, part: str, head: int) -> Tensor:
    """Head ``head``'s ``part`` (q, k or v, before the q/k norm) of the stream ``x [b, p, d]``
    entering ``layer``, ``[b, p, d_head]``: that head alone (a grouped key or value: the query
    head's own copy of its group's)."""
    pre = f"blocks.{layer}.attn"
    name = part.upper()
    return attention_input(w, layer, x) @ w.get(f"{pre}.W_{name}")[head] + w.get(f"{pre}.b_{name}")[head]


def path_patch(w: WeightSource, clean: Tensor | Sequence, corrupt: Tensor | Sequence, metric: Metric,
               edges: Sequence[tuple[tuple[int, int], tuple[int, int]]], *, receiver_input: str = "q",
               noising: bool = False, progress: Progress = None, cancelled: Cancelled = None) -> PatchResult:
    """Path patching of each edge ``(sender, receiver)`` (module docstring): the sender's
    source-run output enters the receiver's ``receiver_input`` (q, k or v) only
    (``patch_paths`` of ``a{l}.h{h} -> a{l'}.h{h'}<receiver_input>``). One row per edge,
    ``heads = (sender, receiver)``. An end that is not a head is its ``path_nodes.node_key``
    pair (``input``, ``m{l}``, ``logits``); into an MLP or the logits ``receiver_input`` is
    ``mlp`` or ``logits``, as the row's site says."""
    check_site(receiver_input, (*PATH_INPUTS, "mlp", "logits"))
    check_metric(w, metric)
    clean_t, corrupt_t = check_inputs(w, clean, corrupt)
    part = receiver_input if receiver_input in PATH_INPUTS else None
    nodes = path_nodes(w, [(key_node(sender), key_node(receiver, part)) for sender, receiver in edges])
    for _, node in nodes:
        if (node.kind if node.kind != "head" else node.part) != receiver_input:
            raise InvalidRequestError(getattr(w, "path", None), f"{node.name} is not patched at {receiver_input!r}")
    check_cancelled(cancelled)
    runs, values = _path_metrics(w, clean_t, corrupt_t, metric, nodes, noising, progress, cancelled)
    sets = [(tuple(sender), tuple(receiver)) for sender, receiver in edges]
    return _result(w, "path", receiver_input, metric, noising, runs, clean_t, sets, values)


# -- one edge into a head's query or key (QK attribution's confirmation) -------------------------


def receiver_qk(w: WeightSource, layer: int, head: int, x: Tensor, side: str, *,
                scale: Tensor | None = None) -> Tensor:
    """Head ``layer``.``head``'s query or key (``side``: ``q`` | ``k``) before RoPE, ``[..., p,
    d_head]``, read from the stream ``x [..., p, d_model]`` entering its layer as path patching
    feeds a receiver (``attention_input``, then the head's projection; the key: its K/V
    head's). ``scale [p, 1]``: the norm's scale frozen at it instead of ``x``'s own (QK
    attribution's linear picture, docs/math.md)."""
    tw = torch_weights(w)
    normed = attention_input(tw, layer, x) if scale is None else _norm_at(tw, layer, x, scale)
    which = {"q": "Q", "k": "K"}[side]
    pre = f"blocks.{layer}.attn"
    return normed @ tw.get_head(f"{pre}.W_{which}", head) + tw.get_head(f"{pre}.b_{which}", head)


def _norm_at(w: TorchWeights, layer: int, x: Tensor, scale: Tensor) -> Tensor:
    """``layer``'s attention norm of ``x`` divided by ``scale`` instead of its own (``norm``'s
    arithmetic otherwise: LayerNorm centres first; the gain and bias where not folded)."""
    kind, prefix = w.cfg.normalization, f"blocks.{layer}.ln1"
    if kind not in ("LN", "LNPre", "RMS", "RMSPre"):
        return x  # no norm: no scale to freeze
    if kind in ("LN", "LNPre"):
        x = x - x.mean(dim=-1, keepdim=True)
    x = x / scale
    if kind in ("LN", "RMS") and w.has(f"{prefix}.w"):
        x = x * w.get(f"{prefix}.w")
    if kind == "LN" and w.has(f"{prefix}.b"):
        x = x + w.get(f"{prefix}.b")
    return x


def scores_without(w: WeightSource, layer: int, head: int, x: Tensor, query: int, removed: Tensor,
                   side: str, *, freeze_scale: bool, seq_len: int | None = None) -> Tensor:
    """Head ``layer``.``head``'s scores from ``query`` to keys ``0 .. query``, ``[S, query +
    1]``, when its ``side`` input (``q`` | ``k``) reads the stream ``x [p, d_model]`` entering
    its layer less each ``removed[s] [p, d_model]`` in turn: ``S`` path patches into one side of
    the head, each sender's output zeroed, nothing else seeing the change (the other side reads
    ``x``). ``freeze_scale``: the norm divides by ``x``'s scale, as QK attribution's terms
    assume (the drop is then linear in the sender); else by the edited stream's own (the real
    intervention). ``seq_len``: RoPE's, as ``rotate_queries_keys``."""
    from headscope.engine.forward.transformer import norm_scale, rotate_queries_keys

    tw = torch_weights(w)
    frozen = norm_scale(x, tw.cfg) if freeze_scale else None
    rows = {"q": slice(query, query + 1), "k": slice(0, query + 1)}

    def read(s: str, stream: Tensor) -> Tensor:  # [..., rows, d_model] -> [..., rows, d_head]
        return receiver_qk(tw, layer, head, stream, s, scale=None if frozen is None else frozen[rows[s]])

    n = removed.shape[0]
    edited = x[None, rows[side]] - removed[:, rows[side]]
    q = read("q", edited) if side == "q" else read("q", x[rows["q"]]).expand(n, 1, -1)
    k = read("k", edited) if side == "k" else read("k", x[rows["k"]]).expand(n, query + 1, -1)
    q, k = rotate_queries_keys(tw, layer, q, k, seq_len=seq_len)
    return (q @ k.transpose(-1, -2))[:, 0] / tw.cfg.scale
