"""CLI tables that fit the terminal without cutting a number.

Rich shrinks a table wider than the terminal by cutting cells to ``-…``. Here every column
is at least as wide as its widest cell (headers may wrap after a ``_``, never inside a word;
cells never wrap), the box is the
light one (fewer border columns), and when the table is still too wide the trailing
columns are left out with a note saying how many and how to see them (``--json``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from headscope.tui.base.datatext import printable

if TYPE_CHECKING:
    from rich.console import Console

BORDER = 3  # a column costs its width + 2 padding + 1 rule


def table_width(widths: list[int]) -> int:
    return sum(widths) + BORDER * len(widths) + 1


# Short forms of the score names' long words, used only when the table is too wide for
# whole headers and a word is wider than its column's numbers (TSV and --json keep the names).
ABBREVIATIONS = {"positivity": "posit", "duplicate": "dup", "attention": "attn",
                 "delimiter": "delim", "induction": "induct", "ablation": "ablat"}


def header_parts(name: str) -> list[str]:
    """Where a header may wrap: after each ``_`` (``copying_`` ``score``), never inside a
    word (Rich's own folding gave ``copying_sc``/``ore``)."""
    return [p for p in re.split(r"(?<=_)", name) if p]


def abbreviate(name: str, width: int) -> str:
    """``name`` with each word wider than ``width`` shortened (``ABBREVIATIONS``)."""
    parts = header_parts(name)
    out = []
    for part in parts:
        word = part.rstrip("_")
        if len(word) > width and word in ABBREVIATIONS:
            part = ABBREVIATIONS[word] + part[len(word):]
        out.append(part)
    return "".join(out)


def wrap_header(name: str, width: int) -> str:
    """``name`` on lines of at most ``width`` (longer only where one word is), split after ``_``."""
    lines: list[str] = []
    for part in header_parts(name):
        if lines and len(lines[-1]) + len(part) <= width:
            lines[-1] += part
        else:
            lines.append(part)
    return "\n".join(lines)


class Items(list[str]):
    """A cell of several items (a direction's tokens): in a terminal table, packed on as many
    lines as the width left to its column needs, never split inside an item; in TSV, the
    items joined by spaces (``output.format_cell``)."""


def cell_width(cell: str | Items) -> int:
    """What a cell needs at least: the whole of a plain cell, the widest item of ``Items``."""
    return max(map(len, cell), default=0) if isinstance(cell, Items) else len(cell)


def pack(items: Items, width: int) -> str:
    """``items`` separated by spaces, on lines of at most ``width`` (an item longer than that
    on a line of its own)."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + 1 + len(item) <= width:
            lines[-1] += " " + item
        else:
            lines.append(item)
    return "\n".join(lines)


def item_widths(widths: list[int], cells: list[list[str | Items]], width: int) -> list[int]:
    """``widths`` with the ``Items`` columns widened to share what is left of ``width``
    (each up to the length of its longest cell on one line)."""
    packed = {i for row in cells for i, c in enumerate(row[:len(widths)]) if isinstance(c, Items)}
    whole = {i: max(len(" ".join(row[i])) for row in cells if i < len(row)) for i in packed}
    widths = list(widths)
    left = width - table_width(widths)
    while left > 0:  # share out evenly; what one column cannot use goes to the others
        hungry = [i for i in sorted(packed) if widths[i] < whole[i]]
        if not hungry:
            break
        share = max(1, left // len(hungry))
        for i in hungry:
            grow = min(share, whole[i] - widths[i], left)
            widths[i] += grow
            left -= grow
    return widths


def column_widths(columns: list[str], cells: list[list[str | Items]], wrap: bool) -> list[int]:
    """Each column's width: its widest cell (an ``Items`` cell: its widest item), and its
    header's widest word (``wrap``) or the whole header."""
    return [max([cell_width(row[i]) for row in cells if i < len(row)]
                + [max(map(len, header_parts(name))) if wrap else len(name), 1])
            for i, name in enumerate(columns)]


def fit_columns(columns: list[str], cells: list[list[str | Items]], width: int) -> int:
    """How many leading columns fit in ``width`` with every cell and header word whole (at
    least 1)."""
    widths = column_widths(columns, cells, wrap=True)
    keep = len(columns)
    while keep > 1 and table_width(widths[:keep]) > width:
        keep -= 1
    return keep


def print_table(columns: list[str], cells: list[list[str | Items]], console: Console | None = None,
                fewer: str | None = None) -> None:
    """Print ``cells`` (already formatted) under ``columns``, never cutting a cell. Cells are
    data (token strings, paths): shown literally (``datatext``), never as markup. ``fewer``:
    the command's options that choose fewer columns (``--cols``), named when some are left
    out."""
    from rich import box  # Rich only for a terminal (TSV and JSON start faster)
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    columns = [printable(str(c)) for c in columns]
    cells = [[Items(printable(str(i)) for i in c) if isinstance(c, Items) else printable(str(c))
              for c in row] for row in cells]
    # headers on one line when the whole table fits so, else wrapped after their `_`s, their
    # long words shortened where wider than the column's numbers
    if table_width(column_widths(columns, cells, wrap=False)) > console.width:
        cell_widths = column_widths(["" for _ in columns], cells, wrap=False)
        columns = [abbreviate(name, w) for name, w in zip(columns, cell_widths, strict=True)]
    keep = fit_columns(columns, cells, console.width)
    wrap = table_width(column_widths(columns[:keep], cells, wrap=False)) > console.width
    widths = item_widths(column_widths(columns[:keep], cells, wrap=wrap), cells, console.width)
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name, width in zip(columns[:keep], widths, strict=True):
        t.add_column(Text(wrap_header(name, width)), min_width=width, overflow="fold")
    for row in cells:
        t.add_row(*(Text(pack(c, w) if isinstance(c, Items) else c)
                    for c, w in zip(row[:keep], widths, strict=False)))
    console.print(t)
    if keep < len(columns):
        choose = f", or choose fewer with {fewer}" if fewer else ""
        console.print(f"({len(columns) - keep} of {len(columns)} columns left out at "
                      f"{console.width} columns: --json prints them all{choose})", markup=False,
                      highlight=False)
