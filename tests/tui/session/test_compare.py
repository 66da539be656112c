"""tui/session/compare.py without Textual: the compare view, the Changes kind and which head
of model B is shown beside A's."""

from __future__ import annotations

from types import SimpleNamespace

from headscope.tui.session.compare import COMPARE_VIEWS, CompareMode


def test_no_path_is_no_compare_mode() -> None:
    mode = CompareMode(None, False, lambda _m: None)
    assert not mode.enabled and mode.head_b((1, 2)) == (1, 2)


def test_views_and_changes_kinds_cycle() -> None:
    mode = CompareMode("b", False, lambda _m: None)
    seen = [mode.next_view() for _ in COMPARE_VIEWS]
    assert seen == [*COMPARE_VIEWS[1:], COMPARE_VIEWS[0]]
    assert [mode.next_changes_kind() or mode.changes_kind for _ in range(3)] == ["v", "q", "k"]


def test_matched_heads_come_from_the_diff_and_are_marked() -> None:
    mode = CompareMode("b", True, lambda _m: None)
    assert mode.head_b((0, 1)) is None  # not matched yet: B waits for the diff
    mode.diff = SimpleNamespace(matching=[[1, 0], [0, 1]])  # type: ignore[assignment]
    assert mode.head_b((0, 1)) == (0, 0) and mode.head_b((1, 1)) == (1, 1)
    assert mode.title_b("full OV", (0, 1)) == "full OV L0.H0 (matched)"
    assert mode.title_b("full OV", (1, 1)) == "full OV L1.H1"


def test_a_failing_factory_is_kept_as_the_error() -> None:
    def factory(path: str, raw: bool) -> object:
        raise ValueError("boom")

    mode = CompareMode("b", False, lambda _m: None)
    mode.open(factory, raw=False)  # type: ignore[arg-type]
    assert mode.engine_b is None and mode.error is not None and "boom" in mode.error


async def test_model_b_follows_a_to_raw_weights_and_its_diff_is_dropped() -> None:
    calls: list[bool] = []

    class EngineB:
        async def set_raw(self, raw: bool) -> None:
            calls.append(raw)

    mode = CompareMode("b", False, lambda _m: None)
    await mode.set_raw(True)  # not open: nothing to do
    mode.engine_b = EngineB()  # type: ignore[assignment]
    mode.diff = SimpleNamespace(matching=None)  # type: ignore[assignment]
    await mode.set_raw(True)
    assert calls == [True] and mode.diff is None
