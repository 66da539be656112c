"""Edge attribution and faithfulness from an ``EdgesRequest`` / ``FaithfulnessRequest``
(docs/math.md, "Edge attribution"), read from and written to the results store under the
request's key; and those requests from the inputs the CLI, the API and the explorer give
(text or ids, answer tokens as strings or ids, as ``prompts.patch_request``). The forward and
backward passes are ``engine.forward.edges``'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from headscope.engine.core.edge_results import (
    CURVE_FRACTIONS,
    EdgeAttribution,
    EdgeScores,
    ExactEdge,
    Faithfulness,
    FaithfulnessCurve,
    FaithfulnessResult,
    curve_area,
    edge_scores_result,
    metrics_differ,
)
from headscope.engine.core.errors import InvalidRequestError
from headscope.engine.core.progress import Cancelled, Progress, progress_span, report
from headscope.engine.core.requests import EdgesRequest, FaithfulnessRequest, computes
from headscope.engine.core.validation import PATCH_BATCH, SEED, check_patchable
from headscope.engine.sweeps.patch_runs import task_inputs
from headscope.engine.sweeps.prompts import answer_token, prompt_ids

if TYPE_CHECKING:
    from headscope.engine.core.edge_graph import EdgeGraph
    from headscope.engine.model.loading import LoadedModel
    from headscope.engine.sweeps.store import ModelStore

__all__ = ["attribution_vector", "edge_structure", "edges", "edges_request", "edges_vector", "faithfulness",
           "faithfulness_request", "save_edges", "stored_edges"]


# -- requests from what the CLI, the API and the explorer type ---------------------------------


def edge_structure(model: LoadedModel) -> dict[str, Any]:
    """The model's structure with what its edge graph depends on beyond it (so
    ``EdgesRequest.of`` counts the edges exactly: NeoX's parallel MLP reads no head of its layer)."""
    return {**model.structure(), "attn_only": bool(model.cfg.attn_only),
            "parallel_attn_mlp": bool(model.cfg.parallel_attn_mlp)}


def _inputs(model: LoadedModel, clean: Any, corrupt: Any, answer: Any, wrong: Any) -> dict[str, Any]:
    check_patchable(model.structure(), str(model.path))
    return dict(clean=prompt_ids(model, clean, "clean"), corrupt=prompt_ids(model, corrupt, "corrupt"),
                answer=None if answer is None else answer_token(model, answer, "answer"),
                wrong=None if wrong is None else answer_token(model, wrong, "wrong"))


def edges_request(model: LoadedModel, clean: str | Sequence[Any] | None = None,
                  corrupt: str | Sequence[Any] | None = None, *, answer: int | str | None = None,
                  wrong: int | str | None = None, task: str | None = None, method: str = "eap-ig",
                  steps: int = 5, verify: int = 0, seed: int = SEED, seq_len: int | None = None,
                  batch: int = PATCH_BATCH) -> EdgesRequest:
    """``edges``' inputs (as ``patch_request`` takes them) as a validated ``EdgesRequest``."""
    return EdgesRequest.of(edge_structure(model), **_inputs(model, clean, corrupt, answer, wrong), task=task,
                           method=method, steps=steps, verify=verify, seed=seed, seq_len=seq_len, batch=batch,
                           where=str(model.path))


def faithfulness_request(model: LoadedModel, clean: str | Sequence[Any] | None = None,
                         corrupt: str | Sequence[Any] | None = None, *, tops: int | Sequence[int] = (),
                         curve: bool = False, answer: int | str | None = None, wrong: int | str | None = None,
                         task: str | None = None, method: str = "eap-ig", steps: int = 5, seed: int = SEED,
                         seq_len: int | None = None, batch: int = PATCH_BATCH) -> FaithfulnessRequest:
    """``faithfulness``' inputs as a validated ``FaithfulnessRequest``."""
    return FaithfulnessRequest.of(edge_structure(model), **_inputs(model, clean, corrupt, answer, wrong),
                                  tops=tops, curve=curve, task=task, method=method, steps=steps, seed=seed,
                                  seq_len=seq_len, batch=batch, where=str(model.path))


# -- the computations ----------------------------------------------------------------------------


def _graph(model: LoadedModel) -> EdgeGraph:
    from headscope.engine.forward.edges import graph_of

    return graph_of(model.weights)


def _shape(model: LoadedModel, req: EdgesRequest | FaithfulnessRequest) -> tuple[int, int]:
    """(tokens, sequences) of the request's inputs."""
    if req.task != "logit_diff":  # a built-in task: 2 × seq_len tokens
        return 2 * int(req.seq_len or 0), req.batch
    return len(req.clean[0]), len(req.clean)


def _top_edges(scores: EdgeScores, k: int) -> list[str]:
    """The ``k`` edges of largest |score| (finite ones only)."""
    ranked = [int(i) for i in scores.ranked()[:k] if not scores.nonfinite[int(i)]]
    return [scores.graph.edges[i] for i in ranked]


def attribution_vector(result: EdgeAttribution, verify: int = 0) -> np.ndarray:
    """What the store keeps of an attribution (and a cluster task sends back): clean,
    corrupt, every score (NaN: a non-finite gradient), each of the ``verify`` checks' exact
    value (NaN: none)."""
    scores = result.scores
    values = np.where(scores.nonfinite, np.nan, scores.scores)
    checks = [row.exact for row in result.exact] + [np.nan] * (verify - len(result.exact))
    return np.concatenate(([scores.clean, scores.corrupt], values, checks)).astype(np.float64)


def _from_vector(model: LoadedModel, req: EdgesRequest, graph: EdgeGraph, found: np.ndarray) -> EdgeAttribution:
    """The attribution ``attribution_vector`` kept."""
    tokens, batch = _shape(model, req)
    scores = edge_scores_result(method=req.method, steps=req.steps, metric=_metric_name(model, req),  # type: ignore[arg-type]
                                clean=float(found[0]), corrupt=float(found[1]), graph=graph,
                                scores=found[2:2 + graph.n_edges], tokens=tokens, batch=batch)
    checked = _top_edges(scores, req.verify)
    exact = tuple(ExactEdge(edge=e, estimate=scores.score(e), patched=float(v) + scores.clean, exact=float(v))
                  for e, v in zip(checked, found[2 + graph.n_edges:], strict=False))
    return EdgeAttribution(scores, exact)


def _metric_name(model: LoadedModel, req: EdgesRequest) -> str:
    return task_inputs(model, req)[2].name


def stored_edges(model: LoadedModel, req: EdgesRequest, store: ModelStore | None) -> EdgeAttribution | None:
    """The attribution of ``req`` the store holds, or None."""
    graph = _graph(model)
    found = None if store is None else store.load(req.key(), "all", (2 + graph.n_edges + req.verify,), np.float64)
    return None if found is None else _from_vector(model, req, graph, found)


def save_edges(store: ModelStore | None, req: EdgesRequest, result: EdgeAttribution) -> None:
    """Keep ``result`` under ``req``'s key (``stored_edges`` reads it back)."""
    if store is not None:
        store.save(req.key(), attribution_vector(result, req.verify), "all")
        store.finish()


def edges_vector(model: LoadedModel, req: EdgesRequest, found: np.ndarray) -> EdgeAttribution:
    """An attribution from the vector a cluster task sent back (``attribution_vector``'s layout)."""
    return _from_vector(model, req, _graph(model), found)


@computes(EdgesRequest)
def edges(model: LoadedModel, req: EdgesRequest, *, progress: Progress = None, cancelled: Cancelled = None,
          store: ModelStore | None = None, **_: Any) -> EdgeAttribution:
    """EAP or EAP-IG scores of every edge (``forward.edges.edge_scores``), then the top
    ``req.verify`` edges patched exactly (``exact_edges``). The store keeps one float64
    vector: clean, corrupt, every score (NaN: a non-finite gradient), each check's exact value."""
    found = stored_edges(model, req, store)
    if found is not None:
        report(progress, 1.0)
        return found
    from headscope.engine.forward import edges as forward_edges
    from headscope.engine.forward.runtime import gradient_mode

    clean, corrupt, metric = task_inputs(model, req)
    attributing = progress_span(progress, 0.0, 0.8 if req.verify else 1.0)
    with gradient_mode():  # a backward pass: the Engine's workers run under inference_mode
        scores = forward_edges.edge_scores(model.weights, clean, corrupt, metric, method=req.method,  # type: ignore[arg-type]
                                           steps=max(req.steps, 1), progress=attributing, cancelled=cancelled)
    checked = _top_edges(scores, req.verify)
    exact: tuple[ExactEdge, ...] = ()
    if checked:
        exact = tuple(forward_edges.exact_edges(model.weights, clean, corrupt, metric, checked, scores,
                                                progress=progress_span(progress, 0.8, 1.0), cancelled=cancelled))
    report(progress, 1.0)
    result = EdgeAttribution(scores, exact)
    save_edges(store, req, result)
    return result


def _same_metric(model: LoadedModel, scores: EdgeScores) -> InvalidRequestError:
    return InvalidRequestError(str(model.path), f"the clean and corrupt inputs give the same {scores.metric} "
                               f"({scores.clean:.6g}): faithfulness is undefined")


@computes(FaithfulnessRequest)
def faithfulness(model: LoadedModel, req: FaithfulnessRequest, *, progress: Progress = None,
                 cancelled: Cancelled = None, store: ModelStore | None = None, **_: Any) -> FaithfulnessResult:
    """The attribution (``edges``, through the store), then every asked N and the curve's
    points evaluated in one patched pass (``forward.edges.faithfulness``). The store keeps
    clean, corrupt and each circuit's metric; the pruned circuits are remade from the scores."""
    scores = edges(model, req.scores_request(), progress=progress_span(progress, 0.0, 0.5),
                   cancelled=cancelled, store=store).scores
    if not metrics_differ(scores.clean, scores.corrupt):
        raise _same_metric(model, scores)
    graph = scores.graph
    for n in req.tops:
        if n > graph.n_edges:  # the request counted the edges without the model's config
            raise InvalidRequestError(str(model.path), f"--top {n} is larger than the graph's {graph.n_edges} edges")
    curve_tops = [int(f * graph.n_edges) for f in CURVE_FRACTIONS] if req.curve else []
    tops = [*req.tops, *curve_tops]
    name = req.key()
    found = None if store is None else store.load(name, "all", (2 + len(tops),), np.float64)
    if found is not None:
        usable = ~scores.nonfinite
        span = float(found[0]) - float(found[1])
        points = []
        for n, m in zip(tops, found[2:], strict=True):
            mask = graph.circuit(scores.scores, n, usable)
            mask.setflags(write=False)
            points.append(Faithfulness(top=n, edges=int(mask.sum()), clean=float(found[0]), corrupt=float(found[1]),
                                       circuit=float(m), faithfulness=(float(m) - float(found[1])) / span,
                                       in_circuit=mask))
        report(progress, 1.0)
    else:
        from headscope.engine.forward import edges as forward_edges

        clean, corrupt, metric = task_inputs(model, req)
        points = forward_edges.faithfulness(model.weights, clean, corrupt, metric, scores, tops,
                                            progress=progress_span(progress, 0.5, 1.0), cancelled=cancelled)
        report(progress, 1.0)
        if store is not None and points:
            store.save(name, np.asarray([points[0].clean, points[0].corrupt, *(p.circuit for p in points)],
                                        dtype=np.float64), "all")
            store.finish()
    asked, on_curve = tuple(points[:len(req.tops)]), tuple(points[len(req.tops):])
    curve = None
    if req.curve:
        values = tuple(p.faithfulness for p in on_curve)
        curve = FaithfulnessCurve(fractions=CURVE_FRACTIONS, points=on_curve,
                                  area=curve_area(CURVE_FRACTIONS, values),
                                  area_from_1=curve_area(CURVE_FRACTIONS, tuple(abs(1.0 - v) for v in values)))
    return FaithfulnessResult(scores=scores, points=asked, curve=curve)
