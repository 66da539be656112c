"""Modal screens: the help screen (every key) and a one-line input dialog."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Label, Static

from headscope.tui.base.datatext import data_text
from headscope.tui.base.keymap import APP_BINDINGS, WIDGET_KEYS


def _display(keys: str) -> str:
    names = {"question_mark": "?", "left_square_bracket": "[", "right_square_bracket": "]",
             "slash": "/", "comma": ",", "full_stop": ".", "minus": "-",
             "equals_sign": "=", "plus": "+", "less_than_sign": "<", "greater_than_sign": ">",
             "left_parenthesis": "(", "right_parenthesis": ")",
             "left_curly_bracket": "{", "right_curly_bracket": "}"}
    return " / ".join(names.get(k.strip(), k.strip()) for k in keys.split(","))


def help_table(keymap: dict[str, str]) -> Table:
    """Every binding (after the user's keymap) with its id and what it does."""
    table = Table(box=None, expand=True, padding=(0, 1))
    table.add_column("key", style="bold", no_wrap=True)
    table.add_column("does")
    table.add_column("id", style="dim", no_wrap=True)
    for b in APP_BINDINGS:
        keys = keymap.get(b.id or "", b.key)
        table.add_row(data_text(_display(keys)), b.tooltip or b.description, b.id or "")  # user's keys
    for keys, what in WIDGET_KEYS:
        table.add_row(keys, what, "")
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,question_mark,q", "dismiss", "Close", id="help-close",
                tooltip="Close the help screen"),
    ]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical {
        width: 90%; max-width: 100; height: 90%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    HelpScreen #help-title { text-style: bold; width: 100%; }  /* wraps at 80 columns */
    """

    def __init__(self, keymap: dict[str, str]) -> None:
        super().__init__()
        self.keymap = keymap

    def compose(self) -> ComposeResult:
        with Vertical():
            # Text, not a markup string: "[keymap]" would be read as a style tag.
            yield Label(Text("headscope keys  (remap by id: [keymap] in "
                             "~/.config/headscope/config.toml)"), id="help-title")
            with VerticalScroll():
                yield Static(help_table(self.keymap), id="help-keys")
            yield Label(Text("escape / ? closes", style="dim"))

    def action_dismiss(self, result: None = None) -> None:  # type: ignore[override]
        self.dismiss(None)


class InputScreen(ModalScreen[str | None]):
    """Ask for one line (token set, output directory); escape cancels."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel", id="input-cancel",
                        tooltip="Close the dialog without changing anything")]
    DEFAULT_CSS = """
    InputScreen { align: center middle; }
    InputScreen > Vertical {
        width: 80%; max-width: 90; height: auto;
        border: round $primary; background: $surface; padding: 0 1;
    }
    """

    def __init__(self, title: str, value: str = "", placeholder: str = "", hint: str = "") -> None:
        super().__init__()
        self.title_text = title
        self.value = value
        self.placeholder = placeholder
        self.hint = hint

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.title_text)
            yield Input(self.value, placeholder=self.placeholder, id="dialog-input")
            if self.hint:
                yield Label(Text(self.hint, style="dim"))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)
