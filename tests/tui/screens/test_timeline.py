"""Timeline mode in the explorer (tui/timeline_mode.py, tui/timeline_view.py).

``headscope --timeline PATH [PATH ...]`` opens the series' last step with a Timeline tab; ``{``/``}``
scrub steps by swapping the engine for one on that step's checkpoint. The shipped training
series (sample_models/attn-only-2l-training) is scored once per module; the explorer then
gets that timeline through ``TimelineMode(compute=...)`` so each test does not re-score it.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from textual.widgets import DataTable, Static

from headscope.engine.core.requests import CircuitRequest
from headscope.engine.service.engine import default_workers
from headscope.engine.sweeps import timeline as engine_timeline
from headscope.engine.sweeps.timeline import (
    StepScores,
    StepSource,
    Timeline,
    build_timeline,
    score_keys,
)
from headscope.tui.app import HeadscopeApp
from headscope.tui.base.settings import Settings
from headscope.tui.cli.main import main
from headscope.tui.screens.timeline import (
    TimelineMode,
    compute_series,
    engine_workers,
    open_timeline,
)
from headscope.tui.widgets.head_tree import HeadTree
from headscope.tui.widgets.status import StatusBar
from headscope.tui.widgets.timeline import TimelinePane
from tests.conftest import INDUCTION_HEAD, SAMPLE_MODELS, notified
from tests.engine.sweeps.test_timeline import _write_step
from tests.fake_engine import FakeEngine
from tests.tui.test_app import plain, settle, wait_until

SERIES = SAMPLE_MODELS / "attn-only-2l-training"


@pytest.fixture(autouse=True)
def _quiet_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HEADSCOPE_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("HEADSCOPE_OUTPUT_DIR", str(tmp_path / "out"))


@pytest.fixture(scope="module")
def shipped() -> tuple[list[StepSource], list[str], Timeline]:
    mode = open_timeline(SERIES)
    timeline = compute_series(mode.sources, mode.notes, False, lambda d, t: None, lambda: False)
    return mode.sources, mode.notes, timeline


def shipped_app(shipped: tuple[list[StepSource], list[str], Timeline], **kw: Any) -> HeadscopeApp:
    sources, notes, timeline = shipped
    mode = TimelineMode(sources, notes, compute=lambda *_a: timeline)
    return HeadscopeApp(timeline=mode, settings=Settings(), debounce=0.01, sweep=False, **kw)


async def wait_timeline(pilot: Any, app: HeadscopeApp) -> None:
    await wait_until(pilot, lambda: app.timeline.timeline is not None or app.errors,
                     "the timeline computed")
    await wait_until(pilot, lambda: app.model_ready.is_set(), "the model open")
    await settle(pilot, app)


def grid(app: HeadscopeApp) -> str:
    return plain(app.explorer.query_one("#timeline-grid", Static))


def status(app: HeadscopeApp) -> str:
    return app.explorer.query_one(StatusBar).render().plain


# -- the tab -------------------------------------------------------------------------------


async def test_timeline_tab_has_a_sparkline_row_per_head_and_the_induction_phase_change(
        shipped: Any) -> None:
    _, _, timeline = shipped
    app = shipped_app(shipped)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_timeline(pilot, app)
        await pilot.press("8")
        await settle(pilot, app)
        assert app.explorer.active_tab == "timeline"
        lines = grid(app).splitlines()
        heads = [line for line in lines if line.startswith("L")]
        assert [h.split()[0] for h in heads] == ["L0.H0", "L0.H1", "L0.H2",
                                                 "L1.H0", "L1.H1", "L1.H2"]
        for title in ("copying", "QK+", "prev-token", "dup-token", "induction"):
            assert title in lines[0]
        # Five sparklines per row, each followed by the value at the step shown (the last).
        induction_row = next(h for h in heads if h.startswith("L1.H2"))
        words = induction_row.split()
        assert len(words) == 1 + 2 * 5
        assert all(all(0x2800 <= ord(c) <= 0x28FF or c in "▁▂▃▄▅▆▇█" for c in w)
                   for w in words[1::2])
        last = timeline.series["induction_score"][-1, 1, 2]
        assert words[-1] == f"{last:+.2f}" and last > 0.8
        # The phase change: listed with before → after, at the step the engine found.
        table = app.explorer.query_one("#timeline-changes", DataTable)
        rows = [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]
        assert len(rows) == len(timeline.phase_changes)
        found = [r for r in rows if r[:2] == ["L1.H2", "induction"]]
        assert len(found) == 1
        change = next(c for c in timeline.phase_changes
                      if (c["layer"], c["head"], c["score"]) == (*INDUCTION_HEAD, "induction_score"))
        assert found[0][2] == str(change["step"]) == "675"
        assert change["before"] < 0.3 and change["after"] > 0.8
        assert found[0][3] == f"{change['before']:+.2f} → {change['after']:+.2f}"
        assert "step 3000 (18 of 18)" in status(app)
        await pilot.press("q")


# -- scrubbing -----------------------------------------------------------------------------


async def test_scrubbing_opens_that_steps_weights_in_every_tab_and_its_badges(
        shipped: Any) -> None:
    from headscope.engine.service.engine import Engine

    sources, _, timeline = shipped
    app = shipped_app(shipped)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_timeline(pilot, app)
        last_block = np.array(app.explorer.results["qk"]["token"].values)
        target = timeline.steps.index(675)
        for _ in range(len(sources) - 1 - target):
            await pilot.press("left_curly_bracket")
        assert app.timeline.index == target
        assert "step 675 (9 of 18)" in status(app)
        await wait_until(pilot, lambda: app.timeline.opened == target, "step 675 opened")
        await wait_until(pilot, lambda: app.model_ready.is_set(), "step 675 ready")
        await settle(pilot, app)
        assert app.path == str(sources[target].path)
        shown = np.array(app.explorer.results["qk"]["token"].values)
        direct = Engine(str(sources[target].path))
        try:
            await direct.ready()
            expected = await direct.get(CircuitRequest.of(direct.structure, 0, 0, "qk", "token", limit=direct.max_block_bytes))
        finally:
            await direct.aclose()
        np.testing.assert_allclose(shown, np.asarray(expected.values), rtol=1e-6, atol=1e-6)
        assert not np.allclose(shown, last_block)  # another step's weights, not the last's
        # The badges are that step's scores: the induction head is not one yet at 600.
        tree = app.explorer.query_one(HeadTree)
        assert tree.scores[INDUCTION_HEAD].induction_score == pytest.approx(
            timeline.series["induction_score"][target, 1, 2])
        await pilot.press(*["left_curly_bracket"] * 3)  # 650, 625, then 600
        await wait_until(pilot, lambda: app.timeline.opened == target - 3, "step 600 opened")
        await settle(pilot, app)
        assert "step 600 (6 of 18)" in status(app)
        assert tree.scores[INDUCTION_HEAD].induction_score < 0.3 < \
            timeline.series["induction_score"][-1, 1, 2]
        # The Timeline tab shows the same step.
        await pilot.press("8")
        await settle(pilot, app)
        assert "step 600 (6 of 18" in plain(app.explorer.query_one("#timeline-header", Static))
        await pilot.press("q")


async def test_enter_on_a_phase_change_shows_that_head_at_that_step(shipped: Any) -> None:
    _, _, timeline = shipped
    app = shipped_app(shipped)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_timeline(pilot, app)
        await pilot.press("8")
        await settle(pilot, app)
        table = app.explorer.query_one("#timeline-changes", DataTable)
        i = next(i for i, c in enumerate(timeline.phase_changes)
                 if (c["layer"], c["head"], c["score"]) == (1, 2, "induction_score"))
        table.focus()
        table.move_cursor(row=i)
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.timeline.opened == timeline.steps.index(675),
                         "step 675 opened")
        await settle(pilot, app)
        assert app.explorer.head == INDUCTION_HEAD
        assert "step 675 (9 of 18)" in status(app)
        await pilot.press("q")


# -- the real computation, warnings and errors ------------------------------------------------


async def test_identical_steps_are_a_notification_and_the_steps_are_scored_in_a_pool(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "run"
    for i, step in enumerate((0, 100, 200)):
        _write_step(root / f"step-{step}", seed=i)
    shutil.copytree(root / "step-100", root / "step-300")
    mode = open_timeline(root)
    assert mode.workers is None  # the engine's pool size, asked for when scoring starts
    assert engine_workers() == default_workers()[0]
    mode.workers = 2
    progress: list[int] = []
    ui_thread: list[bool] = []
    step_threads: set[str] = set()
    score_step = engine_timeline.score_step

    def recorded(*args: Any, **kwargs: Any) -> Any:
        import threading

        step_threads.add(threading.current_thread().name)
        return score_step(*args, **kwargs)

    def counted(report: Any) -> Any:
        import threading

        ui_thread.append(threading.current_thread() is threading.main_thread())

        def progress_of(done: int, total: int) -> None:
            progress.append(done)
            report(done, total)
        return progress_of

    compute = mode.compute
    mode.compute = lambda sources, notes, raw, report, cancelled: compute(
        sources, notes, raw, counted(report), cancelled)
    monkeypatch.setattr(engine_timeline, "score_step", recorded)
    app = HeadscopeApp(timeline=mode, settings=Settings(), debounce=0.01, sweep=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_timeline(pilot, app)
        assert ui_thread == [False]
        assert step_threads and all(n.startswith("timeline") for n in step_threads)
        assert progress == [1, 2, 3, 4]
        notes = [n.message for n in notified(app)]
        assert any("identical weights" in n and "100" in n and "300" in n for n in notes)
        assert app.errors == []
        assert "step 300 (4 of 4)" in status(app)
        assert "scoring" not in status(app)
        await pilot.press("q")


async def test_the_timeline_tab_counts_the_steps_scored_as_the_status_bar_does(tmp_path: Path) -> None:
    """While the timeline is scored, the Timeline tab's "scoring the steps… k/n" follows the
    progress (it kept the count it was first drawn with: 4/18 beside the status bar's 9/18)."""
    import threading

    sources = [StepSource(s, tmp_path / f"step-{s}") for s in (0, 1, 2)]
    go = threading.Event()
    started = asyncio.Event()
    loop = asyncio.get_running_loop()

    def compute(_s: Any, _n: Any, _r: Any, progress: Any, cancelled: Any) -> Timeline:
        import time

        loop.call_soon_threadsafe(started.set)
        go.wait(30)
        progress(2, 3)
        while not cancelled():
            time.sleep(0.01)
        raise AssertionError("unreachable: cancelled when the app quits")

    mode = TimelineMode(sources, compute=compute)
    app = HeadscopeApp(timeline=mode, engine_factory=lambda p, r: FakeEngine(p),
                       settings=Settings(), debounce=0.01, sweep=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await asyncio.wait_for(started.wait(), 30)
        await pilot.press("8")
        header = app.explorer.query_one("#timeline-header", Static)
        await wait_until(pilot, lambda: "0/3" in plain(header), "the tab drawn before any step")
        go.set()
        await wait_until(pilot, lambda: "scoring steps 2/3" in status(app), "the status bar's 2/3")
        await pilot.pause()
        assert "scoring the steps… 2/3" in plain(header)
        await pilot.press("q")


async def test_the_status_bar_turns_its_spinner_while_the_timeline_is_scored(tmp_path: Path) -> None:
    """The status bar showed `✓` (nothing running) beside `scoring steps 1/3`: the steps are
    scored in timeline mode's own worker, not in the engine, whose activity the bar followed.
    While that worker runs the spinner turns; once the timeline is in (here: it failed), `✓`."""
    import threading

    from headscope.engine.core.errors import ShapeMismatchError
    from headscope.tui.widgets.status import SPINNER

    sources = [StepSource(s, tmp_path / f"step-{s}") for s in (0, 1, 2)]
    go = threading.Event()

    def compute(_s: Any, _n: Any, _r: Any, progress: Any, cancelled: Any) -> Timeline:
        progress(1, 3)
        go.wait(30)
        raise ShapeMismatchError(sources[2].path, "not one series")

    app = HeadscopeApp(timeline=TimelineMode(sources, compute=compute),
                       engine_factory=lambda p, r: FakeEngine(p), settings=Settings(),
                       debounce=0.01, sweep=False)
    async with app.run_test(size=(80, 24)) as pilot:
        try:
            await wait_until(pilot, lambda: app.model_ready.is_set(), "the model open")
            await wait_until(pilot, lambda: not any(
                not w.is_finished for w in app.workers if w.group != "timeline"),
                "everything but the timeline done")
            await wait_until(pilot, lambda: "scoring steps 1/3" in status(app), "the step count")
            seen = set()
            for _ in range(6):  # the status tick is 0.15 s: several beats
                await pilot.pause(0.1)
                seen.add(status(app).splitlines()[1].split(" │ ")[2][0])  # the activity
            assert "✓" not in seen and seen <= set(SPINNER) and len(seen) > 1, (seen, status(app))
        finally:
            go.set()
        await wait_until(pilot, lambda: app.errors, "the timeline failed")
        await wait_until(pilot, lambda: "✓" in status(app), "the bar idle again")
        await pilot.press("q")


async def test_quitting_while_the_timeline_is_scored_cancels_it_between_steps(
        tmp_path: Path) -> None:
    sources = [StepSource(s, tmp_path / f"step-{s}") for s in (0, 1, 2)]
    seen: list[bool] = []
    started = asyncio.Event()
    loop = asyncio.get_running_loop()

    def compute(_s: Any, _n: Any, _r: Any, _p: Any, cancelled: Any) -> Timeline:
        import time

        loop.call_soon_threadsafe(started.set)
        while not cancelled():  # a step at a time, checking in between
            time.sleep(0.01)
        seen.append(True)
        raise AssertionError("unreachable: the engine raises CancelledError")

    mode = TimelineMode(sources, compute=compute)
    app = HeadscopeApp(timeline=mode, engine_factory=lambda p, r: FakeEngine(p),
                       settings=Settings(), debounce=0.01, sweep=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await asyncio.wait_for(started.wait(), 30)
        assert "scoring steps 0/3" in status(app)
        await pilot.press("q")
    for _ in range(200):
        if seen:
            break
        await asyncio.sleep(0.01)
    assert seen == [True]


@pytest.mark.parametrize("what", ["single", "missing", "with-path", "with-compare"])
def test_a_bad_series_is_a_one_line_error_before_the_explorer_opens(
        what: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import headscope.tui.app as app_module

    def never(*_a: Any, **_k: Any) -> None:
        raise AssertionError("the explorer opened")

    monkeypatch.setattr(app_module, "run_app", never)
    argv = {"single": ["--timeline", str(SERIES / "step-000675")],
            "missing": ["--timeline", str(SERIES / "nope")],
            "with-path": [str(SAMPLE_MODELS / "attn-only-2l"), "--timeline", str(SERIES)],
            "with-compare": ["--timeline", str(SERIES), "--compare", str(SERIES / "step-000675")],
            }[what]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("headscope: ")
    assert {"single": "single checkpoint", "missing": "no such file",
            "with-path": "not both", "with-compare": "cannot be combined"}[what] in err


def test_open_timeline_opens_the_last_step(monkeypatch: pytest.MonkeyPatch) -> None:
    import headscope.tui.app as app_module

    opened: dict[str, Any] = {}
    monkeypatch.setattr(app_module, "run_app", lambda path, **kw: opened.update(kw, path=path))
    assert main(["open", "--timeline", str(SERIES)]) == 0
    mode = opened["timeline"]
    assert mode.step == 3000 and len(mode.sources) == 18
    assert HeadscopeApp(timeline=mode, settings=Settings()).path == str(SERIES / "step-003000")
    # Several checkpoints in order, as `headscope timeline` takes them.
    chosen = [str(SERIES / f"step-000{s}") for s in (600, 675, 700)]
    assert main(["--timeline", *chosen]) == 0
    mode = opened["timeline"]
    assert [s.step for s in mode.sources] == [600, 675, 700] and mode.path == chosen[-1]


async def test_without_a_timeline_key_8_says_how_to_open_one() -> None:
    engine = FakeEngine()
    app = HeadscopeApp(engine.path, engine_factory=lambda _p, _r: engine, settings=Settings(),
                       debounce=0.01, sweep=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("8", "right_curly_bracket")
        assert app.explorer.active_tab == "qk"
        assert not app.explorer.query(TimelinePane)
        notes = [n.message for n in notified(app)]
        assert sum("--timeline" in n for n in notes) == 2
        await pilot.press("q")


async def test_a_burst_of_step_keys_opens_one_step_and_closes_the_engines_it_replaces(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import headscope.tui.screens.timeline as timeline_mode

    # A burst is keys closer together than the scrub delay; on a busy machine Pilot's presses
    # can be 0.15 s apart, so the test widens the delay rather than racing it.
    monkeypatch.setattr(timeline_mode, "SCRUB_DELAY", 2.0)
    sources, timeline = synthetic_timeline()
    engines: list[FakeEngine] = []

    def factory(path: str, _raw: bool) -> FakeEngine:
        engines.append(FakeEngine(path, n_heads=3, fail={"ready"} if "000200" in path else set()))
        return engines[-1]

    mode = TimelineMode(sources, compute=lambda *_a: timeline)
    app = HeadscopeApp(timeline=mode, engine_factory=factory, settings=Settings(),
                       debounce=0.01, sweep=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_timeline(pilot, app)
        await pilot.press(*["left_curly_bracket"] * 4, *["right_curly_bracket"] * 9)
        assert mode.index == len(sources) - 1  # clamped at the last step
        await pilot.press("left_curly_bracket", "left_curly_bracket")
        await wait_until(pilot, lambda: mode.opened == 5, "step 500 opened")
        await settle(pilot, app)
        assert [Path(e.path).name for e in engines] == ["step-000700", "step-000500"]
        assert engines[0].closed and not engines[1].closed
        # A step that cannot be opened is a notification; the next step opens as usual.
        await pilot.press(*["left_curly_bracket"] * 3)
        await wait_until(pilot, lambda: app.errors, "step 200's error")
        assert len(app.errors) == 1 and "ready failed" in app.errors[0]
        await pilot.press("left_curly_bracket")
        await wait_until(pilot, lambda: mode.opened == 1 and app.model_ready.is_set(),
                         "step 100 opened")
        await settle(pilot, app)
        assert app.explorer.results["qk"]["token"] is not None
        assert app.explorer.query_one(StatusBar).error == ""
        assert [e.closed for e in engines] == [True, True, True, False]
        await pilot.press("q")


async def test_a_narrow_terminal_keeps_the_induction_and_previous_token_columns_unwrapped() -> None:
    sources, timeline = synthetic_timeline()
    app = HeadscopeApp(timeline=TimelineMode(sources, compute=lambda *_a: timeline),
                       engine_factory=lambda p, _r: FakeEngine(p, n_heads=3),
                       settings=Settings(), debounce=0.01, sweep=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_timeline(pilot, app)
        await pilot.press("8")
        await settle(pilot, app)
        lines = grid(app).splitlines()
        assert len(lines) == 1 + 6  # the header row and a row per head: nothing wrapped
        assert lines[0].split()[1:] == ["copying", "prev-token", "induction"]
        assert all(len(line.split()) == 1 + 2 * 3 for line in lines[1:])
        await pilot.press("q")


# -- the picture -----------------------------------------------------------------------------


def synthetic_timeline(n_layers: int = 2, n_heads: int = 3) -> tuple[list[StepSource], Timeline]:
    """Eight steps of made-up scores: an induction head forming at step 400 (deterministic)."""
    steps = [0, 100, 200, 300, 400, 500, 600, 700]
    sources = [StepSource(s, Path(f"run/step-{s:06d}")) for s in steps]
    ramp = 1 / (1 + np.exp(-(np.array(steps) - 400) / 40.0))
    results = []
    for i, s in enumerate(steps):
        base = np.linspace(0.05, 0.3, n_layers * n_heads).reshape(n_layers, n_heads)
        scores = {k: base.copy() for k in score_keys()}
        scores["induction_score"][1, 2] = 0.02 + 0.9 * ramp[i]
        scores["prev_token_score"][0, 1] = 0.1 + 0.6 * min(1.0, s / 300)
        scores["copying_score"] = scores["copying_score"] + 0.05 * i
        results.append(StepScores(s, sources[i].path, n_layers, n_heads, f"fp{i}", scores))
    return sources, build_timeline(results)


def test_timeline_tab_120x40(snap_compare: Any) -> None:
    sources, timeline = synthetic_timeline()
    mode = TimelineMode(sources, compute=lambda *_a: timeline)
    app = HeadscopeApp(timeline=mode, engine_factory=lambda p, _r: FakeEngine(p, n_heads=3),
                       settings=Settings(), debounce=0.01, sweep=False)

    async def run_before(pilot: Any) -> None:
        await wait_timeline(pilot, pilot.app)
        for key in ("8", "left_curly_bracket", "left_curly_bracket", "left_curly_bracket"):
            await pilot.press(key)
        await wait_until(pilot, lambda: mode.opened == 4, "step 400 opened")
        await settle(pilot, pilot.app)
        pilot.app.clear_notifications()
        await pilot.pause(0.05)

    assert snap_compare(app, terminal_size=(120, 40), run_before=run_before)


def test_the_timeline_keys_are_in_the_help_and_collide_with_no_other_key() -> None:
    from rich.console import Console

    from headscope.tui.base.keymap import APP_BINDINGS
    from headscope.tui.screens.dialogs import help_table
    from headscope.tui.widgets.head_tree import HeadTree as Tree

    console = Console(width=200, record=True)
    console.print(help_table({}))
    text = console.export_text()
    for binding_id in ("tab-timeline", "prev-step", "next-step"):
        assert binding_id in text
    keys = [k for b in [*APP_BINDINGS, *Tree.BINDINGS] for k in b.key.split(",")]  # type: ignore[union-attr]
    for key in ("8", "left_curly_bracket", "right_curly_bracket"):
        assert keys.count(key) == 1


async def test_a_timeline_that_cannot_be_computed_is_a_one_line_notification(
        tmp_path: Path) -> None:
    from headscope.engine.core.errors import ShapeMismatchError

    sources = [StepSource(s, tmp_path / f"step-{s}") for s in (0, 1)]

    def compute(*_a: Any) -> Timeline:
        raise ShapeMismatchError(sources[1].path, "4 layers × 2 heads: not one series")

    app = HeadscopeApp(timeline=TimelineMode(sources, compute=compute),
                       engine_factory=lambda p, r: FakeEngine(p), settings=Settings(),
                       debounce=0.01, sweep=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.errors, "the error reported")
        assert app.errors == [f"timeline: {sources[1].path}: 4 layers × 2 heads: not one series"]
        await pilot.press("8")
        await settle(pilot, app)
        assert "not one series" in plain(app.explorer.query_one("#timeline-header", Static))
        assert "scoring" not in status(app)
        await pilot.press("q")


async def test_the_changes_are_listed_even_if_the_pane_missed_the_computed_message(
        shipped: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the real app the timeline can finish before the tab is first shown; the list of
    phase changes must not depend on the pane having handled that one message."""
    from headscope.tui.base.messages import TimelineComputed

    post = TimelinePane.post_message

    def drop_computed(self: TimelinePane, message: Any) -> bool:
        return False if isinstance(message, TimelineComputed) else post(self, message)

    monkeypatch.setattr(TimelinePane, "post_message", drop_computed)
    _, _, timeline = shipped
    app = shipped_app(shipped)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_timeline(pilot, app)
        await pilot.press("8")
        await settle(pilot, app)
        table = app.explorer.query_one("#timeline-changes", DataTable)
        assert table.row_count == len(timeline.phase_changes) > 0
        await pilot.press("q")


async def test_the_explorer_scores_the_series_through_the_results_store(tmp_path: Path) -> None:
    """With the default settings the steps' sweeps land in the results store (conftest points
    it at a temp dir), one entry per step, so the series opens from it the next time."""
    from headscope.engine.sweeps.store import default_store

    root = tmp_path / "run"
    for i, step in enumerate((0, 100)):
        _write_step(root / f"step-{step}", seed=i)
    app = HeadscopeApp(timeline=open_timeline(root), engine_factory=lambda p, r: FakeEngine(p),
                       settings=Settings(), debounce=0.01, sweep=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.timeline.timeline is not None or app.errors,
                         "the timeline computed")
        assert not app.errors
        await pilot.press("q")
    stored = {Path(e.path).name for e in default_store(Settings().cache_disk_mb).entries()}
    assert stored == {"step-0", "step-100"}
