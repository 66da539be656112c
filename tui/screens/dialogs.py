"""Modal screens: the help screen (every key) and a one-line input dialog."""

from __future__ import annotations

import itertools
from typing import Any, ClassVar

from rich.console import Group
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


# The help screen's sections, in order: the binding ids of each (the rest are "global").
HELP_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Tabs", ("tab-qk", "tab-ov", "tab-spectrum", "tab-prompt", "tab-composition",
              "tab-summary", "tab-changes", "tab-timeline", "tab-patch", "tab-circuit")),
    ("Heads (the tree)", ("prev-head", "next-head", "cycle-filter")),
    ("QK / OV tabs", ("choose-tokens", "toggle-directions", "prev-direction", "next-direction",
                      "prev-source", "next-source", "offset-down", "offset-up", "compare-view")),
    ("Prompt tab", ("edit-prompt", "why", "explain-head", "why-cursor-up", "why-cursor-down",
                    "why-cursor-left", "why-cursor-right")),
    ("Composition and Summary tabs", ("composition", "threshold-down", "threshold-up",
                                      "cycle-sort", "ablation-sweep")),
    ("Patch tab", ("stop-patch",)),
    ("Timeline mode", ("prev-step", "next-step")),
)
GLOBAL_GROUP = "Global"
WIDGETS_GROUP = "Lists, panes and dialogs"


def _group_of(binding_id: str) -> str:
    return next((name for name, ids in HELP_GROUPS if binding_id in ids), GLOBAL_GROUP)


def help_rows(keymap: dict[str, str]) -> list[tuple[str, str, str, str]]:
    """(group, keys, what it does, id) of every binding (after the user's keymap) and of
    the widgets' own keys, grouped by tab, pane and global, in the help screen's order."""
    order = [GLOBAL_GROUP, *(name for name, _ in HELP_GROUPS), WIDGETS_GROUP]
    rows = [(_group_of(b.id or ""), _display(keymap.get(b.id or "", b.key)),
             b.tooltip or b.description, b.id or "") for b in APP_BINDINGS]
    rows += [(WIDGETS_GROUP, keys, what, "") for keys, what in WIDGET_KEYS]
    return sorted(rows, key=lambda row: order.index(row[0]))  # stable: bindings' order kept


def badge_legend(strong: str = "green", mid: str = "yellow") -> Text:
    """What the letters after each head in the tree mean, in the theme's badge colours."""
    text = Text("Head tree badges: ", style="bold")
    for letter, what in (("C", "copying"), ("P", "previous-token"), ("I", "induction"),
                         ("S", "attention sink")):
        text.append(letter, style=f"bold {strong}")
        text.append(f" {what}  ")
    text.append("\n")
    text.append("strong", style=f"bold {strong}")
    text.append(" (score ≥ 0.6), ")
    text.append("middling", style=mid)
    text.append(" (≥ 0.3), · weak; S only where it is there. Δ (compare): the head changed")
    return text


def help_table(keymap: dict[str, str], query: str = "") -> Group:
    """Every binding (after the user's keymap) with its id and what it does, a table per
    group; ``query``: only the rows whose keys, text, id or group contain it (any case)."""
    needle = query.strip().lower()
    parts: list[Any] = []
    for group, rows in itertools.groupby(help_rows(keymap), key=lambda row: row[0]):
        shown = [r for r in rows if not needle or needle in " ".join(r).lower()]
        if not shown:
            continue
        table = Table(box=None, expand=True, padding=(0, 1), show_header=False,
                      title=Text(group, style="bold underline"), title_justify="left")
        table.add_column("key", style="bold", no_wrap=True, min_width=9)
        table.add_column("does")
        table.add_column("id", style="dim", no_wrap=True)
        for _group, keys, what, binding_id in shown:
            table.add_row(data_text(keys), what, binding_id)  # the user's keys: data
        parts.append(table)
    if not parts:
        parts.append(Text(f"no key matches {query.strip()!r}", style="italic"))
    return Group(*parts)


class HelpScreen(ModalScreen[None]):
    AUTO_FOCUS = ""  # nothing focused (None: the app's "*"): keys first: ?/q/escape close, / goes to the filter
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,question_mark,q", "dismiss", "Close", id="help-close",
                tooltip="Close the help screen"),
        Binding("slash", "search", "Filter", id="help-search",
                tooltip="Type to show only the keys that match"),
    ]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical {
        width: 90%; max-width: 100; height: 90%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    HelpScreen #help-title { text-style: bold; width: 100%; }  /* wraps at 80 columns */
    HelpScreen #help-filter { margin: 0; }
    """

    def __init__(self, keymap: dict[str, str]) -> None:
        super().__init__()
        self.keymap = keymap

    def compose(self) -> ComposeResult:
        variables = self.app.theme_variables if self.app else {}
        with Vertical():
            # Text, not a markup string: "[keymap]" would be read as a style tag.
            yield Label(Text("headscope keys  (remap by id: [keymap] in "
                             "~/.config/headscope/config.toml)"), id="help-title")
            yield Input(placeholder="/ filter: a key, a word, a tab…", id="help-filter",
                        compact=True)
            with VerticalScroll():
                yield Static(help_table(self.keymap), id="help-keys")
                yield Static(badge_legend(variables.get("badge-strong", "green"),
                                          variables.get("badge-mid", "yellow")),
                             id="help-badges")
            yield Label(Text("/ filters · escape / ? closes"))


    def action_search(self) -> None:
        self.query_one("#help-filter", Input).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.query_one("#help-keys", Static).update(help_table(self.keymap, event.value))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.set_focus(None)

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
