"""Behavioural head scores and ablation (docs/math.md, "Scores"): forward passes on the
seeded repeated sequences. The weight-only scores are in ``spectral`` and ``composition``.

Model-wide sweeps report ``progress(fraction)`` and stop with
:class:`~engine.errors.CancelledError` when ``cancelled()`` turns true (checked between
layers). Heads with non-finite weights get NaN scores, never a crash.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from headscope.engine.core.errors import InvalidRequestError
from headscope.engine.core.memory import (
    release_free_heap,  # the sweeps end by returning freed pages
)
from headscope.engine.core.progress import Cancelled, Memo, Progress, check_cancelled, report
from headscope.engine.model.nonfinite import layer_nonfinite
from headscope.engine.model.weights import WeightSource

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "BehaviourSums",
    "ablation_effect",
    "ablation_effects",
    "behaviour_scores",
    "copies_per_pass",
    "detection_patterns",
    "equal_parts",
    "per_layer",
    "repeated_tokens",
    "second_copy_log_probs",
]


def _known(memo: Memo | None, index: int, shape: tuple[int, ...] | None = None) -> Tensor | None:
    if memo is None:
        return None
    found = memo.get(index, shape)
    return None if found is None else torch.from_numpy(np.array(found, dtype=np.float32))


def repeated_tokens(vocab: int, n_ctx: int, seed: int = 0, seq_len: int | None = None,
                    batch: int = 4) -> Tensor:
    """``[batch, 2T]`` seeded random sequences, each a length-``T`` sequence written twice.

    ``T = seq_len`` or ``min(32, n_ctx // 2)``. Within one copy the ids are distinct when the
    vocabulary allows it (drawn without replacement), so the only duplicates are the
    repetition itself and the induction target of position ``t`` is exactly ``t - T + 1``.
    """
    half = seq_len if seq_len is not None else min(32, n_ctx // 2)
    if half < 1 or 2 * half > n_ctx:
        raise InvalidRequestError(
            None, f"a repeated sequence of 2×{half} tokens does not fit the context of {n_ctx}"
        )
    g = torch.Generator().manual_seed(seed)
    if vocab >= half:
        first = torch.stack([torch.randperm(vocab, generator=g)[:half] for _ in range(batch)])
    else:
        first = torch.randint(vocab, (batch, half), generator=g)
    return torch.cat((first, first), dim=1)


def detection_patterns(tokens: Tensor) -> dict[str, Tensor]:
    """TransformerLens' head-detector patterns ``[batch, q, k]`` (1 where attention counts).

    prev_token: ``(i, i-1)``. duplicate_token: ``(i, j)``, ``j < i``, same token.
    induction: the duplicate pattern shifted one key to the right, ``(i, j+1)``: the token
    after an earlier occurrence of the current one.
    """
    b, n = tokens.shape
    prev = torch.ones(n, n).tril(-1).triu(-1).expand(b, n, n)
    same = tokens[:, :, None] == tokens[:, None, :]
    dup = (same & torch.ones(n, n, dtype=torch.bool).tril(-1)).float()
    ind = torch.zeros_like(dup)
    ind[:, :, 1:] = dup[:, :, :-1]
    return {"prev_token": prev, "duplicate_token": dup, "induction": ind}


def _excluded(n: int, exclude_bos: bool, exclude_current_token: bool) -> Tensor | None:
    """``[n, n]`` float mask: 0 on the attention TransformerLens' ``detect_head`` leaves out
    (key 0 with ``exclude_bos``, the diagonal with ``exclude_current_token``), else 1."""
    if not (exclude_bos or exclude_current_token):
        return None
    keep = torch.ones(n, n)
    if exclude_bos:
        keep[:, 0] = 0
    if exclude_current_token:
        keep.fill_diagonal_(0)
    return keep


def detect(patterns: Tensor, detection: Tensor, *, exclude_bos: bool = False,
            exclude_current_token: bool = False) -> Tensor:
    """TransformerLens ``error_measure="mul"``: attention mass on the pattern / total mass.

    patterns ``[b, ..., q, k]`` (e.g. one layer's ``[b, H, q, k]``), detection ``[b, q, k]``
    -> ``[...]``. The total mass is taken over the query rows where the pattern has an entry
    (TransformerLens divides by all rows, which caps e.g. a perfect induction head at 0.5
    on a twice-repeated sequence); the result is averaged over the batch, one sequence at a
    time as TransformerLens does for a list of prompts. For the repeated sequences of
    ``repeated_tokens`` this is the induction score of docs/math.md: the mean attention from
    the second copy's ``t`` to ``t - T + 1``. ``exclude_bos`` / ``exclude_current_token`` are
    TransformerLens' options: the attention to key 0 / to the query's own position is set to
    zero first, in the numerator and the denominator alike.
    """
    b, q, k = detection.shape
    middle = (1,) * (patterns.ndim - 3)
    keep = _excluded(q, exclude_bos, exclude_current_token)
    if keep is not None:
        patterns = patterns * keep
    rows = (detection.sum(-1) > 0).float().reshape(b, *middle, q)
    on_pattern = (patterns * detection.reshape(b, *middle, q, k)).sum((-2, -1))
    total = (patterns.sum(-1) * rows).sum(-1)
    return (on_pattern / total).mean(0)


def behaviour_scores(w: WeightSource, seed: int = 0, *, seq_len: int | None = None,
                     batch: int = 4, progress: Progress = None, cancelled: Cancelled = None,
                     exclude_bos: bool = False, exclude_current_token: bool = False,
                     ) -> dict[str, Tensor]:
    """``prev_token``, ``duplicate_token`` and ``induction`` scores ``[L, H]``.

    One forward pass on ``repeated_tokens(vocab, n_ctx, seed, seq_len, batch)`` (see there and
    ``detect``): by default ``batch=4`` sequences of ``T = min(32, n_ctx // 2)`` distinct
    random tokens written twice (``2T = 64`` positions). Each layer's scores are computed
    from its pattern as soon as the layer's attention has run (``BehaviourSums``), so memory
    holds one layer's ``[batch, n_heads, 2T, 2T]`` pattern, never all of them, and the
    unembedding is skipped. ``progress`` and ``cancelled()`` are reported/checked after each
    layer. Non-finite heads get NaN. ``exclude_bos`` / ``exclude_current_token``: as
    TransformerLens' ``detect_head`` (see ``detect``); the sequences have no BOS token, so
    "BOS" is position 0. (``sweeps.scores.calibrated_score_table`` runs the same reduction
    in one pass with the attention sinks and the random-head null.)
    """
    from headscope.engine.forward.transformer import blocks_together, embed

    check_cancelled(cancelled)
    tokens = repeated_tokens(w.cfg.d_vocab, w.cfg.n_ctx, seed, seq_len, batch)
    found = BehaviourSums(w, tokens, exclude_bos=exclude_bos, exclude_current_token=exclude_current_token)
    with torch.inference_mode():
        blocks_together(w, [embed(w, tokens)], on_block=lambda _i, layer, _x, pattern: found(layer, pattern),
                        after_layer=per_layer(w.cfg.n_layers, progress, cancelled))
    release_free_heap()
    return found.result()


class BehaviourSums:
    """``behaviour_scores``' reduction of the patterns of one token batch (``tokens [b, 2T]``),
    layer by layer: ``found(layer, pattern)`` as each layer's attention has run, ``result()``
    at the end: NaN for the heads with non-finite weights. ``nonfinite [L, H]``: the heads
    to give NaN if the caller knows them (the weight sweep's flags, which add the heads whose
    float32 products overflow: their forward pass does too), a numpy array read at
    ``result()`` (a weight sweep run in the same pass fills it in layer by layer:
    ``sweeps.scores``); else each layer's weights are checked as it goes (they were just read
    for the attention and are still cached)."""

    def __init__(self, w: WeightSource, tokens: Tensor, *, exclude_bos: bool = False,
                 exclude_current_token: bool = False, nonfinite: Any = None) -> None:
        cfg = w.cfg
        self.weights = w  # numpy: the non-finite check is the weight sweep's (model.nonfinite.layer_nonfinite)
        self.exclude = {"exclude_bos": exclude_bos, "exclude_current_token": exclude_current_token}
        self.detections = detection_patterns(tokens)
        self.out = {name: torch.full((cfg.n_layers, cfg.n_heads), math.nan) for name in self.detections}
        self.known = nonfinite is not None
        self.bad = nonfinite if self.known else np.zeros((cfg.n_layers, cfg.n_heads), bool)

    def __call__(self, layer: int, pattern: Tensor) -> None:
        if not self.known:
            self.bad[layer] = layer_nonfinite(self.weights, layer)
        pattern = pattern.float()
        for name, det in self.detections.items():
            self.out[name][layer] = detect(pattern, det, **self.exclude)

    def result(self) -> dict[str, Tensor]:
        bad = torch.from_numpy(np.array(self.bad, dtype=bool))
        return {name: torch.where(bad, torch.full_like(score, math.nan), score)
                for name, score in self.out.items()}


def per_layer(n_layers: int, progress: Progress, cancelled: Cancelled) -> Callable[[int], None]:
    """An ``after_layer(layer)`` for a pass: reports ``(layer + 1) / n_layers`` and checks
    ``cancelled()`` before every layer but the first."""

    def after_layer(layer: int) -> None:
        report(progress, (layer + 1) / n_layers)
        if layer + 1 < n_layers:
            check_cancelled(cancelled)

    return after_layer


# -- ablation --------------------------------------------------------------------------------

# Activation memory one batched ablation pass may use (bytes, roughly): the heads of a layer
# are ablated in chunks of this size. Measured on GPT-2-small shapes (default sequences):
# 6 heads per batch add ~0.1 GB to the peak and take ~15 % longer than all 12 (+0.35 GB).
_ABLATION_BATCH_BYTES = 128 << 20


def second_copy_log_probs(logits: Tensor, tokens: Tensor) -> Tensor:
    """``[batch, T-1]`` log-probabilities of the second copy's next tokens of a ``[batch, 2T]``
    repeated sequence: ``logits [batch, T-1, d_vocab]`` at positions ``T .. 2T-2``, predicting
    tokens ``T+1 .. 2T-1``, the predictions the first copy determines. The first copy is
    random, so no head can make it likelier; including it would only add noise (and penalise
    heads that, like induction heads, guess from context). The ablation effect's loss is
    minus their mean; the induction task of patching reads their mean per patched run."""
    half = tokens.shape[1] // 2
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, tokens[:, half + 1 :, None])[..., 0]


def _second_copy_loss(logits: Tensor, tokens: Tensor) -> float:
    """Mean next-token cross-entropy of the second copy (``second_copy_log_probs``)."""
    return float(-second_copy_log_probs(logits, tokens).mean())


def _stream_loss(w: WeightSource, x: Tensor, tokens: Tensor) -> float:
    """``_second_copy_loss`` of the final residual stream ``x [batch, 2T, d_model]``.

    The unembedding is position-wise, so only the ``T-1`` positions the loss reads are
    unembedded (the ``d_vocab``-wide product is the most expensive step of a pass).
    """
    from headscope.engine.forward.transformer import unembed

    half = tokens.shape[1] // 2
    return _second_copy_loss(unembed(w, x[:, half:-1]), tokens)


def _heads_per_pass(w: WeightSource, tokens: Tensor) -> int:
    """How many single-head ablations of a layer to run as one batch (memory-bounded)."""
    return copies_per_pass(w, tokens.shape[0], tokens.shape[1], w.cfg.n_heads)


def copies_per_pass(w: WeightSource, batch: int, pos: int, n: int) -> int:
    """How many of ``n`` edited copies of a ``[batch, pos]`` token batch (one per ablated
    head) to run through the rest of the model as one batch: as many as fit in
    ``_ABLATION_BATCH_BYTES``, in equal chunks (12 -> 6 + 6)."""
    cfg = w.cfg
    # float32 per-head outputs [b, H, p, d_model] (and their ablated copy) plus the MLP's
    # hidden activations: the largest tensors of one ablated copy of the batch.
    per_head = 4 * batch * pos * (cfg.n_heads * cfg.d_model + 3 * (cfg.d_mlp or 0))
    return equal_parts(n, _ABLATION_BATCH_BYTES // per_head)


def equal_parts(n: int, most: int) -> int:
    """The size of the fewest equal parts of ``n`` items with at most ``most`` (at least one)
    in each: 12 items, at most 8 -> 6 (6 + 6, not 8 + 4)."""
    most = max(1, min(n, most))
    return math.ceil(n / math.ceil(n / most)) if n else 1


def _check_ablation(w: WeightSource, ablation: str) -> None:
    if ablation not in ("zero", "mean"):
        raise ValueError(f"ablation must be 'zero' or 'mean', not {ablation!r}")


def ablation_effects(w: WeightSource, seed: int = 0, *, seq_len: int | None = None,
                     batch: int = 4, ablation: str = "zero", progress: Progress = None,
                     cancelled: Cancelled = None, memo: Memo | None = None) -> Tensor:
    """Loss increase ``[L, H]`` on ``repeated_tokens(..., seed)`` when each head is ablated.

    The loss is the mean next-token cross-entropy on the second copy (``_second_copy_loss``),
    by default over ``batch=4`` sequences of ``T = min(32, n_ctx // 2)`` random tokens written
    twice; the head's output is zeroed (``ablation="zero"``) or replaced by its mean over
    positions. The value for head ``(l, h)`` is by definition that of
    ``run(w, tokens, ablate=[(l, h)], ablation=ablation)`` minus the clean loss; it is
    computed without re-running what the ablation cannot change: one clean pass keeps the
    residual stream entering each layer, and for layer ``l`` its heads' ablations resume
    from there, batched (``forward.run_ablations``; ``_heads_per_pass`` heads at a time, 6
    on GPT-2-small). Only the scored positions are unembedded. On GPT-2-small shapes this is
    1.4× (quiet 2-core box) to 3–4× (loaded box) faster than one full pass per head
    (bench/README.md). ``progress`` and ``cancelled()``
    are reported/checked between layers. ``memo``: layers already done are taken from it
    (when all are, no forward pass runs), those computed are put in it.
    """
    import torch

    from headscope.engine.forward.torch_weights import torch_weights
    from headscope.engine.forward.transformer import blocks, embed, run_ablations

    weights, w = w, torch_weights(w)  # numpy for the non-finite flags (model.nonfinite.layer_nonfinite)
    _check_ablation(w, ablation)
    cfg = w.cfg
    n_layers, n_heads = cfg.n_layers, cfg.n_heads
    tokens = repeated_tokens(cfg.d_vocab, cfg.n_ctx, seed, seq_len, batch)
    chunk = _heads_per_pass(w, tokens)
    out = torch.empty(n_layers, n_heads)
    known = {layer: _known(memo, layer, (n_heads,)) for layer in range(n_layers)}
    if all(v is not None for v in known.values()):
        report(progress, 1.0)
        return torch.stack([v for v in known.values() if v is not None])
    # Work per layer: the blocks after it plus the unembedding (about one block's worth).
    cost = [n_layers - layer + 1 for layer in range(n_layers)]
    done = 0
    check_cancelled(cancelled)
    with torch.inference_mode():
        entering: list[Tensor] = []  # the clean residual stream entering each block
        clean = blocks(w, embed(w, tokens), on_block=lambda _layer, x, _pattern: entering.append(x))
        base = _stream_loss(w, clean, tokens)
        for layer in range(n_layers):
            stored = known[layer]
            if stored is not None:
                out[layer] = stored
                done += cost[layer]
                report(progress, done / sum(cost))
                continue
            check_cancelled(cancelled)
            for first in range(0, n_heads, chunk):
                heads = list(range(first, min(n_heads, first + chunk)))
                final = run_ablations(w, entering[layer], layer, heads, ablation)
                for i, head in enumerate(heads):
                    out[layer, head] = _stream_loss(w, final[i], tokens) - base
            if memo is not None:
                # NaN for non-finite heads, as in the whole table below
                bad = torch.from_numpy(layer_nonfinite(weights, layer))
                memo.put(layer, torch.where(bad, math.nan, out[layer]))
            done += cost[layer]
            report(progress, done / sum(cost))
    entering.clear()  # the streams are not needed any more: free them before the trim
    del clean
    bad = torch.from_numpy(np.stack([layer_nonfinite(weights, layer) for layer in range(n_layers)]))
    release_free_heap()
    return torch.where(bad, torch.full_like(out, math.nan), out)


def ablation_effect(w: WeightSource, layer: int, head: int, seed: int = 0, *,
                    seq_len: int | None = None, batch: int = 4, ablation: str = "zero") -> float:
    """``ablation_effects(...)[layer, head]`` for one head: one clean pass, plus the blocks
    from ``layer`` on again with the head ablated."""
    import torch

    from headscope.engine.forward.transformer import blocks, embed, run_ablations

    cfg = w.cfg
    cfg.check_head(layer, head, getattr(w, "path", None))
    _check_ablation(w, ablation)
    tokens = repeated_tokens(cfg.d_vocab, cfg.n_ctx, seed, seq_len, batch)
    with torch.inference_mode():
        entering = blocks(w, embed(w, tokens), 0, layer)
        base = _stream_loss(w, blocks(w, entering, layer), tokens)
        final = run_ablations(w, entering, layer, [head], ablation)
        return _stream_loss(w, final[0], tokens) - base
