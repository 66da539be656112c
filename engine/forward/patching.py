"""Activation, attribution and path patching of attention heads (docs/math.md, "Patching").

Conventions are TransformerLens' ``patching`` module's, so the numbers compare 1:1:
denoising by default (run the corrupt input, patch in a head's clean activation at every
position), ``noising`` the reverse; sites ``out`` (the head's ``z``, ``hook_z``), ``q``, ``k``,
``v`` (before RoPE, after any q/k norm) and ``pattern`` (after the softmax); the metric is
read from the patched logits. With grouped-query attention a "head" is a query head: its
``k``/``v`` site is its own copy of the shared key/value head (TransformerLens patches the
stored K/V head, which equals patching its group of query heads together).

Cost (``patch_heads``): one pass over the clean and the corrupt batch together keeps the
residual stream entering each layer; then the patches that start at layer ``l`` resume from
there, as ``transformer.run_ablations`` does: the attention of ``l`` runs once, only the
patched heads' attention is recomputed (side by side, one "head" per patch), and the rest of
the model runs on all the patched copies as one batch (``behaviour.copies_per_pass`` copies
at a time). Nothing below ``l`` is rerun, nothing is rerun per head.

Attribution (``attribute_heads``, AtP, Kramár et al. 2024) is the first-order estimate
``grad(metric) · (source - base)`` of every head at once from the same two runs and one
backward pass, taken layer by layer from the top (each layer's forward is recomputed with
gradients from its kept input, so memory holds one layer's graph, never the model's). For
``q``/``k`` the softmax is recomputed with the patched queries or keys and the gradient
taken at the pattern (AtP*'s QK fix: a linear estimate through a saturated softmax misses
the head).

Path patching (``path_patch``) of an edge sender -> receiver puts the sender's clean output
(as it enters the residual stream) into the receiver's q, k or v input only: the receiver's
input is the corrupt stream entering its layer plus (clean - corrupt) sender output, and no
other head or MLP sees the change; the receiver's new output then flows through the rest of
the model as usual.

Every entry point takes ``progress(fraction)`` and ``cancelled()`` (checked between patched
batches, raising ``CancelledError``) like the other sweeps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from headscope.engine.circuits.spectral import check_cancelled, report
from headscope.engine.core.errors import (
    IndexOutOfRangeError,
    InvalidRequestError,
    NonFiniteError,
    PromptError,
)
from headscope.engine.core.results import PatchResult, patch_result
from headscope.engine.core.validation import PATCH_SITES, PATH_INPUTS, check_patchable
from headscope.engine.forward.behaviour import (
    copies_per_pass,
    repeated_tokens,
    second_copy_log_probs,
)
from headscope.engine.forward.torch_weights import torch_weights
from headscope.engine.forward.transformer import (
    attention_input,
    attention_pattern,
    blocks,
    embed,
    finish_block,
    post_normed_heads,
    projections,
    qk_norm,
    token_ids,
    unembed,
)
from headscope.engine.model.weights import WeightSource

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "PATH_INPUTS",
    "SITES",
    "HeadSet",
    "InductionLogProb",
    "LogitDiff",
    "Metric",
    "attribute_heads",
    "check_inputs",
    "induction_task",
    "patch_heads",
    "path_patch",
]

Progress = Callable[[float], None] | None
Cancelled = Callable[[], bool] | None
HeadSet = tuple[tuple[int, int], ...]  # heads patched together
SITES = PATCH_SITES  # (core.validation: one list for every entry point)


# -- metrics ---------------------------------------------------------------------------------


class Metric(Protocol):
    """What patching measures, read from the final residual stream of ``n`` runs of a token
    batch side by side (``final [n·b, pos, d_model]``): ``[n]``, each run's mean over the
    batch. Only the positions the metric reads are unembedded."""

    name: str

    def __call__(self, w: WeightSource, final: Tensor, n: int) -> Tensor: ...


@dataclass(frozen=True)
class LogitDiff:
    """``logit[answer] - logit[wrong]`` at the last position."""

    answer: int
    wrong: int
    name: str = "logit_diff"

    def __call__(self, w: WeightSource, final: Tensor, n: int) -> Tensor:
        logits = unembed(w, final[:, -1], (self.answer, self.wrong))  # [n·b, 2]: not all of W_U
        return (logits[:, 0] - logits[:, 1]).float().reshape(n, -1).mean(1)


@dataclass(frozen=True)
class InductionLogProb:
    """The mean log-probability of the clean next token over the second half of a repeated
    sequence (``behaviour.second_copy_log_probs`` of the clean ``tokens [b, 2T]``)."""

    tokens: Tensor
    name: str = "induction"

    def __call__(self, w: WeightSource, final: Tensor, n: int) -> Tensor:
        half = self.tokens.shape[1] // 2
        logp = second_copy_log_probs(unembed(w, final[:, half:-1]), self.tokens.repeat(n, 1))
        return logp.reshape(n, -1).mean(1)


def induction_task(vocab: int, n_ctx: int, seed: int = 0, seq_len: int | None = None,
                   batch: int = 4) -> tuple[Tensor, Tensor]:
    """``(clean, corrupt)`` token batches ``[batch, 2T]`` of the induction task: clean is
    ``behaviour.repeated_tokens(vocab, n_ctx, seed, seq_len, batch)`` (a seeded random
    sequence written twice); corrupt keeps its first half and draws another random second
    half (seeded too, distinct ids within it when the vocabulary allows), so nothing in the
    corrupt context predicts the clean second half."""
    clean = repeated_tokens(vocab, n_ctx, seed, seq_len, batch)
    half = clean.shape[1] // 2
    g = torch.Generator().manual_seed(seed + 0x5EED)
    if vocab >= half:
        second = torch.stack([torch.randperm(vocab, generator=g)[:half] for _ in range(batch)])
    else:
        second = torch.randint(vocab, (batch, half), generator=g)
    return clean, torch.cat((clean[:, :half], second), dim=1)


# -- inputs ----------------------------------------------------------------------------------


def check_inputs(w: WeightSource, clean: Tensor | Sequence, corrupt: Tensor | Sequence
                 ) -> tuple[Tensor, Tensor]:
    """The clean and corrupt token ids as ``[batch, pos]`` tensors, checked: a causal model
    (patching reads a next-token metric), ids in range, at most ``n_ctx``, not empty, the
    same shape (the patched activations are position by position)."""
    cfg, path = w.cfg, getattr(w, "path", None)
    check_patchable({"causal": cfg.causal, "architecture": cfg.architecture}, path)
    toks = []
    for name, tokens in (("clean", clean), ("corrupt", corrupt)):
        try:
            toks.append(token_ids(tokens, cfg, path))
        except PromptError:
            raise PromptError(path, f"the {name} input is empty") from None
    a, b = toks
    if a.shape != b.shape:
        raise InvalidRequestError(
            path, f"the clean and corrupt inputs must have the same length: clean has {a.shape[-1]} "
            f"tokens, corrupt {b.shape[-1]}" + (f" (batches {a.shape[0]} and {b.shape[0]})" if a.shape[0] != b.shape[0] else ""))
    return a, b


def _check_metric(w: WeightSource, metric: Metric) -> None:
    if isinstance(metric, LogitDiff):
        for what, token in (("answer", metric.answer), ("wrong", metric.wrong)):
            if not 0 <= token < w.cfg.d_vocab:
                raise IndexOutOfRangeError(getattr(w, "path", None),
                                           f"{what} token id {token} out of range (d_vocab={w.cfg.d_vocab})")


def _check_site(site: str, allowed: Sequence[str] = SITES) -> None:
    if site not in allowed:
        raise InvalidRequestError(None, f"site must be one of {', '.join(allowed)}, not {site!r}")


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
                 clean=float(values[0]), corrupt=float(values[1]))


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
    """One patched copy of the run: its heads patched together, at one position or all."""

    heads: HeadSet
    pos: int | None = None


# (variant, head, pos): one head of one variant patched at the layer being run
_Pair = tuple[int, int, "int | None"]
# the activation each pair patches in, [b, P, ...] in the order of the pairs
SourceFor = Callable[[int, list[_Pair]], "Tensor"]


def _patched_attention(w: WeightSource, layer: int, x: Tensor, n: int, pairs: list[_Pair],
                       site: str, source: Tensor, shared: bool) -> Tensor:
    """The attention output ``[n·b, p, d_model]`` of ``layer`` for ``n`` variants.

    ``x [m·b, p, d]`` enters the layer: ``shared``, one stream all variants share (``m = 1``,
    the layer where they start: its attention runs once), else one per variant (``m = n``). Each pair's
    head gets ``source [b, P, ...]`` at its site; its attention is recomputed with the other
    inputs it had, side by side with the other pairs' heads, and its output replaces the
    head's in the sum, which is formed as the forward pass forms it (``transformer.attention``).
    """
    w = torch_weights(w)
    m = 1 if shared else n
    b = x.shape[0] // m
    q_pre, k_pre, v = projections(w, layer, attention_input(w, layer, x))
    q, k = qk_norm(w, layer, q_pre, k_pre)
    pattern = attention_pattern(w, layer, q, k)
    w_o = w.get(f"blocks.{layer}.attn.W_O")
    variant = torch.tensor([j for j, _, _ in pairs])
    heads = torch.tensor([h for _, h, _ in pairs])
    rows = variant if m > 1 else torch.zeros_like(variant)

    def pick(t: Tensor) -> Tensor:  # [m·b, h, ...] -> the pairs' heads [b, P, ...]
        return t.reshape(m, b, *t.shape[1:])[rows, :, heads].transpose(0, 1)

    def per_variant(t: Tensor) -> Tensor:  # [m·b, h, ...] -> [n, b, h, ...], a copy to edit
        t = t.reshape(m, b, *t.shape[1:])
        return t.expand(n, *t.shape[1:]).clone() if m == 1 else t.clone()

    base = {"q": q_pre, "k": k_pre, "v": v, "pattern": pattern, "out": pattern @ v}[site]
    patched = _at_positions(pick(base), source, [pos for _, _, pos in pairs])
    if site in ("q", "k") and _norm_spans_heads(w, layer):
        # the norm mixes the heads: every head of a variant gets its renormalised q (k)
        edited = per_variant(q_pre if site == "q" else k_pre)
        edited[variant, :, heads] = patched.transpose(0, 1)
        other = per_variant(k_pre if site == "q" else q_pre)
        nb = (n * b, *edited.shape[2:])
        edited, other = edited.reshape(nb), other.reshape(nb)
        q_v, k_v = qk_norm(w, layer, *((edited, other) if site == "q" else (other, edited)))
        z = attention_pattern(w, layer, q_v, k_v) @ per_variant(v).reshape(nb)
        a = torch.einsum("bhqe,hem->bhqm", z, w_o).sum(dim=1) + w.get(f"blocks.{layer}.attn.b_O")
        return a

    result = torch.einsum("bhqe,hem->bhqm", pattern @ v, w_o)
    result = result.reshape(m, b, *result.shape[1:])
    result = result.expand(n, *result.shape[1:]).clone() if m == 1 else result
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
    result[variant, :, heads] = torch.einsum("bPqe,Pem->Pbqm", z_new, w_o[heads])
    a = result.sum(dim=2) + w.get(f"blocks.{layer}.attn.b_O")  # [n, b, p, d_model]
    return a.reshape(n * b, *a.shape[2:])


def _normed(w: WeightSource, layer: int, x: Tensor, which: str) -> Tensor:
    """The q/k norm of ``layer`` (a per-head one: each head alone) applied to ``x``."""
    q, k = qk_norm(w, layer, x, x)
    return q if which == "q" else k


def _at_positions(base: Tensor, source: Tensor, positions: list[int | None]) -> Tensor:
    """``source [b, P, p, ...]`` where each pair patches (every position, or its one
    position: the query row of a pattern), ``base`` elsewhere."""
    if all(pos is None for pos in positions):
        return source
    out = base.clone()
    for i, pos in enumerate(positions):
        if pos is None:
            out[:, i] = source[:, i]
        else:
            out[:, i, pos] = source[:, i, pos]
    return out


def _run_variants(w: WeightSource, base_in: list[Tensor], variants: Sequence[_Variant], site: str,
                  source_for: SourceFor) -> Tensor:
    """The final stream ``[n·b, p, d]`` of each variant, resumed from the first layer any of
    them patches (they must all start there) with the heads patched layer by layer."""
    n = len(variants)
    start = min(layer for v in variants for layer, _ in v.heads)
    last = max(layer for v in variants for layer, _ in v.heads)
    x = base_in[start]
    shared = True
    for layer in range(start, last + 1):
        pairs = [(j, head, v.pos) for j, v in enumerate(variants) for lh, head in v.heads if lh == layer]
        if not pairs:
            x = blocks(w, x, layer, layer + 1)
            continue
        a = _patched_attention(w, layer, x, n, pairs, site, source_for(layer, pairs), shared)
        if shared:
            b, p, d = x.shape
            x = x[None].expand(n, b, p, d).reshape(n * b, p, d)
            shared = False
        x = finish_block(w, layer, x, a)
    return blocks(w, x, last + 1)


def _head_sets(w: WeightSource, heads: Sequence[Sequence[tuple[int, int]]] | None) -> list[HeadSet]:
    """Every head alone (``None``), or the given sets, each checked and without repeats."""
    cfg = w.cfg
    if heads is None:
        return [((layer, head),) for layer in range(cfg.n_layers) for head in range(cfg.n_heads)]
    sets = []
    for group in heads:
        found = tuple(dict.fromkeys((int(layer), int(head)) for layer, head in group))
        if not found:
            raise InvalidRequestError(None, "an empty set of heads to patch")
        for layer, head in found:
            cfg.check_head(layer, head, getattr(w, "path", None))
        sets.append(found)
    return sets


def _evaluate(w: WeightSource, runs: _Runs, variants: list[_Variant], site: str, metric: Metric,
              source_for: SourceFor, progress: Progress, cancelled: Cancelled) -> list[float]:
    """The metric of every variant: grouped by the layer they start at, in batches of
    ``copies_per_pass`` resumed from there. Progress counts the layers run."""
    n_layers = len(runs.base_in)
    b, p, _ = runs.base_in[0].shape
    by_start: dict[int, list[int]] = {}
    for i, v in enumerate(variants):
        by_start.setdefault(min(layer for layer, _ in v.heads), []).append(i)
    total = sum((n_layers - start + 1) * len(idx) for start, idx in by_start.items()) or 1
    done = 0
    out = [math.nan] * len(variants)
    for start in sorted(by_start):
        idx = by_start[start]
        chunk = copies_per_pass(w, b, p, len(idx))
        for first in range(0, len(idx), chunk):
            check_cancelled(cancelled)
            part = idx[first:first + chunk]
            final = _run_variants(w, runs.base_in, [variants[i] for i in part], site, source_for)
            for i, value in zip(part, metric(w, final, len(part)).tolist(), strict=True):
                out[i] = value
            done += (n_layers - start + 1) * len(part)
            report(progress, done / total)
    return out


def patch_heads(w: WeightSource, clean: Tensor | Sequence, corrupt: Tensor | Sequence, metric: Metric, *,
                site: str = "out", noising: bool = False,
                heads: Sequence[Sequence[tuple[int, int]]] | None = None, by_position: bool = False,
                progress: Progress = None, cancelled: Cancelled = None) -> PatchResult:
    """Exact activation patching of every head (``heads=None``) or of each given set of heads
    patched together, at every position (as TransformerLens'
    ``get_act_patch_attn_head_{out,q,k,v,pattern}_all_pos``); ``by_position`` adds each
    position patched alone (``..._by_pos``: the query row of a pattern)."""
    _check_site(site)
    _check_metric(w, metric)
    clean_t, corrupt_t = check_inputs(w, clean, corrupt)
    sets = _head_sets(w, heads)
    check_cancelled(cancelled)
    with torch.inference_mode():
        runs = _two_runs(w, clean_t, corrupt_t, metric, noising)
        variants = [_Variant(s) for s in sets]
        if by_position:
            variants += [_Variant(s, pos) for s in sets for pos in range(clean_t.shape[1])]
        values = _evaluate(w, runs, variants, site, metric, _activation_source(w, runs, site), progress, cancelled)
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


def _activation_source(w: WeightSource, runs: _Runs, site: str) -> SourceFor:
    """The source run's activation at ``site`` for each pair, computed once per layer."""
    cache: dict[int, Tensor] = {}

    def source_for(layer: int, pairs: list[_Pair]) -> Tensor:
        if layer not in cache:
            cache[layer] = _site_activation(w, layer, runs.source_in[layer], site)
        return cache[layer][:, [head for _, head, _ in pairs]]

    return source_for


# -- attribution -----------------------------------------------------------------------------


def attribute_heads(w: WeightSource, clean: Tensor | Sequence, corrupt: Tensor | Sequence, metric: Metric, *,
                    site: str = "out", noising: bool = False, verify: int = 0,
                    progress: Progress = None, cancelled: Cancelled = None) -> PatchResult:
    """Attribution patching of every head at ``site``: the first-order estimate of what
    patching it would change the metric by (module docstring). Each row's ``estimate`` is
    that change, ``patched`` the metric it predicts, ``recovered`` the recovery it predicts.
    ``verify = K`` patches the top K heads by ``|estimate|`` exactly and adds the exact
    metric and recovery to their rows."""
    _check_site(site)
    _check_metric(w, metric)
    clean_t, corrupt_t = check_inputs(w, clean, corrupt)
    cfg = w.cfg
    tw = torch_weights(w)
    check_cancelled(cancelled)
    steps = cfg.n_layers + 1 + (1 if verify else 0)
    with torch.no_grad():  # not inference_mode: the kept streams enter the backward pass
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
    heads = _all_heads(cfg.n_layers, cfg.n_heads)
    values = [float(v) for v in estimates.flatten()]
    exact = None
    if verify:
        order = sorted(range(len(heads)), key=lambda i: -abs(values[i]) if math.isfinite(values[i]) else math.inf)
        top = order[:verify]
        with torch.inference_mode():
            found = _evaluate(w, runs, [_Variant((heads[i],)) for i in top], site, metric,
                              _activation_source(w, runs, site), None, cancelled)
        exact = [math.nan] * len(heads)
        for i, value in zip(top, found, strict=True):
            exact[i] = value
    report(progress, 1.0)
    return _result(w, "attribution", site, metric, noising, runs, clean_t, [(h,) for h in heads], values,
                   exact=exact)


def _all_heads(n_layers: int, n_heads: int) -> list[tuple[int, int]]:
    return [(layer, head) for layer in range(n_layers) for head in range(n_heads)]


# -- path patching ---------------------------------------------------------------------------


def path_patch(w: WeightSource, clean: Tensor | Sequence, corrupt: Tensor | Sequence, metric: Metric,
               edges: Sequence[tuple[tuple[int, int], tuple[int, int]]], *, receiver_input: str = "q",
               noising: bool = False, progress: Progress = None, cancelled: Cancelled = None) -> PatchResult:
    """Path patching of each edge ``(sender, receiver)`` (module docstring): the sender's
    source-run output enters the receiver's ``receiver_input`` (q, k or v) only. One row per
    edge, ``heads = (sender, receiver)``."""
    _check_site(receiver_input, PATH_INPUTS)
    _check_metric(w, metric)
    clean_t, corrupt_t = check_inputs(w, clean, corrupt)
    cfg, path = w.cfg, getattr(w, "path", None)
    for sender, receiver in edges:
        cfg.check_head(*sender, path)
        cfg.check_head(*receiver, path)
        if sender[0] >= receiver[0]:
            raise InvalidRequestError(path, f"a path runs from an earlier layer to a later one: L{sender[0]}.H{sender[1]} "
                                      f"is not below L{receiver[0]}.H{receiver[1]}")
    tw = torch_weights(w)
    check_cancelled(cancelled)
    values: list[float] = [math.nan] * len(edges)
    with torch.inference_mode():
        runs = _two_runs(w, clean_t, corrupt_t, metric, noising)
        shares: dict[tuple[int, bool], Tensor] = {}

        def share(layer: int, source: bool) -> Tensor:
            """Each head's output ``[b, h, p, d_model]`` as it enters the residual stream."""
            if (layer, source) not in shares:
                x = (runs.source_in if source else runs.base_in)[layer]
                z = _site_activation(tw, layer, x, "out")
                result = torch.einsum("bhqe,hem->bhqm", z, tw.get(f"blocks.{layer}.attn.W_O"))
                shares[layer, source] = post_normed_heads(tw, layer, result)
            return shares[layer, source]

        by_layer: dict[int, list[int]] = {}
        for i, (_, receiver) in enumerate(edges):
            by_layer.setdefault(receiver[0], []).append(i)
        for n_done, (layer, idx) in enumerate(sorted(by_layer.items())):
            check_cancelled(cancelled)
            # the receiver's input: the base stream + (source - base) output of the sender
            delta = torch.stack([share(edges[i][0][0], True)[:, edges[i][0][1]]
                                 - share(edges[i][0][0], False)[:, edges[i][0][1]] for i in idx])
            x = runs.base_in[layer][None] + delta  # [E, b, p, d]
            e, b, p, d = x.shape
            qkv = projections(tw, layer, attention_input(tw, layer, x.reshape(e * b, p, d)))
            fed = qkv[PATH_INPUTS.index(receiver_input)].reshape(e, b, *qkv[0].shape[1:])
            source = fed[torch.arange(e), :, [edges[i][1][1] for i in idx]].transpose(0, 1)  # [b, E, p, d_head]
            variants = [_Variant((edges[i][1],)) for i in idx]
            final = _run_variants(w, runs.base_in, variants, receiver_input,
                                  lambda _layer, _pairs, source=source: source)
            for i, value in zip(idx, metric(w, final, len(idx)).tolist(), strict=True):
                values[i] = value
            report(progress, (n_done + 1) / len(by_layer))
    sets = [(tuple(sender), tuple(receiver)) for sender, receiver in edges]
    return _result(w, "path", receiver_input, metric, noising, runs, clean_t, sets, values)
