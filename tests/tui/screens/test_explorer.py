"""The explorer screen's seams: typed messages from the workers, the tab-view registry.

Against the fake engine (tests/fake_engine.py); the views themselves are tested in
tests/tui/test_app.py and tests/tui/widgets/test_compare.py.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest
from textual.message import Message

from headscope.tui.base.messages import AblationSwept, ModelReady, ScoresSwept
from headscope.tui.screens.explorer import TABS, VIEWS, ExplorerScreen
from tests.tui.test_app import make_app, settle, wait_until


@pytest.fixture(autouse=True)
def _quiet_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HEADSCOPE_CONFIG", str(tmp_path / "no-config.toml"))
    monkeypatch.setenv("HEADSCOPE_OUTPUT_DIR", str(tmp_path / "out"))


def test_every_tab_has_a_view_that_loads_itself() -> None:
    assert set(VIEWS) == set(TABS)
    for tab, view in VIEWS.items():
        assert inspect.iscoroutinefunction(getattr(view, "load", None)), tab
        assert list(inspect.signature(view.load).parameters) == ["self", "host", "key"], tab


async def test_the_model_and_the_sweep_arrive_as_messages() -> None:
    posted: list[Message] = []
    app, engine = make_app()
    async with app.run_test(size=(120, 40), message_hook=posted.append) as pilot:
        await settle(pilot, app)
        assert isinstance(app.screen, ExplorerScreen) and app.screen is app.explorer
        kinds = [type(m) for m in posted]
        assert kinds.count(ModelReady) == 1
        sweeps = [m for m in posted if isinstance(m, ScoresSwept)]
        assert len(sweeps) == 1 and sweeps[0].gen == 0
        assert {(r.layer, r.head) for r in sweeps[0].rows} == \
            {(layer, h) for layer in range(engine.L) for h in range(engine.H)}
        assert kinds.index(ModelReady) < kinds.index(ScoresSwept)
        assert app.explorer.scores.rows == {(r.layer, r.head): r for r in sweeps[0].rows}


async def test_a_result_for_older_weights_is_dropped() -> None:
    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        ex = app.explorer
        old = list(ex.scores.rows.values())
        await pilot.press("r")  # raw weights: generation 1
        await wait_until(pilot, lambda: ex.gen == 1, "the raw switch")
        await settle(pilot, app)
        planted = [dataclasses.replace(r, copying_score=123.0) for r in old]
        ex.post_message(ScoresSwept(planted, gen=0))  # from the processed weights' sweep
        ex.post_message(AblationSwept(_effects(app), gen=0))
        await settle(pilot, app)
        assert all(r.copying_score != 123.0 for r in ex.scores.rows.values())
        assert ex.scores.ablation is None
        ex.post_message(ScoresSwept(planted, gen=1))  # the same rows, this generation's
        await settle(pilot, app)
        assert all(r.copying_score == 123.0 for r in ex.scores.rows.values())


def _effects(app: Any) -> Any:
    import numpy as np

    return np.ones((app.explorer.n_layers, app.explorer.n_heads))
