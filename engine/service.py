"""``Engine``: the async facade the TUI and the CLI talk to (DESIGN.md §5, docs/internals.md).

One ``Engine`` per open model. ``structure`` is there at once (header and config only, no
torch); the model itself is opened on a background thread. Every other method is ``async``
and returns a frozen dataclass of read-only numpy arrays (``engine.results``), computed on a
small thread pool by the pure functions of ``engine.circuits`` / ``engine.scores`` /
``engine.forward`` and kept in a per-head LRU cache bounded by bytes.

Scheduling (``engine.scheduler``): identical requests in flight share one computation; the
focused head's requests run first; requests for heads the user has left are dropped before
they start (or stop at their next check) and their awaiters get ``CancelledError``; when
idle, the views the user last looked at are prefetched for the neighbouring heads. Sweeps
report progress and fill the per-head cache.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .cache import ByteLRU
from .diff import EDGE_THRESHOLD
from .errors import (
    HeadscopeError,
    IndexOutOfRangeError,
    InvalidRequestError,
    NonFiniteError,
    PromptError,
    ResourceLimitError,
)
from .results import (
    CacheStats,
    CircuitBlock,
    Composition,
    HeadScores,
    Profile,
    PromptView,
    ScoreTable,
    Spectrum,
    TopTokens,
    readonly,
)
from .scheduler import JobContext, Scheduler

if TYPE_CHECKING:
    from .diff import ModelDiff
    from .loading import Model

__all__ = ["DEFAULT_BLOCK", "Engine", "default_workers"]

DEFAULT_BLOCK = 24  # rows/cols of a circuit block when the caller names none (as engine.report)
SEED = 0  # seed of the behavioural / composition-baseline sequences (reproducible scores)
TOP_EDGES = 50
MAX_PREFETCH_VIEWS = 3

Progress = Callable[[float], None] | None


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
        max_block_bytes: int = 256 << 20,
        prefetch: bool = True,
        model: Model | None = None,
    ) -> None:
        """Open ``path`` (or wrap an already open ``model``: notebooks, tests, benchmarks).

        ``max_block_bytes`` bounds any one materialised result (a circuit block, a prompt's
        patterns): bigger requests raise ``ResourceLimitError`` (issue 6).
        """
        if path is None and model is None:
            raise InvalidRequestError(None, "Engine needs a checkpoint path or an open model")
        self.path = Path(path) if path is not None else Path(model.path)  # type: ignore[union-attr]
        self._where = str(self.path)
        self._raw = bool(raw)
        self.max_block_bytes = int(max_block_bytes)
        self._prefetch_enabled = prefetch
        cpus = os.cpu_count() or 1
        if workers is None:
            workers, torch_threads = default_workers(cpus)
        else:
            workers, torch_threads = max(1, workers), max(1, cpus // max(1, workers))
        self._torch_threads = torch_threads
        self._previous_torch_threads: int | None = None
        self.cache = ByteLRU(cache_bytes)
        self._scheduler = Scheduler(
            workers, on_result=self.cache.put, job_context=_inference_mode
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._models: dict[bool, Model] = {}
        self._models_lock = threading.Lock()
        self._views: list[tuple[str, tuple[Any, ...]]] = []  # recent views, for prefetch
        self._opened: concurrent.futures.Future[Model] = concurrent.futures.Future()
        if model is not None:
            self.structure: dict[str, Any] = model.structure()
            self._set_torch_threads()
            self._models[model.raw] = model
            self._opened.set_result(model)
        else:
            from .loading import read_structure  # header + config only: no torch here

            self.structure = read_structure(self.path)
            threading.Thread(target=self._open, name="headscope-open", daemon=True).start()
        self.n_layers = int(self.structure["n_layers"])
        self.n_heads = int(self.structure["n_heads"])

    # -- lifecycle ------------------------------------------------------------------

    def _open(self) -> None:
        try:
            self._set_torch_threads()
            from .loading import open_model

            model = open_model(self.path, raw=self._raw)
            _warm_up(model)
            with self._models_lock:
                self._models[model.raw] = model
            self._opened.set_result(model)
        except HeadscopeError as exc:
            self._opened.set_exception(exc)
        except Exception as exc:
            from .errors import ComputeError, out_of_memory

            self._opened.set_exception(out_of_memory(exc, self._where, "opening the model")
                                       or ComputeError(self._where, f"cannot open: {exc}"))

    def _set_torch_threads(self) -> None:
        import torch

        self._previous_torch_threads = torch.get_num_threads()
        torch.set_num_threads(self._torch_threads)

    async def ready(self) -> None:
        """Wait until the model is open (torch imported, config and tensors checked)."""
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

    async def aclose(self) -> None:
        self._scheduler.close()
        await asyncio.to_thread(self._scheduler.join, 5.0)
        if self._previous_torch_threads is not None:
            import torch

            torch.set_num_threads(self._previous_torch_threads)

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
        )

    @property
    def computations_started(self) -> int:
        """How many jobs began running (not cache hits, not joined requests)."""
        return self._scheduler.started

    # -- focus and prefetch -----------------------------------------------------------

    def focus(self, layer: int, head: int) -> None:
        """The user looks at (layer, head): its requests go first, stale ones are dropped."""
        self._check_head(layer, head)
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

    def _check_head(self, layer: int, head: int) -> None:
        if not (0 <= int(layer) < self.n_layers and 0 <= int(head) < self.n_heads):
            raise IndexOutOfRangeError(
                self._where,
                f"head L{layer}H{head} out of range: {self.n_layers} layers × {self.n_heads} heads",
            )

    def _check_bytes(self, n_bytes: int, what: str) -> None:
        if n_bytes > self.max_block_bytes:
            raise ResourceLimitError(
                self._where,
                f"{what} would materialise {n_bytes / 2**20:.1f} MiB, over the limit of "
                f"{self.max_block_bytes / 2**20:.1f} MiB; ask for a smaller block",
            )

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
        self._check_head(layer, head)
        if kind not in ("qk", "ov") or basis not in ("token", "position"):
            raise InvalidRequestError(self._where, f"unknown circuit {kind!r} in basis {basis!r}")
        if basis == "position" and kind != "qk":
            raise InvalidRequestError(self._where, "the position basis exists for the QK circuit only")
        s = self.structure
        if basis == "position" and s["positional"] != "learned":
            raise InvalidRequestError(
                self._where,
                f"{s['positional']} positions have no positional QK matrix; use the token basis "
                "with an offset (rotary) or rotary_profile",
            )
        n = int(s["n_ctx"] if basis == "position" else s["d_vocab"])
        rows = rows if rows is not None else tuple(range(min(n, DEFAULT_BLOCK)))
        cols = cols if cols is not None else tuple(range(min(n, DEFAULT_BLOCK)))
        for i in (*rows, *cols):
            if not 0 <= i < n:
                raise IndexOutOfRangeError(self._where, f"{basis} {i} out of range 0..{n - 1}")
        self._check_bytes(4 * len(rows) * len(cols), f"a {len(rows)}×{len(cols)} block")
        if s["positional"] != "rotary":
            offset = 0
        raw = self._raw
        key = (layer, head, "circuit_block", (kind, basis, rows, cols, offset, raw))

        def compute(ctx: JobContext) -> CircuitBlock:
            from .circuits import circuit_block

            model = self._model(raw)
            ctx.check()
            values = circuit_block(model.weights, layer, head, kind, basis, rows, cols, offset)
            return _block_result(model, layer, head, kind, basis, rows, cols, offset, values)

        return key, compute

    async def top_outputs(self, layer: int, head: int, source_token: int, k: int = 10) -> TopTokens:
        """The output tokens the full OV circuit raises most when the head attends to ``source_token``."""
        args = (int(source_token), int(k))
        key, fn = self._plan_top_outputs(layer, head, *args)
        return await self._get(key, fn, head=(layer, head), label=f"L{layer}H{head} top outputs")

    def _plan_top_outputs(
        self, layer: int, head: int, source: int, k: int
    ) -> tuple[Hashable, Callable[[JobContext], TopTokens]]:
        self._check_head(layer, head)
        d_vocab = int(self.structure["d_vocab"])
        if not 0 <= source < d_vocab:
            raise IndexOutOfRangeError(self._where, f"token {source} out of range 0..{d_vocab - 1}")
        k = max(1, min(k, d_vocab))
        raw = self._raw
        key = (layer, head, "top_outputs", (source, k, raw))

        def compute(ctx: JobContext) -> TopTokens:
            import torch

            model = self._model(raw)
            row = _full_ov_rows(model, layer, head, [source])[0]  # [d_vocab]
            values, ids = torch.topk(row, k)
            tok = model.tokenizer
            return TopTokens(
                layer=layer,
                head=head,
                source_token=source,
                source_label=_label(tok, source),
                ids=tuple(int(i) for i in ids),
                labels=tuple(_label(tok, int(i)) for i in ids),
                values=readonly(values, np.float32),
                note=_unembed_note(model),
            )

        return key, compute

    # -- spectra, profiles, scores ----------------------------------------------------

    async def spectrum(self, layer: int, head: int, kind: Literal["ov", "qk"]) -> Spectrum:
        """Eigenvalues of the full OV (``"ov"``) or token QK (``"qk"``) circuit, and its score."""
        key, fn = self._plan_spectrum(layer, head, kind)
        self._remember_view("spectrum", (kind,))
        return await self._get(key, fn, head=(layer, head), label=f"L{layer}H{head} spectrum")

    def _plan_spectrum(
        self, layer: int, head: int, kind: str
    ) -> tuple[Hashable, Callable[[JobContext], Spectrum]]:
        self._check_head(layer, head)
        if kind not in ("ov", "qk"):
            raise InvalidRequestError(self._where, f"spectrum kind must be 'ov' or 'qk', not {kind!r}")
        raw = self._raw
        key = (layer, head, "spectrum", (kind, raw))

        def compute(ctx: JobContext) -> Spectrum:
            import torch

            from . import circuits, scores

            model = self._model(raw)
            w = model.weights
            if kind == "ov":
                fm = circuits.full_ov(w, layer, head)
                score = scores.copying_score(fm)
            else:
                fm = circuits.token_qk(w, layer, head)
                score = scores.qk_positivity(fm)
            ctx.check()
            try:
                eig = fm.eigenvalues
            except NonFiniteError:
                # NaN/inf weights (flagged in HeadScores.nonfinite): an empty spectrum with a
                # NaN score, like every other score of the head, rather than an error.
                eig = torch.zeros(0, dtype=torch.complex64)
            order = eig.abs().argsort(descending=True)
            return Spectrum(
                eigenvalues=readonly(eig[order], np.complex64),
                score=float(score),
                kind=kind,  # type: ignore[arg-type]
                layer=layer,
                head=head,
            )

        return key, compute

    async def rotary_profile(self, layer: int, head: int, offsets: Sequence[int]) -> Profile:
        """Rotary models: the head's QK score as a function of the query-key offset Δ."""
        if self.structure["positional"] != "rotary":
            raise InvalidRequestError(self._where, "rotary_profile needs a rotary model")
        key, fn = self._plan_rotary_profile(layer, head, tuple(int(o) for o in offsets))
        return await self._get(key, fn, head=(layer, head), label=f"L{layer}H{head} profile")

    def _plan_rotary_profile(
        self, layer: int, head: int, offsets: tuple[int, ...]
    ) -> tuple[Hashable, Callable[[JobContext], Profile]]:
        self._check_head(layer, head)
        raw = self._raw
        key = (layer, head, "rotary_profile", (offsets, raw))

        def compute(ctx: JobContext) -> Profile:
            from . import circuits

            model = self._model(raw)
            values = circuits.rotary_profile(model.weights, layer, head, list(offsets))
            return Profile(layer, head, offsets, readonly(values, np.float32))

        return key, compute

    async def head_scores(self, layer: int, head: int) -> HeadScores:
        """Every score of one head (its spectra are cached too: the spectrum view is free)."""
        self._check_head(layer, head)
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
            copying=copying,
            qk_positivity=positivity,
            prev_token=float(behaviour["prev_token"][layer, head]),
            duplicate_token=float(behaviour["duplicate_token"][layer, head]),
            induction=float(behaviour["induction"][layer, head]),
            nonfinite=nonfinite or bool(behaviour["nonfinite"][layer, head]),
        )
        self.cache.put(key, result)
        return result

    async def _behaviour(self, raw: bool) -> dict[str, np.ndarray]:
        """Behavioural scores of every head: one batched forward pass, model-wide."""

        def compute(ctx: JobContext) -> dict[str, np.ndarray]:
            from . import scores

            model = self._model(raw)
            found = scores.behaviour_scores(model.weights, seed=SEED, cancelled=ctx.cancelled)
            out = {name: readonly(found[name], np.float32) for name in _BEHAVIOURS}
            out["nonfinite"] = readonly(_nonfinite_heads(model, out), bool)
            return out

        return await self._get(
            (None, None, "behaviour", (SEED, raw)), compute, head=None, label="behaviour scores"
        )

    async def all_head_scores(self, progress: Progress = None) -> ScoreTable:
        """Every score of every head (a sweep): fills the per-head ``head_scores`` cache."""
        raw = self._raw

        def compute(ctx: JobContext) -> ScoreTable:
            from . import scores

            model = self._model(raw)
            w = model.weights
            ctx.progress(0.0)
            copying = scores.all_copying_scores(
                w, progress=_part(ctx, 0.0, 0.4), cancelled=ctx.cancelled
            )
            positivity = scores.all_qk_positivity(
                w, progress=_part(ctx, 0.4, 0.8), cancelled=ctx.cancelled
            )
            behaviour = scores.behaviour_scores(
                w, seed=SEED, progress=_part(ctx, 0.8, 0.95), cancelled=ctx.cancelled
            )
            ctx.check()
            nonfinite = _nonfinite_heads(model, behaviour)
            table = ScoreTable(
                copying=readonly(copying, np.float32),
                qk_positivity=readonly(positivity, np.float32),
                prev_token=readonly(behaviour["prev_token"], np.float32),
                duplicate_token=readonly(behaviour["duplicate_token"], np.float32),
                induction=readonly(behaviour["induction"], np.float32),
                nonfinite=readonly(nonfinite, bool),
            )
            for layer in range(table.n_layers):
                for head in range(table.n_heads):
                    ctx.publish((layer, head, "head_scores", (raw,)), table.head(layer, head))
            ctx.progress(1.0)
            return table

        return await self._get(
            (None, None, "all_head_scores", (SEED, raw)),
            compute,
            head=None,
            label="all head scores",
            progress=progress,
        )

    async def composition(self, kind: Literal["q", "k", "v"], progress: Progress = None) -> Composition:
        """Q/K/V composition scores between all pairs of heads (a cancellable sweep)."""
        if kind not in ("q", "k", "v"):
            raise InvalidRequestError(self._where, f"composition kind must be q, k or v, not {kind!r}")
        raw = self._raw

        def compute(ctx: JobContext) -> Composition:
            from . import scores

            model = self._model(raw)
            found = scores.composition_scores(
                model.weights, kind, seed=SEED, progress=ctx.progress, cancelled=ctx.cancelled
            )
            values = readonly(found.scores, np.float32)
            baseline = float(found.baseline)
            return Composition(kind, values, baseline, _top_edges(values, baseline))

        return await self._get(
            (None, None, "composition", (kind, SEED, raw)),
            compute,
            head=None,
            label=f"composition {kind}",
            progress=progress,
        )

    async def ablation(self, layer: int, head: int) -> float:
        """Loss increase on the seeded repeated sequence when the head's output is zeroed."""
        self._check_head(layer, head)
        raw = self._raw

        def compute(ctx: JobContext) -> float:
            from . import scores

            return float(scores.ablation_effect(self._model(raw).weights, layer, head, seed=SEED))

        return await self._get(
            (layer, head, "ablation", (SEED, raw)), compute, head=(layer, head), label="ablation"
        )

    async def all_ablation_effects(self, progress: Progress = None) -> np.ndarray:
        """``[n_layers, n_heads]`` zero-ablation effects of every head (a cancellable sweep).

        The values ``ablation(layer, head)`` gives, computed together by
        ``scores.ablation_effects`` (which skips what an ablation cannot change), and
        published per head so that ``ablation`` is a cache hit afterwards. Opt-in: a forward
        pass per head is the most expensive sweep on a big model.
        """
        raw = self._raw

        def compute(ctx: JobContext) -> np.ndarray:
            from . import scores

            effects = scores.ablation_effects(
                self._model(raw).weights, seed=SEED, progress=ctx.progress, cancelled=ctx.cancelled
            )
            table = readonly(effects, np.float32)
            for layer in range(table.shape[0]):
                for head in range(table.shape[1]):
                    ctx.publish((layer, head, "ablation", (SEED, raw)), float(effects[layer, head]))
            return table

        return await self._get(
            (None, None, "all_ablation_effects", (SEED, raw)),
            compute,
            head=None,
            label="ablation sweep",
            progress=progress,
        )

    async def compare(
        self, other: Engine, *, match_heads: bool = False, threshold: float = EDGE_THRESHOLD
    ) -> ModelDiff:
        """Diff this model (A) against ``other`` (B) with ``engine.diff.diff_models``, on a worker.

        Each model is taken with its own current raw/processed setting.
        """
        await self.ready()
        await other.ready()
        raw, other_raw = self._raw, other.raw

        def compute(ctx: JobContext) -> ModelDiff:
            from .diff import diff_models

            return diff_models(
                self._model(raw),
                other._model(other_raw),
                match_heads=match_heads,
                threshold=threshold,
                seed=SEED,
            )

        key = (None, None, "compare", (str(other.path), id(other), raw, other_raw, match_heads, threshold))
        return await self._get(key, compute, head=None, label="compare")

    def cancel_sweeps(self) -> None:
        """Stop every running or queued model-wide sweep (their awaiters get CancelledError)."""
        for name in ("all_head_scores", "composition", "behaviour", "all_ablation_effects"):
            for key in self._scheduler_keys():
                if isinstance(key, tuple) and len(key) == 4 and key[2] == name:
                    self._scheduler.cancel(key, f"{name}: cancelled")

    def _scheduler_keys(self) -> list[Hashable]:
        with self._scheduler._cv:
            return list(self._scheduler._inflight)

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
        self._check_head(layer, head)
        if not text or not text.strip():
            raise PromptError(self._where, "empty prompt: type some text first")
        raw = self._raw

        def compute(ctx: JobContext) -> _PromptRun:
            return _run_prompt(self._model(raw), text, self._check_bytes, ctx)

        run: _PromptRun = await self._get(
            (None, None, "prompt", (text, raw)), compute, head=None, label="prompt"
        )
        return run.view(layer, head)


# -- computations (worker threads) -------------------------------------------------------

_BEHAVIOURS = ("prev_token", "duplicate_token", "induction")


def _inference_mode() -> contextlib.AbstractContextManager[Any]:
    import torch

    return torch.inference_mode()


def _warm_up(model: Model) -> None:
    """Read (and process) the embedding and unembedding while the user reads the tree:
    every token-basis view needs them, and the first view should not pay for them."""
    import torch

    with torch.inference_mode():
        for name in ("embed.W_E", "unembed.W_U"):
            if model.weights.has(name):
                model.weights.get(name)


def _part(ctx: JobContext, start: float, stop: float) -> Callable[[float], None]:
    """Progress of one step of a sweep, mapped into [start, stop] of the whole."""
    return lambda fraction: ctx.progress(start + (stop - start) * fraction)


def _ids(ids: Sequence[int] | None) -> tuple[int, ...] | None:
    return None if ids is None else tuple(int(i) for i in ids)


def _label(tokenizer: Any, token: int) -> str:
    decode = getattr(tokenizer, "decode_token", None)
    if decode is None:
        return str(token)
    try:
        return str(decode(token))
    except Exception:
        return str(token)


def _unembed_note(model: Model) -> str:
    return "W_U is tied W_Eᵀ" if model.cfg.tied_unembed else ""


def _full_ov_rows(model: Model, layer: int, head: int, rows: Sequence[int]) -> Any:
    """Whole rows of the full OV circuit ``W_E OV W_U``: ``[len(rows), d_vocab]``."""
    from . import circuits

    return circuits.full_ov_block(model.weights, layer, head, rows, range(model.cfg.d_vocab))


def _block_result(
    model: Model,
    layer: int,
    head: int,
    kind: str,
    basis: str,
    rows: tuple[int, ...],
    cols: tuple[int, ...],
    offset: int,
    values: Any,
) -> CircuitBlock:
    array = readonly(values, np.float32)
    finite = array[np.isfinite(array)]
    tok = model.tokenizer
    if basis == "position":
        row_labels, col_labels = tuple(map(str, rows)), tuple(map(str, cols))
    else:
        row_labels = tuple(_label(tok, t) for t in rows)
        col_labels = tuple(_label(tok, t) for t in cols)
    notes = []
    if kind == "ov" and model.cfg.tied_unembed:
        notes.append(_unembed_note(model))
    if finite.size < array.size:
        notes.append("NaN/inf in this head's weights")
    return CircuitBlock(
        values=array,
        row_labels=row_labels,
        col_labels=col_labels,
        row_ids=rows,
        col_ids=cols,
        kind=kind,  # type: ignore[arg-type]
        basis=basis,  # type: ignore[arg-type]
        layer=layer,
        head=head,
        vmin=float(finite.min()) if finite.size else float("nan"),
        vmax=float(finite.max()) if finite.size else float("nan"),
        note="; ".join(notes),
        offset=offset,
    )


def _nonfinite_heads(model: Model, behaviour: dict[str, Any]) -> np.ndarray:
    """[L, H] bool: heads with a NaN/inf in their attention weights, or whose behaviour
    scores are not finite (finite weights whose attention overflows)."""
    from . import scores

    flags = np.zeros((model.cfg.n_layers, model.cfg.n_heads), bool)
    for layer, head in scores.nonfinite_heads(model.weights):
        flags[layer, head] = True
    for name in _BEHAVIOURS:
        flags |= ~np.isfinite(np.asarray(behaviour[name], dtype=np.float64))
    return flags


def _top_edges(scores: np.ndarray, baseline: float) -> tuple[tuple[int, int, int, int, float], ...]:
    n_layers = scores.shape[0]
    # only pairs with source layer < target layer are meaningful
    valid = np.zeros(scores.shape, bool)
    for l1 in range(n_layers):
        valid[l1, :, l1 + 1 :, :] = True
    excess = np.where(valid & np.isfinite(scores), scores - baseline, -np.inf)
    flat = np.argsort(excess, axis=None)[::-1][:TOP_EDGES]
    edges = []
    for index in flat:
        if not np.isfinite(excess.flat[index]):
            break
        l1, h1, l2, h2 = (int(i) for i in np.unravel_index(index, scores.shape))
        edges.append((l1, h1, l2, h2, float(excess.flat[index])))
    return tuple(edges)


class _PromptRun:
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


def _encode(tokenizer: Any, text: str) -> list[int]:
    ids = tokenizer.encode(text)
    ids = getattr(ids, "ids", ids)
    return [int(i) for i in ids]


def _run_prompt(
    model: Model, text: str, check_bytes: Callable[[int, str], None], ctx: JobContext, top_k: int = 10
) -> _PromptRun:
    import torch

    from . import forward

    cfg, w = model.cfg, model.weights
    ids = _encode(model.tokenizer, text)
    if not ids:
        raise PromptError(str(model.path), "the prompt encodes to no tokens")
    truncated = len(ids) > cfg.n_ctx
    ids = ids[: cfg.n_ctx]
    n = len(ids)
    # patterns [L,H,n,n] + head outputs [L,H,n,d_model], in float32
    check_bytes(4 * cfg.n_layers * cfg.n_heads * n * (n + cfg.d_model), f"a {n}-token prompt")
    ctx.check()
    result = forward.run(w, ids, return_head_outputs=True)
    logits = result.logits[0]  # [pos, vocab]
    predicted = logits.argmax(dim=-1)  # [pos]
    dla = _direct_logit_attribution(model, result, predicted)
    probs = torch.softmax(logits[-1], dim=-1)
    p_top, i_top = torch.topk(probs, min(top_k, probs.shape[0]))
    tok = model.tokenizer
    top = tuple((int(i), _label(tok, int(i)), float(p)) for p, i in zip(p_top, i_top, strict=True))
    return _PromptRun(
        tokens=tuple(_label(tok, i) for i in ids),
        ids=tuple(ids),
        patterns=readonly(result.patterns[0], np.float32),
        dla=readonly(dla, np.float32),
        predicted=tuple(int(i) for i in predicted),
        top=top,
        truncated=truncated,
    )


def _direct_logit_attribution(model: Model, result: Any, predicted: Any) -> Any:
    """[L, H, pos]: each head's output at each position, through the final norm's scale,
    dotted with ``W_U[:, predicted[pos]]`` — its direct share of that position's top logit.

    LayerNorm subtracts the mean, so the head output is centred first (a no-op on processed
    weights, whose writing weights are centred); on raw weights the final norm's gain, not
    yet folded into ``W_U``, multiplies it. Post-LN models (BERT) have no such linear
    decomposition: NaN.
    """
    import torch

    cfg, w = model.cfg, model.weights
    out = result.head_outputs[0]  # [L, H, pos, d_model]
    if result.final_scale is None:
        return torch.full(out.shape[:3], float("nan"))
    if cfg.normalization in ("LN", "LNPre"):
        out = out - out.mean(dim=-1, keepdim=True)
    out = out / result.final_scale[0]  # [pos, 1] broadcasts over L, H
    if cfg.normalization in ("LN", "RMS") and w.has("ln_final.w"):
        out = out * w.get("ln_final.w")
    w_u = w.get("unembed.W_U")[:, predicted]  # [d_model, pos]
    return torch.einsum("lhpd,dp->lhp", out, w_u)
