"""Every request headscope answers is computed here, once: from an open ``Model`` and a
request validated at its entry (``core.validation``) to a result of ``core.results``.

The ``Engine`` runs these on its worker threads and caches what they return; the CLI, the
exports and ``api.report`` call them directly. The maths is in ``engine.circuits`` (the
weight algebra) and ``engine.forward`` (torch: forward passes, and the token batches and
thread settings of ``forward.runtime``); this module selects, labels and packs, and imports
no torch itself. Long computations take ``cancelled() -> bool`` (checked between steps;
``CancelledError``) and ``progress(fraction)`` (``progress_span`` maps a step's into the
whole's).

The sweeps take an optional ``store`` (``sweeps.store.ModelStore``, the model's entry in the
on-disk results store): the parts it holds are read from it, the parts computed are written
to it as soon as each is finished (docs/internals.md, "The results store").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from headscope.engine.core.errors import CancelledError, NonFiniteError, PromptError
from headscope.engine.core.progress import Cancelled, Memo, Progress
from headscope.engine.core.results import (
    CircuitBlock,
    Composition,
    PatchResult,
    Profile,
    PromptView,
    ScoreNull,
    ScoreTable,
    SingularDirections,
    Spectrum,
    TokenDirection,
    TopTokens,
    VirtualPath,
    patch_result,
    rank_edges,
    readonly,
)
from headscope.engine.core.threads import one_lapack_thread
from headscope.engine.core.validation import (
    NULL_SAMPLES,
    PATH_SAMPLE,
    SCORE_NAMES,
    SEED,
    TOP_EDGES,
    CircuitRequest,
    PatchRequest,
    PathRequest,
    check_result_bytes,
    prompt_bytes,
)
from headscope.engine.model.caveats import ov_caveats, qk_caveats

if TYPE_CHECKING:
    from headscope.engine.model.loading import Model
    from headscope.engine.sweeps.cluster import Cluster
    from headscope.engine.sweeps.store import LayerMemo, ModelStore

BEHAVIOURS = ("prev_token", "duplicate_token", "induction")  # keys of behaviour.behaviour_scores
SINKS = ("attention_sink", "delimiter_sink")  # sinks.sink_scores


def _check(cancelled: Cancelled) -> None:
    if cancelled is not None and cancelled():
        raise CancelledError()


def progress_span(progress: Progress, start: float, stop: float) -> Progress:
    """Progress of one step of a sweep, mapped into [start, stop] of the whole."""
    if progress is None:
        return None
    return lambda fraction: progress(start + (stop - start) * fraction)


def label(tokenizer: Any, token: int) -> str:
    """The token's string, or its id when the tokenizer cannot decode it."""
    decode = getattr(tokenizer, "decode_token", None)
    if decode is None:
        return str(token)
    try:
        return str(decode(token))
    except Exception:
        return str(token)


def _unembed_note(model: Model) -> str:
    return "W_U is tied W_Eᵀ" if model.cfg.tied_unembed else ""


# -- per-head requests --------------------------------------------------------------------------


def circuit_block(model: Model, req: CircuitRequest) -> CircuitBlock:
    """The block ``req`` asks for (``head_circuits.circuit_block``), labelled."""
    from headscope.engine.circuits import head_circuits


    values = head_circuits.circuit_block(model.weights, req.layer, req.head, req.kind, req.basis,
                                         req.rows, req.cols, req.offset)
    array = readonly(values, np.float32)
    finite = array[np.isfinite(array)]
    if req.basis == "position":
        row_labels, col_labels = tuple(map(str, req.rows)), tuple(map(str, req.cols))
    else:
        row_labels = tuple(label(model.tokenizer, t) for t in req.rows)
        col_labels = tuple(label(model.tokenizer, t) for t in req.cols)
    notes = []
    if req.kind == "ov" and model.cfg.tied_unembed:
        notes.append(_unembed_note(model))
    # Where the circuit is not exactly what the model computes (docs/math.md).
    notes += ov_caveats(model.cfg) if req.kind == "ov" else qk_caveats(model.cfg)
    if finite.size < array.size:
        notes.append("NaN/inf in this head's weights")
    return CircuitBlock(
        values=array,
        row_labels=row_labels,
        col_labels=col_labels,
        row_ids=req.rows,
        col_ids=req.cols,
        kind=req.kind,  # type: ignore[arg-type]
        basis=req.basis,  # type: ignore[arg-type]
        layer=req.layer,
        head=req.head,
        vmin=float(finite.min()) if finite.size else float("nan"),
        vmax=float(finite.max()) if finite.size else float("nan"),
        note="; ".join(notes),
        offset=req.offset,
    )


def top_outputs(model: Model, layer: int, head: int, source: int, k: int) -> TopTokens:
    """The output tokens the full OV circuit raises most when the head attends to ``source``."""
    from headscope.engine.circuits import head_circuits

    k = max(1, min(k, model.cfg.d_vocab))
    row = head_circuits.full_ov_row(model.weights, layer, head, source)
    ids = np.argsort(-row, kind="stable")[:k]  # the k largest, largest first
    values = row[ids]
    tok = model.tokenizer
    return TopTokens(
        layer=layer,
        head=head,
        source_token=source,
        source_label=label(tok, source),
        ids=tuple(int(i) for i in ids),
        labels=tuple(label(tok, int(i)) for i in ids),
        values=readonly(values, np.float32),
        note=_unembed_note(model),
    )


def spectrum(model: Model, layer: int, head: int, kind: str, cancelled: Cancelled = None) -> Spectrum:
    """Eigenvalues of the full OV (``"ov"``) or token QK (``"qk"``) circuit, and its score."""
    from headscope.engine.circuits import head_circuits, spectral


    w = model.weights
    if kind == "ov":
        fm = head_circuits.full_ov(w, layer, head)
        score = spectral.copying_score(fm)
    else:
        fm = head_circuits.token_qk(w, layer, head)
        score = spectral.qk_positivity(fm)
    _check(cancelled)
    # NaN/inf weights (flagged in HeadScores.nonfinite): an empty spectrum with a NaN score,
    # like every other score of the head, rather than an error.
    eig = _eigenvalues(fm)
    return Spectrum(
        eigenvalues=readonly(eig, np.complex64),
        score=float(score),
        kind=kind,  # type: ignore[arg-type]
        layer=layer,
        head=head,
    )


def rotary_profile(model: Model, layer: int, head: int, offsets: tuple[int, ...]) -> Profile:
    from headscope.engine.circuits import head_circuits


    values = head_circuits.rotary_profile(model.weights, layer, head, list(offsets))
    return Profile(layer, head, offsets, readonly(values, np.float32))


def ablation_effect(model: Model, layer: int, head: int, seed: int = SEED) -> float:
    """Loss increase on the seeded repeated sequence when the head's output is zeroed."""
    from headscope.engine.forward import behaviour

    return float(behaviour.ablation_effect(model.weights, layer, head, seed=seed))


# -- model-wide requests (sweeps) ---------------------------------------------------------------


def nonfinite_heads(model: Model, behaviour: dict[str, Any] | None = None) -> np.ndarray:
    """[L, H] bool: heads with a NaN/inf in their attention weights (or weights whose
    products overflow float32), and, given the behaviour scores, heads whose scores are not
    finite (finite weights whose attention overflows)."""
    from headscope.engine.circuits import spectral


    flags = np.zeros((model.cfg.n_layers, model.cfg.n_heads), bool)
    for layer, head in spectral.nonfinite_heads(model.weights):
        flags[layer, head] = True
    for name in BEHAVIOURS if behaviour is not None else ():
        flags |= ~np.isfinite(np.asarray(behaviour[name], dtype=np.float64))
    return flags


def _memo(store: ModelStore | None, name: str, shape: tuple[int, ...]) -> LayerMemo | None:
    return None if store is None else store.memo(name, shape)


def _monotone(progress: Progress) -> Progress:
    """``progress`` that never goes back (a cluster run, then the local sweep reading its
    parts back, both report over the same span)."""
    if progress is None:
        return None
    best = [0.0]

    def report(fraction: float) -> None:
        best[0] = max(best[0], fraction)
        progress(best[0])

    return report


def _sweep_memo(model: Model, store: ModelStore | None, name: str, shape: tuple[int, ...],
                cluster: Cluster | None, progress: Progress, cancelled: Cancelled) -> Memo | None:
    """The memo of one sweep; with a ``cluster``, its missing parts are computed there
    first (sweeps.cluster) and the local sweep then only reads them back."""
    memo = _memo(store, name, shape)
    if cluster is None:
        return memo
    from headscope.engine.sweeps.cluster import KeptMemo, run_parts
    from headscope.engine.sweeps.store import fingerprint

    kept = KeptMemo(memo)
    key = store.key if store is not None and store.key else fingerprint(model.checkpoint, model.raw)
    run_parts(cluster, model, key, name, kept, progress, cancelled)
    return kept


def _stored_nonfinite(model: Model, store: ModelStore | None,
                      known: np.ndarray | None = None) -> np.ndarray:
    shape = (model.cfg.n_layers, model.cfg.n_heads)
    found = None if store is None else store.load("nonfinite", "all", shape, bool)
    if found is None:
        found = nonfinite_heads(model) if known is None else known
        if store is not None:
            store.save("nonfinite", found)
    return readonly(found, bool)


def behaviour(model: Model, seed: int = SEED, cancelled: Cancelled = None,
              progress: Progress = None, store: ModelStore | None = None,
              weights_nonfinite: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Behavioural scores of every head (one batched forward pass) and the non-finite flags.

    With a ``store``, the three tables are one stored part (a forward pass is not resumable);
    read back, they need neither torch nor the weights. ``weights_nonfinite``:
    ``nonfinite_heads(model)`` if the caller already has it (from the spectral sweep), so the
    weights are not checked a second time.
    """
    return _behaviour(model, seed, cancelled, progress, store, weights_nonfinite)[0]


def _behaviour(model: Model, seed: int, cancelled: Cancelled, progress: Progress,
               store: ModelStore | None, weights_nonfinite: np.ndarray | None,
               null_samples: int | None = None) -> tuple[dict[str, np.ndarray], ScoreNull | None]:
    """``behaviour``, and with ``null_samples`` also ``score_null(samples=null_samples)``:
    when neither is stored, both come from one forward pass (at 7B a pass reads 13 GB of
    weights; the random heads read the stream the real heads read)."""
    # The three behavioural tables and the two attention-sink tables are one stored part.
    shape = (len(BEHAVIOURS) + len(SINKS), model.cfg.n_layers, model.cfg.n_heads)
    stacked = None if store is None else store.load(behaviour_part(seed), "all", shape)
    null = None if null_samples is None else _stored_null(model, seed, null_samples, store)
    # Weights that are not finite (stored), or attention that is not (these scores).
    flags = np.array(_stored_nonfinite(model, store, weights_nonfinite))
    if stacked is None:
        found, sinks, null_found = _behaviour_pass(
            model, seed, flags, progress, cancelled, null_samples if null is None else None)
        stacked = np.stack([*(np.asarray(found[b], dtype=np.float32) for b in BEHAVIOURS), *sinks])
        if store is not None:
            store.save(behaviour_part(seed), stacked)
        if null_found is not None:
            null = _null_of(model, seed, null_samples, null_found, store)  # type: ignore[arg-type]
    elif progress is not None:
        progress(1.0)
    if null_samples is not None and null is None:  # the scores were stored, the null was not
        null = score_null(model, seed, null_samples, store, cancelled)
    out = {b: readonly(stacked[i], np.float32) for i, b in enumerate((*BEHAVIOURS, *SINKS))}
    for b in BEHAVIOURS:
        flags |= ~np.isfinite(np.asarray(out[b], dtype=np.float64))
    out["nonfinite"] = readonly(flags, bool)
    return out, null


def _behaviour_pass(model: Model, seed: int, bad: np.ndarray, progress: Progress,
                    cancelled: Cancelled, null_samples: int | None
                    ) -> tuple[dict[str, Any], tuple[np.ndarray, np.ndarray], dict[str, Any] | None]:
    """One forward pass of ``sink_batches`` side by side (``sinks.passes``: each layer's
    weights are read once): the behavioural scores on the repeated batch
    (``behaviour.BehaviourSums``), the sink scores on every batch (``sinks.SinkSums``) and,
    with ``null_samples``, the random heads' behaviour (``null.NullSums``): each the
    numbers its own pass gives (up to float rounding: the MLPs of all batches run as one)."""
    from headscope.engine.core.memory import release_free_heap
    from headscope.engine.forward import behaviour, null, sinks

    w = model.weights
    repeated, natural = sink_batches(model, seed)
    masks = delimiter_masks(model, natural)
    found = behaviour.BehaviourSums(w, repeated, nonfinite=bad)  # the weight sweep's flags
    sink_sums = sinks.SinkSums(model.cfg, 1 + len(natural), [None, *masks])
    null_sums = None if null_samples is None else null.NullSums(
        w, repeated, natural, seed, null_samples, masks, cancelled)

    def on_block(i: int, layer: int, x: Any, pattern: Any) -> None:
        if i == 0:
            found(layer, pattern)
        sink_sums(i, layer, x, pattern)
        if null_sums is not None:
            null_sums(i, layer, x, pattern)

    _check(cancelled)
    # numpy's BLAS on one thread while torch runs the pass: the weights it processes on the way
    # are small products, and an idle OpenBLAS pool spins against torch's on 2 cores (gpt2-small
    # `heads`: 2.3 s more CPU and 1 s more wall with both pools at 2 threads).
    with one_lapack_thread():
        sinks.passes(w, [repeated, *natural], on_block, behaviour.per_layer(model.cfg.n_layers, progress, cancelled))
    release_free_heap()
    return (found.result(), _masked_sinks(*sink_sums.result(), bad),
            None if null_sums is None else null_sums.result())


def _masked_sinks(first: Any, delim: Any, bad: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The two sink tables as numpy, NaN for the heads with non-finite weights (``bad``)."""
    first, delim = first.numpy(), delim.numpy()
    first[bad] = np.nan
    delim[bad] = np.nan
    return readonly(first, np.float32), readonly(delim, np.float32)


def behaviour_part(seed: int) -> str:
    """The results-store name of ``behaviour``'s one part."""
    return f"behaviour-seed{seed}"


def score_table(
    model: Model,
    seed: int = SEED,
    progress: Progress = None,
    cancelled: Cancelled = None,
    store: ModelStore | None = None,
    cluster: Cluster | None = None,
) -> ScoreTable:
    """Every score of every head, ``[n_layers, n_heads]`` each, under ``SCORE_NAMES``.

    The weight scores are ``weight_scores``' (``spectral.spectral_scores``), so
    ``heads`` and ``heads --no-behaviour`` give the same numbers bit for bit. torch is
    imported only for the behavioural forward pass, on a background thread while the weight
    sweep runs, and not at all when the store holds every part (a warm ``heads``).
    """
    return calibrated_score_table(model, seed, progress, cancelled, store, cluster, null_samples=None)[0]


def calibrated_score_table(
    model: Model,
    seed: int = SEED,
    progress: Progress = None,
    cancelled: Cancelled = None,
    store: ModelStore | None = None,
    cluster: Cluster | None = None,
    null_samples: int | None = NULL_SAMPLES,
) -> tuple[ScoreTable, ScoreNull | None]:
    """``score_table`` and ``score_null(samples=null_samples)`` (None: no null), the
    behavioural scores of the real and of the random heads from one forward pass."""
    if cluster is not None:
        progress = _monotone(progress)
    if progress is not None:
        progress(0.0)
    if not _stored(store, behaviour_part(seed)):
        from headscope.engine.forward.runtime import import_torch_in_background

        import_torch_in_background()
    weights = weight_scores(model, progress_span(progress, 0.0, 0.7), cancelled, store, cluster)
    found, null = _behaviour(model, seed, cancelled, progress_span(progress, 0.7, 0.98), store,
                             weights["nonfinite"], null_samples)
    _check(cancelled)
    if store is not None:
        store.finish()
    if progress is not None:
        progress(1.0)
    return table_of(weights["copying_score"], weights["qk_positivity"], found), null


def _stored(store: ModelStore | None, name: str) -> bool:
    return store is not None and store.has(name)


def table_of(copying: Any, positivity: Any, found: dict[str, np.ndarray]) -> ScoreTable:
    """The ``ScoreTable`` of the two weight sweeps and ``behaviour``'s tables (the one place
    that names them, so a new behavioural score reaches every caller)."""
    return ScoreTable(
        copying_score=readonly(copying, np.float32),
        qk_positivity=readonly(positivity, np.float32),
        prev_token_score=found["prev_token"],
        duplicate_token_score=found["duplicate_token"],
        induction_score=found["induction"],
        attention_sink_score=found["attention_sink"],
        delimiter_sink_score=found["delimiter_sink"],
        nonfinite=found["nonfinite"],
    )


def weight_scores(model: Model, progress: Progress = None, cancelled: Cancelled = None,
                  store: ModelStore | None = None, cluster: Cluster | None = None
                  ) -> dict[str, np.ndarray]:
    """The weight-only scores of every head, ``[L, H]`` each: ``copying_score``,
    ``qk_positivity`` and ``nonfinite`` (heads with non-finite or overflowing attention
    weights), without a forward pass and without torch (``spectral.spectral_scores``).

    ``store``: one part per score and layer (an interrupted sweep resumes) and the
    ``nonfinite`` flags are read back or written. ``cluster``: the missing layers are
    computed there first (sweeps.cluster, by the same function), then read back here.
    """
    from headscope.engine.circuits import spectral


    n_heads = (model.cfg.n_heads,)
    if cluster is not None:  # the cluster's parts, then their read-back, over the same span
        progress = _monotone(progress)
        memos: dict[str, Memo] | None = {
            name: _sweep_memo(model, store, name, n_heads, cluster, progress_span(progress, i / 2, (i + 1) / 2),
                              cancelled)
            for i, name in enumerate(SPECTRAL_SWEEPS)}
    else:
        memos = None if store is None else {name: store.memo(name, n_heads) for name in SPECTRAL_SWEEPS}
    flags = None if store is None else store.load(
        "nonfinite", "all", (model.cfg.n_layers, model.cfg.n_heads), bool)
    found = spectral.spectral_scores(model.weights, progress, cancelled, memos=memos, known_flags=flags)
    nonfinite = found["nonfinite"] | found["overflow"]
    if store is not None and flags is None:
        store.save("nonfinite", nonfinite)
    if store is not None:
        store.finish()
    return {"copying_score": readonly(found["copying_score"], np.float32),
            "qk_positivity": readonly(found["qk_positivity"], np.float32),
            "nonfinite": readonly(nonfinite, bool)}


SPECTRAL_SWEEPS = ("copying_score", "qk_positivity")  # their stored parts: one per layer


def composition(
    model: Model,
    kind: str,
    seed: int = SEED,
    progress: Progress = None,
    cancelled: Cancelled = None,
    top: int = TOP_EDGES,
    on_tile: Callable[[int, int, np.ndarray], None] | None = None,
    store: ModelStore | None = None,
    cluster: Cluster | None = None,
) -> Composition:
    """Q/K/V composition scores between all pairs of heads, and the ``top`` strongest edges.

    ``on_tile(source_layer, target_layer, scores [H, H])`` gets each layer pair's scores as
    soon as they are computed (a graph or a ``--top`` list can fill in during the sweep).
    Stored per target layer (``composition.composition_scores``' tiles): the scores do not
    depend on ``seed``, only the baseline does (not stored: it is cheap). ``kind`` is
    validated at the entry (``report``, ``Engine``, ``api.model``), not here.
    """
    from headscope.engine.circuits.composition import composition_scores


    if cluster is not None:  # the missing tiles on the cluster first, then read back here
        progress = _monotone(progress)
    memo = _sweep_memo(model, store, f"composition-{kind}", (), cluster, progress, cancelled)
    tile_cb = None if on_tile is None else (lambda t: on_tile(t.source, t.target, t.scores))
    found = composition_scores(model.weights, kind, seed, progress, cancelled,
                               on_tile=tile_cb, memo=memo)
    if store is not None:
        store.finish()
    values = readonly(found.scores, np.float32)
    return Composition(kind, values, found.baseline, rank_edges(values, found.baseline, top))  # type: ignore[arg-type]


def ablation_effects(
    model: Model,
    seed: int = SEED,
    progress: Progress = None,
    cancelled: Cancelled = None,
    store: ModelStore | None = None,
) -> np.ndarray:
    """``[n_layers, n_heads]`` zero-ablation effects of every head (``behaviour.ablation_effects``)."""
    from headscope.engine.forward import behaviour

    effects = behaviour.ablation_effects(
        model.weights, seed=seed, progress=progress, cancelled=cancelled,
        memo=_memo(store, f"ablation-seed{seed}", (model.cfg.n_heads,)),
    )
    if store is not None:
        store.finish()
    return readonly(effects, np.float32)


def stored_ablation_effects(model: Model, seed: int = SEED,
                            store: ModelStore | None = None) -> np.ndarray | None:
    """The ``[n_layers, n_heads]`` effects ``ablation_effects`` stored, read back without a
    forward pass (and without torch); None unless every layer's part is there."""
    memo = _memo(store, f"ablation-seed{seed}", (model.cfg.n_heads,))
    if memo is None:
        return None
    parts = [memo.get(layer) for layer in range(model.cfg.n_layers)]
    if any(part is None for part in parts):
        return None
    return readonly(np.stack(parts), np.float32)


# -- reading a head (docs/math.md, "Reading a head") ----------------------------------------


def sink_batches(model: Model, seed: int = SEED) -> tuple[Any, list[Any]]:
    """The token batches of the sink scores and of the behavioural null: the seeded repeated
    random sequences of the behavioural scores, and ``sinks.NATURAL_PROMPTS`` encoded by
    the model's tokenizer (none for a tokenizer that only knows ids), cut to ``n_ctx``."""
    from headscope.engine.formats.tokenizer import reads_text
    from headscope.engine.forward import behaviour, sinks
    from headscope.engine.forward.runtime import token_batch

    cfg = model.cfg
    repeated = behaviour.repeated_tokens(cfg.d_vocab, cfg.n_ctx, seed)
    natural: list[Any] = []
    if reads_text(model.tokenizer):
        for text in sinks.NATURAL_PROMPTS:
            ids = [i for i in encode(model.tokenizer, text) if 0 <= i < cfg.d_vocab][: cfg.n_ctx]
            if len(ids) > sinks.SINK_SKIP:
                natural.append(token_batch([ids]))
    return repeated, natural


def delimiter_masks(model: Model, natural: Sequence[Any]) -> list[Any]:
    """``[b, p]`` bool per natural batch: which tokens are delimiters (``sinks.is_delimiter``
    of the token's text)."""
    from headscope.engine.forward import sinks
    from headscope.engine.forward.runtime import mask_batch

    memo: dict[int, bool] = {}

    def delimiter(token: int) -> bool:
        if token not in memo:
            memo[token] = sinks.is_delimiter(label(model.tokenizer, token))
        return memo[token]

    return [mask_batch([[delimiter(int(t)) for t in row] for row in tokens.tolist()])
            for tokens in natural]


def sink_tables(model: Model, seed: int = SEED, bad: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """``[L, H]`` attention-sink scores on the first token and on delimiters
    (``sinks.sink_scores``), in one pass; NaN for heads with non-finite weights (``bad``,
    ``nonfinite_heads(model)`` if not given)."""
    from headscope.engine.forward import sinks

    repeated, natural = sink_batches(model, seed)
    masks = [None, *delimiter_masks(model, natural)]
    first, delim = sinks.sink_scores(model.weights, [repeated, *natural], masks)
    return _masked_sinks(first, delim, nonfinite_heads(model) if bad is None else bad)


def singular_directions(model: Model, layer: int, head: int, kind: str, k: int, top: int
                        ) -> SingularDirections:
    """The top ``k`` singular directions of the full OV / token QK circuit, ``top`` tokens a
    side (validated by ``validation.check_svd``)."""
    from headscope.engine.circuits import directions, head_circuits


    w = model.weights
    fm = head_circuits.full_ov(w, layer, head) if kind == "ov" else head_circuits.token_qk(w, layer, head)
    found = directions.signed_directions(fm, k)
    tok = model.tokenizer
    rows = []
    for i in range(found.s.shape[0]):
        in_ids, in_values = directions.top_by_magnitude(found.u[:, i], top)
        out_ids, out_values = directions.top_by_magnitude(found.v[:, i], top)
        rows.append(TokenDirection(
            index=i, sigma=float(found.s[i]),
            in_ids=tuple(in_ids), in_labels=tuple(label(tok, t) for t in in_ids),
            in_values=readonly(in_values, np.float32),
            out_ids=tuple(out_ids), out_labels=tuple(label(tok, t) for t in out_ids),
            out_values=readonly(out_values, np.float32),
            overlap=directions.overlap(in_ids, in_values, out_ids, out_values),
        ))
    overlaps = [d.overlap for d in rows]
    return SingularDirections(
        layer=layer, head=head, kind=kind,  # type: ignore[arg-type]
        singular_values=readonly(found.s, np.float32), directions=tuple(rows),
        overlap=float(np.mean(overlaps)) if overlaps else float("nan"),
    )


def _eigenvalues(fm: Any) -> np.ndarray:
    """The circuit's eigenvalues, largest ``|λ|`` first; none for non-finite weights."""
    try:
        eig = fm.eigenvalues
    except NonFiniteError:
        return np.zeros(0, dtype=np.complex64)
    return eig[np.argsort(-np.abs(eig), kind="stable")]


def virtual_path(model: Model, req: PathRequest, seed: int = SEED) -> VirtualPath:
    """The V- and K-composition virtual heads of ``req.source → req.target``: spectra and
    scores, a ``rows × cols`` block of the K-path, and its diagonal rate on a seeded sample of
    ``PATH_SAMPLE`` token ids (docs/math.md, "Virtual heads")."""
    from headscope.engine.circuits import directions, spectral
    from headscope.engine.circuits.head_circuits import token_sample

    source, target, rows, cols = req.source, req.target, req.rows, req.cols
    sample = token_sample(model.cfg.d_vocab, PATH_SAMPLE, seed)

    w, tok = model.weights, model.tokenizer
    virtual = directions.virtual_ov(w, source, target)
    path = directions.k_path(w, source, target)
    try:
        singular = virtual.S
    except NonFiniteError:
        singular = np.zeros(0)
    block = path.block(list(rows), list(cols))
    return VirtualPath(
        source=source, target=target,
        v_copying_score=float(spectral.copying_score(virtual)),
        v_eigenvalues=readonly(_eigenvalues(virtual), np.complex64),
        v_singular_values=readonly(singular, np.float32),
        k_positivity=float(spectral.qk_positivity(path)),
        k_diagonal=directions.diagonal_rate(path.block(sample, sample)),
        k_eigenvalues=readonly(_eigenvalues(path), np.complex64),
        k_block=readonly(block, np.float32),
        row_ids=tuple(rows), col_ids=tuple(cols),
        row_labels=tuple(label(tok, t) for t in rows),
        col_labels=tuple(label(tok, t) for t in cols),
    )


def _finite_mean_std(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation of each row's finite entries (NaN for a row with none),
    without numpy's all-NaN warnings (warnings filters are not thread-safe)."""
    finite = np.isfinite(values)
    count = finite.sum(axis=1)
    safe = np.where(finite, values, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = safe.sum(axis=1) / count
        var = (np.where(finite, values - mean[:, None], 0.0) ** 2).sum(axis=1) / count
    return mean, np.sqrt(var)


def score_null(model: Model, seed: int = SEED, samples: int | None = None,
               store: ModelStore | None = None, cancelled: Cancelled = None) -> ScoreNull:
    """Every score on random heads of the model's shapes and norms (docs/math.md,
    "Calibrated scores"): mean and standard deviation per score and layer.

    With a ``store``, computed once per model and seed (one stored part, mean and std), and
    read back without torch. (``calibrated_score_table`` computes it in the forward pass of
    the real heads' behavioural scores.)"""
    samples = NULL_SAMPLES if samples is None else int(samples)
    stored = _stored_null(model, seed, samples, store)
    if stored is not None:
        return stored

    from headscope.engine.forward import null

    repeated, natural = sink_batches(model, seed)
    found = null.behaviour_null(model.weights, repeated, natural, seed, samples,
                                delimiter_masks(model, natural), cancelled)
    return _null_of(model, seed, samples, found, store)


def _null_part(model: Model, seed: int, samples: int) -> tuple[str, tuple[int, ...]]:
    return f"null-seed{seed}-n{samples}", (2, len(SCORE_NAMES), model.cfg.n_layers)


def _stored_null(model: Model, seed: int, samples: int, store: ModelStore | None) -> ScoreNull | None:
    part, shape = _null_part(model, seed, samples)
    stored = None if store is None else store.load(part, "all", shape)
    if stored is None:
        return None
    return ScoreNull(names=SCORE_NAMES, mean=readonly(stored[0], np.float32),
                     std=readonly(stored[1], np.float32), samples=samples, seed=seed)


def _null_of(model: Model, seed: int, samples: int, behaviour: dict[str, Any],
             store: ModelStore | None) -> ScoreNull:
    """The null from the random heads' behaviour (``null.behaviour_null``) and their
    spectral scores, stored."""
    from headscope.engine.circuits.directions import null_spectral_scores
    from headscope.engine.circuits.spectral import kept_spectral_middles

    cfg = model.cfg
    # the weight sweep's W_U W_E and W_Eᵀ W_E (kept): a 7B model's vocabulary-sized products
    # run once
    middles = kept_spectral_middles(model.weights)
    found = {
        "copying_score": null_spectral_scores(middles["copying_score"], cfg.d_head, seed, samples),
        "qk_positivity": null_spectral_scores(middles["qk_positivity"], cfg.d_head, seed + 1, samples),
    }
    mean = np.zeros((len(SCORE_NAMES), cfg.n_layers))
    std = np.zeros((len(SCORE_NAMES), cfg.n_layers))
    for i, name in enumerate(SCORE_NAMES):
        if name in found:
            values = found[name].astype(np.float64)[None, :].repeat(cfg.n_layers, 0)
        else:
            values = behaviour[name.removesuffix("_score")].double().numpy()
        mean[i], std[i] = _finite_mean_std(values)
    if store is not None:
        store.save(_null_part(model, seed, samples)[0], np.stack([mean, std]).astype(np.float32))
    return ScoreNull(names=SCORE_NAMES, mean=readonly(mean, np.float32),
                     std=readonly(std, np.float32), samples=samples, seed=seed)


# -- prompts ----------------------------------------------------------------------------------


class PromptRun:
    """One prompt through the model, every head at once; per-head views are slices."""

    def __init__(
        self,
        tokens: tuple[str, ...],
        ids: tuple[int, ...],
        patterns: np.ndarray,  # [L, H, q, k]
        dla: np.ndarray,  # [L, H, pos]
        predicted: tuple[int, ...],
        top: tuple[tuple[int, str, float], ...],
        truncated: bool,
    ) -> None:
        self.tokens, self.ids, self.patterns, self.dla = tokens, ids, patterns, dla
        self.predicted, self.top, self.truncated = predicted, top, truncated
        self.nbytes = int(patterns.nbytes + dla.nbytes) + 64 * len(ids)

    def view(self, layer: int, head: int) -> PromptView:
        return PromptView(
            tokens=self.tokens,
            ids=self.ids,
            pattern=self.patterns[layer, head],
            dla=self.dla[layer, head],
            predicted=self.predicted,
            top_predictions=self.top,
            truncated=self.truncated,
            layer=layer,
            head=head,
        )


def encode(tokenizer: Any, text: str) -> list[int]:
    ids = tokenizer.encode(text)
    ids = getattr(ids, "ids", ids)
    return [int(i) for i in ids]


# -- patching's inputs, as the CLI, the API and the explorer give them ---------------------------


def answer_token(model: Model, token: int | str, what: str) -> int:
    """An answer (or wrong) token as an id: an int, digits (``12``, or ``#12`` as the explorer
    shows ids), or a token string as ``--rows`` takes it (the vocabulary's spelling, else text
    that encodes to exactly one token). A word-level vocabulary encodes an unknown word as
    ``<unk>``: that is not the token asked for, and is refused. The range of an id is checked
    by ``validation.patch_request``."""
    where = str(model.path)
    if isinstance(token, int):
        return token
    text = str(token)
    digits = text.strip()[1:] if text.strip().startswith("#") else text.strip()
    if digits.isascii() and digits.isdigit():
        return int(digits)
    if not text.strip():
        raise PromptError(where, f"the {what} token is empty")
    found = model.tokenizer.token_to_id(text)
    if found is not None:
        return int(found)
    ids = encode(model.tokenizer, text)
    if len(ids) != 1:
        raise PromptError(where, f"the {what} token {text!r} is {len(ids)} tokens "
                          f"({', '.join(label(model.tokenizer, i) for i in ids) or 'none'}): "
                          "give one token, by its string or its id")
    spelled = model.tokenizer.decode_token(ids[0])
    if spelled.strip().lower() != text.strip().lower():
        raise PromptError(where, f"the {what} token {text!r} is not in the vocabulary "
                          f"(it encodes to {spelled!r})")
    return ids[0]


def prompt_ids(model: Model, given: str | Sequence[Any] | None, what: str) -> list[list[int]] | None:
    """A prompt as a batch of token id lists: text (encoded by the tokenizer), token ids, or
    already a batch of id lists; None stays None (the task's own prompts)."""
    if given is None:
        return None
    if isinstance(given, str):
        if not given.strip():
            raise PromptError(str(model.path), f"the {what} prompt is empty")
        return [encode(model.tokenizer, given)]
    rows = list(given)
    if rows and not isinstance(rows[0], str) and isinstance(rows[0], Sequence):
        return [[int(t) for t in row] for row in rows]
    return [[int(t) for t in rows]]


def run_prompt(
    model: Model,
    text: str,
    *,
    limit: int | None = None,
    cancelled: Cancelled = None,
    top_k: int = 10,
) -> PromptRun:
    """Tokenise ``text`` (cut to n_ctx) and run it: patterns, DLA and predictions of every head
    (``forward.prompt.prompt_pass``), labelled."""
    from headscope.engine.forward.prompt import prompt_pass

    cfg = model.cfg
    where = str(model.path)
    ids = encode(model.tokenizer, text)
    if not ids:
        raise PromptError(where, "the prompt encodes to no tokens")
    truncated = len(ids) > cfg.n_ctx
    ids = ids[: cfg.n_ctx]
    n = len(ids)
    check_result_bytes(prompt_bytes(model.structure(), n), f"a {n}-token prompt", where, limit)
    _check(cancelled)
    found = prompt_pass(model.weights, ids, top_k)
    tok = model.tokenizer
    return PromptRun(
        tokens=tuple(label(tok, i) for i in ids),
        ids=tuple(ids),
        patterns=readonly(found.patterns, np.float32),
        dla=readonly(found.dla, np.float32),
        predicted=found.predicted,
        top=tuple((i, label(tok, i), p) for i, p in found.top),
        truncated=truncated,
    )


def forward_tokens(model: Model, tokens: Sequence[int]) -> Any:
    """The reference forward pass on validated token ids (``validation.check_tokens``)."""
    from headscope.engine.forward import transformer as forward

    return forward.run(model.weights, list(tokens))


# -- patching (docs/math.md, "Patching") --------------------------------------------------------


def _patch_shape(model: Model, req: PatchRequest) -> tuple[int, int, int]:
    """(rows, positions, sequences) of a request's result."""
    cfg = model.cfg
    rows = 1 if req.edge is not None else len(req.heads) if req.heads is not None else cfg.n_layers * cfg.n_heads
    if req.task != "logit_diff":  # a built-in task: 2 × seq_len tokens
        return rows, 2 * int(req.seq_len or 0), req.batch
    return rows, len(req.clean[0]), len(req.clean)


def patch_part(req: PatchRequest) -> str:
    """The results store's part name of a patching request: a hash of every input
    (``PatchRequest.key``), in the entry of the checkpoint's fingerprint."""
    import hashlib

    return "patch-" + hashlib.blake2b(req.key().encode(), digest_size=12).hexdigest()


def patch(model: Model, req: PatchRequest, progress: Progress = None, cancelled: Cancelled = None,
          store: ModelStore | None = None) -> PatchResult:
    """Activation patching of every head (or ``req.heads``), attribution patching (with
    ``req.verify`` heads patched exactly), or path patching of ``req.edge``, as the request
    says (``validation.patch_request``). The entry point of ``headscope patch`` /
    ``path-patch``, ``Model.patch`` / ``path_patch`` and the explorer: runs on a worker,
    reports ``progress(fraction)``, stops on ``cancelled()``. With a ``store`` (the model's
    entry) a request already answered is read back, not recomputed."""
    rows, pos, batch = _patch_shape(model, req)
    n = 2 + rows + (rows * pos if req.by_position else 0) + (rows if req.verify else 0)
    name = patch_part(req)
    found = None if store is None else store.load(name, "all", (n,), np.float64)
    if found is not None:
        if progress is not None:
            progress(1.0)
        return _patch_of(model, req, found, rows, pos, batch)
    result = _patch_now(model, req, progress, cancelled)
    if store is not None:
        store.save(name, _patch_values(result), "all")
        store.finish()
    return result


def _patch_now(model: Model, req: PatchRequest, progress: Progress, cancelled: Cancelled) -> PatchResult:
    from headscope.engine.forward import patching
    from headscope.engine.forward.runtime import token_batch

    cfg, w = model.cfg, model.weights
    metric: Any
    if req.task != "logit_diff":  # a built-in task
        clean, corrupt = patching.induction_task(cfg.d_vocab, cfg.n_ctx, req.seed, req.seq_len, req.batch,
                                                 task=req.task)
        metric = patching.task_metric(req.task, clean)
    else:
        clean, corrupt = token_batch(req.clean), token_batch(req.corrupt)
        metric = patching.LogitDiff(int(req.answer or 0), int(req.wrong or 0))
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


def _patch_of(model: Model, req: PatchRequest, values: np.ndarray, rows: int, pos: int, batch: int
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
                        n_heads=cfg.n_heads, tokens=pos, batch=batch, positions=positions, exact=exact)
