"""The explorer's footer: Textual's, with one-word keys below 100 columns.

At 80 columns the full footer (``[ Prev head``, ``v Directions``, … ``e Export``) ran past the
edge and lost its last keys mid-word (issue 39 §3). Narrow, each key keeps a one-word
description and the keys that matter least on a small screen (tokens, theme, screenshot, and
c: the tab strip shows ``5 Comp``) leave the footer; every key stays in ``?`` and works as
before.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

# By action (a user keymap changes keys, not actions); None: not in the narrow footer.
NARROW_DESCRIPTIONS: dict[str, str | None] = {
    "screen.step_head(-1)": "Prev",
    "screen.step_head(1)": "Next",
    "screen.toggle_directions": "Dirs",
    "screen.choose_tokens": None,
    "screen.composition": None,  # the tab strip's `5 Comp` does it; its room went to `z Zoom`
    "screen.toggle_raw": "Raw",
    "cycle_theme": None,
    "screenshot_svg": None,
    "leave_input": "Back",
}


class ExplorerFooter(Footer):
    """``narrow``: the short footer (set by the explorer's layout, recomposed on change)."""

    def __init__(self, *, narrow: bool = False, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.narrow = narrow

    def set_narrow(self, narrow: bool) -> None:
        if narrow != self.narrow:
            self.narrow = narrow
            self.refresh(recompose=True)

    def compose(self) -> ComposeResult:
        for widget in super().compose():
            if self.narrow and isinstance(widget, FooterKey):
                short = NARROW_DESCRIPTIONS.get(widget.action, widget.description)
                if short is None:
                    continue
                widget.description = short
            yield widget
