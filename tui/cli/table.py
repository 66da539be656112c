"""CLI tables that fit the terminal without cutting a number.

Rich shrinks a table wider than the terminal by cutting cells to ``-…``. Here every column
is at least as wide as its widest cell (headers may wrap, cells never), the box is the
light one (fewer border columns), and when the table is still too wide the trailing
columns are left out with a note saying how many and how to see them (``--json``).
"""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from headscope.tui.base.datatext import printable

BORDER = 3  # a column costs its width + 2 padding + 1 rule


def table_width(widths: list[int]) -> int:
    return sum(widths) + BORDER * len(widths) + 1


def fit_columns(columns: list[str], cells: list[list[str]], width: int) -> int:
    """How many leading columns fit in ``width`` with every cell whole (at least 1)."""
    widths = [max([len(row[i]) for row in cells if i < len(row)] + [1])
              for i in range(len(columns))]
    keep = len(columns)
    while keep > 1 and table_width(widths[:keep]) > width:
        keep -= 1
    return keep


def print_table(columns: list[str], cells: list[list[str]], console: Console | None = None) -> None:
    """Print ``cells`` (already formatted) under ``columns``, never cutting a cell. Cells are
    data (token strings, paths): shown literally (``datatext``), never as markup."""
    console = console or Console()
    columns = [printable(str(c)) for c in columns]
    cells = [[printable(str(c)) for c in row] for row in cells]
    keep = fit_columns(columns, cells, console.width)
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for i, name in enumerate(columns[:keep]):
        longest = max([len(row[i]) for row in cells if i < len(row)] + [1])
        t.add_column(Text(name), min_width=longest, overflow="fold")
    for row in cells:
        t.add_row(*(Text(c) for c in row[:keep]))
    console.print(t)
    if keep < len(columns):
        console.print(f"({len(columns) - keep} of {len(columns)} columns left out at "
                      f"{console.width} columns: --json prints them all, or choose fewer "
                      "with --rows/--cols where the command has them)", markup=False,
                      highlight=False)
