"""Compare mode: model A explored with model B alongside.

``headscope A --compare B`` opens both engines; ``Engine.compare`` runs
``engine.api.diff.diff_models`` on A's worker pool and returns a ``ModelDiff``. This module reads
that result for the views (per-head change, the biggest-changes rows, the composition-graph
diff) and holds the "Changes" tab. Nothing here computes circuit numbers: the heatmap
difference B − A and the shared colour range of a side-by-side pair are taken in a worker
thread (``tui.plots.pairs.pair_figures``), everything else is read off the diff.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Static

from headscope.tui.base.labels import SHORT
from headscope.tui.plots.figures import EdgeDiff
from headscope.tui.widgets.bars import text_colours
from headscope.tui.widgets.chart import Chart

if TYPE_CHECKING:
    from headscope.tui.base.protocols import LoadKey, PaneHost

Head = tuple[int, int]
# (score name, column label) of the Δ columns: diff rows carry `<name>_a`, `_b`, `_delta`.
DELTAS: tuple[tuple[str, str], ...] = tuple(
    (key, f"Δ{SHORT[key]}")
    for key in ("induction_score", "prev_token_score", "copying_score", "qk_positivity"))
# The focus line in compare mode: A → B of the badge scores, then the circuit similarities.
FOCUS_SCORES: tuple[tuple[str, str], ...] = tuple(
    (key, SHORT[key]) for key in ("copying_score", "prev_token_score", "induction_score"))
BADGE_LETTER = {"copying_score": "C", "prev_token_score": "P", "induction_score": "I"}


def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def head_changes(diff: Any) -> dict[Head, float]:
    """How much each head of A changed in B (``change`` of every diff row)."""
    return {(int(r["layer"]), int(r["head"])): _num(r.get("change")) for r in diff.heads}


def head_row(diff: Any, head: Head) -> dict[str, Any] | None:
    for r in diff.heads:
        if (int(r["layer"]), int(r["head"])) == head:
            return r
    return None


def changes(diff: Any) -> list[dict[str, Any]]:
    """Every head, biggest change first (NaN last); heads whose changes agree to 1e-6 (float
    noise) in layer/head order, so the table does not reshuffle between platforms."""
    def order(row: dict[str, Any]) -> tuple[bool, float, int, int]:
        c = _num(row.get("change"))
        return (math.isnan(c), round(-c, 6) if c == c else 0.0,
                int(row["layer"]), int(row["head"]))

    return sorted(diff.heads, key=order)


def edge_diff(diff: Any, kind: str) -> list[tuple[str, int, int, int, int, float, float]]:
    """``(status, l1, h1, l2, h2, a, b)`` of the composition-graph diff for ``kind``: lost
    edges first, then gained, then changed, each biggest |b − a| first (engine order)."""
    part = (diff.composition or {}).get(kind) or {}
    out = []
    for status in ("lost", "gained", "changed"):
        for e in part.get(status) or []:
            (l1, h1), (l2, h2) = e["source"], e["target"]
            out.append((status, int(l1), int(h1), int(l2), int(h2), _num(e["a"]), _num(e["b"])))
    return out


def focus_text(diff: Any, head: Head, short: bool = False) -> Text | None:
    """The focus line's scores in compare mode: A → B of the badge scores and the circuit
    similarities of ``head`` (``None`` if the diff has no row for it)."""
    row = head_row(diff, head)
    if row is None:
        return None

    def value(x: Any) -> str:
        v = _num(x)
        if not math.isfinite(v):
            return "—"
        # Narrow: "+.27" (no leading zero), so every number fits in 80 columns.
        return f"{v:+.2f}".replace("0.", ".", 1) if short and abs(v) < 1 else f"{v:+.2f}"

    text = Text()
    text.append("│ ", style="dim")
    for i, (key, label) in enumerate(FOCUS_SCORES):
        if i:
            text.append("· ", style="dim")
        # Narrow: the tree's badge letter (C, P, I) instead of the score's short name.
        name = BADGE_LETTER.get(key, label) if short else label
        text.append(f"{name} {value(row.get(f'{key}_a'))}→")
        delta = abs(_num(row.get(f"{key}_delta")))
        text.append(f"{value(row.get(f'{key}_b'))} ",
                    style="bold" if math.isfinite(delta) and delta >= 0.3 else "")
    text.append("│ ", style="dim")
    matched = row.get("matched_head")
    if diff.matching is not None and matched is not None and int(matched) != head[1]:
        text.append(f"≙ B H{int(matched)} ", style="bold")  # heads paired by similarity
    text.append("sim " if short else "B sim ", style="dim")
    text.append(f"OV {value(row.get('ov_similarity'))} · QK {value(row.get('qk_similarity'))}")
    return text


def _cell(v: float, strong: float = 0.5) -> Text:
    if not math.isfinite(v):
        return Text("—", style="dim", justify="right")
    style = "bold" if abs(v) >= strong else ("" if abs(v) >= 0.05 else "dim")
    return Text(f"{v:+.2f}", style=style, justify="right")


class ChangesPane(Horizontal):
    """Biggest changes (every head, most changed first) and the composition-graph diff."""

    def compose(self) -> ComposeResult:
        with Vertical(id="changes-left"):
            yield Static(id="changes-note")
            table: DataTable[Any] = DataTable(id="changes-table", cursor_type="row",
                                              zebra_stripes=True)
            yield table
        with Vertical(id="changes-right"):
            yield Chart(id="changes-graph", placeholder="comparing the two models…")
            yield Static(id="changes-edges")

    def on_mount(self) -> None:
        table = self.query_one("#changes-table", DataTable)
        table.add_column("head", key="head")
        table.add_column("change", key="change")
        table.add_column("OV sim", key="ov")
        table.add_column("QK sim", key="qk")
        for key, label in DELTAS:
            table.add_column(label, key=key)
        table.border_title = "biggest changes (enter: go)"

    def waiting(self, text: str) -> None:
        self.query_one("#changes-graph", Chart).message(text)
        self.query_one("#changes-note", Static).update(Text(text, style="dim"))

    def show(self, diff: Any, kind: str, n_layers: int, n_heads: int, name_b: str) -> None:
        rows = changes(diff)
        matched = diff.matching is not None
        note = Text()
        note.append(f"A → B = {name_b}: ", style="bold")
        note.append("heads matched by circuit similarity (Hungarian)" if matched
                    else "head h of A vs head h of B")
        self.query_one("#changes-note", Static).update(note)
        table = self.query_one("#changes-table", DataTable)
        table.clear()
        for r in rows:
            head = f"L{r['layer']}.H{r['head']}"
            if matched and r.get("matched_head") != r["head"]:
                head += f"→H{r['matched_head']}"
            table.add_row(head, _cell(_num(r.get("change")), 0.5),
                          _cell(_num(r.get("ov_similarity")), 2.0),
                          _cell(_num(r.get("qk_similarity")), 2.0),
                          *[_cell(_num(r.get(f"{key}_delta")), 0.3) for key, _ in DELTAS],
                          key=f"{r['layer']}.{r['head']}")
        es = edge_diff(diff, kind)
        part = (diff.composition or {}).get(kind) or {}
        counts = {s: sum(1 for e in es if e[0] == s) for s in ("lost", "gained", "changed")}
        threshold = _num(part.get("threshold"))
        title = (f"{kind.upper()}-composition diff · {counts['lost']} lost, "
                 f"{counts['gained']} gained, {counts['changed']} changed "
                 f"(score − baseline > {threshold:.2f}) · c: kind")
        self.query_one("#changes-graph", Chart).show(EdgeDiff(n_layers, n_heads, tuple(es),
                                                              title=title))
        listing = Text()
        neg, pos = text_colours(self)
        for status, l1, h1, l2, h2, a, b in es[:12]:
            colour = {"lost": f"bold {neg}", "gained": f"bold {pos}"}.get(status, "")
            listing.append(f"{kind.upper()} {status:<7} ", style=colour)
            listing.append(f"L{l1}.H{h1}→L{l2}.H{h2} ")
            listing.append(f"{a:+.3f}→{b:+.3f}\n", style="dim")
        if not es:
            listing.append(f"no {kind.upper()}-composition edge crossed the threshold",
                           style="dim")
        self.query_one("#changes-edges", Static).update(listing)

    async def load(self, host: PaneHost, key: LoadKey) -> None:
        diff = host.compare.diff
        if diff is None:
            if host.compare.engine_b is None:
                self.waiting(f"no model B: {host.compare.error or 'not opened'}")
            return  # the explorer shows it when the diff arrives
        name_b = Path(host.compare.path or "").name or "B"
        self.show(diff, host.compare.changes_kind, host.n_layers, host.n_heads, name_b)
