"""Data made safe to show (tui/base/datatext.py): token strings and paths are never Rich
markup, and no control or format character reaches the terminal (each is one visible cell)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from headscope.tui.base.datatext import REPLACEMENT, data_table, data_text, printable, tsv_field


def test_printable_strings_are_unchanged() -> None:
    for s in ("the", " Mary", "ĠJohn", "[unused0]", "日本", ""):
        assert printable(s) == s


@pytest.mark.parametrize(("raw", "shown"), [
    ("a\nb", "a⏎b"), ("a\tb", "a⇥b"), ("\x00", "␀"), ("\x1b[31m", "␛[31m"), ("x\x7f", "x␡"),
    ("\u202eabc", REPLACEMENT + "abc"),  # a bidi override would reorder what follows
    ("a\u200bb", "a" + REPLACEMENT + "b"),  # a zero-width space takes no cell
    ("\x85", REPLACEMENT),  # a C1 control
    ("\u0301e", "◌\u0301e"),  # a leading combining mark gets a circle to sit on
])
def test_each_control_or_format_character_is_one_visible_character(raw: str, shown: str) -> None:
    assert printable(raw) == shown
    assert printable(raw).isprintable()


def test_a_combining_mark_after_a_letter_stays_on_it() -> None:
    assert printable("e\u0301") == "e\u0301"


@pytest.mark.parametrize("token", ["[/]", "[unused0]", "[link=https://x.invalid]x[/link]", "[bold]b"])
def test_markup_looking_data_is_shown_literally(token: str) -> None:
    assert data_text(token).plain == token
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(data_table(["token"], [[token]]))
    assert token in out.getvalue()


def test_data_text_is_cut_to_its_width_after_being_made_printable() -> None:
    assert data_text("a\nbcdef", width=3).plain == "a⏎b"
    assert data_text(12345, style="bold").plain == "12345"
    assert str(data_text("x", style="bold").style) == "bold"


def test_a_tsv_field_holds_no_tab_or_newline() -> None:
    field = tsv_field("a\tb\nc")
    assert "\t" not in field and "\n" not in field
    assert "\t".join([tsv_field("x\ty"), tsv_field(3)]).split("\t") == ["x⇥y", "3"]
