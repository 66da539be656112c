"""The UI's structural protocols name what each part needs from the one above it (so nothing
imports upward, docs/internals.md "The explorer"); these checks keep them true: every member a
protocol names exists on the class that plays it, so a rename cannot leave a pane or a mode
calling something that is gone."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from headscope.tui.app import HeadscopeApp
from headscope.tui.base.protocols import CompareSide, PaneChoices, PaneHost, TimelineSource
from headscope.tui.screens.explorer import ExplorerHost, ExplorerScreen
from headscope.tui.screens.palette import PaletteHost
from headscope.tui.screens.timeline import TimelineExplorer, TimelineHost, TimelineMode
from headscope.tui.session.choices import ViewChoices
from headscope.tui.session.compare import CompareMode


def members(protocol: type) -> set[str]:
    """Methods, properties and annotated attributes a protocol declares."""
    names = {n for n, v in vars(protocol).items()
             if not n.startswith("_") and (callable(v) or isinstance(v, property))}
    return names | set(getattr(protocol, "__annotations__", {}))


def instance_attributes(cls: type, *args: Any, **kwargs: Any) -> set[str]:
    obj = cls(*args, **kwargs)
    return set(dir(obj)) | set(vars(obj))


@pytest.mark.parametrize(("protocol", "cls", "args"), [
    (PaneHost, ExplorerScreen, ()),
    (TimelineExplorer, ExplorerScreen, ()),
    (PaneChoices, ViewChoices, ()),
    (CompareSide, CompareMode, (None, False, print)),
    (TimelineSource, TimelineMode, ()),
    (ExplorerHost, HeadscopeApp, ()),
    (TimelineHost, HeadscopeApp, ()),
    (PaletteHost, HeadscopeApp, ()),
])
def test_the_class_that_plays_a_protocol_has_every_member(protocol: type, cls: type,
                                                          args: tuple[Any, ...]) -> None:
    have = instance_attributes(cls, *args)
    missing = sorted(members(protocol) - have)
    assert not missing, f"{cls.__name__} lacks {missing} of {protocol.__name__}"


def test_pane_host_methods_keep_their_parameters() -> None:
    for name in ("fresh", "keep_result", "sweep_progress", "show_summary", "report"):
        want = list(inspect.signature(getattr(PaneHost, name)).parameters)
        have = list(inspect.signature(getattr(ExplorerScreen, name)).parameters)
        assert have == want, name
