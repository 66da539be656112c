"""The explorer's first frame: what is opened, and the keys, drawn before the explorer exists.

``headscope PATH`` paints this screen with nothing but Textual imported (no numpy, plotext or
engine; tests/tui/screens/test_opening.py checks it): the status bar names the model and says it is
opening, the footer shows the explorer's keys (greyed out until the explorer is up: ``q``,
``?`` and ``t`` already work). The app then imports the explorer off the UI thread, reads the
checkpoint's header and pushes the explorer over this screen (tui/app.py,
``HeadscopeApp._load_explorer``): docs/internals.md, "First frame"; timings in bench/README.md.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer, Static

from headscope.tui.base.datatext import printable
from headscope.tui.widgets.status import SPINNER

BODY = ("The head tree (from the checkpoint's header) and the views come next; the model's "
        "weights open after them. The keys below light up with the explorer; the help and "
        "quit keys work already.")
# The app's own actions that work before the explorer is up; the others wait for it.
READY_ACTIONS = frozenset({"quit", "help", "cycle_theme", "command_palette", "screenshot_svg",
                           "choose_output_dir"})


def opening_text(path: str, *, raw: bool, compare: str | None, frame: int = 0,
                 width: int = 120) -> Text:
    """The status bar's two lines while the model opens (the explorer's StatusBar layout)."""
    name = printable(Path(path).name or path)
    top = Text()
    top.append(f"headscope · {name} ", style="bold")
    if compare:
        top.append(f"vs {printable(Path(compare).name or compare)}", style="bold reverse")
        top.append(" ")
    top.append("│ ", style="dim")
    top.append("raw" if raw else "processed", style="reverse bold" if raw else "reverse")
    top.append(" ")
    top.append("│ reading the header…", style="dim")
    top.truncate(max(width, 10), overflow="ellipsis")
    bottom = Text()
    bottom.append(SPINNER[frame % len(SPINNER)] + " ")
    bottom.append(f"opening {printable(path)}")
    if compare:
        bottom.append(f" and {printable(compare)}")
    bottom.append(" …")
    bottom.truncate(max(width, 10), overflow="ellipsis")
    return Text("\n").join([top, bottom])


class OpeningScreen(Screen[None]):
    """The first screen: the status bar (model, opening…) and the footer."""

    DEFAULT_CSS = """
    OpeningScreen #opening-status { height: 2; padding: 0 1; background: $panel; }
    OpeningScreen #opening-body { height: 1fr; padding: 1 2; color: $text-muted; }
    """

    def __init__(self, path: str, *, raw: bool = False, compare: str | None = None) -> None:
        super().__init__(id="opening")
        self.path, self.raw, self.compare = path, raw, compare
        self.frame = 0

    def compose(self) -> ComposeResult:
        yield Static(self._text(), id="opening-status")
        yield Static(BODY, id="opening-body", markup=False)
        yield Footer()

    def when_drawn(self, then: Callable[[], None], tries: int = 50) -> None:
        """Call ``then`` once this screen is painted with the footer's keys (Textual fills the
        footer a frame or two after the first, and the explorer's import would hold that
        back), or after ~0.5 s whatever the footer does."""
        footers = self.query(Footer)
        if tries <= 0 or (footers and footers.first().children):
            self.app.call_after_refresh(then)
        else:
            self.set_timer(0.01, lambda: self.when_drawn(then, tries - 1))

    def on_mount(self) -> None:
        self._spinner = self.set_interval(0.15, self._tick)

    def on_screen_suspend(self) -> None:  # the explorer (or the help) over this screen
        self._spinner.pause()

    def on_screen_resume(self) -> None:
        if hasattr(self, "_spinner"):
            self._spinner.resume()

    def _text(self) -> Text:
        return opening_text(self.path, raw=self.raw, compare=self.compare, frame=self.frame,
                            width=self.app.size.width - 2)

    def _tick(self) -> None:
        self.frame += 1
        self.query_one("#opening-status", Static).update(self._text())

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The explorer's keys (``screen.…`` actions) are shown, greyed out, until it is up."""
        return None
