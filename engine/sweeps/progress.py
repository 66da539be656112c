"""How a long computation reports and stops: ``progress(fraction)`` and ``cancelled() -> bool``.

Every computation of ``engine.sweeps`` takes both (None: nobody listens / never cancelled);
``progress_span`` maps a step's progress into the whole's, ``monotone`` keeps it from going
back, ``stop_if_cancelled`` raises ``CancelledError`` between steps.
"""

from __future__ import annotations

from collections.abc import Callable

from headscope.engine.core.errors import CancelledError

__all__ = ["Cancelled", "Progress", "monotone", "progress_span", "stop_if_cancelled"]

Progress = Callable[[float], None] | None
Cancelled = Callable[[], bool] | None


def stop_if_cancelled(cancelled: Cancelled) -> None:
    if cancelled is not None and cancelled():
        raise CancelledError()


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

    def report(fraction: float) -> None:
        best[0] = max(best[0], fraction)
        progress(best[0])

    return report
