"""The plumbing every long computation shares (docs/internals.md, "Sweeps in pieces"): how it
reports progress, how it learns it was cancelled, and where it keeps its finished parts so an
interrupted sweep resumes.

Weight sweeps (engine.circuits), forward-pass sweeps (engine.forward) and their callers
(engine.sweeps, the facades) all take these; they live in the bottom layer so neither
algebra nor forward passes import each other for them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from headscope.engine.core.errors import CancelledError

__all__ = ["Cancelled", "Memo", "Progress", "check_cancelled", "monotone", "progress_span", "report"]

# Called with the fraction done, 0..1 (None: nobody is listening).
Progress = Callable[[float], None] | None
# Asked between steps whether to stop (None: never cancelled).
Cancelled = Callable[[], bool] | None


class Memo(Protocol):
    """Where a sweep keeps its per-layer parts (``engine.sweeps.store.LayerMemo``): ``get(i)``
    a part already finished (or None), ``put(i, value)`` one just finished. Sweeps given a
    memo compute only the parts it lacks and store each as soon as it is done, so an
    interrupted sweep resumes (docs/internals.md, "The results store")."""

    def get(self, index: int, shape: tuple[int, ...] | None = None) -> np.ndarray | None: ...

    def put(self, index: int, value: Any) -> None: ...


def check_cancelled(cancelled: Cancelled) -> None:
    """Raise ``CancelledError`` if ``cancelled`` says the sweep should stop."""
    if cancelled is not None and cancelled():
        raise CancelledError("sweep cancelled")


def report(progress: Progress, fraction: float) -> None:
    """Tell ``progress`` the fraction done, clamped to 0..1."""
    if progress is not None:
        progress(min(1.0, max(0.0, fraction)))


def progress_span(progress: Progress, start: float, stop: float) -> Progress:
    """Progress of one step of a sweep, mapped into [start, stop] of the whole."""
    if progress is None:
        return None
    return lambda fraction: progress(start + (stop - start) * fraction)


def monotone(progress: Progress) -> Progress:
    """``progress`` that never goes back (a cluster run, then the local sweep reading its
    parts back, both report over the same span)."""
    if progress is None:
        return None
    best = [0.0]

    def forward(fraction: float) -> None:
        best[0] = max(best[0], fraction)
        progress(best[0])

    return forward
