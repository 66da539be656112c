"""What patching measures and on which inputs (docs/math.md, "Patching"): the metrics read
from the final residual stream (``LogitDiff``, ``InductionLogProb``), the built-in tasks that make
their own clean and corrupt tokens (``induction_task``, ``task_metric``), and the checks every
patching entry point runs on its inputs. Shared by ``forward.patching`` (activation, attribution
and path patching) and ``forward.edges`` (edge attribution and faithfulness).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from headscope.engine.core.errors import IndexOutOfRangeError, InvalidRequestError, PromptError
from headscope.engine.core.validation import BUILTIN_TASKS, PATCH_SITES, check_patchable
from headscope.engine.forward.behaviour import repeated_tokens, second_copy_log_probs
from headscope.engine.forward.transformer import token_ids, unembed
from headscope.engine.model.weights import WeightSource

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "FIRST_OCCURRENCE_EVERY",
    "SITES",
    "TASKS",
    "InductionLogProb",
    "LogitDiff",
    "Metric",
    "check_inputs",
    "check_metric",
    "check_site",
    "induction_task",
    "task_metric",
]

SITES = PATCH_SITES  # (core.validation: one list for every entry point)

# -- metrics ---------------------------------------------------------------------------------


class Metric(Protocol):
    """What patching measures, read from the final residual stream of ``n`` runs of a token
    batch side by side (``final [n·b, pos, d_model]``): ``[n]``, each run's mean over the
    batch. Only the positions the metric reads are unembedded."""

    name: str

    def __call__(self, w: WeightSource, final: Tensor, n: int) -> Tensor: ...

    def reads(self, p: int) -> int:
        """How many of the last positions of a ``p``-token final stream the metric reads:
        it is called with at least those (``final [n·b, >= reads, d]``) and indexes from
        the end, so patched runs compute only them in the last layer."""
        ...


@dataclass(frozen=True)
class LogitDiff:
    """``logit[answer] - logit[wrong]`` at the last position."""

    answer: int
    wrong: int
    name: str = "logit_diff"

    def __call__(self, w: WeightSource, final: Tensor, n: int) -> Tensor:
        # [n·b, 2]: not all of W_U; a difference needs no centring over the vocabulary
        logits = unembed(w, final[:, -1], (self.answer, self.wrong), centred=False)
        return (logits[:, 0] - logits[:, 1]).float().reshape(n, -1).mean(1)

    def reads(self, p: int) -> int:
        return 1


@dataclass(frozen=True)
class InductionLogProb:
    """The mean log-probability of the clean next token over the second half of a repeated
    sequence (``behaviour.second_copy_log_probs`` of the clean ``tokens [b, 2T]``: the
    predictions at positions ``T .. 2T-2``), or of every ``every``-th of those predictions
    from the first (the first-occurrence task reads only those whose answer it keeps)."""

    tokens: Tensor
    name: str = "induction"
    every: int = 1

    def __call__(self, w: WeightSource, final: Tensor, n: int) -> Tensor:
        p = self.tokens.shape[1]
        logp = second_copy_log_probs(unembed(w, final[:, final.shape[1] - self.reads(p):-1]), self.tokens.repeat(n, 1))
        return logp[:, ::self.every].reshape(n, -1).mean(1)

    def reads(self, p: int) -> int:
        return p - p // 2  # the second half (its predictions: all but the last position)


TASKS = BUILTIN_TASKS  # (core.validation: one list for every entry point)
# first-occurrence: the first half's positions 0, 2, 4, ... are redrawn (docs/math.md, "Patching")
FIRST_OCCURRENCE_EVERY = 2


def _other_tokens(vocab: int, shape: tuple[int, int], seed: int, avoid: Tensor | None = None) -> Tensor:
    """``[batch, n]`` seeded random ids, distinct within a row when the vocabulary allows, and
    (``avoid [batch, m]``) none of the ids of that row of ``avoid`` when it allows that too:
    the tokens a task's corrupt input puts where the clean one's were."""
    batch, n = shape
    g = torch.Generator().manual_seed(seed + 0x5EED)
    if vocab < n:
        return torch.randint(vocab, (batch, n), generator=g)
    rows = []
    for b in range(batch):
        perm = torch.randperm(vocab, generator=g)
        if avoid is not None:
            kept = perm[~torch.isin(perm, avoid[b])]
            perm = kept if len(kept) >= n else perm
        rows.append(perm[:n])
    return torch.stack(rows)


def induction_task(vocab: int, n_ctx: int, seed: int = 0, seq_len: int | None = None,
                   batch: int = 4, task: str = "induction") -> tuple[Tensor, Tensor]:
    """``(clean, corrupt)`` token batches ``[batch, 2T]`` of a built-in task (``TASKS``):
    clean is ``behaviour.repeated_tokens(vocab, n_ctx, seed, seq_len, batch)`` (a seeded
    random sequence written twice) for both.

    ``induction``: corrupt keeps the first half and draws another random second half (seeded
    too, distinct ids within it when the vocabulary allows), so nothing in the corrupt
    context predicts the clean second half.

    ``first-occurrence``: corrupt keeps the second half and redraws the first half's tokens at
    positions ``0, 2, 4, ...`` (ids of neither copy, when the vocabulary allows), keeping the
    odd ones. A second-half token at an even offset then has no earlier occurrence, while the
    token that followed it (its clean answer) is still in place: only the previous-token
    information at that answer's position, which an induction head reads through its keys,
    finds it again (docs/math.md, "Patching")."""
    if task not in TASKS:
        raise InvalidRequestError(None, f"the task must be one of {', '.join(TASKS)}, not {task!r}")
    clean = repeated_tokens(vocab, n_ctx, seed, seq_len, batch)
    half = clean.shape[1] // 2
    if task == "induction":
        return clean, torch.cat((clean[:, :half], _other_tokens(vocab, (batch, half), seed)), dim=1)
    redrawn = torch.arange(0, half, FIRST_OCCURRENCE_EVERY)
    corrupt = clean.clone()
    corrupt[:, redrawn] = _other_tokens(vocab, (batch, len(redrawn)), seed, avoid=clean[:, :half])
    return clean, corrupt


def task_metric(task: str, clean: Tensor) -> InductionLogProb:
    """The metric of a built-in task on its clean tokens (``induction_task``).

    ``first-occurrence`` reads the predictions at ``T + i`` for even ``i`` only (of
    ``T .. 2T-2``): their query token's first occurrence (position ``i``) is redrawn and their
    answer (position ``i + 1``) kept, so the corrupt run has nothing to find and a path into
    the keys can give it back. At odd ``i`` the answer itself is redrawn: the induction head
    finds the right position in the corrupt run too and copies the wrong token from it, which
    no path through a head's keys can change; reading those would only halve every
    recovered fraction (docs/math.md, "Patching"). Like ``induction``'s, the metric skips the
    prediction of the second half's first token (at position ``T-1``): it is random in both
    runs."""
    if task == "induction":
        return InductionLogProb(clean)
    return InductionLogProb(clean, name=task, every=FIRST_OCCURRENCE_EVERY)


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


def check_metric(w: WeightSource, metric: Metric) -> None:
    if isinstance(metric, LogitDiff):
        for what, token in (("answer", metric.answer), ("wrong", metric.wrong)):
            if not 0 <= token < w.cfg.d_vocab:
                raise IndexOutOfRangeError(getattr(w, "path", None),
                                           f"{what} token id {token} out of range (d_vocab={w.cfg.d_vocab})")


def check_site(site: str, allowed: Sequence[str] = SITES) -> None:
    if site not in allowed:
        raise InvalidRequestError(None, f"site must be one of {', '.join(allowed)}, not {site!r}")
