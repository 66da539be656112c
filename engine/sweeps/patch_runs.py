"""Activation, attribution and path patching from a ``PatchRequest`` (docs/math.md,
"Patching"), read from and written to the results store under the request's key; and the
inputs of the built-in tasks. The forward passes are ``engine.forward.patching``'s.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import numpy as np

from headscope.engine.core.progress import Cancelled, Progress, progress_span
from headscope.engine.core.requests import (
    InductionPromptsRequest,
    PatchInputsRequest,
    PatchRequest,
    computes,
)
from headscope.engine.core.results import PatchResult, patch_result

if TYPE_CHECKING:
    from headscope.engine.model.loading import LoadedModel
    from headscope.engine.sweeps.store import ModelStore


def _patch_shape(model: LoadedModel, req: PatchRequest) -> tuple[int, int, int]:
    """(rows, positions, sequences) of a request's result."""
    cfg = model.cfg
    rows = 1 if req.edge is not None else len(req.heads) if req.heads is not None else cfg.n_layers * cfg.n_heads
    if req.task != "logit_diff":  # a built-in task: 2 × seq_len tokens
        return rows, 2 * int(req.seq_len or 0), req.batch
    return rows, len(req.clean[0]), len(req.clean)


@computes(PatchRequest)
def patch(model: LoadedModel, req: PatchRequest, *, progress: Progress = None, cancelled: Cancelled = None,
          store: ModelStore | None = None, **_: Any) -> PatchResult:
    """Activation patching of every head (or ``req.heads``), attribution patching (with
    ``req.verify`` heads patched exactly), or path patching of ``req.edge``, as the request
    says. Runs on a worker, reports ``progress(fraction)``, stops on ``cancelled()``. With a
    ``store`` (the model's entry) a request already answered is read back under its key, not
    recomputed."""
    rows, pos, batch = _patch_shape(model, req)
    n = 2 + rows + (rows * pos if req.by_position else 0) + (rows if req.verify else 0)
    name = req.key()
    found = None if store is None else store.load(name, "all", (n,), np.float64)
    if found is not None:
        if progress is not None:
            progress(1.0)
        return _patch_of(model, req, found, rows, pos, batch)
    from headscope.engine.forward.runtime import gradient_mode

    # attribution takes a backward pass: the Engine's workers run under inference_mode
    with gradient_mode() if req.method == "attribution" else contextlib.nullcontext():
        result = _patch_now(model, req, progress, cancelled)
    if store is not None:
        store.save(name, _patch_values(result), "all")
        store.finish()
    return result


def task_inputs(model: LoadedModel, req: Any) -> tuple[Any, Any, Any]:
    """The clean and corrupt token batches and the metric of a request with patching's
    inputs (``task``, ``clean``, ``corrupt``, ``answer``, ``wrong``, ``seed``, ``seq_len``,
    ``batch``: a ``PatchRequest``, an ``EdgesRequest``)."""
    from headscope.engine.forward import patch_tasks
    from headscope.engine.forward.runtime import token_batch

    cfg = model.cfg
    if req.task != "logit_diff":  # a built-in task
        clean, corrupt = patch_tasks.induction_task(cfg.d_vocab, cfg.n_ctx, req.seed, req.seq_len, req.batch,
                                                 task=req.task)
        return clean, corrupt, patch_tasks.task_metric(req.task, clean)
    return (token_batch(req.clean), token_batch(req.corrupt),
            patch_tasks.LogitDiff(int(req.answer or 0), int(req.wrong or 0)))


def _patch_now(model: LoadedModel, req: PatchRequest, progress: Progress, cancelled: Cancelled) -> PatchResult:
    from headscope.engine.forward import patching

    w = model.weights
    clean, corrupt, metric = task_inputs(model, req)
    common = dict(noising=req.noising, progress=progress, cancelled=cancelled)
    if req.edge is not None:
        return patching.path_patch(w, clean, corrupt, metric, [req.edge], receiver_input=req.site, **common)
    if req.method == "attribution":
        return patching.attribute_heads(w, clean, corrupt, metric, site=req.site, verify=req.verify, **common)
    return patching.patch_heads(w, clean, corrupt, metric, site=req.site, heads=req.heads,
                                by_position=req.by_position, **common)


def _patch_values(result: PatchResult) -> np.ndarray:
    """A result as the one float64 vector the store keeps: clean, corrupt, each row's value
    (attribution: its estimate), then each row's positions, then each row's exact metric."""
    def num(v: float | None) -> float:
        return np.nan if v is None else v

    out = [result.clean, result.corrupt]
    out += [num(r.estimate if result.method == "attribution" else r.patched) for r in result.rows]
    for r in result.rows:
        out += [num(v) for v in (r.positions or ())]
    if any(r.exact is not None for r in result.rows):
        out += [num(r.exact) for r in result.rows]
    return np.asarray(out, dtype=np.float64)


def _patch_of(model: LoadedModel, req: PatchRequest, values: np.ndarray, rows: int, pos: int, batch: int
              ) -> PatchResult:
    """The stored vector (``_patch_values``) back as the result it was made from."""
    cfg = model.cfg
    if req.edge is not None:
        sets: Any = [req.edge]
    elif req.heads is not None:
        sets = req.heads
    else:
        sets = [((layer, head),) for layer in range(cfg.n_layers) for head in range(cfg.n_heads)]
    at = 2 + rows
    positions = values[at:at + rows * pos].reshape(rows, pos) if req.by_position else None
    after = at + (rows * pos if req.by_position else 0)
    exact = values[after:after + rows] if req.verify else None
    return patch_result(method="path" if req.edge is not None else req.method,  # type: ignore[arg-type]
                        site=req.site, metric=req.task, noising=req.noising, clean=float(values[0]),
                        corrupt=float(values[1]), sets=sets, values=values[2:at], n_layers=cfg.n_layers,
                        n_heads=cfg.n_heads, tokens=pos, batch=batch, positions=positions, exact=exact,
                        verified=req.verify)


@computes(PatchInputsRequest)
def patch_inputs(model: LoadedModel, req: PatchInputsRequest, *, progress: Progress = None,
                 cancelled: Cancelled = None, store: ModelStore | None = None, **_: Any) -> PatchResult:
    """``req``'s inputs resolved against the tokenizer into ``PatchRequest``s (one, or one per
    edge), each computed by ``patch`` (and kept in the store under its own key); the edges'
    rows joined into one result, in the order of ``req.edges``."""
    import dataclasses

    from headscope.engine.sweeps.prompts import patch_request

    # what resolving the inputs had to say (unknown words, a digit answer read as a token):
    # the CLI prints these on stderr; here they join the result's note, which the tab shows
    notes: list[str] = []
    inputs: dict[str, Any] = dict(answer=req.answer, wrong=req.wrong, task=req.task, notes=notes)
    if req.edges is None:
        result = patch(model, patch_request(model, req.clean, req.corrupt, site=req.site, method=req.method,
                                            **inputs), progress=progress, cancelled=cancelled, store=store)
    else:
        requests = [patch_request(model, req.clean, req.corrupt, site=req.site, edge=edge, **inputs)
                    for edge in req.edges]
        n = len(requests)
        found = [patch(model, one, progress=progress_span(progress, i / n, (i + 1) / n), cancelled=cancelled,
                       store=store) for i, one in enumerate(requests)]
        result = dataclasses.replace(found[0], rows=tuple(row for result in found for row in result.rows))
    said = list(dict.fromkeys(notes))  # one edge's inputs are every edge's: each note once
    if not said:
        return result
    return dataclasses.replace(result, note="; ".join([*said, *([result.note] if result.note else [])]))


@computes(InductionPromptsRequest)
def task_prompts(model: LoadedModel, req: InductionPromptsRequest, **_: Any
                 ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The first clean and corrupt sequence of a seeded built-in task (``"induction"``, what
    a ``PatchRequest`` with no prompts runs, or ``"first-occurrence"``)."""
    from headscope.engine.forward.patch_tasks import induction_task

    cfg = model.cfg
    clean, corrupt = induction_task(cfg.d_vocab, cfg.n_ctx, req.seed, req.seq_len, req.batch, task=req.task)
    return tuple(int(i) for i in clean[0]), tuple(int(i) for i in corrupt[0])
