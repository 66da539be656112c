"""The explorer on the real ``engine.service.Engine`` (tiny HF checkpoints from hf_fixtures).

Checks what the app shows against the pure engine functions, that a broken checkpoint is
a notification (the app keeps running), and that the UI event loop keeps turning while
model-wide sweeps run on the engine's threads.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from headscope.engine.core.requests import CompositionRequest
from headscope.tui.app import HeadscopeApp
from headscope.tui.base.settings import Settings
from headscope.tui.widgets.chart import Chart
from tests import weight_algebra as algebra
from tests.conftest import notified
from tests.tui.test_app import settle, wait_until


@pytest.fixture(autouse=True)
def _quiet_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HEADSCOPE_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("HEADSCOPE_OUTPUT_DIR", str(tmp_path / "out"))


async def wait_ready(pilot: Any, app: HeadscopeApp, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not app.model_ready.is_set() and not app.errors:
        assert time.monotonic() < deadline, "model did not open"
        await pilot.pause(0.1)
    await settle(pilot, app)


@pytest.fixture
def gpt2(gpt2_dir: Any) -> Path:
    return Path(gpt2_dir[0])


async def test_real_engine_views_match_the_pure_functions(gpt2: Path) -> None:
    from headscope.engine.circuits import head_circuits as circuits
    from headscope.engine.model.loading import load_model

    app = HeadscopeApp(gpt2, settings=Settings(), debounce=0.01, sweep=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot, app)
        assert app.errors == []
        assert "token QK L0.H0" in app.explorer.query_one("#qk-token", Chart).rendered.plain
        await pilot.press("right_square_bracket", "3")  # L0.H1, spectrum tab
        await wait_ready(pilot, app)
        assert app.explorer.head == (0, 1)
        model = load_model(gpt2)
        expected = algebra.copying_score(circuits.full_ov(model.weights, 0, 1))
        text = app.explorer.query_one("#spectrum-ov", Chart).rendered.plain
        assert f"copying {expected:+.3f}" in text
        await pilot.press("q")


async def test_truncated_checkpoint_becomes_a_notification(tmp_path: Path, gpt2: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in gpt2.iterdir():
        data = f.read_bytes()
        if f.name == "model.safetensors":
            data = data[: len(data) // 2]  # truncated download
        (broken / f.name).write_bytes(data)
    app = HeadscopeApp(broken, settings=Settings())
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_ready(pilot, app)
        assert app.errors and str(broken) in app.errors[0]
        assert any(str(broken) in n.message for n in notified(app))
        await pilot.press("2", "j", "question_mark")  # still answering keys
        await wait_until(pilot, lambda: app.screen.__class__.__name__ == "HelpScreen",
                         "the help screen")


async def test_event_loop_keeps_ticking_while_sweeps_run(
        gpt2: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every engine job of the sweeps runs off the UI thread, and the UI's event loop keeps
    turning while it runs: each job waits, on its worker thread, for the loop to tick twice
    before it computes (a loop blocked on the job would never tick: the job times out and the
    test fails). Counts and threads, not a wall-clock bound: the longest stall is bench/'s
    business, measured on a quiet machine (`python -m bench.stall`)."""
    from headscope.engine.service.scheduler import Scheduler

    ticks, stop = 0, False
    tick = threading.Condition()
    job_threads: set[int] = set()
    starved: list[str] = []
    submit = Scheduler._submit

    def gated_submit(self: Scheduler, key: Any, fn: Any, **kw: Any) -> Any:
        def gated(ctx: Any) -> Any:
            job_threads.add(threading.get_ident())
            with tick:
                start = ticks
                if not tick.wait_for(lambda: stop or ticks >= start + 2, timeout=60):
                    starved.append(str(kw.get("label", key)))
            return fn(ctx)

        return submit(self, key, gated, **kw)

    monkeypatch.setattr(Scheduler, "_submit", gated_submit)
    app = HeadscopeApp(gpt2, settings=Settings(), debounce=0.01, sweep=False)
    async with app.run_test(size=(120, 40)) as pilot:

        async def probe() -> None:
            nonlocal ticks
            while not stop:
                await asyncio.sleep(0.002)
                with tick:
                    ticks += 1
                    tick.notify_all()

        task = asyncio.create_task(probe())
        await wait_ready(pilot, app)
        app.explorer.start_sweep()  # all head scores: behaviour forward passes on engine threads
        # Q/K/V composition sweeps at once, while the status bar animates their progress.
        await asyncio.gather(*(app.engine.get(CompositionRequest.of(app.engine.structure, k)) for k in "qkv"))
        await settle(pilot, app)  # the sweep's scores reach the explorer
        with tick:  # jobs submitted from now on (idle prefetch) no longer wait for ticks
            stop = True
            tick.notify_all()
        await task
        assert app.errors == []
        assert app.explorer.scores.rows, "the sweep filled the score table"
        assert job_threads and threading.get_ident() not in job_threads
        assert starved == [], f"the event loop stopped turning while {starved[0]} ran"


async def test_the_composition_graph_fills_in_pair_by_pair(gpt2_dir: Any, tmp_path: Path) -> None:
    """Partial results reach the graph while the sweep runs (engine.composition's
    ``partial``), each agreeing with the final result on the layer pairs it has; the final
    graph is the one-shot result."""
    from unittest import mock

    import numpy as np

    from headscope.engine.model.loading import load_model
    from headscope.engine.sweeps import scores as score_sweeps
    from headscope.tui.widgets.panes import CompositionPane
    from tests import hf_fixtures

    with mock.patch.object(hf_fixtures, "N_LAYERS", 4):  # 6 layer pairs
        path, _ = hf_fixtures.build_gpt2(tmp_path / "deep")
    app = HeadscopeApp(path, settings=Settings(), debounce=0.01, sweep=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot, app)
        app.engine.partial_interval = 0.0  # every pair but the last one
        seen: list[Any] = []
        direct = await app.engine.get(CompositionRequest.of(app.engine.structure, "q"), partial=seen.append)
        await pilot.press("5")  # the composition tab: K-composition, with partial graphs
        pane = app.explorer.query_one(CompositionPane)
        await wait_until(pilot, lambda: ("k", app.explorer.gen) in pane.cache, "the K sweep")
        await settle(pilot, app)
        assert app.errors == []
        assert pane.partials >= 1
        text = app.explorer.query_one("#comp-graph", Chart).rendered.plain
        assert "K-composition" in text and "computing" not in text
    one_shot = {kind: score_sweeps.composition(load_model(path), kind).scores for kind in "qk"}
    np.testing.assert_array_equal(pane.shown.scores, one_shot["k"])
    np.testing.assert_array_equal(direct.scores, one_shot["q"])
    assert len(seen) == 5  # the last pair's scores come with the final result
    done = [sum(bool(np.isfinite(p.scores[s_, :, t, :]).all()) for t in range(4) for s_ in range(t))
            for p in seen]
    assert done == [1, 2, 3, 4, 5]
    for p in seen:
        computed = np.isfinite(p.scores)
        np.testing.assert_array_equal(p.scores[computed], direct.scores[computed])
        assert all(np.isfinite(p.scores[e[0], e[1], e[2], e[3]]) for e in p.top_edges)
