"""tui/session/sweeps.py without Textual: the explorer's sweep requests against the fake
engine — what comes back, what is reported, the progress shown and its end."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from headscope.engine.core.errors import CancelledError as EngineCancelled
from headscope.engine.core.requests import HeadScoresRequest
from headscope.engine.core.validation import SCORE_NAMES
from headscope.tui.session import sweeps
from tests.fake_engine import FakeEngine


class Seen:
    """What the explorer would have been told: reports and progress."""

    def __init__(self) -> None:
        self.reports: list[str] = []
        self.progress: list[float | None] = []

    def report(self, message: str) -> None:
        self.reports.append(message)

    def show(self, fraction: float | None) -> None:
        self.progress.append(fraction)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_the_score_sweep_gives_every_head_in_layer_order_and_shows_its_progress() -> None:
    engine, seen = FakeEngine(n_layers=2, n_heads=3, sweep_steps=3), Seen()
    rows = run(sweeps.all_scores(engine, seen.show, seen.report))
    assert [(r.layer, r.head) for r in rows] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    one = run(engine.get(HeadScoresRequest.of(engine.structure, 1, 2)))  # the same head asked for alone
    for name in SCORE_NAMES:
        assert getattr(rows[5], name) == pytest.approx(getattr(one, name)), name
    assert seen.progress[0] == 0.0 and seen.progress[-1] is None
    middle = seen.progress[1:-1]
    assert middle and middle == sorted(middle) and middle[-1] == 1.0
    assert not seen.reports


def test_a_failing_sweep_is_reported_once_and_its_progress_ends() -> None:
    engine, seen = FakeEngine(fail={"all_ablation_effects"}), Seen()
    assert run(sweeps.ablation(engine, seen.show, seen.report)) is None
    assert len(seen.reports) == 1 and "all_ablation_effects failed" in seen.reports[0]
    assert seen.progress == [0.0, None]


def test_a_cancelled_request_gives_nothing_and_says_nothing() -> None:
    class Cancelled(FakeEngine):
        async def head_scores(self, req: Any, progress: Any = None) -> Any:
            raise EngineCancelled("moved on")

    seen = Seen()
    assert run(sweeps.head_scores(Cancelled(), (0, 1), seen.report)) is None
    assert not seen.reports


def test_stored_ablation_is_none_until_stored_and_quiet_on_errors() -> None:
    engine = FakeEngine()
    assert run(sweeps.stored_ablation(engine)) is None
    engine.stored_ablation = True
    stored = run(sweeps.stored_ablation(engine))
    swept = run(sweeps.ablation(engine, lambda _f: None, lambda _m: None))
    np.testing.assert_array_equal(stored, swept)
    assert run(sweeps.stored_ablation(FakeEngine(fail={"stored_ablation_effects"}))) is None


def test_a_failed_null_is_marked_failed_and_reported() -> None:
    failed: list[bool] = []
    seen = Seen()
    assert run(sweeps.score_null(FakeEngine(fail={"score_null"}), seen.report,
                                 lambda: failed.append(True))) is None
    assert failed == [True] and len(seen.reports) == 1
    null = run(sweeps.score_null(FakeEngine(), seen.report, lambda: failed.append(True)))
    assert null is not None and failed == [True]


def test_a_failed_diff_names_compare_in_the_report_and_the_changes_note() -> None:
    notes: list[str] = []
    seen = Seen()
    a, b = FakeEngine(fail={"compare"}), FakeEngine(seed=1)
    assert run(sweeps.diff(a, b, False, seen.report, notes.append)) is None
    assert seen.reports[0].startswith("compare: ") and notes[0].startswith("cannot compare: ")


def test_set_raw_switches_a_then_b_and_says_whether_it_happened() -> None:
    a, b = FakeEngine(), FakeEngine()
    assert run(sweeps.set_raw(a, b.set_raw, True, lambda _m: None)) is True
    assert a.raw and b.raw
    seen = Seen()
    c = FakeEngine(fail={"set_raw"})
    assert run(sweeps.set_raw(c, b.set_raw, False, seen.report)) is False
    assert b.raw and len(seen.reports) == 1  # B is not switched when A could not be


def test_tokens_are_ids_as_written_words_through_the_tokenizer_or_not_tokenised() -> None:
    engine, seen = FakeEngine(), Seen()
    waited: list[bool] = []

    async def ready() -> None:
        waited.append(True)

    assert run(sweeps.tokens(" #3 #1 ", seen.report, ready, lambda: engine)) == [3, 1]
    assert run(sweeps.tokens("  ", seen.report, ready, lambda: engine)) is None
    assert not waited  # ids and the empty set need no model
    words = run(sweeps.tokens("the cat", seen.report, ready, lambda: engine))
    assert words == engine.encode("the cat") and waited == [True]
    broken = FakeEngine(fail={"tokenize"})
    assert run(sweeps.tokens("the", seen.report, ready, lambda: broken)) \
        is sweeps.NOT_TOKENISED
    assert len(seen.reports) == 1
