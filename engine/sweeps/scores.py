"""Model-wide sweeps: every head's scores (weights, behaviour, sinks), their calibration
against random heads, composition between all pairs of heads, and zero-ablation effects
(docs/math.md). The maths is in ``engine.circuits`` (the weight algebra) and
``engine.forward`` (torch forward passes); this module selects, labels, packs and stores.

The sweeps take an optional ``store`` (``sweeps.store.ModelStore``, the model's entry in the
on-disk results store): the parts it holds are read from it, the parts computed are written
to it as soon as each is finished (docs/internals.md, "The results store").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from headscope.engine.core.progress import (
    Cancelled,
    Memo,
    Progress,
    check_cancelled,
    monotone,
    progress_span,
)
from headscope.engine.core.requests import (
    AblationSweepRequest,
    BehaviourRequest,
    CompositionRequest,
    HeadScoresRequest,
    ScoreNullRequest,
    ScoreTableRequest,
    computes,
)
from headscope.engine.core.results import (
    Composition,
    HeadScores,
    ScoreNull,
    ScoreTable,
    rank_edges,
    readonly,
)
from headscope.engine.core.threads import one_lapack_thread
from headscope.engine.core.validation import NULL_SAMPLES, SCORE_NAMES, SEED, TOP_EDGES
from headscope.engine.sweeps.prompts import encode, label

if TYPE_CHECKING:
    from headscope.engine.circuits.spectral import SpectralPass
    from headscope.engine.model.loading import LoadedModel
    from headscope.engine.sweeps.cluster import Cluster
    from headscope.engine.sweeps.store import LayerMemo, ModelStore

BEHAVIOURS = ("prev_token", "duplicate_token", "induction")  # keys of behaviour.behaviour_scores


SINKS = ("attention_sink", "delimiter_sink")  # sinks.sink_scores


def nonfinite_table(model: LoadedModel, behaviour: dict[str, Any] | None = None) -> np.ndarray:
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


def _sweep_memo(model: LoadedModel, store: ModelStore | None, name: str, shape: tuple[int, ...],
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


def _load_nonfinite(model: LoadedModel, store: ModelStore | None) -> np.ndarray | None:
    """The stored ``nonfinite`` flags ``[L, H]`` (weights' ``nonfinite | overflow``), if any."""
    shape = (model.cfg.n_layers, model.cfg.n_heads)
    return None if store is None else store.load("nonfinite", "all", shape, bool)


def _stored_nonfinite(model: LoadedModel, store: ModelStore | None,
                      known: np.ndarray | None = None) -> np.ndarray:
    found = _load_nonfinite(model, store)
    if found is None:
        found = nonfinite_table(model) if known is None else known
        if store is not None:
            store.save("nonfinite", found)
    return readonly(found, bool)


def behaviour(model: LoadedModel, seed: int = SEED, cancelled: Cancelled = None,
              progress: Progress = None, store: ModelStore | None = None,
              weights_nonfinite: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Behavioural scores of every head (one batched forward pass) and the non-finite flags.

    With a ``store``, the three tables are one stored part (a forward pass is not resumable);
    read back, they need neither torch nor the weights. ``weights_nonfinite``:
    ``nonfinite_table(model)`` if the caller already has it (from the spectral sweep), so the
    weights are not checked a second time.
    """
    return _behaviour(model, seed, cancelled, progress, store, weights_nonfinite)[0]


def _behaviour(model: LoadedModel, seed: int, cancelled: Cancelled, progress: Progress,
               store: ModelStore | None, weights_nonfinite: np.ndarray | None,
               null_samples: int | None = None, spectral: SpectralPass | None = None
               ) -> tuple[dict[str, np.ndarray], ScoreNull | None]:
    """``behaviour``, and with ``null_samples`` also ``score_null(samples=null_samples)``:
    when neither is stored, both come from one forward pass (at 7B a pass reads 13 GB of
    weights; the random heads read the stream the real heads read). ``spectral``: the weight
    sweep, run layer by layer in that pass (``_weights_and_behaviour``; its ``flags`` are the
    weights' non-finite flags, filled in as the pass goes)."""
    # The three behavioural tables and the two attention-sink tables are one stored part.
    shape = (len(BEHAVIOURS) + len(SINKS), model.cfg.n_layers, model.cfg.n_heads)
    stacked = None if store is None else store.load(behaviour_part(seed), "all", shape)
    null = None if null_samples is None else _stored_null(model, seed, null_samples, store)
    if spectral is not None and stacked is not None:  # stored since the caller looked: no pass
        spectral.result()  # to drive the sweep, which runs alone (its flags are read below)
    # Weights that are not finite (stored, or the sweep's), or attention that is not (these scores).
    flags = spectral.flags if spectral is not None else np.array(_stored_nonfinite(model, store, weights_nonfinite))
    if stacked is None:
        found, sinks, null_found = _behaviour_pass(
            model, seed, flags, progress, cancelled, null_samples if null is None else None, spectral)
        flags = np.array(flags)
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


def _behaviour_pass(model: LoadedModel, seed: int, bad: np.ndarray, progress: Progress,
                    cancelled: Cancelled, null_samples: int | None, spectral: SpectralPass | None = None
                    ) -> tuple[dict[str, Any], tuple[np.ndarray, np.ndarray], dict[str, Any] | None]:
    """One forward pass of ``sink_batches`` side by side (``sinks.passes``: each layer's
    weights are read once): the behavioural scores on the repeated batch
    (``behaviour.BehaviourSums``), the sink scores on every batch (``sinks.SinkSums``) and,
    with ``null_samples``, the random heads' behaviour (``null.NullSums``): each the
    numbers its own pass gives (up to float rounding: the MLPs of all batches run as one).
    ``spectral``: each layer's piece of the weight sweep, before the layer's attention
    (``bad``, its flags, is read once the pass is done)."""
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

    check_cancelled(cancelled)
    # numpy's BLAS on one thread while torch runs the pass: the weights it processes on the way
    # are small products, and an idle OpenBLAS pool spins against torch's on 2 cores (gpt2-small
    # `heads`: 2.3 s more CPU and 1 s more wall with both pools at 2 threads). The weight
    # sweep's products are not small: they run on every core, between the layers' holds.
    with contextlib.ExitStack() as hold:
        hold.enter_context(one_lapack_thread())

        def before_layer(layer: int) -> None:
            hold.close()
            spectral.layer(layer)  # type: ignore[union-attr]
            hold.enter_context(one_lapack_thread())

        sinks.passes(w, [repeated, *natural], on_block, behaviour.per_layer(model.cfg.n_layers, progress, cancelled),
                     before_layer=None if spectral is None else before_layer)
    if spectral is not None:
        w.release()  # as after the weight sweep alone (spectral.spectral_scores)
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
    model: LoadedModel,
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
    model: LoadedModel,
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
        progress = monotone(progress)
    if progress is not None:
        progress(0.0)
    if not _stored(store, behaviour_part(seed)):
        from headscope.engine.forward.runtime import import_torch_in_background

        import_torch_in_background()
    if cluster is None and not _stored(store, behaviour_part(seed)):  # both sweeps, one pass
        weights, found, null = _weights_and_behaviour(model, seed, progress_span(progress, 0.0, 0.98),
                                                      cancelled, store, null_samples)
    else:  # the weight sweep (on the cluster, or alone), then the stored behaviour or a pass
        weights = weight_scores(model, progress_span(progress, 0.0, 0.7), cancelled, store, cluster)
        found, null = _behaviour(model, seed, cancelled, progress_span(progress, 0.7, 0.98), store,
                                 weights["nonfinite"], null_samples)
    check_cancelled(cancelled)
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


def weight_scores(model: LoadedModel, progress: Progress = None, cancelled: Cancelled = None,
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
        progress = monotone(progress)
        memos: dict[str, Memo] | None = {
            name: _sweep_memo(model, store, name, n_heads, cluster, progress_span(progress, i / 2, (i + 1) / 2),
                              cancelled)
            for i, name in enumerate(SPECTRAL_SWEEPS)}
    else:
        memos = None if store is None else {name: store.memo(name, n_heads) for name in SPECTRAL_SWEEPS}
    flags = _load_nonfinite(model, store)
    found = spectral.spectral_scores(model.weights, progress, cancelled, memos=memos, known_flags=flags)
    return _weight_tables(found, store, stored_flags=flags is not None)


def _weight_tables(found: dict[str, np.ndarray], store: ModelStore | None, *, stored_flags: bool
                   ) -> dict[str, np.ndarray]:
    """``weight_scores``' tables of a finished spectral sweep; its flags saved unless
    ``stored_flags`` (they were read from the store)."""
    nonfinite = found["nonfinite"] | found["overflow"]
    if store is not None and not stored_flags:
        store.save("nonfinite", nonfinite)
    if store is not None:
        store.finish()
    return {"copying_score": readonly(found["copying_score"], np.float32),
            "qk_positivity": readonly(found["qk_positivity"], np.float32),
            "nonfinite": readonly(nonfinite, bool)}


def _weights_and_behaviour(model: LoadedModel, seed: int, progress: Progress, cancelled: Cancelled,
                           store: ModelStore | None, null_samples: int | None
                           ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], ScoreNull | None]:
    """``weight_scores`` and ``_behaviour`` in one pass over the layers: each layer's spectral
    piece runs as the forward pass reaches the layer (``spectral.SpectralPass``), on the
    attention weights the pass reads next, so they are read and processed once, not twice (at
    7B 4 GB of bf16 or dequantised GGUF into 8 GB of float32). The same numbers as the two
    sweeps one after the other: the same functions on the same weights."""
    from headscope.engine.circuits.spectral import SpectralPass

    n_heads = (model.cfg.n_heads,)
    memos = None if store is None else {name: store.memo(name, n_heads) for name in SPECTRAL_SWEEPS}
    flags = _load_nonfinite(model, store)
    sweep = SpectralPass(model.weights, memos=memos, known_flags=flags)
    check_cancelled(cancelled)
    sweep.prepare()  # the middles (2 TFLOP at 7B) while torch imports
    found, null = _behaviour(model, seed, cancelled, progress, store, None, null_samples, sweep)
    return _weight_tables(sweep.result(), store, stored_flags=flags is not None), found, null


SPECTRAL_SWEEPS = ("copying_score", "qk_positivity")  # their stored parts: one per layer


def composition(
    model: LoadedModel,
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
        progress = monotone(progress)
    memo = _sweep_memo(model, store, f"composition-{kind}", (), cluster, progress, cancelled)
    tile_cb = None if on_tile is None else (lambda t: on_tile(t.source, t.target, t.scores))
    found = composition_scores(model.weights, kind, seed, progress, cancelled,
                               on_tile=tile_cb, memo=memo)
    if store is not None:
        store.finish()
    values = readonly(found.scores, np.float32)
    return Composition(kind, values, found.baseline, rank_edges(values, found.baseline, top))  # type: ignore[arg-type]


def ablation_sweep(
    model: LoadedModel,
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


def stored_ablation_effects(model: LoadedModel, seed: int = SEED,
                            store: ModelStore | None = None) -> np.ndarray | None:
    """The ``[n_layers, n_heads]`` effects ``ablation_sweep`` stored, read back without a
    forward pass (and without torch); None unless every layer's part is there."""
    memo = _memo(store, f"ablation-seed{seed}", (model.cfg.n_heads,))
    if memo is None:
        return None
    parts = [memo.get(layer) for layer in range(model.cfg.n_layers)]
    if any(part is None for part in parts):
        return None
    return readonly(np.stack(parts), np.float32)


def sink_batches(model: LoadedModel, seed: int = SEED) -> tuple[Any, list[Any]]:
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


def delimiter_masks(model: LoadedModel, natural: Sequence[Any]) -> list[Any]:
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


def sink_tables(model: LoadedModel, seed: int = SEED, bad: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """``[L, H]`` attention-sink scores on the first token and on delimiters
    (``sinks.sink_scores``), in one pass; NaN for heads with non-finite weights (``bad``,
    ``nonfinite_table(model)`` if not given)."""
    from headscope.engine.forward import sinks

    repeated, natural = sink_batches(model, seed)
    masks = [None, *delimiter_masks(model, natural)]
    first, delim = sinks.sink_scores(model.weights, [repeated, *natural], masks)
    return _masked_sinks(first, delim, nonfinite_table(model) if bad is None else bad)


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


def score_null(model: LoadedModel, seed: int = SEED, samples: int | None = None,
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


def _null_part(model: LoadedModel, seed: int, samples: int) -> tuple[str, tuple[int, ...]]:
    return f"null-seed{seed}-n{samples}", (2, len(SCORE_NAMES), model.cfg.n_layers)


def _stored_null(model: LoadedModel, seed: int, samples: int, store: ModelStore | None) -> ScoreNull | None:
    part, shape = _null_part(model, seed, samples)
    stored = None if store is None else store.load(part, "all", shape)
    if stored is None:
        return None
    return ScoreNull(names=SCORE_NAMES, mean=readonly(stored[0], np.float32),
                     std=readonly(stored[1], np.float32), samples=samples, seed=seed)


def _null_of(model: LoadedModel, seed: int, samples: int, behaviour: dict[str, Any],
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


# -- the requests these sweeps answer (core.requests) --------------------------------------------


@computes(BehaviourRequest)
def _behaviour_of(model: LoadedModel, req: BehaviourRequest, *, progress: Progress = None,
                  cancelled: Cancelled = None, store: ModelStore | None = None, **_: Any
                  ) -> dict[str, np.ndarray]:
    return behaviour(model, req.seed, cancelled, progress, store)


@computes(ScoreTableRequest)
def _score_table_of(model: LoadedModel, req: ScoreTableRequest, *, progress: Progress = None,
                    cancelled: Cancelled = None, store: ModelStore | None = None,
                    cluster: Cluster | None = None, **_: Any) -> ScoreTable:
    table = score_table(model, req.seed, progress, cancelled, store, cluster)
    if progress is not None:
        progress(1.0)
    return table


@computes(ScoreNullRequest)
def _score_null_of(model: LoadedModel, req: ScoreNullRequest, *, cancelled: Cancelled = None,
                   store: ModelStore | None = None, **_: Any) -> ScoreNull:
    return score_null(model, req.seed, req.samples, store, cancelled)


@computes(CompositionRequest)
def _composition_of(model: LoadedModel, req: CompositionRequest, *, progress: Progress = None,
                    cancelled: Cancelled = None, store: ModelStore | None = None,
                    cluster: Cluster | None = None,
                    on_tile: Callable[[int, int, np.ndarray], None] | None = None, **_: Any) -> Composition:
    return composition(model, req.kind, req.seed, progress, cancelled, req.top, on_tile, store, cluster)


@computes(AblationSweepRequest)
def _ablation_sweep_of(model: LoadedModel, req: AblationSweepRequest, *, progress: Progress = None,
                       cancelled: Cancelled = None, store: ModelStore | None = None, **_: Any
                       ) -> np.ndarray | None:
    if req.stored_only:
        return stored_ablation_effects(model, req.seed, store)
    return ablation_sweep(model, req.seed, progress, cancelled, store)


@computes(HeadScoresRequest)
def head_scores(model: LoadedModel, req: HeadScoresRequest, *, store: ModelStore | None = None,
                behaviour_tables: dict[str, np.ndarray] | None = None,
                spectra: tuple[float, float, bool] | None = None, **_: Any) -> HeadScores:
    """Every score of one head: its two spectral scores (``spectra``: copying, positivity and
    whether the weights are not finite, if known: the ``Engine`` has them cached) and its row
    of ``behaviour_tables`` (computed here if not given: a forward pass of every head)."""
    from headscope.engine.core.errors import NonFiniteError
    from headscope.engine.core.requests import SpectrumRequest
    from headscope.engine.sweeps.head_views import head_spectrum

    layer, head = req.layer, req.head_index
    found = behaviour(model, req.seed, store=store) if behaviour_tables is None else behaviour_tables
    if spectra is None:
        scores = [float("nan"), float("nan")]
        try:
            for i, kind in enumerate(("ov", "qk")):
                scores[i] = head_spectrum(model, SpectrumRequest(layer, head, kind), store=store).score
            spectra = (scores[0], scores[1], False)
        except NonFiniteError:
            spectra = (scores[0], scores[1], True)
    return HeadScores(
        layer=layer,
        head=head,
        copying_score=spectra[0],
        qk_positivity=spectra[1],
        prev_token_score=float(found["prev_token"][layer, head]),
        duplicate_token_score=float(found["duplicate_token"][layer, head]),
        induction_score=float(found["induction"][layer, head]),
        attention_sink_score=float(found["attention_sink"][layer, head]),
        delimiter_sink_score=float(found["delimiter_sink"][layer, head]),
        nonfinite=spectra[2] or bool(found["nonfinite"][layer, head]),
    )
