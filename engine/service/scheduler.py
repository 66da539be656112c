"""Prioritised, coalescing, cancellable work on a bounded pool of threads.

The engine's computations are torch calls that release the GIL, so a few plain threads are
enough; what matters for an interactive explorer is *which* job runs next:

- **Coalescing**: a request whose key is already queued or running shares that job's
  future: one computation, every awaiter gets the same object.
- **Priority**: the focused head's requests first, then other requests (sweeps included) in
  arrival order, then idle prefetch (at most one prefetch runs at a time).
- **Staleness**: a job bound to a head becomes stale when the user focuses another head
  after it was submitted. Stale queued jobs are dropped before they start; a running job
  sees ``ctx.cancelled()`` turn true and stops at its next check. Their awaiters get
  ``core.errors.CancelledError``. A job whose awaiters all went away is dropped too.
- **Delivery**: results and errors go back to the awaiting event loop with
  ``loop.call_soon_threadsafe``; a job never leaves a future unresolved. Unknown exceptions
  are wrapped in ``ComputeError`` so every caller sees a typed error.

Nothing here knows about torch: the engine passes ``job_context`` (e.g.
``torch.inference_mode``) which is entered inside the worker thread around every job.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from headscope.engine.core.errors import CancelledError, ComputeError, HeadscopeError, out_of_memory
from headscope.engine.core.memory import release_free_heap
from headscope.engine.core.progress import Progress

FOCUSED, USER, PREFETCH = 0, 1, 2  # priority classes, lower runs first

Head = tuple[int, int]


@dataclass(eq=False)
class Job:
    key: Hashable
    fn: Callable[[JobContext], Any]
    head: Head | None  # None: model-wide (sweeps), never stale
    priority: int  # USER or PREFETCH as submitted
    seq: int
    epoch: int  # focus epoch when submitted (or last upgraded)
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    label: str
    progress: Progress = None
    waiters: int = 0
    state: str = "queued"  # queued | running | done
    cancel_reason: str | None = None
    extra: list[tuple[Hashable, Any]] = field(default_factory=list)


class JobContext:
    """What a running job sees: cancellation checks, progress, extra results to cache."""

    def __init__(self, scheduler: Scheduler, job: Job) -> None:
        self._scheduler = scheduler
        self._job = job

    def cancelled(self) -> bool:
        return self._scheduler._cancel_reason(self._job) is not None

    def check(self) -> None:
        reason = self._scheduler._cancel_reason(self._job)
        if reason is not None:
            raise CancelledError(reason)

    def progress(self, fraction: float) -> None:
        self._scheduler._report_progress(self._job, fraction)

    def publish(self, key: Hashable, value: Any) -> None:
        """Cache ``value`` under ``key`` too when this job completes (sweeps fill per-head entries)."""
        self._job.extra.append((key, value))


class Scheduler:
    def __init__(
        self,
        workers: int,
        *,
        on_result: Callable[[Hashable, Any], None] | None = None,
        job_context: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
        thread_init: Callable[[], None] | None = None,
        name: str = "headscope-engine",
    ) -> None:
        self.workers = max(1, int(workers))
        self._on_result = on_result or (lambda key, value: None)
        self._job_context = job_context or contextlib.nullcontext
        self._thread_init = thread_init
        self._name = name
        self._cv = threading.Condition()
        self._queue: list[Job] = []
        self._inflight: dict[Hashable, Job] = {}
        self._running: set[Job] = set()
        self._threads: list[threading.Thread] = []
        self._seq = itertools.count()
        self._focus: Head | None = None
        self._epoch = 0
        self._closed = False
        self.activity: str | None = None
        self.progress: float | None = None
        self._reporter: Job | None = None  # the job whose progress ``activity`` shows
        self.started = 0  # jobs that began running (tests count these)

    # -- public API -----------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        with self._cv:
            return len(self._inflight)

    @property
    def focused(self) -> Head | None:
        return self._focus

    def focus(self, head: Head | None) -> None:
        """Make ``head`` the focused head; drop queued work for heads the user left."""
        with self._cv:
            if head == self._focus:
                return
            self._focus = head
            self._epoch += 1
            dropped = [job for job in self._queue if self._stale(job)]
            for job in dropped:
                self._queue.remove(job)
                self._inflight.pop(job.key, None)
                job.state = "done"
            self._cv.notify_all()
        for job in dropped:
            self._deliver(job, None, CancelledError(f"{job.label}: dropped, focus moved on"))

    async def run(
        self,
        key: Hashable,
        fn: Callable[[JobContext], Any],
        *,
        head: Head | None = None,
        label: str = "job",
        progress: Progress = None,
    ) -> Any:
        """Run ``fn(ctx)`` on a worker (or join the identical job in flight) and await it."""
        job = self._submit(key, fn, head=head, priority=USER, label=label, progress=progress)
        job.waiters += 1
        caller_cancelled = False
        try:
            return await asyncio.shield(job.future)
        except asyncio.CancelledError:
            # The awaiting task was cancelled (e.g. the UI's exclusive worker replaced it).
            caller_cancelled = True
            raise
        finally:
            job.waiters -= 1
            if caller_cancelled and job.waiters == 0 and not job.future.done():
                self._abandon(job, f"{label}: cancelled by the caller")

    def prefetch(
        self, key: Hashable, fn: Callable[[JobContext], Any], *, head: Head | None, label: str
    ) -> None:
        """Queue ``fn`` at idle priority; its result only lands in the cache."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop to deliver to: prefetch is only a hint
        job = self._submit(key, fn, head=head, priority=PREFETCH, label=label, loop=loop)
        job.future.add_done_callback(_consume_exception)

    def cancel_all(self, reason: str = "cancelled") -> None:
        """Drop every queued job and ask every running one to stop."""
        with self._cv:
            dropped = list(self._queue)
            self._queue.clear()
            for job in dropped:
                self._inflight.pop(job.key, None)
                job.state = "done"
            for job in self._running:
                job.cancel_reason = reason
        for job in dropped:
            self._deliver(job, None, CancelledError(reason))

    def cancel(self, key: Hashable, reason: str = "cancelled") -> bool:
        """Cancel the job in flight under ``key`` (queued: dropped; running: asked to stop)."""
        with self._cv:
            job = self._inflight.get(key)
        if job is None:
            return False
        self._abandon(job, reason)
        return True

    def close(self) -> None:
        self.cancel_all("engine closed")
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def join(self, timeout: float | None = None) -> None:
        for thread in self._threads:
            thread.join(timeout)

    # -- submission -----------------------------------------------------------------

    def _submit(
        self,
        key: Hashable,
        fn: Callable[[JobContext], Any],
        *,
        head: Head | None,
        priority: int,
        label: str,
        progress: Progress = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> Job:
        loop = loop or asyncio.get_running_loop()
        with self._cv:
            if self._closed:
                raise CancelledError("engine closed")
            job = self._inflight.get(key)
            if job is not None and job.loop is loop and job.cancel_reason is None:
                if priority < job.priority:  # a user now wants what was only prefetched
                    job.priority = priority
                    job.epoch = self._epoch
                if progress is not None and job.progress is None:
                    job.progress = progress
                self._cv.notify_all()
                return job
            job = Job(
                key=key,
                fn=fn,
                head=head,
                priority=priority,
                seq=next(self._seq),
                epoch=self._epoch,
                loop=loop,
                future=loop.create_future(),
                label=label,
                progress=progress,
            )
            self._inflight[key] = job
            self._queue.append(job)
            self._start_threads()
            self._cv.notify()
            return job

    def _abandon(self, job: Job, reason: str) -> None:
        # nobody awaits the job any more: its "cancelled" ending is retrieved here, or asyncio
        # logs "Future exception was never retrieved" when the future is collected, from
        # wherever the collection happens (once inside pytest's ast.parse, where the nested
        # parse of that log's traceback is CPython 3.11's "AST constructor recursion depth
        # mismatch", gh-106905)
        _call_soon(job.loop, job.future.add_done_callback, _consume_exception)  # any thread
        with self._cv:
            if job.state == "queued":
                self._queue.remove(job)
                job.state = "done"
                drop = True
            else:
                drop = False
            job.cancel_reason = job.cancel_reason or reason
            if self._inflight.get(job.key) is job:
                # A new request for the same key must start afresh, not join a dying job.
                del self._inflight[job.key]
        if drop:
            self._deliver(job, None, CancelledError(reason))

    # -- priorities and staleness (call with the lock held, or racily for a check) --------

    def _stale(self, job: Job) -> bool:
        return job.head is not None and job.epoch < self._epoch and job.head != self._focus

    def _cancel_reason(self, job: Job) -> str | None:
        if job.cancel_reason is not None:
            return job.cancel_reason
        if self._closed:
            return "engine closed"
        if self._stale(job):
            return f"{job.label}: stopped, focus moved on"
        return None

    def _rank(self, job: Job) -> tuple[int, int]:
        cls = job.priority
        if cls == USER and job.head is not None and job.head == self._focus:
            cls = FOCUSED
        return (cls, job.seq)

    def _pick(self) -> Job | None:
        prefetch_running = any(j.priority == PREFETCH for j in self._running)
        best: Job | None = None
        for job in self._queue:
            if job.priority == PREFETCH and prefetch_running:
                continue
            if best is None or self._rank(job) < self._rank(best):
                best = job
        return best

    # -- workers --------------------------------------------------------------------

    def _start_threads(self) -> None:
        if len(self._threads) >= self.workers:
            return
        thread = threading.Thread(
            target=self._worker, name=f"{self._name}-{len(self._threads)}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _worker(self) -> None:
        if self._thread_init is not None:
            with contextlib.suppress(Exception):
                self._thread_init()
        while True:
            with self._cv:
                job = self._pick()
                while job is None and not self._closed:
                    self._cv.wait()
                    job = self._pick()
                if job is None:
                    return
                self._queue.remove(job)
                job.state = "running"
                self._running.add(job)
                if len(self._queue) > 0 and len(self._threads) < self.workers:
                    self._start_threads()
            result, error = None, None
            try:
                reason = self._cancel_reason(job)
                if reason is not None:
                    raise CancelledError(reason)
                self.started += 1
                with self._job_context():
                    result = job.fn(JobContext(self, job))
            except HeadscopeError as exc:
                error = exc
            except BaseException as exc:
                error = out_of_memory(exc, None, job.label) or ComputeError(
                    None, f"{job.label}: {type(exc).__name__}: {exc}")
                error.__cause__ = exc
            finally:
                with self._cv:
                    self._running.discard(job)
                    job.state = "done"
                    # finished work leaves the status bar, whether or not anyone asked for
                    # its progress (every job reports 100% at its end)
                    if self._reporter is job:
                        self.activity, self.progress, self._reporter = None, None, None
                    self._cv.notify_all()
            self._deliver(job, result, error)
            # an idle worker keeps nothing of its last job alive (a result array, or an error
            # whose traceback holds the job and its future) while it waits for the next
            job = result = error = None
            with self._cv:
                idle = not self._running and not self._queue
            if idle:  # the pages a job freed go back to the system (core/memory.py)
                release_free_heap()

    def _report_progress(self, job: Job, fraction: float) -> None:
        fraction = min(1.0, max(0.0, float(fraction)))
        with self._cv:
            if job.state != "running":  # a late report from a job already finished
                return
            self.activity = f"{job.label} {fraction:.0%}"
            self.progress = fraction
            self._reporter = job
        if job.progress is not None:
            callback = job.progress
            deliver_soon(job.loop, callback, fraction)

    # -- delivery (loop thread) -----------------------------------------------------

    def _deliver(self, job: Job, result: Any, error: BaseException | None) -> None:
        _call_soon(job.loop, self._finish, job, result, error)

    def _finish(self, job: Job, result: Any, error: BaseException | None) -> None:
        with self._cv:
            if self._inflight.get(job.key) is job:
                del self._inflight[job.key]
        if error is None:
            try:
                for key, value in job.extra:
                    self._on_result(key, value)
                self._on_result(job.key, result)
            except Exception as exc:
                error = ComputeError(None, f"{job.label}: caching failed: {exc}")
        if job.future.done():
            return
        if error is None:
            job.future.set_result(result)
        else:
            job.future.set_exception(error)


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
        loop.call_soon_threadsafe(fn, *args)


def deliver_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[Any], None], value: Any) -> None:
    """``callback(value)`` on ``loop``, from any thread: a progress report or a partial
    result for the UI, which must never fail the job (its exceptions are dropped), nor reach
    a closed loop."""
    _call_soon(loop, _quietly, callback, value)


def _quietly(callback: Callable[[Any], None], value: Any) -> None:
    with contextlib.suppress(Exception):
        callback(value)


def _consume_exception(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # a prefetch or an abandoned job: its failure is not worth a warning
