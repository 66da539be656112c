"""The explorer screen's seams: typed messages from the workers, the tab-view registry.

Against the fake engine (tests/fake_engine.py); the views themselves are tested in
tests/tui/test_app.py and tests/tui/widgets/test_compare.py.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from textual.message import Message

from headscope.tui.base.messages import AblationSwept, ModelReady, ScoresSwept
from headscope.tui.screens.explorer import TABS, VIEWS, ExplorerScreen
from headscope.tui.widgets.chart import Chart
from headscope.tui.widgets.head_tree import HeadTree
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


async def test_the_patch_and_circuit_tabs_are_built_when_first_shown() -> None:
    """Every widget in the DOM is restyled on each theme change, shown or not (issue 39 §3:
    `t` took ~2 s): the Patch and Circuit panes are mounted on their tab's first show. Until
    then the tabs that read the Patch tab's inputs still load (Composition's path column keys
    on them); keys that reach the screen while the Patch form is being mounted (a few turns
    of the event loop) run no binding (`r` raw weights, `t` the theme) and are typed into the
    form once it is there, in order; once shown, each pane is in its tab and loads."""
    from textual import events
    from textual.widgets import Input

    from headscope.tui.widgets.circuit_tab import CircuitTab
    from headscope.tui.widgets.patch import PatchPane

    app, _ = make_app(sweep=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        ex = app.explorer
        assert not app.query(PatchPane) and not app.query(CircuitTab)
        await pilot.press("5")
        await settle(pilot, app)
        assert "composition" in ex.results  # its key read the unbuilt Patch tab's inputs
        ex.action_show_tab("patch")
        assert not ex.patch_pane.is_mounted
        keys = [events.Key(ch, ch) for ch in "rat"]
        for key in keys:  # as the screen gets them, before the form is mounted
            ex.on_key(key)
            assert key._stop_propagation and key._no_default_action  # no binding runs
        await settle(pilot, app)
        assert app.query_one("#patch-clean", Input).value == "rat"
        await pilot.press("escape", "0")  # out of the box, then the Circuit tab
        await settle(pilot, app)
        for tab, pane in (("patch", PatchPane), ("circuit", CircuitTab)):
            built = app.query_one(pane)
            assert built.parent is not None and built.parent.id == tab
        # each tab's load ran on its built pane (the fake engine computes no edge attribution)
        assert ex.active_tab == "circuit" and "patch" in ex.results
        assert ex.circuit_tab.state == "error"
        assert "does not compute edge attribution" in str(app.query_one("#circuit-graph").render())


def _effects(app: Any) -> Any:
    import numpy as np

    return np.ones((app.explorer.n_layers, app.explorer.n_heads))


# -- z: the tab's chart on the whole screen ----------------------------------------------------
# README step 7's prompt has 24 tokens and repeats its first 8 at 16-23; an induction head
# attends from each repeated token to the one after its first occurrence: (q, q − 15).
_REPEAT = 15


def _induction_pattern(n: int) -> np.ndarray:
    """A causal pattern: uniform, but rows from the repeat on put 0.9 on (q, q − 15)."""
    p = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    for q in range(_REPEAT + 1, n):
        p[q] = 0.1 * p[q]
        p[q, q - _REPEAT] += 0.9
    return p


def _drawn_grid(chart: Chart) -> np.ndarray:
    """The heatmap's cells as drawn, ``[rows, cols, rgb]``, read from the chart's picture."""
    import re

    from rich.console import Console

    text = chart.rendered
    assert text is not None, "the chart has not been drawn at its size"
    console = Console(color_system="truecolor", width=chart.size.width + 5, force_terminal=True)
    with console.capture() as cap:
        console.print(text, crop=False, soft_wrap=True)
    rows = []
    for line in cap.get().splitlines():
        if "┤" not in line and "│" not in line:  # the frame's rows only (not the key's ramp)
            continue
        cells = []
        for params, blocks in re.findall(r"\x1b\[([\d;]*)m(█+|◆ *)", line):
            # a block's colour is its foreground; the cursor's ◆ (and its cell's other
            # columns, blank) stand on its cell's colour
            which = "38;2;" if blocks[0] == "█" else "48;2;"
            colour = re.search(which + r"(\d+);(\d+);(\d+)", params)
            if colour:
                cells += [tuple(int(v) for v in colour.groups())] * len(blocks)
        if cells:
            rows.append(cells)
    return np.asarray(rows, dtype=np.float64)


async def test_z_zooms_the_prompt_pattern_so_an_induction_stripe_shows_at_80x24() -> None:
    """Issue 39 §3: at 80×24 the Prompt tab's 24-token pattern got 5 rows, one pooled row
    over the whole stripe. ``z`` draws it on the whole screen: ~17 rows, each stripe cell the
    brightest of its pooled row; ``esc`` (or ``z``) goes back, as does another tab."""
    from headscope.tui.plots.colormap import bins

    words = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "to", "and", "in", "of", "it",
             "was", "he", "she"]
    prompt = " ".join([*words, *words[:8]])  # 24 tokens, 16-23 repeat 0-7
    n = len(prompt.split())
    planted = _induction_pattern(n)
    app, engine = make_app(colors="truecolor", prompt=prompt, sweep=False)
    view_of = engine.prompt_view
    engine.prompt_view = lambda text, layer, head: dataclasses.replace(  # type: ignore[method-assign]
        view_of(text, layer, head), pattern=planted.astype(np.float32))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await pilot.press("4")
        await settle(pilot, app)
        chart = app.query_one("#prompt-pattern", Chart)
        small = _drawn_grid(chart)
        await pilot.press("z")
        assert app.screen.maximized is chart
        await wait_until(pilot, lambda: chart.size.height > 20 and chart.rendered is not None,
                         "the pattern drawn on the whole screen")
        grid = _drawn_grid(chart)
        ch, cw = grid.shape[:2]
        assert ch >= 16 and ch >= 3 * small.shape[0]
        zero = grid[0, -1]  # (0, 23): above the diagonal, no attention
        brightness = np.linalg.norm(grid - zero, axis=2)
        rows, cols = bins(n, ch), bins(n, cw)
        for i in range(ch):
            sources = range(rows[0][i], rows[1][i])
            keys = {q - _REPEAT for q in sources if q > _REPEAT}
            if not keys:
                continue
            # a line, not a block: each pooled row lights its own rows' stripe keys, ≤ 2 of
            # them (unzoomed, one pooled row lit keys 4-8 of queries 19-23 alike)
            brightest = np.flatnonzero(brightness[i] >= brightness[i].max() - 1e-9)
            assert {int(cols[0][j]) for j in brightest} == keys and len(keys) <= 2, (i, sources)
        await pilot.press("escape")
        await wait_until(pilot, lambda: chart.size.height < 20 and chart.rendered is not None,
                         "the pattern back in its pane")
        assert app.screen.maximized is None and app.explorer.active_tab == "prompt"
        assert isinstance(app.focused, HeadTree)  # focus back where it was, not in the prompt box
        assert _drawn_grid(chart).shape == small.shape
        await pilot.press("z")
        await pilot.pause()
        assert app.screen.maximized is chart
        await pilot.press("1")  # another tab: its own view, unzoomed
        await pilot.pause()
        assert app.screen.maximized is None and app.explorer.active_tab == "qk"


async def test_a_key_that_shows_no_tab_builds_no_binding_map(monkeypatch: pytest.MonkeyPatch) -> None:
    """The explorer's key handler looked every key up in ``active_bindings``, which builds the
    whole binding map (the focus chain's bindings copied, the keymap applied, every action
    checked) on each press, a held `]` included. The tab keys are a map built once per keymap:
    other keys never build it; tab keys, a remapped one and a keymap changed later still work."""
    app, _ = make_app(keymap={"tab-ov": "y"})
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        screen = app.explorer
        built_by: list[str] = []
        original = ExplorerScreen.active_bindings

        def counted(self: ExplorerScreen) -> Any:
            built_by.append(sys._getframe(1).f_code.co_name)  # who asked for the map
            return original.fget(self)

        monkeypatch.setattr(ExplorerScreen, "active_bindings", property(counted))
        await pilot.press("right_square_bracket", "right_square_bracket", "left_square_bracket")
        await settle(pilot, app)
        assert screen.head == (0, 1)  # the keys did their work
        await pilot.press("j", "v", "comma")  # the tree's, the app's, a binding of another tab
        await settle(pilot, app)
        assert "_tab_key" not in built_by, built_by
        await pilot.press("y")  # the keymap's key for the OV tab
        await pilot.pause()
        assert screen.active_tab == "ov"
        await pilot.press("2")  # moved away by the keymap: no longer a tab key
        await pilot.press("5")
        await pilot.pause()
        assert screen.active_tab == "composition"
        app.update_keymap({"tab-qk": "u"})  # a new keymap: the map is built again
        await pilot.press("u")
        await pilot.pause()
        assert screen.active_tab == "qk"
        await settle(pilot, app)
