"""Edge attribution over a file of prompt pairs (``headscope edges PATH --prompts FILE``):
one ``EdgesRequest`` per pair, each computed (and stored under its own key) as ``edges``
computes one, on this process or one Dask task per pair (engine/sweeps/cluster.py), and the
scores averaged over the pairs (docs/math.md, "Edge attribution", over a dataset).

The file: JSON Lines, one object a line with ``clean``, ``corrupt``, ``answer`` and
``wrong`` (the prompts as text or a list of token ids; the tokens as ``--answer`` takes
them), or tab-separated, four columns in that order (text; a first line naming the columns
is skipped). Blank lines and lines starting with ``#`` are skipped. Each pair's prompts have
the same length; pairs may differ in length.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from headscope.engine.core.edge_results import EdgeScores, edge_scores_result
from headscope.engine.core.errors import (
    HeadscopeError,
    IndexOutOfRangeError,
    InvalidRequestError,
    PromptError,
)
from headscope.engine.core.files import read_text
from headscope.engine.core.progress import (
    Cancelled,
    Progress,
    check_cancelled,
    progress_span,
    report,
)
from headscope.engine.core.requests import EdgesRequest
from headscope.engine.sweeps.edges import (
    edges,
    edges_request,
    edges_vector,
    save_edges,
    stored_edges,
)

if TYPE_CHECKING:
    from headscope.engine.model.loading import LoadedModel
    from headscope.engine.sweeps.cluster import Cluster
    from headscope.engine.sweeps.store import ModelStore

__all__ = ["PromptPair", "edges_over_prompts", "edges_pair_task", "pair_requests", "read_prompt_pairs"]

FIELDS = ("clean", "corrupt", "answer", "wrong")
MAX_FILE_BYTES = 64 << 20


@dataclass(frozen=True)
class PromptPair:
    """One line of a prompts file: the prompts (text or ids) and the metric's tokens."""

    clean: str | tuple[int, ...]
    corrupt: str | tuple[int, ...]
    answer: str | int
    wrong: str | int
    line: int


def read_prompt_pairs(path: str | Path) -> list[PromptPair]:
    """The pairs of a prompts file (module docstring); a ``PromptError`` naming the file and
    the line for anything else, and for a file with no pair."""
    text = read_text(path, MAX_FILE_BYTES, PromptError, "the prompts file")
    pairs: list[PromptPair] = []
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("{"):
            pairs.append(_json_pair(path, n, line))
        else:
            cells = raw.rstrip("\r\n").split("\t")
            if not pairs and [c.strip().lower() for c in cells] == list(FIELDS):
                continue  # the header
            if len(cells) != len(FIELDS):
                raise PromptError(path, f"line {n}: expected 4 tab-separated columns (clean, corrupt, answer, "
                                  f"wrong) or a JSON object, found {len(cells)} column(s)")
            pairs.append(PromptPair(*cells, line=n))
    if not pairs:
        raise PromptError(path, "no prompt pair in the file (one a line: JSON, or clean, corrupt, answer, wrong "
                          "separated by tabs)")
    return pairs


def _json_pair(path: str | Path, n: int, line: str) -> PromptPair:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as err:
        raise PromptError(path, f"line {n}: not JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(obj, dict):
        raise PromptError(path, f"line {n}: expected a JSON object")
    missing = [f for f in FIELDS if f not in obj]
    extra = sorted(set(obj) - set(FIELDS))
    if missing or extra:
        what = f"missing {', '.join(missing)}" if missing else f"unknown key(s) {', '.join(map(repr, extra))}"
        raise PromptError(path, f"line {n}: {what} (a pair has clean, corrupt, answer, wrong)")

    def prompt(value: Any, name: str) -> str | tuple[int, ...]:
        if isinstance(value, str):
            return value
        if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
            return tuple(value)
        raise PromptError(path, f"line {n}: {name} must be text or a non-empty list of token ids")

    def token(value: Any, name: str) -> str | int:
        if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
            return value
        raise PromptError(path, f"line {n}: {name} must be a token string or id")

    return PromptPair(prompt(obj["clean"], "clean"), prompt(obj["corrupt"], "corrupt"),
                      token(obj["answer"], "answer"), token(obj["wrong"], "wrong"), line=n)


def pair_requests(model: LoadedModel, pairs: Sequence[PromptPair], *, method: str = "eap-ig", steps: int = 5,
                  source: str | Path | None = None) -> list[EdgesRequest]:
    """One ``EdgesRequest`` per pair, validated as ``edges_request`` validates one; a bad
    pair is its error with the file and line (``source``) in front."""
    requests = []
    for pair in pairs:
        def ids(p: str | tuple[int, ...]) -> Any:
            return p if isinstance(p, str) else [list(p)]

        try:
            requests.append(edges_request(model, ids(pair.clean), ids(pair.corrupt), answer=pair.answer,
                                          wrong=pair.wrong, method=method, steps=steps))
        except (InvalidRequestError, PromptError, IndexOutOfRangeError) as err:
            where = f"{source} line {pair.line}" if source is not None else f"pair {pair.line}"
            raise type(err)(err.path, f"{where}: {err.reason}") from None
    return requests


def edges_pair_task(path: str, key: str, raw: bool, req: EdgesRequest) -> np.ndarray:
    """One pair's attribution on a worker (``cluster.run_tasks``): the checkpoint opened
    from ``path`` and checked against the client's fingerprint ``key``, as the other
    cluster tasks; the result as the vector the store keeps."""
    from headscope.engine.sweeps.cluster import ClusterTaskError, on_worker, worker_model
    from headscope.engine.sweeps.edges import attribution_vector

    try:
        return attribution_vector(edges(worker_model(path, key, raw), req), req.verify)
    except ClusterTaskError:
        raise
    except HeadscopeError as err:  # re-typed: it must travel back to the client intact
        raise on_worker(err) from None


def edges_over_prompts(model: LoadedModel, requests: Sequence[EdgesRequest], *, progress: Progress = None,
                       cancelled: Cancelled = None, store: ModelStore | None = None,
                       cluster: Cluster | None = None) -> EdgeScores:
    """Every request's scores (from the store, computed here, or one Dask task each on
    ``cluster``, stored here as they arrive), averaged: ``Σ_pairs score / n_pairs`` per edge,
    EAP-IG's ``attribute`` over a dataset with the per-example metric summed over a batch
    (docs/math.md). ``clean``/``corrupt`` are the pairs' mean metrics; an edge non-finite
    in any pair is non-finite. ``progress`` moves per finished pair (and within a pair here);
    ``cancelled`` stops between pairs here, and cancels the outstanding tasks on a cluster."""
    if not requests:
        raise InvalidRequestError(str(model.path), "no prompt pair to attribute")
    total = len(requests)
    found: dict[int, EdgeScores] = {}
    for i, req in enumerate(requests):
        kept = stored_edges(model, req, store)
        if kept is not None:
            found[i] = kept.scores
    report(progress, len(found) / total)
    missing = [i for i in range(total) if i not in found]
    if cluster is not None and missing:
        from headscope.engine.sweeps.cluster import run_tasks
        from headscope.engine.sweeps.store import fingerprint

        key = store.key if store is not None and store.key else fingerprint(model.checkpoint, model.raw)

        def arrived(j: int, vector: np.ndarray) -> None:
            req = requests[missing[j]]
            result = edges_vector(model, req, np.asarray(vector, dtype=np.float64))
            save_edges(store, req, result)
            found[missing[j]] = result.scores
            report(progress, len(found) / total)

        run_tasks(cluster, edges_pair_task, [(str(model.path), key, bool(model.raw), requests[i]) for i in missing],
                  finished=arrived, cancelled=cancelled)
    else:
        for i in missing:
            check_cancelled(cancelled)
            done = len(found)
            found[i] = edges(model, requests[i], progress=progress_span(progress, done / total, (done + 1) / total),
                             cancelled=cancelled, store=store).scores
    report(progress, 1.0)
    return mean_scores([found[i] for i in range(total)])


def mean_scores(results: Sequence[EdgeScores]) -> EdgeScores:
    """The pairs' scores averaged (``edges_over_prompts``); ``tokens`` is the longest pair's
    length, ``batch`` the number of sequences."""
    first = results[0]
    values = np.stack([np.where(r.nonfinite, np.nan, r.scores) for r in results])
    n = len(results)
    return edge_scores_result(method=first.method, steps=first.steps, metric=first.metric,
                              clean=math.fsum(r.clean for r in results) / n,
                              corrupt=math.fsum(r.corrupt for r in results) / n, graph=first.graph,
                              scores=values.sum(axis=0) / n, tokens=max(r.tokens for r in results),
                              batch=sum(r.batch for r in results))
