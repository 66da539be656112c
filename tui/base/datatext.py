"""Data (token strings, paths, names from a checkpoint) made safe to show.

Data is never Rich markup: a vocabulary entry ``[/]`` must not crash a table, ``[unused0]``
(in every BERT vocabulary) must not vanish, ``[link=…]`` must not write a hyperlink. So data
goes into ``rich.text.Text`` (or a plain string for TSV), never into a ``str`` that Rich or
Textual would parse. And control characters never reach the terminal or shift a layout:
``printable`` turns each into one visible cell.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: the CLI's JSON and TSV output never loads Rich
    from rich.table import Table
    from rich.text import Text

# Each C0 control as its Unicode "control picture" (one cell: ␀ ␁ … ␟), DEL as ␡; newline
# and tab as the arrows the heatmaps already use.
_PICTURES = {code: chr(0x2400 + code) for code in range(0x20)}
_PICTURES.update({0x0A: "⏎", 0x09: "⇥", 0x7F: "␡"})
# Other characters that move the cursor, reorder text or take no cell: C1 controls, format
# characters (bidi overrides, zero-width spaces), line/paragraph separators, surrogates.
_INVISIBLE = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
_COMBINING = frozenset({"Mn", "Me"})
REPLACEMENT = "�"


def printable(s: str) -> str:
    """``s`` with every control/format character replaced by one visible character (a
    leading combining mark gets a dotted circle to sit on, so it cannot join the cell
    before it)."""
    if s.isprintable() and not (s and unicodedata.category(s[0]) in _COMBINING):
        return s
    out = []
    for i, ch in enumerate(s):
        code = ord(ch)
        if code in _PICTURES:
            out.append(_PICTURES[code])
        elif unicodedata.category(ch) in _INVISIBLE:
            out.append(REPLACEMENT)
        elif i == 0 and unicodedata.category(ch) in _COMBINING:
            out.append("◌" + ch)
        else:
            out.append(ch)
    return "".join(out)


def data_text(s: object, style: str = "", width: int | None = None) -> Text:
    """``s`` as a ``Text`` (never parsed as markup), made printable and cut to ``width``."""
    from rich.text import Text

    shown = printable(str(s))
    return Text(shown if width is None else shown[:width], style=style)


def tsv_field(s: object) -> str:
    """A TSV cell: printable, so a tab or newline inside a token cannot shift the columns."""
    return printable(str(s))


def data_table(columns: Sequence[object], rows: Sequence[Sequence[object]]) -> Table:
    """A Rich table of data cells: headers and cells are ``Text``, none is markup."""
    from rich.table import Table

    table = Table()
    for column in columns:
        table.add_column(data_text(column))
    for row in rows:
        table.add_row(*(data_text(cell) for cell in row))
    return table
