"""tui/session/focus.py without Textual: the focused head, the debounced cursor move, the
first head and stepping across layers."""

from __future__ import annotations

from headscope.tui.session.focus import HeadFocus


def test_a_highlighted_head_waits_until_due_and_not_when_already_focused() -> None:
    f = HeadFocus()
    assert not f.waiting and f.due() is None
    f.pending = (0, 1)
    assert f.waiting and f.due() == (0, 1)
    f.head = (0, 1)
    assert not f.waiting and f.due() is None  # already focused: nothing to do


def test_the_first_head_is_the_one_asked_for_if_the_model_has_it() -> None:
    assert HeadFocus().first(2, 3) == ((0, 0), None)
    assert HeadFocus((1, 2)).first(2, 3) == ((1, 2), None)
    head, why = HeadFocus((5, 0)).first(2, 3)
    assert head == (0, 0) and why is not None and "L5.H0" in why and "2 layers × 3 heads" in why


def test_stepping_crosses_layers_and_wraps() -> None:
    f = HeadFocus()
    assert f.stepped(1, 2, 3) == (0, 0)  # nothing focused: the first head, either way
    assert f.stepped(-1, 2, 3) == (0, 0)
    f.head = (0, 2)
    assert f.stepped(1, 2, 3) == (1, 0)
    f.head = (1, 2)
    assert f.stepped(1, 2, 3) == (0, 0)
    assert f.stepped(-4, 2, 3) == (0, 1)


def test_stepping_goes_on_from_the_head_waiting_for_its_debounce() -> None:
    f = HeadFocus()
    f.head = (0, 0)
    f.pending = (0, 2)  # two `]` pressed, the debounce still running
    assert f.target == (0, 2) and f.stepped(-1, 2, 3) == (0, 1)
    f.head = (0, 2)  # the debounce ran out: the pending head is focused
    assert f.target == (0, 2) and f.stepped(1, 2, 3) == (1, 0)
    f.pending = None  # the cursor left the heads (an MLP): from the focused head
    assert f.target == (0, 2) and f.stepped(1, 2, 3) == (1, 0)
