"""tui/session/loads.py without Textual: load keys and when a tab is loaded again."""

from __future__ import annotations

from headscope.tui.session.loads import TabLoads, load_key


def test_only_per_head_tabs_carry_the_head() -> None:
    assert load_key("qk", (1, 2), 3, (0, 0)) == ("qk", (1, 2), 3, 0, 0)
    assert load_key("composition", (1, 2), 3, ("k",)) == ("composition", None, 3, "k")


def test_a_tab_is_loaded_again_only_for_another_key_or_when_forced() -> None:
    loads = TabLoads()
    key = load_key("ov", (0, 0), 0)
    assert loads.ask(key) and not loads.ask(key)
    assert loads.ask(key, force=True)
    assert loads.ask(load_key("ov", (0, 1), 0))  # another head
    assert loads.ask(key)


def test_a_cancelled_or_forgotten_load_is_asked_again() -> None:
    loads = TabLoads()
    a, b = load_key("spectrum", (0, 0), 0), load_key("summary", None, 0)
    loads.ask(a)
    loads.ask(b)
    loads.cancelled(load_key("spectrum", (9, 9), 0))  # not the tab's key: no effect
    assert not loads.ask(a)
    loads.cancelled(a)
    assert loads.ask(a)
    loads.forget()
    assert loads.ask(a) and loads.ask(b)
