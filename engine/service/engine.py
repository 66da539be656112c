"""``Engine``: the async facade the explorer talks to (docs/internals.md, "Engine").

One ``Engine`` per open model. ``structure`` is there at once (header and config only, no
torch); the model itself is opened on a background thread. ``get(request)`` takes any
request of ``core.requests`` (validated where it was built: ``SomeRequest.of(structure, ...)``,
the same checks the CLI and the Python API run), computes it on a small thread pool with
``sweeps.dispatch.compute`` (what the CLI and the API call directly) and keeps the result, a
frozen dataclass of read-only numpy arrays (``core.results``), in an LRU cache bounded by
bytes under ``(request.key(), raw)``: this module owns the caching, the scheduling and the
prefetch, not the maths. ``compare`` is the one other computation: it needs two open models.

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
import os
import threading
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from headscope.engine.core import validation
from headscope.engine.core.cache import ByteLRU
from headscope.engine.core.errors import HeadscopeError, InvalidRequestError, NonFiniteError
from headscope.engine.core.progress import Progress
from headscope.engine.core.requests import (
    BehaviourRequest,
    CompositionRequest,
    HeadScoresRequest,
    Request,
    SpectrumRequest,
)
from headscope.engine.core.results import (
    CacheStats,
    Composition,
    HeadScores,
    readonly,
)
from headscope.engine.core.validation import (
    EDGE_THRESHOLD,
    MAX_RESULT_BYTES,
    SEED,
    TOP_EDGES,
)
from headscope.engine.forward.runtime import inference_mode, set_threads
from headscope.engine.service.scheduler import JobContext, Scheduler
from headscope.engine.sweeps.dispatch import compute

if TYPE_CHECKING:
    from headscope.engine.model.loading import LoadedModel
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
        model: LoadedModel | None = None,
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
        self._models: dict[bool, LoadedModel] = {}
        self._models_lock = threading.Lock()
        self._views: list[Request] = []  # recent views, for prefetch
        self.store = store
        self._entries: dict[bool, ModelStore] = {}
        self._origin = ""  # where the last sweep's numbers came from (stats().origin)
        self._opened: concurrent.futures.Future[LoadedModel] = concurrent.futures.Future()
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
            from headscope.engine.model.loading import load_model

            model = load_model(self.path, raw=self._raw)
            model.lazy_tokenizer.get()  # the explorer shows tokens: read it (and its warning) now
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

    def _model(self, raw: bool) -> LoadedModel:
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
        # The workers are joined on a daemon thread of our own, not asyncio's default executor:
        # asyncio.run waits for that executor's threads at exit, so a caller that stopped
        # waiting (the explorer's quit waits 0.25 s) still waited out a running job's join,
        # up to 5 s per worker (issue 39 §3: `q` took 3.3 s).
        loop = asyncio.get_running_loop()
        joined: asyncio.Future[None] = loop.create_future()

        def join() -> None:
            self._scheduler.join(5.0)
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
                loop.call_soon_threadsafe(lambda: joined.done() or joined.set_result(None))

        threading.Thread(target=join, name="headscope-close", daemon=True).start()
        await joined
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
        raw = self._raw
        for view in list(self._views):
            for nl, nh in neighbours:
                if 0 <= nl < self.n_layers and 0 <= nh < self.n_heads:
                    request = view.at(nl, nh)
                    key = (request.key(), raw)
                    if key not in self.cache:
                        self._scheduler.prefetch(key, self._job(request, raw), head=(nl, nh),
                                                 label=f"prefetch {request.name}")

    def _remember_view(self, request: Request) -> None:
        if request in self._views:
            self._views.remove(request)
        self._views.insert(0, request)
        del self._views[MAX_PREFETCH_VIEWS:]

    def _remember_loop(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()

    # -- the request path -----------------------------------------------------------

    async def get(self, request: Request, progress: Progress = None, *,
                  partial: Callable[[Composition], None] | None = None) -> Any:
        """The result of ``request`` (``core.requests``, built with ``SomeRequest.of``): from
        the cache, or joining the identical request in flight, or a new job on the worker pool
        (``sweeps.dispatch.compute``), the focused head's first; a request for a head the user
        has left is dropped (its awaiter gets ``CancelledError``). Stored requests read and
        write the results store. ``progress(fraction)`` for sweeps; ``partial(comp)``: a
        composition's scores so far, on the event loop (``_partial_composition``)."""
        self._remember_loop()
        raw = self._raw
        key = (request.key(), raw)
        if request.prefetched:
            self._remember_view(request)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        if isinstance(request, HeadScoresRequest):  # assembled from two cached views and a sweep
            return await self._head_scores(request, key)
        return await self._scheduler.run(key, self._job(request, raw, partial), head=request.head,
                                         label=request.label(), progress=progress)

    def _job(self, request: Request, raw: bool,
             partial: Callable[[Composition], None] | None = None) -> Callable[[JobContext], Any]:
        loop = self._loop

        def run(ctx: JobContext) -> Any:
            model = self._model(raw)
            ctx.check()
            options: dict[str, Any] = {}
            if partial is not None and loop is not None and isinstance(request, CompositionRequest):
                options["on_tile"] = _partial_composition(model, request.kind, partial, loop,
                                                          self.partial_interval)
            def run_with(entry: ModelStore | None) -> Any:
                return compute(model, request, progress=ctx.progress, cancelled=ctx.cancelled,
                               store=entry, **options)

            # only stored requests open the model's entry (it fingerprints the checkpoint)
            result = self._stored(raw, request.origin(), run_with) if request.stored else run_with(None)
            for other, value in request.published(result):
                ctx.publish((other.key(), raw), value)
            ctx.progress(1.0)
            return result

        return run

    async def _head_scores(self, request: HeadScoresRequest, key: Hashable) -> HeadScores:
        """One head's scores from the model-wide behaviour tables and its two spectra (each
        cached on its own: the spectrum view is free afterwards)."""
        tables = await self.get(BehaviourRequest(request.seed))
        scores, nonfinite = [float("nan"), float("nan")], False
        try:
            for i, kind in enumerate(("ov", "qk")):
                spectrum = SpectrumRequest(request.layer, request.head_index, kind)
                scores[i] = (await self.get(spectrum)).score
        except NonFiniteError:
            nonfinite = True
        model = self._opened.result()
        result = compute(model, request, behaviour_tables=tables, spectra=(*scores, nonfinite))
        self.cache.put(key, result)
        return result

    async def compare(
        self, other: Engine, *, match_heads: bool = False, threshold: float = EDGE_THRESHOLD
    ) -> ModelDiff:
        """Diff this model (A) against ``other`` (B) with ``sweeps.diff.diff_models``, on a worker.

        Each model is taken with its own current raw/processed setting (not a ``Request``:
        it needs two open models).
        """
        await self.ready()
        await other.ready()
        self._remember_loop()
        raw, other_raw = self._raw, other.raw

        def run(ctx: JobContext) -> ModelDiff:
            from headscope.engine.sweeps.diff import diff_models

            return diff_models(self._model(raw), other._model(other_raw), match_heads=match_heads,
                               threshold=threshold, seed=SEED)

        key = ("compare", str(other.path), id(other), raw, other_raw, match_heads, threshold)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        return await self._scheduler.run(key, run, head=None, label="compare")


# -- helpers ---------------------------------------------------------------------------


def _warm_up(model: LoadedModel) -> None:
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


def _partial_composition(model: LoadedModel, kind: str, deliver: Callable[[Composition], None],
                         loop: asyncio.AbstractEventLoop, interval: float
                         ) -> Callable[[int, int, np.ndarray], None]:
    """An ``on_tile`` for ``scores.composition`` that gathers the tiles as they finish and
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
