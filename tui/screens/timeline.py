"""Timeline mode: a series of training checkpoints explored one step at a time.

``headscope --timeline PATH [PATH ...]`` opens the explorer on the last step of the series (a
directory of checkpoints or several checkpoints in order; the steps are
``engine.api.timeline.discover_steps``'s). The timeline itself (every head's scores at every
step, the phase changes: docs/math.md "Training dynamics") is computed once, in a thread
worker calling the synchronous ``engine.api.timeline`` functions, which score as many steps
at once as the engine has pool threads (progress in the status bar, cancellation checked
between steps, each step read from or written to the results store), and drawn by the
Timeline tab (tui/widgets/timeline.py).

Scrubbing to another step swaps the app's engine for one opened on that step's checkpoint
(the same factory as the first): every other tab then shows that step's weights, and the
head tree's badges are that step's scores, taken from the timeline once it is computed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from textual.css.query import NoMatches
from textual.notifications import SeverityLevel
from textual.timer import Timer
from textual.worker import get_current_worker

from headscope.engine.core.errors import HeadscopeError, InvalidRequestError
from headscope.tui.base.messages import ModelFailed, TimelineComputed
from headscope.tui.session.timeline import TimelineState
from headscope.tui.widgets.status import StatusBar

# The app imports this module before its first frame (TimelineMode() is "no timeline"): what
# numpy or the engine's timeline module brings is imported where a series is opened or scored.
if TYPE_CHECKING:
    from headscope.engine.api.store import ResultStore
    from headscope.engine.api.timeline import StepSource, Timeline
    from headscope.engine.core.results import HeadScores
    from headscope.tui.base.protocols import ExplorerEngine
    from headscope.tui.base.settings import Settings

    # (sources, notes, raw, progress(done, total), cancelled()) → the timeline of those steps
    Compute = Callable[[Sequence[StepSource], Sequence[str], bool, Callable[[int, int], None],
                        Callable[[], bool]], Timeline]

SCRUB_DELAY = 0.15  # seconds: a burst of step keys opens only the step it ends on
# The worker group that scores the steps: outside the engine, so the engine's activity does not
# show it; the explorer's status tick counts it as busy (the spinner turns, not `✓`).
SCORING_GROUP = "timeline"


class TimelineExplorer(Protocol):
    """What timeline mode needs from the explorer screen: its widgets, and to be told that
    the weights under it changed (``ExplorerScreen.weights_replaced``)."""

    auto_sweep: bool

    def query_one(self, selector: Any, expect_type: Any = ...) -> Any: ...

    def post_message(self, message: Any) -> bool: ...

    def set_scores(self, rows: list[HeadScores]) -> None: ...

    def weights_replaced(self, rows: list[HeadScores] | None) -> None: ...

    def start_sweep(self) -> None: ...


class TimelineHost(Protocol):
    """What timeline mode needs from the app (``HeadscopeApp``): its engine and how to
    replace it, the explorer, and Textual's workers, timers and notifications."""

    engine: ExplorerEngine | None
    engine_factory: Callable[[str, bool], ExplorerEngine]
    path: str
    raw: bool
    structure: dict[str, Any]
    model_ready: asyncio.Event
    ready_failed: bool
    settings: Settings

    @property
    def explorer(self) -> TimelineExplorer: ...

    def run_worker(self, work: Any, *, group: str = ..., exclusive: bool = ...,
                   thread: bool = ..., exit_on_error: bool = ...) -> Any: ...

    def set_timer(self, delay: float, callback: Callable[[], Any]) -> Timer: ...

    def call_from_thread(self, callback: Callable[..., Any], *args: Any) -> Any: ...

    def notify(self, message: str, *, title: str = ..., severity: SeverityLevel = ...,
               timeout: float | None = ..., markup: bool = ...) -> None: ...

    def report(self, message: str) -> None: ...


def compute_series(sources: Sequence[StepSource], notes: Sequence[str], raw: bool,
                   progress: Callable[[int, int], None],
                   cancelled: Callable[[], bool], store: ResultStore | None = None,
                   workers: int = 1) -> Timeline:
    """Score the steps (``engine.api.timeline.score_steps``: ``workers`` at once, in threads),
    then assemble the timeline; ``store``: the results store the steps are read from and
    written to (a series opened again is read back). ``progress(done, total)`` after each
    step; ``cancelled()`` is checked between steps."""
    from headscope.engine.api.timeline import build_timeline, check_layouts, score_steps

    check_layouts(sources)
    results = score_steps(sources, raw=raw, progress=lambda done, total, _r: progress(done, total),
                          cancelled=cancelled, store=store, workers=workers)
    return build_timeline(results, notes)


def engine_workers() -> int:
    """How many steps the explorer scores at once: as many as the engine has pool threads
    (``engine.service.engine.default_workers``; each step's torch work uses the engine's share of
    the cores)."""
    from headscope.engine.service.engine import default_workers

    return default_workers()[0]


def open_timeline(series: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
                  path: str | None = None, compare: str | None = None) -> TimelineMode:
    """Timeline mode on a series (``headscope --timeline PATH [PATH ...]``: a directory of
    checkpoints, or several checkpoints in order, as ``headscope timeline`` takes them),
    checked before the explorer opens: a bad path, a single step, or a model path or
    ``--compare`` given as well is a ``HeadscopeError``."""
    paths = [series] if isinstance(series, str | os.PathLike) else list(series)
    if path is not None:
        raise InvalidRequestError(None, f"--timeline opens the series' last step: give "
                                  f"{' '.join(map(str, paths))} or {path}, not both")
    if compare is not None:
        raise InvalidRequestError(None, "--timeline and --compare cannot be combined")
    from headscope.engine.api.timeline import discover_steps

    sources, notes = discover_steps(paths)
    return TimelineMode(sources, notes)


class TimelineMode(TimelineState):
    """Timeline mode: the series' state (tui/session/timeline.py) and what drives it (the
    timeline's worker, scrubbing, the engine swap), on the app given to each call."""

    def __init__(self, sources: Sequence[StepSource] = (), notes: Sequence[str] = (), *,
                 compute: Compute | None = None) -> None:
        super().__init__(sources, notes)
        self.compute: Compute = compute or self._series
        self.store: ResultStore | None = None  # the app's results store, set by start()
        # steps scored at once; None: the engine's pool size, asked for when scoring starts
        # (engine.service imports numpy, which the first frame must not wait for)
        self.workers: int | None = None
        self._timer: Timer | None = None

    # -- computing the timeline ------------------------------------------------------------
    def start(self, app: TimelineHost) -> None:
        """Compute the timeline in a thread worker (once; the status bar shows progress)."""
        if not self.enabled or self.timeline is not None:
            return
        self.raw = app.raw
        mb = app.settings.cache_disk_mb
        if mb > 0:
            from headscope.engine.api.store import default_store

            self.store = default_store(mb)
        app.run_worker(lambda: self._compute(app), thread=True, group=SCORING_GROUP,
                       exclusive=True, exit_on_error=False)

    def _series(self, sources: Sequence[StepSource], notes: Sequence[str], raw: bool,
                progress: Callable[[int, int], None], cancelled: Callable[[], bool]) -> Timeline:
        return compute_series(sources, notes, raw, progress, cancelled, store=self.store,
                              workers=self.workers or engine_workers())

    def _compute(self, app: TimelineHost) -> None:
        worker = get_current_worker()

        def on_ui(*call: Any) -> None:
            if not worker.is_cancelled:
                with contextlib.suppress(RuntimeError):  # the app closed meanwhile
                    app.call_from_thread(*call)

        def progress(done: int, total: int) -> None:
            self.done = done
            on_ui(self.update_status, app)

        try:
            timeline = self.compute(self.sources, self.notes, self.raw, progress,
                                    lambda: worker.is_cancelled)
        except HeadscopeError as err:
            self.error = f"timeline: {err.one_line()}"
            on_ui(self._failed, app)
            return
        except Exception as err:  # an engine bug: a notification, not a silent worker
            self.error = f"timeline: unexpected error {err!r}"
            on_ui(self._failed, app)
            return
        on_ui(self._computed, app, timeline)

    def _failed(self, app: TimelineHost) -> None:
        app.report(self.error or "timeline: failed")
        self.update_status(app)
        from headscope.tui.widgets.timeline import TimelinePane  # numpy: not before the first frame

        with contextlib.suppress(NoMatches):
            app.explorer.query_one(TimelinePane).failed(self.error or "")

    def _computed(self, app: TimelineHost, timeline: Timeline) -> None:
        self.timeline = timeline
        for warning in timeline.warnings:  # identical steps, unnumbered names
            app.notify(warning, severity="warning", timeout=10)
        self.update_status(app)
        if app.raw == self.raw:
            rows = self.scores_at(self.opened)
            if rows is not None:
                app.explorer.set_scores(rows)
        from headscope.tui.widgets.timeline import TimelinePane  # numpy: not before the first frame

        with contextlib.suppress(NoMatches):
            app.explorer.query_one(TimelinePane).post_message(TimelineComputed(timeline))

    def update_status(self, app: TimelineHost) -> None:
        with contextlib.suppress(Exception):  # before the explorer is mounted, or shutting down
            app.explorer.query_one(StatusBar).timeline = self.status_text()
        if self.timeline is None:  # the Timeline tab's "scoring the steps… 4/18" too (it
            # stayed at the count it was drawn with while the status bar moved on); numpy:
            # not imported before the first frame
            from headscope.tui.widgets.timeline import TimelinePane

            with contextlib.suppress(Exception):
                app.explorer.query_one(TimelinePane).redraw()

    # -- scrubbing -------------------------------------------------------------------------
    def scrub(self, app: TimelineHost, delta: int | None = None, *, to: int | None = None) -> None:
        """Show the step ``delta`` away (or step index ``to``); the engine follows after a
        short pause, so holding the key does not open every step on the way."""
        if not self.enabled:
            app.notify("no timeline: open a series with headscope --timeline PATH",
                       severity="warning")
            return
        self.show(to if to is not None else self.index + (delta or 0))
        self.update_status(app)
        from headscope.tui.widgets.timeline import TimelinePane  # numpy: not before the first frame

        with contextlib.suppress(NoMatches):
            app.explorer.query_one(TimelinePane).redraw()
        if self._timer is not None:
            self._timer.stop()
        self._timer = app.set_timer(SCRUB_DELAY, lambda: self._open_step(app))

    def _open_step(self, app: TimelineHost) -> None:
        if self.index == self.opened or app.engine is None:
            return
        app.run_worker(partial(self._swap, app, self.index), group="timeline-swap", exclusive=True,
                       exit_on_error=False)

    async def _swap(self, app: TimelineHost, index: int) -> None:
        """Replace the app's engine with one on step ``index``'s checkpoint."""
        path = str(self.sources[index].path)
        try:
            engine = app.engine_factory(path, app.raw)
        except HeadscopeError as err:
            app.report(str(err))
            return
        except Exception as err:  # an engine bug must not take the explorer down
            app.report(f"{path}: cannot open ({err!r})")
            return
        old = app.engine
        app.model_ready.clear()
        app.ready_failed = False
        app.engine, app.path, self.opened = engine, path, index
        app.structure = {**dict(engine.structure), "path": path}
        rows = self.scores_at(index) if app.raw == self.raw else None
        app.explorer.weights_replaced(rows)
        if old is not None:
            app.run_worker(partial(_close, old), group="timeline-close", exit_on_error=False)
        try:
            await engine.ready()
        except HeadscopeError as err:  # a broken step: say so; another step may open
            app.ready_failed = True
            app.report(str(err))
            app.explorer.post_message(ModelFailed(str(err), str(err)))
            return
        app.ready_failed = False
        app.explorer.query_one(StatusBar).error = ""
        app.model_ready.set()
        if rows is None and app.explorer.auto_sweep:
            app.explorer.start_sweep()


async def _close(engine: ExplorerEngine) -> None:
    """Close a replaced engine (its threads); a failure to close is not the user's concern."""
    with contextlib.suppress(Exception):
        await engine.aclose()
