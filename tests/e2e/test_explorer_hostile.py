"""The explorer on hostile and broken inputs, on the real Engine.

Every broken checkpoint of the corpus (tests/engine/test_hostile.py ``BROKEN``) opened in the app
becomes an error notification naming the file and the problem; nothing crashes, and the
app keeps answering keys (help screen, tabs, quit). NaN weights are not an error: the app
opens and the affected head is flagged in the head tree while the others keep their
badges. Resource limits: an over-limit circuit block is a notification; a prompt longer
than the context is truncated with a visible notice.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from textual.widgets import DataTable
from textual.worker import WorkerState

from headscope.engine.core.requests import SpectrumRequest
from headscope.tui.app import HeadscopeApp
from headscope.tui.base.labels import score
from headscope.tui.base.settings import Settings
from headscope.tui.screens.dialogs import HelpScreen
from headscope.tui.widgets.chart import Chart
from headscope.tui.widgets.head_tree import HeadTree
from headscope.tui.widgets.status import StatusBar
from tests.conftest import notified
from tests.engine import test_hostile
from tests.engine.test_hostile import (
    BROKEN,
    NAN_HEAD,
    NAN_LAYER,
    Sources,
    build_broken,
    nan_weights,
)
from tests.tui.test_app import settle as quiet

corpus_sources = test_hostile.corpus_sources  # the corpus' pytest fixture
SIZE = (100, 30)
# One case per error class also switches tabs and moves in the tree (the app takes the
# same path for every case of a class; switching tabs costs time on a busy machine).
WITH_TABS = {
    "truncated": "CorruptFileError",
    "path_escaping_shard": "UnsafePathError",
    "pickle_only_directory": "UnsafeFormatError",
    "empty_directory": "UnsupportedFormatError",
    "config_unsupported_architecture": "UnknownArchitectureError",
    "config_missing_field": "ConfigError",
    "wrong_shape": "ShapeMismatchError",
    "missing_tensor": "MissingTensorError",
}


@pytest.fixture(autouse=True)
def _quiet_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HEADSCOPE_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("HEADSCOPE_OUTPUT_DIR", str(tmp_path / "out"))


async def settle(pilot: Any, app: HeadscopeApp, until: Any, timeout: float = 30.0) -> None:
    """Pause until ``until()`` holds (or an error was reported), then until the app is quiet
    (workers finished, their messages handled)."""
    deadline = time.monotonic() + timeout
    while not until() and not app.errors:
        assert time.monotonic() < deadline, "the app never got there"
        await pilot.pause(0.05)
    await quiet(pilot, app, rounds=1)


def screen_text(app: HeadscopeApp) -> str:
    """What the terminal shows right now, one line per row."""
    strips = app.screen._compositor.render_strips()
    return "\n".join(strip.text for strip in strips)


def assert_no_crash(app: HeadscopeApp) -> None:
    """No unhandled exception, no worker died, no notification is a raw traceback or repr."""
    assert app._exception is None
    failed = [w for w in app.workers if w.state == WorkerState.ERROR]
    assert not failed, [repr(w.error) for w in failed]
    for n in notified(app):
        assert "Traceback" not in n.message and "unexpected error" not in n.message, n.message


async def keys_still_work_then_quit(pilot: Any, app: HeadscopeApp, *, tabs: bool = True) -> None:
    """Help opens and closes, (tabs and the tree take keys), ``q`` exits with code 0."""
    main = app.screen
    await pilot.press("question_mark")
    await pilot.pause()
    assert isinstance(app.screen, HelpScreen)
    await pilot.press("escape")
    await pilot.pause()
    assert app.screen is main
    if tabs:  # a few hundred ms per switch on a busy machine: not for every corpus case
        await pilot.press("2", "j", "6")
        await pilot.pause()
        assert app.explorer.active_tab == "summary"
    assert_no_crash(app)
    await pilot.press("q")
    await pilot.pause()
    assert app.return_code == 0  # exited, cleanly


@pytest.mark.parametrize("case", list(BROKEN))
async def test_broken_checkpoint_is_a_notification_and_keys_keep_working(
    tmp_path: Path, corpus_sources: Sources, case: str
) -> None:
    broken = build_broken(case, tmp_path, corpus_sources)
    app = HeadscopeApp(broken.path, settings=Settings(), sweep=False)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, lambda: app.model_ready.is_set())
        assert not app.model_ready.is_set(), "a broken checkpoint opened"
        errors = [n.message for n in notified(app) if n.severity == "error"]
        assert len(errors) == 1, errors
        message = errors[0]
        assert broken.names in message, message  # names the file at fault
        assert re.search(broken.fragment, message), message  # and the problem
        assert "\n" not in message
        assert case not in WITH_TABS or WITH_TABS[case] == broken.error.__name__
        assert app.explorer.query_one(StatusBar).error == message
        # Every chart says why it is empty instead of waiting for a model forever.
        assert all(message in c.rendered.plain for c in app.explorer.query(Chart)
                   if c.rendered is not None)  # fmt: skip
        assert_no_crash(app)
        await keys_still_work_then_quit(pilot, app, tabs=case in WITH_TABS)


@pytest.mark.parametrize("case", ["truncated", "missing_tensor"])
async def test_engine_constructed_on_a_broken_checkpoint_is_a_notification(
    tmp_path: Path, corpus_sources: Sources, case: str
) -> None:
    """The same through an engine factory (the app opens the Engine before the first frame)."""
    from headscope.engine.service.engine import Engine

    broken = build_broken(case, tmp_path, corpus_sources)
    app = HeadscopeApp(broken.path, settings=Settings(), sweep=False,
                       engine_factory=lambda p, raw: Engine(p, raw=raw))  # fmt: skip
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, lambda: app.model_ready.is_set())
        assert app.engine is None and len(app.errors) == 1
        assert broken.names in app.errors[0] and re.search(broken.fragment, app.errors[0])
        assert_no_crash(app)
        await keys_still_work_then_quit(pilot, app, tabs=False)


# --- NaN weights: flagged, not crashed on ---------------------------------------------------


async def test_nan_head_is_flagged_in_the_tree_and_other_heads_keep_badges(
    tmp_path: Path, corpus_sources: Sources
) -> None:

    from headscope.engine.circuits.spectral import nonfinite_heads
    from headscope.engine.model.loading import load_model

    path = nan_weights(tmp_path, corpus_sources)
    bad = (NAN_LAYER, NAN_HEAD)
    model = load_model(path)
    assert nonfinite_heads(model.weights) == [bad]  # the engine flags exactly the poisoned head

    app = HeadscopeApp(path, settings=Settings(), debounce=0.01, sweep=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, lambda: len(app.explorer.scores.rows) == 8)
        assert app.errors == []
        tree = app.explorer.query_one(HeadTree)
        assert app.explorer.scores.rows[bad].nonfinite and math.isnan(app.explorer.scores.rows[bad].induction_score)
        label = tree.head_nodes[bad].label
        assert label.plain == f"H{NAN_HEAD} ! nan"
        assert any("red" in str(span.style) and label.plain[span.start:span.end] == "!"
                   for span in label.spans)  # fmt: skip
        for head, row in app.explorer.scores.rows.items():
            if head == bad:
                continue
            assert not row.nonfinite and all(not math.isnan(score(row, k)) for k in
                                             ("copying_score", "prev_token_score", "induction_score"))  # fmt: skip
            text = tree.badge_text(head)
            assert "!" not in text and "nan" not in text
            assert re.fullmatch(rf"H{head[1]} [C·] [P·] [I·]( S)?", text), text  # S: a sink
        # The summary table flags the row too, and has no number for its scores.
        await pilot.press("6")
        await settle(pilot, app, lambda: True)
        table = app.explorer.query_one("#summary-table", DataTable)
        cells = [str(c) for c in table.get_row(f"{NAN_LAYER}.{NAN_HEAD}")]
        assert "!" in cells[0] and not any(re.search(r"\d", c) for c in cells[1:]), cells
        # The ablation sweep: with a NaN in the weights the clean loss is NaN, so no effect
        # is defined; a warning says why instead of a column of dashes and nothing else.
        await pilot.press("a")
        await settle(pilot, app, lambda: app.explorer.scores.ablation is not None)
        assert app.errors == [] and np.isnan(app.explorer.scores.ablation).all()
        assert any("no ablation effect is finite" in n.message for n in notified(app))
        assert_no_crash(app)
        await keys_still_work_then_quit(pilot, app, tabs=False)


async def test_viewing_a_nan_head_is_flagged_or_a_notification_naming_file_and_head(
    tmp_path: Path, corpus_sources: Sources
) -> None:
    path = nan_weights(tmp_path, corpus_sources)
    bad = (NAN_LAYER, NAN_HEAD)
    app = HeadscopeApp(path, settings=Settings(), debounce=0.01, sweep=False)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, lambda: app.model_ready.is_set())
        app.explorer.goto_head(bad, immediate=True)
        for tab in ("1", "2", "3"):  # QK (NaN W_Q), OV (intact), spectrum (eigenvalues)
            await pilot.press(tab)
            await settle(pilot, app, lambda: True)
        assert app.explorer.head == bad
        assert "non-finite" in str(app.explorer.query_one("#focus-line").render())
        assert_no_crash(app)
        # Flagged views need no notification; one that is shown must say where and which head.
        for message in app.errors:
            assert str(path) in message and f"L{NAN_LAYER}" in message, message
        await keys_still_work_then_quit(pilot, app, tabs=False)


# --- resource limits ------------------------------------------------------------------------


async def test_over_limit_circuit_block_is_a_notification(corpus_sources: Sources) -> None:
    from headscope.engine.service.engine import Engine

    def small_engine(path: str, raw: bool) -> Engine:
        return Engine(path, raw=raw, max_block_bytes=1024)  # a 24×24 float32 block is 2304 B

    app = HeadscopeApp(corpus_sources.gpt2, settings=Settings(), engine_factory=small_engine,
                       sweep=False)  # fmt: skip
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, lambda: bool(app.errors))
        assert len(app.errors) == 1 and "limit" in app.errors[0], app.errors
        assert_no_crash(app)
        await keys_still_work_then_quit(pilot, app)


async def test_prompt_longer_than_the_context_is_truncated_with_a_notice(
    corpus_sources: Sources,
) -> None:
    from tests.hf_fixtures import N_CTX

    long_prompt = " ".join(["the cat sat on the mat"] * N_CTX)  # 6 × n_ctx tokens
    app = HeadscopeApp(corpus_sources.gpt2, settings=Settings(), sweep=False,
                       prompt=long_prompt)  # fmt: skip
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, lambda: app.model_ready.is_set())
        await pilot.press("4")
        await settle(pilot, app, lambda: "prompt" in app.explorer.results)
        assert app.errors == []
        view = app.explorer.results["prompt"]
        assert view.truncated and len(view.ids) == N_CTX
        # On screen (the side pane may wrap the rest of the sentence).
        assert "prompt truncated" in screen_text(app)
        assert_no_crash(app)
        await keys_still_work_then_quit(pilot, app)


async def test_bad_requests_are_notifications_and_empty_prompts_are_declined(
    corpus_sources: Sources,
) -> None:
    from tests.hf_fixtures import VOCAB

    path = corpus_sources.gpt2
    app = HeadscopeApp(path, settings=Settings(), sweep=False, debounce=0.01)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, lambda: app.model_ready.is_set())
        await app.workers.wait_for_complete()
        # A token id beyond the vocabulary, typed into the token chooser.
        await pilot.press("slash")
        await pilot.press(*"#5 #100000", "enter")
        await settle(pilot, app, lambda: bool(app.errors))
        assert app.errors == [f"{path}: token 100000 out of range 0..{VOCAB - 1}"]
        # A blank prompt is declined politely: a hint in the view, not an error.
        await pilot.press("p", "space", "space", "enter")
        await settle(pilot, app, lambda: True)
        assert app.explorer.active_tab == "prompt" and len(app.errors) == 1
        assert "no prompt yet" in screen_text(app)
        # Back to the tree (escape does not leave the prompt input: keys would be typed).
        app.explorer.query_one(HeadTree).focus()
        assert_no_crash(app)
        await keys_still_work_then_quit(pilot, app)


async def test_engine_spectrum_of_a_nan_head_is_empty_with_a_nan_score(
    tmp_path: Path, corpus_sources: Sources
) -> None:
    """The engine side of the flag above: no error, no eigenvalues, NaN score; a finite
    head's spectrum is unaffected."""
    from headscope.engine.service.engine import Engine

    engine = Engine(nan_weights(tmp_path, corpus_sources))
    try:
        bad = await engine.get(SpectrumRequest.of(engine.structure, NAN_LAYER, NAN_HEAD, "qk"))  # its W_Q holds the NaN
        assert bad.eigenvalues.size == 0 and math.isnan(bad.score)
        good = await engine.get(SpectrumRequest.of(engine.structure, NAN_LAYER, (NAN_HEAD + 1) % 4, "qk"))
        assert good.eigenvalues.size > 0 and math.isfinite(good.score)
    finally:
        await engine.aclose()
