"""The Summary tab (6): every head with every score, its z against random heads and its
zero-ablation effect, sortable by column.

The scores, null and ablation effects are the explorer's (``tui.session.scores.ScoreBoard``);
the pane draws what ``show`` is given and redraws it when the layout narrows.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from headscope.engine.core.results import (
    HeadScores,
    ScoreNull,
)
from headscope.tui.base.labels import (
    ABLATION,
    ABLATION_LABEL,
    ABLATION_SHORT,
    SCORES,
    SHORT,
    head_name,
    score,
    z_score,
    z_text,
)

if TYPE_CHECKING:
    from headscope.tui.base.protocols import LoadKey, PaneHost


def summary_hints(ablation_label: str) -> tuple[str, str, str]:
    """The Summary's hint lines (before the ablation sweep, after it, the z's), naming the
    ablation column by the label it has on screen."""
    return ((f"{ablation_label}: press a to zero-ablate every head in turn "
             "(the loss it costs on repeated random tokens) · o or a header click: sort"),
            (f"{ablation_label}: loss increase (nats) on repeated random tokens when the "
             "head is zeroed · o or a header click: sort"),
            ("z: how far the score is above random heads of this layer's shapes and norms "
             "(docs/math.md, Calibrated scores)"))


ABLATION_HINT, ABLATION_DONE, Z_HINT = summary_hints(ABLATION_LABEL)
# Below 100 columns (``SummaryPane.compact``): the short labels, and the z's under the scores
# are bare numbers.
COMPACT_HINTS = (*summary_hints(ABLATION_SHORT)[:2],
                 "z, under each score: how far above random heads of this layer's shapes "
                 "and norms (docs/math.md, Calibrated scores)")


class SummaryPane(Vertical):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        # Below 100 columns (set_compact): the nine columns in the ~59 an 80-column terminal
        # leaves (84 with the full labels, padding and three decimals: it scrolled sideways).
        self.compact = False
        self._shown: tuple[Any, ...] | None = None  # show()'s arguments, to redraw

    def compose(self) -> ComposeResult:
        table: DataTable[Any] = DataTable(id="summary-table", cursor_type="row",
                                          zebra_stripes=True)
        yield table
        yield Static(ABLATION_HINT, id="summary-hint", classes="hint")

    def on_mount(self) -> None:
        self._sorted_by: str | None = ""  # no header yet: the first _columns builds it
        self._columns(None)

    def _columns(self, sort: str | None) -> None:
        """(Re)build the header when the sort changes; the sorted column gets a ▼."""
        if sort == self._sorted_by:
            return
        self._sorted_by = sort
        table = self.query_one("#summary-table", DataTable)
        table.clear(columns=True)
        if self.compact:
            # Packed like the Composition tab's edge list: no cell padding, each cell after
            # the first starts with its own separating space (see _score_cell).
            table.cell_padding = 0
            columns = [(key, SHORT[key]) for key, _ in SCORES] + [(ABLATION, ABLATION_SHORT)]
            table.add_column("head", key="head")
            for key, label in columns:
                table.add_column(Text(f" {label}" + (" ▼" if key == sort else ""),
                                      justify="right"), key=key)
            return
        table.cell_padding = 1
        for key, label in (("head", "head"), *SCORES, (ABLATION, ABLATION_LABEL)):
            table.add_column(label + (" ▼" if key == sort else ""), key=key)

    def set_compact(self, compact: bool) -> None:
        """Pack the table below 100 columns (the explorer's layout_for)."""
        if compact == self.compact:
            return
        self.compact = compact
        self._sorted_by = ""  # the header is rebuilt with the other labels
        if self._shown is not None:
            self.show(*self._shown)
        elif self.is_mounted:
            self._columns(None)

    def show(self, rows: list[HeadScores], ablation: list[float] | None = None,
             sort: str | None = None, null: ScoreNull | None = None) -> None:
        """One row per head; ``ablation`` (aligned with ``rows``) once the sweep has run;
        ``sort``: the column the rows are sorted by; with the ``null``, each score's z
        under it (two-line rows)."""
        self._shown = (rows, ablation, sort, null)
        table = self.query_one("#summary-table", DataTable)
        self._columns(sort)
        table.clear()
        compact = self.compact
        for i, r in enumerate(rows):
            cells = [_score_cell(score(r, k), z_score(null, r, k) if null else None,
                                 compact=compact) for k, _ in SCORES]
            cells.append(_ablation_cell(math.nan if ablation is None else ablation[i],
                                        compact=compact))
            table.add_row(head_name(r.layer, r.head) + (" NaN!" if r.nonfinite else ""), *cells,
                          key=f"{r.layer}.{r.head}", height=2 if null else 1)
        hints = COMPACT_HINTS if compact else (ABLATION_HINT, ABLATION_DONE, Z_HINT)
        hint = hints[0] if ablation is None else hints[1]
        self.query_one("#summary-hint", Static).update(
            hint if null is None else f"{hint}\n{hints[2]}")

    async def load(self, host: PaneHost, key: LoadKey) -> None:
        if host.has_scores:
            host.show_summary()


def _ablation_cell(v: float, *, compact: bool = False) -> Text:
    """Nats: a head the model cannot do without costs ≥ 0.5; most cost a few hundredths
    (three decimals, narrow too). ``compact``: with the space that separates it."""
    gap = " " if compact else ""
    if not math.isfinite(v):
        return Text(f"{gap}—", style="dim", justify="right")
    style = "bold" if v >= 0.5 else ("" if v >= 0.1 else "dim")
    return Text(f"{gap}{v:+.3f}", style=style, justify="right")


def _score_cell(v: float, z: float | None = None, *, compact: bool = False) -> Text:
    """The score; with ``z`` (the null is known), its z on a second line ("—" unknown).
    ``compact`` (below 100 columns): two decimals, the z without its ``z=`` (the hint says
    what the second line is), each line starting with the space that separates the cell
    from the one before."""
    gap = " " if compact else ""
    if not math.isfinite(v):
        text = Text(f"{gap}—", style="dim", justify="right")
    else:
        style = "bold" if v >= 0.6 else ("" if v >= 0.3 else "dim")
        text = Text(f"{gap}{v:{'+.2f' if compact else '+.3f'}}", style=style, justify="right")
    if z is not None:
        shown = z_text(z)
        text.append("\n" + gap)
        text.append((shown.removeprefix("z=") if compact else shown) or "—", style="dim")
    return text
