"""Plain-data reports of a model: what the CLI prints, exports write and notebooks read.

Each report is a request of ``core.requests`` (validated where it is built) computed by
``sweeps.dispatch.compute`` (what the explorer's ``Engine`` runs), turned into JSON-ready Python values
(lists, floats, ints, strings) under the public names of ``validation.SCORE_NAMES``. Non-finite
floats become ``None`` only at serialisation time (``core.export.jsonable``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from headscope.engine.circuits.composition import composition_baseline  # noqa: F401  (re-exported: the CLI prints it)
from headscope.engine.core import validation
from headscope.engine.core.path_nodes import key_name
from headscope.engine.core.progress import Progress, progress_span
from headscope.engine.core.requests import (
    CircuitRequest,
    CompositionRequest,
    DirectionsRequest,
    PathRequest,
    Request,
)
from headscope.engine.core.validation import (
    ABLATION_EFFECT,
    NULL_SAMPLES,
    SCORE_NAMES,
    SEED,
    WEIGHT_SCORE_NAMES,
)
from headscope.engine.model.caveats import ov_caveats, qk_caveats
from headscope.engine.sweeps import scores
from headscope.engine.sweeps.dispatch import compute
from headscope.engine.sweeps.edges import edge_structure, edges_request, faithfulness_request  # noqa: F401  (re-exported for the CLI)
from headscope.engine.sweeps.prompts import (  # noqa: F401  (head_sets, patch_request: re-exported for the CLI)
    forward_tokens,
    head_sets,
    label,
    patch_request,
)

if TYPE_CHECKING:
    import numpy as np

    from headscope.engine.core.results import (
        CircuitBlock,
        Composition,
        PatchResult,
        ScoreNull,
        ScoreTable,
        SingularDirections,
        VirtualPath,
    )
    from headscope.engine.model.loading import LoadedModel
    from headscope.engine.sweeps.cluster import Cluster
    from headscope.engine.sweeps.store import ResultStore


def head_table(
    model: LoadedModel,
    *,
    seed: int = SEED,
    ablation: bool = False,
    calibrated: bool = True,
    store: ResultStore | None = None,
    progress: Progress = None,
    cluster: Cluster | None = None,
) -> list[dict[str, Any]]:
    """One row per head with every weight-based and behavioural score, and (``calibrated``)
    each score's z against random heads, ``<name>_z`` (``scores.score_null``).

    ``ablation`` adds ``ablation_effect``: the loss increase on the second copy of the same
    seeded repeated random tokens when the head is zero-ablated
    (``forward.behaviour.ablation_effects``; a forward pass per head, so off by default).
    ``store``: the on-disk results store (``sweeps.store``) to read finished parts from and
    write new ones to.
    """
    entry = None if store is None else store.for_model(model)
    # progress: the sweep (with the calibration's random heads), then the ablation sweep
    split = 0.5 if ablation else 1.0
    # the random heads' behaviour (the z's) comes from the real heads' forward pass
    table, null = scores.calibrated_score_table(
        model, seed, progress_span(progress, 0.0, split), store=entry, cluster=cluster,
        null_samples=NULL_SAMPLES if calibrated else None)
    effects = None
    if ablation:
        effects = scores.ablation_sweep(model, seed, progress_span(progress, split, 1.0), store=entry)
    if progress is not None:
        progress(1.0)
    return score_rows(table, effects, null)


def weight_table(model: LoadedModel, *, store: ResultStore | None = None,
                 progress: Progress = None) -> list[dict[str, Any]]:
    """``head_table`` without the behavioural scores (no forward pass, no torch:
    ``engine.circuits.spectral``): ``layer``, ``head``, ``WEIGHT_SCORE_NAMES``, ``nonfinite``.
    ``store``: the same stored parts as ``head_table``'s spectral sweeps (either command
    reads what the other wrote)."""
    entry = None if store is None else store.for_model(model)
    found = scores.weight_scores(model, progress, store=entry)
    n_layers, n_heads = found["nonfinite"].shape
    return [{"layer": layer, "head": head,
             **{name: float(found[name][layer, head]) for name in WEIGHT_SCORE_NAMES},
             "nonfinite": bool(found["nonfinite"][layer, head])}
            for layer in range(n_layers) for head in range(n_heads)]


def score_rows(table: ScoreTable, effects: np.ndarray | None = None,
               null: ScoreNull | None = None) -> list[dict[str, Any]]:
    """``table`` (and ablation ``effects``, and with a ``null`` each score's ``<name>_z``) as
    one dict per head, layer by layer."""
    z = {name: null.z(name, getattr(table, name)) for name in SCORE_NAMES} if null else {}
    rows = []
    for layer in range(table.n_layers):
        for head in range(table.n_heads):
            row: dict[str, Any] = {"layer": layer, "head": head}
            row.update({name: float(getattr(table, name)[layer, head]) for name in SCORE_NAMES})
            row.update({f"{name}_z": float(values[layer, head]) for name, values in z.items()})
            if effects is not None:
                row[ABLATION_EFFECT] = float(effects[layer, head])
            # NaN/inf weights or products that overflow float32, or non-finite attention
            # (scores.nonfinite_table): the head's scores cannot all be trusted.
            row["nonfinite"] = bool(table.nonfinite[layer, head])
            rows.append(row)
    return rows


def sort_rows(rows: list[dict[str, Any]], key: str | None) -> list[dict[str, Any]]:
    """Sort descending by ``key`` (NaN last); ``None`` keeps layer/head order."""
    if key is None:
        return rows
    columns = [k for k in rows[0] if k not in ("layer", "head", "nonfinite")] if rows else []
    validation.check_sort_key(key, columns or [*SCORE_NAMES, ABLATION_EFFECT])

    def k(r: dict[str, Any]) -> tuple[bool, float]:
        v = r[key]
        bad = v is None or (isinstance(v, float) and math.isnan(v))
        return (bad, 0.0 if bad else -float(v))

    return sorted(rows, key=k)


def composition_report(
    model: LoadedModel,
    kind: Literal["q", "k", "v"],
    *,
    top: int = 10,
    seed: int = SEED,
    store: ResultStore | None = None,
    progress: Progress = None,
    cluster: Cluster | None = None,
    on_tile: Callable[[int, int, np.ndarray], None] | None = None,
) -> dict[str, Any]:
    """All ``kind``-composition scores ``[L][H][L][H]``, the baseline and the top edges.
    ``on_tile(source_layer, target_layer, scores [H, H])``: each layer pair as it is done."""
    req = CompositionRequest.of(model.structure(), kind, seed, top, where=str(model.path))
    entry = None if store is None else store.for_model(model)
    comp = compute(model, req, progress=progress, store=entry, cluster=cluster, on_tile=on_tile)
    return composition_dict(comp, seed)


def composition_dict(comp: Composition, seed: int = SEED) -> dict[str, Any]:
    """A ``Composition`` result as the JSON the CLI prints and exports write."""
    baseline = float(comp.baseline)
    return {
        "kind": comp.kind,
        "baseline": baseline,
        "seed": seed,
        "scores": comp.scores.tolist(),
        "top_edges": [
            {
                "source": [l1, h1],
                "target": [l2, h2],
                "score": float(comp.scores[l1, h1, l2, h2]),
                "above_baseline": above,
            }
            for l1, h1, l2, h2, above in comp.top_edges
        ],
    }


def forward_report(model: LoadedModel, tokens: Sequence[int]) -> dict[str, Any]:
    """Logits ``[pos][vocab]`` and attention patterns ``[layer][head][query][key]``."""
    validation.check_tokens(model.structure(), tokens, str(model.path))
    result = forward_tokens(model, tokens)
    return {
        "tokens": list(tokens),
        "token_strings": [label(model.tokenizer, t) for t in tokens],
        "logits": result.logits[0].tolist(),
        "patterns": result.patterns[0].tolist(),
    }


def circuit_report(
    model: LoadedModel,
    layer: int,
    head: int,
    kind: Literal["qk", "ov"],
    *,
    basis: Literal["token", "position"] = "token",
    rows: Sequence[int] | None = None,
    cols: Sequence[int] | None = None,
    offset: int = 0,
) -> dict[str, Any]:
    """A ``rows × cols`` block of a head's circuit in the token or position basis.

    token basis: QK is ``W_E QK W_Eᵀ`` (query token × key token), OV is the full OV circuit
    ``W_E OV W_U`` (source token × output token). position basis (QK only): ``W_pos QK
    W_posᵀ`` for learned positions, or ``W_E W_Q R(Δ) W_Kᵀ W_Eᵀ`` at ``offset`` Δ for rotary.
    """
    req = CircuitRequest.of(model.structure(), layer, head, kind, basis, rows, cols, offset,
                            where=str(model.path))
    return circuit_dict(compute(model, req), model)  # no torch import


def circuit_dict(block: CircuitBlock, model: LoadedModel) -> dict[str, Any]:
    """A ``CircuitBlock`` as the JSON the CLI prints and exports write."""
    return {
        "layer": block.layer,
        "head": block.head,
        "kind": block.kind,
        "basis": block.basis,
        "offset": block.offset if model.cfg.positional == "rotary" else None,
        "processed": not model.raw,
        "unembedding_tied": model.cfg.tied_unembed,
        "approximations": ov_caveats(model.cfg) if block.kind == "ov" else qk_caveats(model.cfg),
        "rows": list(block.row_ids),
        "cols": list(block.col_ids),
        "row_labels": list(block.row_labels),
        "col_labels": list(block.col_labels),
        "values": block.values.tolist(),
    }


def svd_report(model: LoadedModel, layer: int, head: int, kind: Literal["qk", "ov"], *, k: int = 5,
               top: int = 10) -> dict[str, Any]:
    """The top ``k`` singular directions of a head's full OV / token QK circuit as tokens
    (``head_views.token_directions``), ``top`` tokens a side ranked by ``|value|``."""
    req = DirectionsRequest.of(model.structure(), layer, head, kind, k, top, where=str(model.path))
    return svd_dict(compute(model, req))


def _tokens(ids: Sequence[int], labels: Sequence[str], values: Any) -> list[dict[str, Any]]:
    return [{"id": int(i), "token": t, "value": float(v)}
            for i, t, v in zip(ids, labels, values, strict=True)]


def svd_dict(found: SingularDirections) -> dict[str, Any]:
    """A ``SingularDirections`` result as the JSON ``headscope svd --json`` prints."""
    return {
        "layer": found.layer,
        "head": found.head,
        "kind": found.kind,
        "singular_values": [float(s) for s in found.singular_values],
        "overlap": found.overlap,
        "directions": [
            {
                # numbered from 1, as the explorer's panel shows them ("OV direction 1/5")
                "direction": d.index + 1,
                "sigma": d.sigma,
                "overlap": d.overlap,
                "in_tokens": _tokens(d.in_ids, d.in_labels, d.in_values),
                "out_tokens": _tokens(d.out_ids, d.out_labels, d.out_values),
            }
            for d in found.directions
        ],
    }


def path_report(model: LoadedModel, source: tuple[int, int], target: tuple[int, int], *,
                rows: Sequence[int] | None = None, cols: Sequence[int] | None = None,
                seed: int = SEED) -> dict[str, Any]:
    """The virtual heads of the path ``source → target`` (``head_views.virtual_heads``)."""
    req = PathRequest.of(model.structure(), source, target, rows, cols, seed=seed, where=str(model.path))
    return path_dict(compute(model, req))


def _complex(values: Any) -> list[list[float]]:
    return [[float(v.real), float(v.imag)] for v in values]


def path_dict(found: VirtualPath) -> dict[str, Any]:
    """A ``VirtualPath`` result as the JSON ``headscope path --json`` prints."""
    return {
        "source": list(found.source),
        "target": list(found.target),
        "v_composition": {
            "copying_score": found.v_copying_score,
            "singular_values": [float(s) for s in found.v_singular_values],
            "eigenvalues": _complex(found.v_eigenvalues),
        },
        "k_composition": {
            "positivity": found.k_positivity,
            "diagonal": found.k_diagonal,
            "eigenvalues": _complex(found.k_eigenvalues),
            "rows": list(found.row_ids),
            "cols": list(found.col_ids),
            "row_labels": list(found.row_labels),
            "col_labels": list(found.col_labels),
            "values": found.k_block.tolist(),
        },
    }


# -- patching (docs/math.md, "Patching") --------------------------------------------------------

def computed(model: LoadedModel, req: Request, *, store: ResultStore | None = None,
             progress: Progress = None, cancelled: Callable[[], bool] | None = None, **options: Any) -> Any:
    """``req`` (built by the CLI with ``SomeRequest.of``) computed with the model's entry of
    the results store (``None``: no store); ``options`` as ``compute`` takes them (a sweep's
    ``cluster``, a composition's ``on_tile``). The ``*_dict`` functions shape the result."""
    entry = None if store is None else store.for_model(model)
    return compute(model, req, progress=progress, cancelled=cancelled, store=entry, **options)


def patch_dict(result: PatchResult) -> dict[str, Any]:
    """The JSON of ``headscope patch`` / ``path-patch``: ``{"method", "site", "metric",
    "clean", "corrupt", "heads": [{"layer", "head", "patched", "recovered"}, ...]}``, plus
    ``noising``, ``note`` (why ``recovered`` is null, if it is), the input's shape, and per
    row: ``heads`` for heads patched together (``[[layer, head], ...]``), ``sender`` and
    ``receiver`` for a path (a head ``[layer, head]``, another node its name: ``input``,
    ``m0``, ``logits``) and its ``edge`` name as ``headscope edges`` gives it, ``positions``/``positions_recovered`` (by position),
    ``estimate``/``exact``/``exact_recovered`` (attribution). Undefined numbers are null."""
    rows = []
    for row in result.rows:
        out: dict[str, Any] = {}
        if result.method == "path":  # a head as [layer, head], another node by its name
            part = result.site if result.site in validation.PATH_INPUTS else None
            out["sender"], out["receiver"] = (list(key) if key[1] >= 0 else key_name(key) for key in row.heads)
            out["edge"] = f"{key_name(row.heads[0])}->{key_name(row.heads[1], part)}"
        elif len(row.heads) == 1:
            out["layer"], out["head"] = row.layer, row.head
        else:
            out["heads"] = [list(h) for h in row.heads]
        out["patched"], out["recovered"] = row.patched, row.recovered
        if row.positions is not None:
            out["positions"], out["positions_recovered"] = list(row.positions), list(row.positions_recovered or ())
        if result.method == "attribution":
            out["estimate"], out["exact"], out["exact_recovered"] = row.estimate, row.exact, row.exact_recovered
        rows.append(out)
    return {"method": result.method, "site": result.site, "metric": result.metric,
            "noising": result.noising, "clean": result.clean, "corrupt": result.corrupt,
            "tokens": result.tokens, "batch": result.batch, "note": result.note or None, "heads": rows}


# -- edge attribution (``headscope edges`` / ``faithfulness``) -----------------------------------


def edges_dict(result: Any, top: int | None = None) -> dict[str, Any]:
    """The JSON of ``headscope edges``: ``{"method", "steps", "metric", "clean", "corrupt",
    "edges": [{"edge", "score", "exact"}, ...]}``, every edge (``top``: the first ``top``) by
    |score|, largest first; ``exact`` the edge patched alone (``--verify``) or null. An edge
    whose gradient was not finite has a null score and is named in ``nonfinite``."""
    scores = result.scores
    exact = {row.edge: row.exact for row in result.exact}
    ranked = scores.ranked()
    rows = [{"edge": scores.graph.edges[int(i)], "score": scores.score(scores.graph.edges[int(i)]),
             "exact": exact.get(scores.graph.edges[int(i)])}
            for i in (ranked if top is None else ranked[:top])]
    nonfinite = [scores.graph.edges[int(i)] for i in np.flatnonzero(scores.nonfinite)]
    return {"method": scores.method, "steps": scores.steps, "metric": scores.metric, "clean": scores.clean,
            "corrupt": scores.corrupt, "tokens": scores.tokens, "batch": scores.batch,
            "n_edges": scores.graph.n_edges, "nonfinite": nonfinite, "edges": rows}


def prompt_edges(model: LoadedModel, prompts: str | os.PathLike[str] | Sequence[Any], *, method: str = "eap-ig", steps: int = 5,
                 store: ResultStore | None = None, progress: Progress = None, cluster: Cluster | None = None,
                 cancelled: Any = None) -> Any:
    """``headscope edges PATH --prompts FILE``: the edge scores averaged over the prompt pairs
    of ``prompts`` (a file, or ``PromptPair``s; ``sweeps.edge_prompts``), each pair stored
    under its own ``EdgesRequest``'s key; on ``cluster``, one Dask task a pair. An
    ``EdgeAttribution`` without exact checks (``edges_dict`` prints it)."""
    from headscope.engine.core.edge_results import EdgeAttribution
    from headscope.engine.sweeps import edge_prompts

    source = str(prompts) if isinstance(prompts, str | os.PathLike) else None
    pairs = edge_prompts.read_prompt_pairs(source) if source is not None else list(prompts)
    requests = edge_prompts.pair_requests(model, pairs, method=method, steps=steps, source=source)
    entry = None if store is None else store.for_model(model)
    scores = edge_prompts.edges_over_prompts(model, requests, progress=progress, cancelled=cancelled, store=entry,
                                             cluster=cluster)
    return EdgeAttribution(scores, ())


def _circuit_dict(point: Any) -> dict[str, Any]:
    return {"top": point.top, "clean": point.clean, "corrupt": point.corrupt, "circuit": point.circuit,
            "faithfulness": point.faithfulness, "edges": point.edges}


def faithfulness_dict(result: Any) -> Any:
    """The JSON of ``headscope faithfulness``: per asked N ``{"top", "clean", "corrupt",
    "circuit", "faithfulness", "edges"}`` (``edges``: left after pruning), one object for one N,
    a list for several; with the curve, ``"curve": {"area", "area_from_1", "points": [{"fraction",
    "top", "edges", "circuit", "faithfulness"}, ...]}`` is added to the object (several N:
    ``{"circuits": [...], "curve": ...}``; no N: ``{"clean", "corrupt", "curve"}``)."""
    circuits = [_circuit_dict(p) for p in result.points]
    out: Any = circuits[0] if len(circuits) == 1 else circuits
    if result.curve is None:
        return out
    curve = result.curve
    found = {"area": curve.area, "area_from_1": curve.area_from_1,
             "points": [{"fraction": f, **{k: v for k, v in _circuit_dict(p).items()
                                           if k not in ("clean", "corrupt")}}
                        for f, p in zip(curve.fractions, curve.points, strict=True)]}
    if isinstance(out, dict):
        return {**out, "curve": found}
    if circuits:
        return {"circuits": circuits, "curve": found}
    return {"clean": result.scores.clean, "corrupt": result.scores.corrupt, "curve": found}
