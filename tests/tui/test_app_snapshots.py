"""Snapshot tests (pytest-textual-snapshot) of the main views at 120×40 and 80×24.

The fake engine (seeded weights) keeps the pictures deterministic and torch-free; the
cursor blink is frozen and every worker (engine calls, chart builds) has finished before
the snapshot. Update with `pytest tests/tui/test_app_snapshots.py --snapshot-update`.
"""

from __future__ import annotations

from typing import Any

import pytest
from textual.widgets import Input

from headscope.tui.app import HeadscopeApp
from headscope.tui.base.settings import Settings
from tests.fake_engine import FakeEngine
from tests.tui.test_app import settle


def make_app() -> HeadscopeApp:
    engine = FakeEngine("sample_models/attn-only-2l")
    return HeadscopeApp(engine.path, engine_factory=lambda _p, _r: engine, settings=Settings(),
                        debounce=0.01, prompt="the cat sat on the mat the cat")


def settle_after(*keys: str) -> Any:
    async def run_before(pilot: Any) -> None:
        app = pilot.app
        for inp in app.query(Input):
            inp.cursor_blink = False
        await settle(pilot, app)
        for key in keys:
            await pilot.press(key)
            await settle(pilot, app)
        app.clear_notifications()
        await pilot.pause(0.05)

    return run_before


@pytest.fixture(autouse=True)
def _no_user_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("HEADSCOPE_CONFIG", str(tmp_path / "none.toml"))


@pytest.mark.parametrize(
    ("view", "keys"),
    [("qk", ()), ("ov", ("2",)), ("spectrum", ("3",)), ("prompt", ("4",)),
     ("composition", ("c", "tab", "down")), ("summary", ("6",))],
)
def test_views_120x40(snap_compare: Any, view: str, keys: tuple[str, ...]) -> None:
    assert snap_compare(make_app(), terminal_size=(120, 40), run_before=settle_after(*keys))


@pytest.mark.parametrize(("view", "keys"), [("qk", ()), ("ov", ("2",))])
def test_views_80x24(snap_compare: Any, view: str, keys: tuple[str, ...]) -> None:
    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=settle_after(*keys))


def test_help_screen(snap_compare: Any) -> None:
    assert snap_compare(make_app(), terminal_size=(120, 40),
                        run_before=settle_after("question_mark"))


def make_compare_app() -> HeadscopeApp:
    """attn-only-2l against a copy with the planted induction head L1.H2 pruned."""
    a = FakeEngine("sample_models/attn-only-2l")
    b = FakeEngine("pruned/attn-only-2l-L1H2").prune(1, 2)
    engines = {a.path: a, b.path: b}
    return HeadscopeApp(a.path, compare=b.path, engine_factory=lambda p, _r: engines[p],
                        settings=Settings(), debounce=0.01)


@pytest.mark.parametrize(("view", "keys"), [("qk-side", ()), ("ov-diff", ("2", "d")),
                                            ("changes", ("7",))])
def test_compare_views_120x40(snap_compare: Any, view: str, keys: tuple[str, ...]) -> None:
    assert snap_compare(make_compare_app(), terminal_size=(120, 40),
                        run_before=settle_after("right_square_bracket", "right_square_bracket",
                                                "right_square_bracket", "right_square_bracket",
                                                "right_square_bracket", "right_square_bracket",
                                                *keys))
