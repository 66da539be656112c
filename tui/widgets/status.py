"""The header: model name, architecture, shapes, processed/raw, and engine activity."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from headscope.tui.base.datatext import printable

if TYPE_CHECKING:  # the opening screen draws this bar before numpy is imported
    from headscope.engine.core.results import CacheStats

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


def _count(n: Any) -> str:
    try:
        n = int(n)
    except (TypeError, ValueError):
        return "?"
    if n >= 10_000:
        return f"{n / 1000:.0f}k"
    return str(n)


def model_summary(structure: dict[str, Any], *, short: int = 0) -> tuple[str, str, str]:
    """(name, architecture, shapes) of a structure dict. Shorter for a narrow bar (at 80
    columns the architecture was cut away): ``short`` 2, the architecture without its family
    and the shapes without head size, context and positional embedding; 3, the shapes only
    layers × heads (1 is the status bar's: no "headscope ·")."""
    s = structure
    name = printable(Path(str(s.get("path") or "?")).name or str(s.get("path")))
    arch = printable(str(s.get("architecture", "?")) if short >= 2
                     else f"{s.get('family', '?')}/{s.get('architecture', '?')}")
    kv = s.get("n_kv_heads")
    heads = f"{s.get('n_heads', '?')}H" + (f"/{kv}kv" if kv and kv != s.get("n_heads") else "")
    parts = [f"{s.get('n_layers', '?')}L×{heads}"]
    if short < 3:
        parts.append(f"d{_count(s.get('d_model'))}")
    if short < 2:
        parts.append(f"dh{_count(s.get('d_head'))}")
    if short < 3:
        parts.append(f"V{_count(s.get('d_vocab'))}")
    if short < 2:
        parts += [f"ctx{_count(s.get('n_ctx'))}", str(s.get("positional", ""))]
    if not s.get("d_mlp"):
        parts.append("attn-only")
    return name, arch, " ".join(p for p in parts if p)


SHORTEST = 3  # model_summary's shortest form


class StatusBar(Widget):
    """Two lines: what model, and what the engine is doing."""

    DEFAULT_CSS = """
    StatusBar { height: 2; padding: 0 1; }
    """

    structure: reactive[dict[str, Any]] = reactive(dict, always_update=True)
    raw: reactive[bool] = reactive(False)
    focus_text: reactive[str] = reactive("")
    activity: reactive[str | None] = reactive(None)
    progress: reactive[float | None] = reactive(None)
    cache: reactive[tuple[int, int, int]] = reactive((0, 0, 0))
    busy: reactive[bool] = reactive(False)
    frame: reactive[int] = reactive(0)
    error: reactive[str] = reactive("")
    compare: reactive[str] = reactive("")  # compare mode: the name of model B
    origin: reactive[str] = reactive("")  # where the last sweep's numbers came from
    timeline: reactive[str] = reactive("")  # timeline mode: the step shown (tui/screens/timeline.py)

    def tick(self, *, busy: bool, stats: CacheStats | None, opening: bool,
             sweep: float | None) -> None:
        """One beat of the explorer's status tick: ``busy`` (a load or the startup runs),
        the engine's ``stats`` (``None``: no engine, or it is closing), ``opening`` (the model
        is still being opened) and the explorer's own ``sweep`` progress, which wins over the
        engine's. The spinner turns while anything runs."""
        activity: str | None = None
        hits = misses = in_flight = 0
        progress: float | None = None
        if stats is not None:
            activity, progress = stats.activity or None, stats.progress
            hits, misses, in_flight = stats.hits, stats.misses, stats.in_flight
            self.origin = getattr(stats, "origin", "")  # computed now / from the cache
        if opening:
            activity = activity or "opening model…"
        self.busy = busy
        self.activity = activity
        self.progress = sweep if sweep is not None else progress
        self.cache = (hits, misses, in_flight)
        if busy or activity or in_flight or self.progress is not None:
            self.frame += 1

    def render(self) -> Text:
        width = max(self.size.width, 10)
        # The full line where it fits; else without "headscope ·", then with shorter shapes
        # and architecture (model_summary; at 80 columns the architecture was cut away).
        top = self._model_line(short=0)
        for short in range(1, SHORTEST + 1):
            if top.cell_len <= width:
                break
            top = self._model_line(short=short)
        top.truncate(width, overflow="ellipsis")
        if self.error:
            bottom = Text(printable(self.error), style="bold red")
            bottom.truncate(width, overflow="ellipsis")
            return Text("\n").join([top, bottom])
        return Text("\n").join([top, self._activity_line(width)])

    def _model_line(self, *, short: int) -> Text:
        name, arch, shapes = model_summary(self.structure, short=short)
        # Spans start with a visible character and carry the spaces at their end: some SVG
        # renderers strip a span's leading spaces, which ran the name into the shape.
        top = Text()
        top.append(f"{name} " if short else f"headscope · {name} ", style="bold")  # short ≥ 1
        if self.compare:
            top.append(f"vs {printable(self.compare)}", style="bold reverse")
            top.append(" ")
        top.append("│ ", style="dim")
        if self.raw:
            top.append("raw", style="reverse bold")
        else:
            top.append("processed", style="reverse")
        top.append(" ")
        top.append("│ ", style="dim")
        top.append(shapes + " ")
        if self.structure.get("tied_unembed"):
            top.append("│ W_U=W_Eᵀ ", style="dim")
        if self.structure.get("approximations"):  # circuits not exactly the scores (docs/math.md)
            top.append("│ circuits≈ ", style="dim")
        top.append(f"│ {arch}", style="dim")
        return top

    def _activity_line(self, width: int) -> Text:
        """The focused head, the timeline step, the spinner or bar, the cache."""
        bottom = Text()
        if self.focus_text:
            bottom.append(self.focus_text + " ", style="bold")
            bottom.append("│ ", style="dim")
        if self.timeline:
            bottom.append(self.timeline + " ", style="bold")
            bottom.append("│ ", style="dim")
        hits, misses, in_flight = self.cache
        if self.busy or in_flight or self.activity or self.progress is not None:
            bottom.append(SPINNER[self.frame % len(SPINNER)] + " ")
        else:
            bottom.append("✓ ", style="dim")
        if self.activity:
            # One percentage on the line: with the bar shown, the job's own "… 80%" goes
            # (the bar is the whole sweep's, the job's figure is only its current step's).
            activity = self.activity
            if self.progress is not None:
                activity = re.sub(r"\s*\d+(\.\d+)?%$", "", activity)
            bottom.append(activity)
        if self.progress is not None:
            filled = round(self.progress * 10)
            bottom.append(f" [{'█' * filled}{'░' * (10 - filled)}] {self.progress:.0%}")
        bottom.append(f" │ cache {hits} hit/{misses} miss", style="dim")
        if in_flight:
            bottom.append(f", {in_flight} running", style="dim")
        if self.origin:
            bottom.append(f" │ {self.origin}", style="dim")
        bottom.truncate(width, overflow="ellipsis")
        return bottom
