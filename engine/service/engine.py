"""``Engine``: the async facade the explorer talks to (docs/internals.md, "Engine").

One ``Engine`` per open model. ``structure`` is there at once (header and config only, no
torch); the model itself is opened on a background thread. Every other method is ``async``
and returns a frozen dataclass of read-only numpy arrays (``core.results``). Each request
is validated by ``core.validation`` (the same checks the CLI and the Python API run),
computed on a small thread pool by the functions of ``sweeps.compute`` (the ones the CLI
calls directly) and kept in a per-head LRU cache bounded by bytes: this module owns the
cache keys, the scheduling and the prefetch, not the maths.

Scheduling (``service.scheduler``): identical requests in flight share one computation; the
focused head's requests run first; requests for heads the user has left are dropped before
they start (or stop at their next check) and their awaiters get ``CancelledError``; when
idle, the views the user last looked at are prefetched for the neighbouring heads. Sweeps
report progress and fill the per-head cache; given a ``store`` (``sweeps.store``), they read
the parts already on disk, write the ones they compute, and ``stats().origin`` says where
the last sweep's numbers came from.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import os
import threading
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from headscope.engine.core import validation
from headscope.engine.core.cache import ByteLRU
from headscope.engine.core.errors import (
    HeadscopeError,
    InvalidRequestError,
    NonFiniteError,
    PromptError,
)
from headscope.engine.core.progress import Progress
from headscope.engine.core.results import (
    CacheStats,
    CircuitBlock,
    Composition,
    HeadScores,
    PatchResult,
    Profile,
    PromptView,
    ScoreNull,
    ScoreTable,
    SingularDirections,
    Spectrum,
    TopTokens,
    VirtualPath,
    readonly,
)
from headscope.engine.core.validation import EDGE_THRESHOLD, MAX_RESULT_BYTES, SEED, TOP_EDGES
from headscope.engine.forward.runtime import gradient_mode, inference_mode, set_threads
from headscope.engine.service.scheduler import JobContext, Scheduler
from headscope.engine.sweeps import compute

if TYPE_CHECKING:
    from headscope.engine.model.loading import Model
    from headscope.engine.sweeps.diff import ModelDiff
    from headscope.engine.sweeps.store import ModelStore, ResultStore

__all__ = ["Engine", "default_workers"]

MAX_PREFETCH_VIEWS = 3



def default_workers(cpus: int | None = None) -> tuple[int, int]:
    """(pool threads, torch intra-op threads) for ``cpus`` cores: never more threads than cores.

    Two workers let a sweep run while the focused head's view is computed; each gets an even
    share of the cores for torch's intra-op parallelism.
    """
    cpus = max(1, cpus or os.cpu_count() or 1)
    workers = 1 if cpus == 1 else min(4, max(2, cpus // 2))
    return workers, max(1, cpus // workers)


class Engine:
    """The async engine of one model. See docs/internals.md "Engine" for the contract."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        *,
        raw: bool = False,
        cache_bytes: int = 256 << 20,
        workers: int | None = None,
        max_block_bytes: int = MAX_RESULT_BYTES,
        prefetch: bool = True,
        model: Model | None = None,
        store: ResultStore | None = None,
    ) -> None:
        """Open ``path`` (or wrap an already open ``model``: notebooks, tests, benchmarks).

        ``max_block_bytes`` bounds any one materialised result (a circuit block, a prompt's
        patterns): bigger requests raise ``ResourceLimitError`` (``core.validation``).
        ``store``: the on-disk results store the sweeps consult and fill (None: memory only).
        """
        if path is None and model is None:
            raise InvalidRequestError(None, "Engine needs a checkpoint path or an open model")
        self.path = Path(path) if path is not None else Path(model.path)  # type: ignore[union-attr]
        self._where = str(self.path)
        self._raw = bool(raw)
        self.max_block_bytes = int(max_block_bytes)
        self._prefetch_enabled = prefetch
        self.partial_interval = 0.25  # seconds between partial composition results (partial=)
        cpus = os.cpu_count() or 1
        if workers is None:
            workers, torch_threads = default_workers(cpus)
        else:
            workers, torch_threads = max(1, workers), max(1, cpus // max(1, workers))
        self._torch_threads = torch_threads
        self._previous_torch_threads: int | None = None
        self.cache = ByteLRU(cache_bytes)
        # set once torch is imported and its threads are set (``_job_mode``)
        self._torch_ready = threading.Event()
        self._threads_lock = threading.Lock()  # the opener sets torch's threads, aclose restores
        self._closed = False
        self._scheduler = Scheduler(
            workers, on_result=self.cache.put, job_context=self._job_mode
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._models: dict[bool, Model] = {}
        self._models_lock = threading.Lock()
        self._views: list[tuple[str, tuple[Any, ...]]] = []  # recent views, for prefetch
        self.store = store
        self._entries: dict[bool, ModelStore] = {}
        self._origin = ""  # where the last sweep's numbers came from (stats().origin)
        self._opened: concurrent.futures.Future[Model] = concurrent.futures.Future()
        if model is not None:
            self.structure: dict[str, Any] = model.structure()
            self._set_torch_threads()
            self._torch_ready.set()
            self._models[model.raw] = model
            self._opened.set_result(model)
        else:
            from headscope.engine.model.loading import (
                read_structure,  # header + config only: no torch here
            )

            self.structure = read_structure(self.path)
        self._where = str(self.structure["path"])  # as the CLI names it: the same error lines
        self.n_layers = int(self.structure["n_layers"])
        self.n_heads = int(self.structure["n_heads"])
        if model is None:
            threading.Thread(target=self._open, name="headscope-open", daemon=True).start()

    # -- lifecycle ------------------------------------------------------------------

    def _open(self) -> None:
        """Open the model (numpy only), then import torch and set its threads, then read the
        embeddings ahead (``_warm_up``). ``ready()`` waits for the first step only: the weight
        views need no torch, and importing it is most of a second (bench/README.md, "GGUF":
        the first head view of a 7B file in under 1 s)."""
        try:
            from headscope.engine.model.loading import open_model

            model = open_model(self.path, raw=self._raw)
            with self._models_lock:
                self._models[model.raw] = model
            self._opened.set_result(model)
        except HeadscopeError as exc:
            self._opened.set_exception(exc)
            return
        except Exception as exc:
            from headscope.engine.core.errors import ComputeError, out_of_memory

            self._opened.set_exception(out_of_memory(exc, self._where, "opening the model")
                                       or ComputeError(self._where, f"cannot open: {exc}"))
            return
        try:
            with self._threads_lock:
                if self._closed:  # closed while opening: leave torch's threads as they are
                    return
                self._set_torch_threads()
            self._torch_ready.set()
        except Exception:  # a broken torch: the forward passes that need it say so
            pass
        _warm_up(model)

    def _job_mode(self) -> contextlib.AbstractContextManager[Any]:
        """What every job runs in: torch's inference mode once the opener has imported torch
        and set its threads. A job that starts before (the first weight views, numpy only)
        waits for neither; one that needs torch that early imports it itself (Python's import
        lock makes it wait for the opener's import) and runs without inference mode, which
        only skips autograd bookkeeping that no weight here asks for (none requires grad)."""
        return inference_mode() if self._torch_ready.is_set() else contextlib.nullcontext()

    def _set_torch_threads(self) -> None:
        self._previous_torch_threads = set_threads(self._torch_threads)

    async def ready(self) -> None:
        """Wait until the model is open (config and tensors checked; torch is imported after)."""
        self._remember_loop()
        await asyncio.wrap_future(self._opened)

    @property
    def raw(self) -> bool:
        return self._raw

    @property
    def warnings(self) -> tuple[str, ...]:
        """What opening the model could not use, one line each (e.g. an unreadable
        tokenizer: token ids are shown instead). Empty until ``ready()``."""
        if not self._opened.done() or self._opened.exception() is not None:
            return ()
        return tuple(self._opened.result().warnings)

    async def set_raw(self, raw: bool) -> None:
        """Switch between processed and raw weights; cached results of both stay valid."""
        raw = bool(raw)
        await self.ready()
        if raw not in self._models:
            await self._scheduler.run(("model", raw), lambda ctx: self._model(raw), label="open")
        self._raw = raw

    def _model(self, raw: bool) -> Model:
        """The open model with weights ``raw`` or processed (call on a worker thread)."""
        base = self._opened.result()
        with self._models_lock:
            model = self._models.get(raw)
            if model is None:
                model = self._models[raw] = base.with_raw(raw)
            return model

    def _entry(self, raw: bool) -> ModelStore | None:
        """The model's entry in the results store (call on a worker thread)."""
        if self.store is None:
            return None
        with self._models_lock:
            entry = self._entries.get(raw)
        if entry is None:
            entry = self.store.for_model(self._model(raw))
            with self._models_lock:
                entry = self._entries.setdefault(raw, entry)
        return entry

    def _stored(self, raw: bool, what: str | None, sweep: Callable[[ModelStore | None], Any]) -> Any:
        """Run ``sweep(entry)`` and note where its numbers came from (``stats().origin``;
        ``what=None``: a part of another sweep, not reported on its own)."""
        entry = self._entry(raw)
        if entry is None:
            return sweep(None)
        # this thread's counts: the explorer's other requests (the null, a head's directions)
        # save into the same entry while the sweep runs, and are not the sweep's
        loaded, computed = entry.counts()
        result = sweep(entry)
        if what is not None:
            now_loaded, now_computed = entry.counts()
            self._origin = origin_text(what, now_loaded - loaded, now_computed - computed)
        return result

    async def aclose(self) -> None:
        self._scheduler.close()
        await asyncio.to_thread(self._scheduler.join, 5.0)
        with self._threads_lock:
            self._closed = True
            if self._previous_torch_threads is not None:
                set_threads(self._previous_torch_threads)
                self._previous_torch_threads = None

    def stats(self) -> CacheStats:
        c = self.cache
        return CacheStats(
            hits=c.hits,
            misses=c.misses,
            evictions=c.evictions,
            bytes=c.bytes,
            capacity=c.capacity,
            entries=len(c),
            in_flight=self._scheduler.in_flight,
            activity=self._scheduler.activity,
            progress=self._scheduler.progress,
            origin=self._origin,
        )

    @property
    def computations_started(self) -> int:
        """How many jobs began running (not cache hits, not joined requests)."""
        return self._scheduler.started

    # -- focus and prefetch -----------------------------------------------------------

    def focus(self, layer: int, head: int) -> None:
        """The user looks at (layer, head): its requests go first, stale ones are dropped."""
        validation.check_head(self.structure, layer, head, self._where)
        self._scheduler.focus((layer, head))
        loop = self._loop
        if self._prefetch_enabled and loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._prefetch_neighbours, layer, head)

    def _prefetch_neighbours(self, layer: int, head: int) -> None:
        if self._scheduler.focused != (layer, head):
            return
        neighbours = [(layer, head + 1), (layer, head - 1), (layer + 1, head), (layer - 1, head)]
        for name, args in list(self._views):
            for nl, nh in neighbours:
                if 0 <= nl < self.n_layers and 0 <= nh < self.n_heads:
                    key, fn = getattr(self, f"_plan_{name}")(nl, nh, *args)
                    if key not in self.cache:
                        self._scheduler.prefetch(key, fn, head=(nl, nh), label=f"prefetch {name}")

    def _remember_view(self, name: str, args: tuple[Any, ...]) -> None:
        view = (name, args)
        if view in self._views:
            self._views.remove(view)
        self._views.insert(0, view)
        del self._views[MAX_PREFETCH_VIEWS:]

    def _remember_loop(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()

    # -- the request path -----------------------------------------------------------

    async def _get(
        self,
        key: Hashable,
        fn: Callable[[JobContext], Any],
        *,
        head: tuple[int, int] | None,
        label: str,
        progress: Progress = None,
    ) -> Any:
        """Cached result, or the one in flight, or a new job; awaited without blocking."""
        self._remember_loop()
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        return await self._scheduler.run(key, fn, head=head, label=label, progress=progress)

    # -- circuit blocks -------------------------------------------------------------

    async def circuit_block(
        self,
        layer: int,
        head: int,
        kind: Literal["qk", "ov"],
        basis: Literal["token", "position"] = "token",
        rows: Sequence[int] | None = None,
        cols: Sequence[int] | None = None,
        offset: int = 0,
    ) -> CircuitBlock:
        """``rows × cols`` of the head's token (or positional) QK or full OV circuit."""
        args = (kind, basis, _ids(rows), _ids(cols), int(offset))
        key, fn = self._plan_circuit_block(layer, head, *args)
        self._remember_view("circuit_block", args)
        return await self._get(key, fn, head=(layer, head), label=f"L{layer}H{head} {kind}")

    def _plan_circuit_block(
        self,
        layer: int,
        head: int,
        kind: str,
        basis: str,
        rows: tuple[int, ...] | None,
        cols: tuple[int, ...] | None,
        offset: int,
    ) -> tuple[Hashable, Callable[[JobContext], CircuitBlock]]:
        req = validation.circuit_request(
            self.structure, layer, head, kind, basis, rows, cols, offset,
            where=self._where, limit=self.max_block_bytes,
        )
        raw = self._raw
        key = (layer, head, "circuit_block", (kind, basis, req.rows, req.cols, req.offset, raw))

        def run(ctx: JobContext) -> CircuitBlock:
            model = self._model(raw)
            ctx.check()
            return compute.circuit_block(model, req)

        return key, run

    async def top_outputs(self, layer: int, head: int, source_token: int, k: int = 10) -> TopTokens:
        """The output tokens the full OV circuit raises most when the head attends to ``source_token``."""
        args = (int(source_token), int(k))
        key, fn = self._plan_top_outputs(layer, head, *args)
        return await self._get(key, fn, head=(layer, head), label=f"L{layer}H{head} top outputs")

    def _plan_top_outputs(
        self, layer: int, head: int, source: int, k: int
    ) -> tuple[Hashable, Callable[[JobContext], TopTokens]]:
        validation.check_head(self.structure, layer, head, self._where)
        validation.check_token(self.structure, source, self._where)
        raw = self._raw
        key = (layer, head, "top_outputs", (source, k, raw))
        return key, lambda ctx: compute.top_outputs(self._model(raw), layer, head, source, k)

    # -- spectra, profiles, scores ----------------------------------------------------

    async def spectrum(self, layer: int, head: int, kind: Literal["ov", "qk"]) -> Spectrum:
        """Eigenvalues of the full OV (``"ov"``) or token QK (``"qk"``) circuit, and its score."""
        key, fn = self._plan_spectrum(layer, head, kind)
        self._remember_view("spectrum", (kind,))
        return await self._get(key, fn, head=(layer, head), label=f"L{layer}H{head} spectrum")

    def _plan_spectrum(
        self, layer: int, head: int, kind: str
    ) -> tuple[Hashable, Callable[[JobContext], Spectrum]]:
        validation.check_head(self.structure, layer, head, self._where)
        validation.check_spectrum_kind(kind, self._where)
        raw = self._raw
        key = (layer, head, "spectrum", (kind, raw))
        return key, lambda ctx: self._stored_spectrum(raw, layer, head, kind, ctx.cancelled)

    def _stored_spectrum(self, raw: bool, layer: int, head: int, kind: str,
                         cancelled: Callable[[], bool]) -> Spectrum:
        """``compute.spectrum``, kept in the results store per head (eigenvalues and score)."""
        entry = self._entry(raw)
        name, index = f"spectrum-{kind}", f"L{layer}H{head}"
        if entry is not None:
            eig = entry.load(name, index, None, np.complex64)
            score = entry.load(f"{name}-score", index, (), np.float64)
            if eig is not None and score is not None:
                return Spectrum(readonly(eig, np.complex64), float(score), kind, layer, head)  # type: ignore[arg-type]
        found = compute.spectrum(self._model(raw), layer, head, kind, cancelled)
        if entry is not None:
            entry.save(name, found.eigenvalues, index)
            entry.save(f"{name}-score", np.asarray(found.score, np.float64), index)
        return found

    async def rotary_profile(self, layer: int, head: int, offsets: Sequence[int]) -> Profile:
        """Rotary models: the head's QK score as a function of the query-key offset Δ."""
        validation.check_rotary(self.structure, self._where)
        key, fn = self._plan_rotary_profile(layer, head, tuple(int(o) for o in offsets))
        return await self._get(key, fn, head=(layer, head), label=f"L{layer}H{head} profile")

    def _plan_rotary_profile(
        self, layer: int, head: int, offsets: tuple[int, ...]
    ) -> tuple[Hashable, Callable[[JobContext], Profile]]:
        validation.check_head(self.structure, layer, head, self._where)
        raw = self._raw
        key = (layer, head, "rotary_profile", (offsets, raw))
        return key, lambda ctx: compute.rotary_profile(self._model(raw), layer, head, offsets)

    async def head_scores(self, layer: int, head: int) -> HeadScores:
        """Every score of one head (its spectra are cached too: the spectrum view is free)."""
        validation.check_head(self.structure, layer, head, self._where)
        raw = self._raw
        key = (layer, head, "head_scores", (raw,))
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        behaviour = await self._behaviour(raw)
        copying, positivity, nonfinite = float("nan"), float("nan"), False
        try:
            copying = (await self.spectrum(layer, head, "ov")).score
            positivity = (await self.spectrum(layer, head, "qk")).score
        except NonFiniteError:
            nonfinite = True
        result = HeadScores(
            layer=layer,
            head=head,
            copying_score=copying,
            qk_positivity=positivity,
            prev_token_score=float(behaviour["prev_token"][layer, head]),
            duplicate_token_score=float(behaviour["duplicate_token"][layer, head]),
            induction_score=float(behaviour["induction"][layer, head]),
            attention_sink_score=float(behaviour["attention_sink"][layer, head]),
            delimiter_sink_score=float(behaviour["delimiter_sink"][layer, head]),
            nonfinite=nonfinite or bool(behaviour["nonfinite"][layer, head]),
        )
        self.cache.put(key, result)
        return result

    async def _behaviour(self, raw: bool) -> dict[str, np.ndarray]:
        """Behavioural scores of every head: one batched forward pass, model-wide."""
        return await self._get(
            (None, None, "behaviour", (SEED, raw)),
            lambda ctx: self._stored(raw, None, lambda entry: compute.behaviour(
                self._model(raw), SEED, ctx.cancelled, store=entry)),
            head=None,
            label="behaviour scores",
        )

    async def all_head_scores(self, progress: Progress = None) -> ScoreTable:
        """Every score of every head (a sweep): fills the per-head ``head_scores`` cache."""
        raw = self._raw

        def run(ctx: JobContext) -> ScoreTable:
            table = self._stored(raw, "head scores", lambda entry: compute.score_table(
                self._model(raw), SEED, ctx.progress, ctx.cancelled, store=entry))
            for layer in range(table.n_layers):
                for head in range(table.n_heads):
                    ctx.publish((layer, head, "head_scores", (raw,)), table.head(layer, head))
            ctx.progress(1.0)
            return table

        return await self._get(
            (None, None, "all_head_scores", (SEED, raw)),
            run,
            head=None,
            label="all head scores",
            progress=progress,
        )

    # -- reading a head (docs/math.md, "Reading a head") -----------------------------------

    async def singular_directions(self, layer: int, head: int, kind: Literal["ov", "qk"],
                                  k: int = 5, top: int = 10) -> SingularDirections:
        """The top ``k`` singular directions of the full OV / token QK circuit, as tokens."""
        validation.check_svd(self.structure, layer, head, kind, k, top, self._where)
        raw = self._raw
        key = (layer, head, "singular_directions", (kind, int(k), int(top), raw))
        return await self._get(
            key,
            lambda ctx: compute.singular_directions(self._model(raw), layer, head, kind, int(k), int(top)),
            head=(layer, head),
            label=f"L{layer}H{head} {kind} directions",
        )

    async def virtual_path(self, source: tuple[int, int], target: tuple[int, int],
                           rows: Sequence[int] | None = None,
                           cols: Sequence[int] | None = None) -> VirtualPath:
        """The V- and K-composition virtual heads of ``source → target``."""
        req = validation.check_path(self.structure, source, target, _ids(rows), _ids(cols),
                                  where=self._where, limit=self.max_block_bytes)
        raw = self._raw
        key = (*req.target, "virtual_path", (req.source, req.rows, req.cols, SEED, raw))
        return await self._get(
            key,
            lambda ctx: compute.virtual_path(self._model(raw), req, SEED),
            head=req.target,
            label=f"L{req.source[0]}H{req.source[1]}→L{req.target[0]}H{req.target[1]}",
        )

    async def score_null(self) -> ScoreNull:
        """Every score on random heads of the model's shapes and norms (model-wide, cached)."""
        raw = self._raw
        return await self._get(
            (None, None, "score_null", (SEED, raw)),
            lambda ctx: self._stored(raw, None, lambda entry: compute.score_null(
                self._model(raw), SEED, store=entry, cancelled=ctx.cancelled)),
            head=None,
            label="score null",
        )

    async def composition(self, kind: Literal["q", "k", "v"], progress: Progress = None,
                          partial: Callable[[Composition], None] | None = None) -> Composition:
        """Q/K/V composition scores between all pairs of heads (a cancellable sweep).

        ``partial(comp)``: called on the event loop with the scores so far while the sweep
        runs, at most every ``partial_interval`` seconds (a graph fills in layer pair by layer
        pair): pairs not computed yet are NaN, the top edges are those of the pairs done.
        Partial results are built on the worker thread; the last one comes before the final
        result is returned. A caller that joins a sweep already running gets no partials.
        """
        validation.check_composition_kind(kind, self._where)
        raw = self._raw
        self._remember_loop()
        loop = self._loop

        def run(ctx: JobContext) -> Composition:
            model = self._model(raw)
            on_tile = None if partial is None or loop is None else \
                _partial_composition(model, kind, partial, loop, self.partial_interval)
            return self._stored(raw, f"composition {kind}", lambda entry: compute.composition(
                model, kind, SEED, ctx.progress, ctx.cancelled, on_tile=on_tile, store=entry))

        return await self._get(
            (None, None, "composition", (kind, SEED, raw)),
            run,
            head=None,
            label=f"composition {kind}",
            progress=progress,
        )

    async def ablation(self, layer: int, head: int) -> float:
        """Loss increase on the seeded repeated sequence when the head's output is zeroed."""
        validation.check_head(self.structure, layer, head, self._where)
        raw = self._raw
        return await self._get(
            (layer, head, "ablation", (SEED, raw)),
            lambda ctx: compute.ablation_effect(self._model(raw), layer, head, SEED),
            head=(layer, head),
            label="ablation",
        )

    async def all_ablation_effects(self, progress: Progress = None) -> np.ndarray:
        """``[n_layers, n_heads]`` zero-ablation effects of every head (a cancellable sweep).

        The values ``ablation(layer, head)`` gives, computed together by
        ``forward.behaviour.ablation_effects`` (which skips what an ablation cannot change), and
        published per head so that ``ablation`` is a cache hit afterwards. Opt-in: a forward
        pass per head is the most expensive sweep on a big model.
        """
        raw = self._raw

        def run(ctx: JobContext) -> np.ndarray:
            table = self._stored(raw, "ablation effects", lambda entry: compute.ablation_effects(
                self._model(raw), SEED, ctx.progress, ctx.cancelled, store=entry))
            for layer in range(table.shape[0]):
                for head in range(table.shape[1]):
                    ctx.publish((layer, head, "ablation", (SEED, raw)), float(table[layer, head]))
            return table

        return await self._get(
            (None, None, "all_ablation_effects", (SEED, raw)),
            run,
            head=None,
            label="ablation sweep",
            progress=progress,
        )

    async def stored_ablation_effects(self) -> np.ndarray | None:
        """The ablation effects already in the results store (a sweep of an earlier run, the
        CLI's ``heads --ablation``), or None: read on a worker, no forward pass."""
        raw = self._raw

        def run(ctx: JobContext) -> np.ndarray | None:
            entry = self._entry(raw)
            return compute.stored_ablation_effects(self._model(raw), SEED, entry)

        return await self._get(
            (None, None, "stored_ablation_effects", (SEED, raw)),
            run,
            head=None,
            label="stored ablation effects",
        )

    # -- interventions: activation, attribution and path patching (docs/math.md, "Patching") --

    async def induction_prompts(self, task: str = "induction") -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The first clean and corrupt sequence of a seeded built-in task (``"induction"``,
        what ``patch()`` runs with no prompts, or ``"first-occurrence"``): the explorer's
        Patch tab shows them as its inputs."""
        raw = self._raw
        # the task's seed, length and batch (an unknown task: one line, before any work)
        req = validation.patch_request(self.structure, task=task, where=self._where)

        def run(ctx: JobContext) -> tuple[tuple[int, ...], tuple[int, ...]]:
            from headscope.engine.forward.patching import induction_task

            cfg = self._model(raw).cfg
            clean, corrupt = induction_task(cfg.d_vocab, cfg.n_ctx, req.seed, req.seq_len,
                                            req.batch, task=req.task)
            return tuple(int(i) for i in clean[0]), tuple(int(i) for i in corrupt[0])

        return await self._get((None, None, "induction_prompts", (SEED, raw, req.task)), run,
                               head=None, label=f"{req.task} task")

    async def patch(self, *, clean: str | Sequence[int] | None = None,
                    corrupt: str | Sequence[int] | None = None, answer: str | int | None = None,
                    wrong: str | int | None = None, site: str = "out", method: str = "exact",
                    task: str | None = None, progress: Progress = None) -> PatchResult:
        """Activation (``method="exact"``) or attribution patching of every head at ``site``,
        denoising: ``compute.patch`` (what ``headscope patch`` runs) as a cancellable sweep.

        No prompts: the seeded built-in ``task`` (default ``"induction"``; or
        ``"first-occurrence"``) and its metric (the mean log-probability of the repeated
        half). Prompts are text (the model's tokenizer) or token ids, with the
        ``answer`` and ``wrong`` tokens of the logit difference (ids, ``#id`` or a one-token
        string). Results are kept in the results store under the checkpoint's fingerprint
        and a hash of the resolved request (``compute.patch_part``)."""
        validation.check_patchable(self.structure, self._where)
        raw = self._raw
        inputs = (_prompt_key(clean), _prompt_key(corrupt), answer, wrong, task)

        def run(ctx: JobContext) -> PatchResult:
            model = self._model(raw)
            req = patch_request(model, clean, corrupt, answer, wrong, site=site, method=method, task=task)
            # attribution takes a backward pass: the workers run under inference_mode
            with gradient_mode() if req.method == "attribution" else contextlib.nullcontext():
                result = self._stored(raw, "patching", lambda entry: compute.patch(
                    model, req, ctx.progress, ctx.cancelled, entry))
            ctx.progress(1.0)
            return result

        return await self._get((None, None, "patch", (*inputs, site, method, SEED, raw)), run,
                               head=None, label=f"patching {site}", progress=progress)

    async def path_patch(self, edges: Sequence[tuple[tuple[int, int], tuple[int, int]]],
                         receiver_input: str, *, clean: str | Sequence[int] | None = None,
                         corrupt: str | Sequence[int] | None = None,
                         answer: str | int | None = None, wrong: str | int | None = None,
                         task: str | None = None, progress: Progress = None) -> PatchResult:
        """Path patching of each composition edge ``(sender, receiver)`` into the receiver's
        ``receiver_input`` (q, k or v), on the same inputs and metric as ``patch``: one
        ``compute.patch`` request per edge (each kept in the results store), one row per edge
        in the result."""
        validation.check_patchable(self.structure, self._where)
        pairs = tuple((tuple(map(int, s)), tuple(map(int, r))) for s, r in edges)
        raw = self._raw
        inputs = (_prompt_key(clean), _prompt_key(corrupt), answer, wrong, task)

        def run(ctx: JobContext) -> PatchResult:
            model = self._model(raw)
            found: list[PatchResult] = []
            for i, edge in enumerate(pairs):
                ctx.check()
                req = patch_request(model, clean, corrupt, answer, wrong, site=receiver_input,
                                    edge=edge, task=task)  # type: ignore[arg-type]

                def part(fraction: float, i: int = i) -> None:
                    ctx.progress((i + fraction) / len(pairs))

                found.append(self._stored(raw, None, lambda entry, req=req, part=part:
                                          compute.patch(model, req, part, ctx.cancelled, entry)))
            ctx.progress(1.0)
            if not found:
                raise InvalidRequestError(self._where, "no edges to path-patch")
            first = found[0]
            return dataclasses.replace(first, rows=tuple(r for f in found for r in f.rows))

        return await self._get(
            (None, None, "path_patch", (pairs, receiver_input, *inputs, SEED, raw)), run,
            head=None, label=f"path patching {receiver_input}", progress=progress)

    async def compare(
        self, other: Engine, *, match_heads: bool = False, threshold: float = EDGE_THRESHOLD
    ) -> ModelDiff:
        """Diff this model (A) against ``other`` (B) with ``sweeps.diff.diff_models``, on a worker.

        Each model is taken with its own current raw/processed setting.
        """
        await self.ready()
        await other.ready()
        raw, other_raw = self._raw, other.raw

        def run(ctx: JobContext) -> ModelDiff:
            from headscope.engine.sweeps.diff import diff_models

            return diff_models(
                self._model(raw),
                other._model(other_raw),
                match_heads=match_heads,
                threshold=threshold,
                seed=SEED,
            )

        key = (None, None, "compare", (str(other.path), id(other), raw, other_raw, match_heads, threshold))
        return await self._get(key, run, head=None, label="compare")

    # -- prompts --------------------------------------------------------------------

    async def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` with the model's tokenizer (for choosing heatmap tokens)."""
        if not text or not text.strip():
            raise PromptError(self._where, "empty text: type some tokens first")
        await self.ready()
        model = self._opened.result()
        return await asyncio.to_thread(model.tokenizer.encode, text)

    async def run_prompt(self, text: str, layer: int, head: int) -> PromptView:
        """Tokenise ``text`` (cut to n_ctx), run it, and show it from (layer, head)."""
        validation.check_head(self.structure, layer, head, self._where)
        validation.check_prompt(text, self._where)
        raw = self._raw

        def run(ctx: JobContext) -> compute.PromptRun:
            return compute.run_prompt(
                self._model(raw), text, limit=self.max_block_bytes, cancelled=ctx.cancelled
            )

        prompt: compute.PromptRun = await self._get(
            (None, None, "prompt", (text, raw)), run, head=None, label="prompt"
        )
        return prompt.view(layer, head)


# -- helpers ---------------------------------------------------------------------------


def _warm_up(model: Model) -> None:
    """Read (and process) the embedding and unembedding while the user reads the tree, after
    the model is open (``ready()`` does not wait for it: on a 7B GGUF file dequantising both
    is most of a second, and the first head view needs only a few embedding rows). Every
    token-basis view needs them later. A failure here is not reported: the view that needs
    the tensor reads it again and reports it. numpy only: opening the model imports no torch."""
    for name in ("embed.W_E", "unembed.W_U"):
        try:
            if model.weights.has(name):
                model.weights.get(name)
        except Exception:  # reported by the view that needs it
            continue


def origin_text(what: str, loaded: int, computed: int) -> str:
    """``"head scores: from the cache"``, ``"...: computed now"`` or a mix of both."""
    if computed == 0 and loaded > 0:
        return f"{what}: from the cache"
    if loaded == 0:
        return f"{what}: computed now"
    return f"{what}: {loaded} parts from the cache, {computed} computed now"


def _ids(ids: Sequence[int] | None) -> tuple[int, ...] | None:
    return None if ids is None else tuple(int(i) for i in ids)


def _partial_composition(model: Model, kind: str, deliver: Callable[[Composition], None],
                         loop: asyncio.AbstractEventLoop, interval: float
                         ) -> Callable[[int, int, np.ndarray], None]:
    """An ``on_tile`` for ``compute.composition`` that gathers the tiles as they finish and
    hands ``deliver`` a partial ``Composition`` on ``loop`` at most every ``interval`` seconds
    (built here, on the worker thread: the event loop only receives it)."""
    import time

    from headscope.engine.circuits.composition import composition_baseline
    from headscope.engine.core.results import rank_edges
    from headscope.engine.service.scheduler import deliver_soon

    cfg = model.cfg
    n_layers, n_heads = cfg.n_layers, cfg.n_heads
    values = np.zeros((n_layers, n_heads, n_layers, n_heads), np.float32)
    for target in range(n_layers):  # pairs not computed yet: NaN (left out of the edges)
        values[:target, :, target, :] = np.nan
    baseline = composition_baseline(cfg.d_model, cfg.d_head, SEED)
    last = [float("-inf")]
    remaining = [n_layers * (n_layers - 1) // 2]

    def on_tile(source: int, target: int, scores: np.ndarray) -> None:
        values[source, :, target, :] = scores
        remaining[0] -= 1
        now = time.monotonic()
        if remaining[0] <= 0 or now - last[0] < interval:  # the last one: the final result
            return
        last[0] = now
        snapshot = readonly(values, np.float32)
        comp = Composition(kind, snapshot, baseline, rank_edges(snapshot, baseline, TOP_EDGES))  # type: ignore[arg-type]
        deliver_soon(loop, deliver, comp)

    return on_tile


# -- patching's inputs ------------------------------------------------------------------------


def _prompt_key(prompt: str | Sequence[int] | None) -> str | tuple[int, ...] | None:
    return prompt if prompt is None or isinstance(prompt, str) else tuple(int(i) for i in prompt)


def patch_request(model: Model, clean: str | Sequence[int] | None,
                  corrupt: str | Sequence[int] | None, answer: str | int | None,
                  wrong: str | int | None, **options: Any) -> validation.PatchRequest:
    """The explorer's inputs (text or ids, tokens as ids or strings) resolved against the
    model's tokenizer and validated by ``validation.patch_request`` (the CLI's checks)."""
    return validation.patch_request(
        model.structure(), clean=compute.prompt_ids(model, clean, "clean"),
        corrupt=compute.prompt_ids(model, corrupt, "corrupt"),
        answer=None if answer is None else compute.answer_token(model, answer, "answer"),
        wrong=None if wrong is None else compute.answer_token(model, wrong, "wrong"),
        where=str(model.path), **options)
