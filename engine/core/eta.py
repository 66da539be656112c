"""Time left of a sweep, from its ``progress(fraction)`` callback.

Sweeps report the fraction of their work done (for composition, of the layer pairs: equal
work each, so the rate is steady). ``Eta`` turns those reports into seconds left: elapsed
time × (1 − fraction) / fraction, measured from the first report.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Eta:
    """``update(fraction)`` from a progress callback; ``seconds_left()`` once work is done."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._start: float | None = None
        self._base = 0.0  # fraction at the first report (work done before it, e.g. resumed)
        self.fraction = 0.0

    def update(self, fraction: float) -> None:
        if self._start is None:
            self._start, self._base = self._clock(), fraction
        self.fraction = min(1.0, max(self.fraction, fraction))

    def seconds_left(self) -> float | None:
        """Seconds until 1.0 at the rate so far; None before any progress past the first report."""
        if self._start is None:
            return None
        done = self.fraction - self._base
        if done <= 0:
            return None
        return (self._clock() - self._start) * (1.0 - self.fraction) / done
