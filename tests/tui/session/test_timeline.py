"""tui/session/timeline.py without Textual: the series' state, the step shown, the status
text and a step's scores from the timeline."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from headscope.engine.api.timeline import StepSource, Timeline
from headscope.engine.core.validation import SCORE_NAMES
from headscope.tui.session.timeline import TimelineState


def series(n: int = 3) -> list[StepSource]:
    return [StepSource(step=100 * i, path=Path(f"s/step-{i}")) for i in range(n)]


def test_no_sources_is_no_timeline() -> None:
    t = TimelineState()
    assert not t.enabled and t.status_text() == "" and t.scores_at(0) is None


def test_the_last_step_is_shown_first_and_show_clamps() -> None:
    t = TimelineState(series(3))
    assert t.index == t.opened == 2 and t.step == 200 and t.path.endswith("step-2")
    assert t.show(-5) == 0 and t.step == 0
    assert t.show(99) == 2


def test_status_text_says_the_progress_until_the_timeline_is_computed() -> None:
    t = TimelineState(series(3))
    t.done = 1
    assert t.status_text() == "step 200 (3 of 3) · scoring steps 1/3"
    t.error = "timeline: failed"
    assert t.status_text() == "step 200 (3 of 3)"
    t.show(0)  # the step number and its place in the series, not "step 0 of 3 steps"
    assert t.status_text() == "step 0 (1 of 3)"


def test_scores_at_reads_a_step_of_the_timeline() -> None:
    t = TimelineState(series(2))
    values = {k: np.zeros((2, 1, 2), np.float32) for k in SCORE_NAMES}
    values["induction_score"][1, 0, 1] = 0.75
    values["copying_score"][0, 0, 0] = np.nan
    t.timeline = Timeline(steps=[0, 100], paths=["a", "b"], n_layers=1, n_heads=2,
                          series=values, phase_changes=[], model_phase_change=None,
                          fingerprints=["x", "y"], warnings=[])
    rows = t.scores_at(1)
    assert rows is not None and [(r.layer, r.head) for r in rows] == [(0, 0), (0, 1)]
    assert rows[1].induction_score == 0.75 and not rows[1].nonfinite
    first = t.scores_at(0)
    assert first is not None and first[0].nonfinite and math.isnan(first[0].copying_score)
