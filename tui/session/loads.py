"""Which load each tab shows or waits for (docs/internals.md, "The explorer"). No Textual.

A load is tagged with a key: ``(tab, head or None, weights generation, what else the tab
shows)``. A tab is loaded again only when its key changed (or when forced); a result whose
key is no longer its tab's is dropped by the pane (``PaneHost.fresh``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from headscope.tui.base.protocols import LoadKey

Head = tuple[int, int]
PER_HEAD = ("qk", "ov", "spectrum", "prompt")  # the tabs that show the focused head


def load_key(tab: str, head: Head | None, gen: int, extra: Sequence[Any] = ()) -> LoadKey:
    """The key of a load of ``tab``: the focused head only for the tabs that show it."""
    return (tab, head if tab in PER_HEAD else None, gen, *extra)


class TabLoads:
    """The key each tab last asked for."""

    def __init__(self) -> None:
        self._asked: dict[str, LoadKey] = {}

    def ask(self, key: LoadKey, force: bool = False) -> bool:
        """Whether ``key`` must be loaded (its tab asked for another key, or ``force``);
        if so it is now the tab's."""
        tab = key[0]
        if not force and self._asked.get(tab) == key:
            return False
        self._asked[tab] = key
        return True

    def cancelled(self, key: LoadKey) -> None:
        """The load of ``key`` was cancelled: asked again at the next load of its tab."""
        if self._asked.get(key[0]) == key:
            del self._asked[key[0]]

    def forget(self) -> None:
        """Everything is to be loaded again (the weights changed)."""
        self._asked.clear()
