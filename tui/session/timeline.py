"""Timeline mode's state: the series' steps, the step shown and the one the engine has, and
the timeline once computed. No Textual here: timeline mode (tui/screens/timeline.py) computes
the timeline in a worker and swaps the app's engine; the Timeline tab draws from this.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from headscope.engine.core.validation import SCORE_NAMES

# Imported before the app's first frame (an empty state is "no timeline"): the engine's
# results and timeline module are imported where a series is opened or scored.
if TYPE_CHECKING:
    from headscope.engine.api.timeline import StepSource, Timeline
    from headscope.engine.core.results import HeadScores


class TimelineState:
    """The series, the step shown, and the timeline once computed (``sources`` empty: off)."""

    def __init__(self, sources: Sequence[StepSource] = (), notes: Sequence[str] = ()) -> None:
        self.sources = list(sources)
        self.notes = list(notes)
        self.index = len(self.sources) - 1  # the step shown: the last one to start with
        self.opened = self.index  # the step whose weights the engine has
        self.timeline: Timeline | None = None
        self.raw = False  # the weights the timeline was scored on
        self.error: str | None = None
        self.done = 0  # steps scored so far

    @property
    def enabled(self) -> bool:
        return bool(self.sources)

    @property
    def step(self) -> int:
        return self.sources[self.index].step

    @property
    def path(self) -> str:
        return str(self.sources[self.index].path)

    def status_text(self) -> str:
        """``step 675 (5 of 18)``: the step number and its place in the series, and the timeline's progress while it is computed."""
        if not self.enabled:
            return ""
        text = f"step {self.step} ({self.index + 1} of {len(self.sources)})"
        if self.timeline is None and self.error is None:
            text += f" · scoring steps {self.done}/{len(self.sources)}"
        return text

    def show(self, index: int) -> int:
        """Show step ``index`` (clamped to the series); the index shown."""
        self.index = max(0, min(len(self.sources) - 1, index))
        return self.index

    def scores_at(self, index: int) -> list[HeadScores] | None:
        """Every head's scores at step ``index`` from the timeline (``None`` until computed)."""
        t = self.timeline
        if t is None:
            return None
        from headscope.engine.core.results import HeadScores

        rows = []
        for layer in range(t.n_layers):
            for head in range(t.n_heads):
                values = {k: float(t.series[k][index, layer, head]) for k in SCORE_NAMES}
                nonfinite = not all(math.isfinite(v) for v in values.values())
                rows.append(HeadScores(layer=layer, head=head, nonfinite=nonfinite, **values))
        return rows
