"""The Timeline tab: every head's scores across the steps of a series, and the phase changes.

One row per head, one sparkline per score (the five of ``headscope heads``; a narrow pane
keeps induction, previous-token, copying, ... first), sized to the pane: a block character per step when there is room, else braille (two steps per character),
else sampled. Each score's sparklines share one scale (that score's range over every head and
step), so rows compare. The step shown is highlighted on every sparkline and the values are
that step's; a phase change (docs/math.md "Training dynamics") is marked on its sparkline
and listed below (enter on a row: that head at that step). The data comes from timeline
mode (tui/screens/timeline.py, its state in tui/session/timeline.py) through the pane's host
(``PaneHost.timeline``); this pane asks the engine for nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import DataTable, Static

from headscope.tui.base.messages import PhaseChangeChosen, TimelineComputed

if TYPE_CHECKING:
    from headscope.engine.api.timeline import Timeline
    from headscope.tui.base.protocols import LoadKey, PaneHost, TimelineSource

BLOCKS = "▁▂▃▄▅▆▇█"
# Braille dots filled bottom-up: the left column (steps 2i), the right column (2i + 1).
BRAILLE_LEFT = (0x40, 0x04, 0x02, 0x01)
BRAILLE_RIGHT = (0x80, 0x20, 0x10, 0x08)
TIMELINE_SCORES = (("copying_score", "copying"), ("qk_positivity", "QK+"),
                   ("prev_token_score", "prev-token"), ("duplicate_token_score", "dup-token"),
                   ("induction_score", "induction"))
LABEL_WIDTH = 7  # "L11.H11"
VALUE_WIDTH = 6  # " +0.95"
GAP = 2
Cell = tuple[str, tuple[int, ...]]  # a character and the step indices it shows


def _level(v: float, low: float, high: float, levels: int) -> int | None:
    if not math.isfinite(v):
        return None
    span = high - low
    frac = 0.0 if span <= 0 else (v - low) / span
    return max(0, min(levels - 1, round(frac * (levels - 1))))


def sparkline_cells(values: Sequence[float], width: int, low: float, high: float) -> list[Cell]:
    """The sparkline of ``values`` in at most ``width`` characters, each with its steps."""
    n = len(values)
    width = max(1, width)
    if n <= width:
        return [(("·" if (lv := _level(v, low, high, len(BLOCKS))) is None else BLOCKS[lv]), (i,))
                for i, v in enumerate(values)]
    if (n + 1) // 2 <= width:
        index = list(range(n))
    else:  # sampled: 2 × width evenly spaced steps, in braille
        index = sorted({round(i * (n - 1) / (2 * width - 1)) for i in range(2 * width)})
    cells = []
    for start in range(0, len(index), 2):
        pair = index[start:start + 2]
        code = 0x2800
        finite = False
        for dots, i in zip((BRAILLE_LEFT, BRAILLE_RIGHT), pair, strict=False):
            lv = _level(values[i], low, high, len(dots))
            if lv is not None:
                finite = True
                for d in dots[:lv + 1]:
                    code |= d
        covered = tuple(range(pair[0], (index[start + 2] if start + 2 < len(index) else n)))
        cells.append((chr(code) if finite else "·", covered))
    return cells


def score_ranges(t: Timeline) -> dict[str, tuple[float, float]]:
    """Each score's range over every head and step (one scale per score column)."""
    ranges = {}
    for key, _ in TIMELINE_SCORES:
        finite = t.series[key][np.isfinite(t.series[key])]
        ranges[key] = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
    return ranges


MIN_SPARK = 6
# Which scores a narrow pane keeps first (shown in TIMELINE_SCORES order).
PRIORITY = ("induction_score", "prev_token_score", "copying_score", "qk_positivity",
            "duplicate_token_score")


def fitting_scores(pane_width: int) -> tuple[tuple[str, str], ...]:
    """The score columns a pane ``pane_width`` wide holds, by ``PRIORITY``, in table order."""
    room = (pane_width - LABEL_WIDTH - 1) // (MIN_SPARK + VALUE_WIDTH + GAP)
    keep = set(PRIORITY[:max(1, room)])
    return tuple((k, title) for k, title in TIMELINE_SCORES if k in keep)


def spark_width(pane_width: int, n_scores: int = len(TIMELINE_SCORES)) -> int:
    """Characters per sparkline in a pane ``pane_width`` wide with ``n_scores`` columns."""
    per_score = (pane_width - LABEL_WIDTH - 1) // max(1, n_scores)
    return max(MIN_SPARK, per_score - VALUE_WIDTH - GAP)


def change_steps(t: Timeline) -> dict[tuple[int, int, str], int]:
    """(layer, head, score) → the step index of its phase change."""
    return {(c["layer"], c["head"], c["score"]): t.steps.index(c["step"])
            for c in t.phase_changes if c["step"] in t.steps}


def grid_text(t: Timeline, index: int, width: int, focused: tuple[int, int] | None,
              mark: str = "yellow") -> Text:
    """The header row and one row per head: a sparkline and the value at step ``index`` per
    score; the step shown is reversed, a phase change is ``mark``-coloured and bold."""
    shown = fitting_scores(width)
    sw = spark_width(width, len(shown))
    ranges = score_ranges(t)
    changes = change_steps(t)
    text = Text(no_wrap=True, overflow="crop")
    text.append("head".ljust(LABEL_WIDTH + 1), style="bold")
    for _, title in shown:
        text.append(title[:sw + VALUE_WIDTH].ljust(sw + VALUE_WIDTH + GAP), style="bold")
    for layer in range(t.n_layers):
        for head in range(t.n_heads):
            text.append("\n")
            label = f"L{layer}.H{head}"
            text.append(label.ljust(LABEL_WIDTH), style="bold reverse" if (layer, head) == focused
                        else "bold")
            text.append(" ")
            for key, _ in shown:
                values = t.head_series(layer, head, key)
                changed = changes.get((layer, head, key))
                cells = sparkline_cells(values, sw, *ranges[key])
                for char, covered in cells:
                    style = ""
                    if changed is not None and changed in covered:
                        style = f"bold {mark}"
                    if index in covered:
                        style = (style + " reverse").strip()
                    text.append(char, style=style or None)
                pad = sw - len(cells)
                v = values[index]
                text.append(" " * pad + (f" {v:+.2f}" if math.isfinite(v) else "   nan"))
                text.append(" " * GAP)
    return text


def model_line(t: Timeline) -> str:
    m = t.model_phase_change
    if m is None:
        return "no phase change: no score jumped within a short window of steps"
    heads = ", ".join(f"L{layer}.H{head}" for layer, head in m["heads"])
    return f"model: most heads changing at step {m['step']} ({m['n_heads']}: {heads})"


class TimelinePane(Vertical):
    """The Timeline tab (timeline mode only)."""

    DEFAULT_CSS = """
    TimelinePane { height: 1fr; }
    /* up to two lines: at 80 columns the keys ("{ } step · enter…", now "{/}": a wrap
       never splits it) and the heads of the model's phase change were cut */
    TimelinePane #timeline-header { height: auto; max-height: 2; }
    TimelinePane #timeline-scroll { height: auto; max-height: 60%; }
    TimelinePane #timeline-grid { height: auto; }
    TimelinePane #timeline-model { height: auto; max-height: 2; margin-top: 1; }
    TimelinePane #timeline-changes { height: 1fr; }
    """

    def compose(self) -> ComposeResult:
        yield Static("scoring the steps…", id="timeline-header")
        with VerticalScroll(id="timeline-scroll"):
            yield Static("", id="timeline-grid")
        yield Static("", id="timeline-model")
        table: DataTable[Any] = DataTable(id="timeline-changes", cursor_type="row",
                                          zebra_stripes=True)
        yield table

    def on_mount(self) -> None:
        self.host = cast("PaneHost", self.screen)
        table = self.query_one("#timeline-changes", DataTable)
        for title in ("head", "score", "step", "before → after", "window"):
            table.add_column(title, key=title)

    # The screen this pane is on (the explorer), as a pane's host: set when mounted.
    host: PaneHost | None = None

    async def load(self, host: PaneHost, key: LoadKey) -> None:
        self.host = host
        self.redraw()

    def on_resize(self) -> None:
        self.redraw()

    @on(TimelineComputed)
    def _computed(self, msg: TimelineComputed) -> None:
        self._fill_changes(msg.timeline)
        self.redraw()

    def failed(self, error: str) -> None:
        self.query_one("#timeline-header", Static).update(Text(error, style="bold red"))

    def redraw(self) -> None:
        """The header and the sparklines at the step shown (cheap: text only)."""
        if self.host is None:
            return
        mode: TimelineSource = self.host.timeline
        header = self.query_one("#timeline-header", Static)
        t = mode.timeline
        if t is None:
            if mode.error is None:
                header.update(Text(f"scoring the steps… {mode.done}/{len(mode.sources)} "
                                   "(the other tabs work meanwhile)"))
            return
        if self._filled_for is not t:  # the TimelineComputed message may predate this pane
            self._fill_changes(t)
        head = Text()
        head.append(f"step {mode.step} ", style="bold")
        head.append(f"({mode.index + 1} of {len(t.steps)}: {t.steps[0]} … {t.steps[-1]}) · ")
        head.append("▮", style="reverse")
        head.append(" shown · ")
        head.append("▮", style=f"bold {self._mark()}")
        head.append(" phase change · {/} step · enter: go to a change")
        header.update(head)
        width = self.query_one("#timeline-scroll").size.width or self.size.width or 100
        grid = grid_text(t, mode.index, width, self.host.head, self._mark())
        self.query_one("#timeline-grid", Static).update(grid)
        self.query_one("#timeline-model", Static).update(Text(model_line(t)))

    def _mark(self) -> str:
        theme = getattr(self.app, "current_theme", None)
        return getattr(theme, "warning", None) or "yellow"

    _filled_for: Timeline | None = None  # the timeline whose changes the table lists

    def _fill_changes(self, t: Timeline) -> None:
        self._filled_for = t
        table = self.query_one("#timeline-changes", DataTable)
        table.clear()
        titles = dict(TIMELINE_SCORES)
        for i, c in enumerate(t.phase_changes):
            table.add_row(
                Text(f"L{c['layer']}.H{c['head']}"), Text(titles.get(c["score"], c["score"])),
                Text(str(c["step"])), Text(f"{c['before']:+.2f} → {c['after']:+.2f}"),
                Text(f"{c['start_step']}–{c['end_step']}"), key=str(i))

    @on(DataTable.RowSelected, "#timeline-changes")
    def _change_selected(self, event: DataTable.RowSelected) -> None:
        """Enter on a phase change: focus its head and show its step."""
        event.stop()
        t = self.host.timeline.timeline if self.host is not None else None
        if t is None or event.row_key.value is None:
            return
        c = t.phase_changes[int(event.row_key.value)]
        self.post_message(PhaseChangeChosen((c["layer"], c["head"]), t.steps.index(c["step"])))
