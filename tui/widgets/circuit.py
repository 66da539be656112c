"""The panes of one head's circuits: token and positional QK (1), full OV and its top
outputs (2), the eigenvalues of both (3).

Like every pane (tui/widgets/panes.py), ``load(host, key)`` asks the engine for what the tab
shows, for the host's focused head and token set (``tui.base.protocols.PaneHost``), and drops
a result for a ``key`` the host no longer shows; the ``show*`` methods draw it.
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Static

from headscope.engine.core.requests import (
    CircuitRequest,
    ProfileRequest,
    SpectrumRequest,
    TopOutputsRequest,
)
from headscope.engine.core.results import (
    Profile,
    TopTokens,
)
from headscope.tui.base.datatext import printable
from headscope.tui.base.labels import (
    head_name,
    profile_xy,
    top_tokens,
)
from headscope.tui.plots.figures import Heatmap, Line, Scatter
from headscope.tui.session.choices import ROTARY_OFFSETS
from headscope.tui.widgets.bars import bar_colours, bar_half, signed_bar
from headscope.tui.widgets.chart import Chart
from headscope.tui.widgets.reading import DirectionsPanel

if TYPE_CHECKING:
    from headscope.tui.base.protocols import LoadKey, PaneHost

POSITIONS_SHOWN = 32  # positional QK: the first positions
# fits the 29 columns of a QK heatmap at 80×24 ("(rows: query token)" was cut: "query to…")
QK_XLABEL = "key token →  (rows: query)"
# the OV x label, and its short form for a heatmap beside the directions panel at 80×24
# (26 columns: "(rows: so…")
OV_XLABEL = "output token →  (rows: source token)"
OV_XLABEL_SHORT = ("output token →  (rows: source)", "output →  (rows: source)")


class QKPane(Horizontal):
    def compose(self) -> ComposeResult:
        yield Chart(id="qk-token", placeholder="waiting for the model…")
        yield Chart(id="qk-token-b", placeholder="waiting for model B…", classes="compare-only")
        with Vertical(id="qk-side"):
            yield Chart(id="qk-position", placeholder="")
            yield DirectionsPanel("qk", id="qk-directions")

    def show_pair(self, a: Heatmap, b: Heatmap) -> None:
        """Compare mode: A's token QK and B's (or B − A) beside it."""
        self.query_one("#qk-token", Chart).show(a)
        self.query_one("#qk-token-b", Chart).show(b)

    def show_token(self, block: Any, offset: int | None = None) -> None:
        title = f"token QK {head_name(block.layer, block.head)}  W_E QK W_Eᵀ"
        if offset is not None:
            title += f"  Δ={offset}"
        xlabel = QK_XLABEL
        if getattr(block, "note", ""):  # e.g. q/k norms or soft-capping (docs/math.md)
            xlabel += f"  · ≈ {block.note}"
        self.query_one("#qk-token", Chart).show(Heatmap(
            np.asarray(block.values), tuple(block.row_labels), tuple(block.col_labels),
            title=title, xlabel=xlabel))

    def show_position(self, block: Any, n_ctx: int = 0) -> None:
        shown = len(block.row_labels)
        part = ""
        if 0 < shown < n_ctx:  # only the first; below 100 columns in the chart's 29 columns
            narrow = self.is_attached and self.screen.has_class("narrow")
            part = f" 0–{shown - 1}/{n_ctx}" if narrow else f" · 0–{shown - 1} of {n_ctx}"
        self.query_one("#qk-position", Chart).show(Heatmap(
            np.asarray(block.values), tuple(block.row_labels), tuple(block.col_labels),
            title=f"positional QK {head_name(block.layer, block.head)}{part}",
            xlabel="key position"))

    def show_profile(self, profile: Profile, layer: int, head: int, offset: int) -> None:
        x, y = profile_xy(profile)
        self.query_one("#qk-position", Chart).show(Line(
            x, y, title=f"rotary QK vs offset {head_name(layer, head)}", xlabel="offset Δ",
            mark_x=float(offset)))

    async def load(self, host: PaneHost, key: LoadKey) -> None:
        layer, head = key[1]
        rotary = host.structure.get("positional") == "rotary"
        engine = host.engine
        block = await engine.get(CircuitRequest.of(
            host.structure, layer, head, "qk", "token", rows=host.choices.tokens, cols=host.choices.tokens,
            offset=host.choices.qk_offset if rotary else 0, limit=engine.max_block_bytes))
        if not host.fresh(key):
            return
        result: dict[str, Any] = {"token": block}
        host.keep_result("qk", result)
        if host.compare.engine_b is not None:
            block_b = await host.compare.block_b(block, offset=host.choices.qk_offset if rotary else 0)
            if not host.fresh(key):
                return
            if block_b is not None:
                a_fig, b_fig = await host.compare.figures(
                    block, block_b, f"token QK L{layer}.H{head}", "token QK",
                    xlabel=QK_XLABEL)
                if not host.fresh(key):
                    return
                self.show_pair(a_fig, b_fig)
                result["token_b"] = block_b
                return  # the positional pane is hidden in compare mode
        self.show_token(block, host.choices.qk_offset if rotary else None)
        pos_chart = self.query_one("#qk-position", Chart)
        if host.structure.get("positional") == "learned":
            n = list(range(min(int(host.structure.get("n_ctx") or 0), POSITIONS_SHOWN)))
            pos = await engine.get(CircuitRequest.of(host.structure, layer, head, "qk", "position",
                                                     rows=n, cols=n, limit=engine.max_block_bytes))
            if not host.fresh(key):
                return
            self.show_position(pos, int(host.structure.get("n_ctx") or 0))
            result["position"] = pos
        elif rotary:
            offsets = list(range(-ROTARY_OFFSETS, ROTARY_OFFSETS + 1))
            profile = await engine.get(ProfileRequest.of(host.structure, layer, head, offsets))
            if not host.fresh(key):
                return
            self.show_profile(profile, layer, head, host.choices.qk_offset)
            result["profile"] = profile
        else:
            pos_chart.message("no positional embedding: QK depends on tokens only")


class OVPane(Horizontal):
    top_shown: TopTokens | None = None  # the top outputs on screen (redrawn on t, m, resize)

    def compose(self) -> ComposeResult:
        yield Chart(id="ov-heatmap", placeholder="waiting for the model…")
        yield Chart(id="ov-heatmap-b", placeholder="waiting for model B…", classes="compare-only")
        with Vertical(id="ov-side"):
            yield Static(id="ov-note")
            yield Static(id="ov-top")
            yield DirectionsPanel("ov", id="ov-directions")

    def show_block(self, block: Any, figure: Heatmap | None = None) -> None:
        """A's full OV (``figure``: already made, e.g. by compare mode) and its note."""
        same = list(block.row_ids) == list(block.col_ids)
        self.query_one("#ov-heatmap", Chart).show(figure or Heatmap(
            np.asarray(block.values), tuple(block.row_labels), tuple(block.col_labels),
            title=f"full OV {head_name(block.layer, block.head)}  W_E OV W_U",
            xlabel=OV_XLABEL, xlabel_short=OV_XLABEL_SHORT, diagonal=same))
        self.query_one("#ov-note", Static).update(Text(block.note or ""))  # #ov-note is muted already

    def show_pair(self, a: Heatmap, b: Heatmap) -> None:
        """Compare mode: A's full OV and B's (or B − A) beside it."""
        self.query_one("#ov-heatmap", Chart).show(a)
        self.query_one("#ov-heatmap-b", Chart).show(b)

    def redraw_top(self) -> None:
        """The top outputs again: the bars in the current theme's colour map and as wide as
        the side column now is (drawn before the layout, they stayed the old colours, or one
        character wide in compare mode)."""
        if self.top_shown is not None:
            self.show_top(self.top_shown)

    def on_resize(self) -> None:
        self.call_after_refresh(self.redraw_top)

    def show_top(self, result: TopTokens) -> None:
        self.top_shown = result
        rows = top_tokens(result)
        src = result.source_label or str(result.source_token)
        # The title above the table, not its title: Rich cut a table title to one line
        # (`top outputs of '<unk` at 80×24) where a Text wraps.
        title = Text(f"top outputs of {printable(src)!r}", style="table.title")
        table = Table(box=None, padding=(0, 1), expand=True)
        # The numbers keep their width (min_width); the token and the bar give way.
        values = [f"{val:+.3g}" for _, val in rows]
        tokens = [printable(tok)[:12] for tok, _ in rows]
        token_width = min(max(map(len, tokens), default=1), 6)
        value_width = max(map(len, values), default=5)
        table.add_column("token", no_wrap=True, overflow="ellipsis", max_width=12,
                         min_width=token_width)
        table.add_column("value", justify="right", no_wrap=True, min_width=value_width)
        # Each half of the bar as wide as the pane allows, up to 6: cropped, a positive
        # bar (the right half) was all that went at 80×24, leaving only the axis.
        top = self.query_one("#ov-top", Static)
        half = bar_half(top.content_size.width, token_width + value_width + 4, 6)
        if half:
            table.add_column("", no_wrap=True, overflow="crop")
        vmax = max((abs(v) for _, v in rows if math.isfinite(v)), default=1.0)
        for (_tok, val), tok, text in zip(rows, tokens, values, strict=True):
            bar = (signed_bar(val, vmax, half, bar_colours(self)),) if half else ()
            table.add_row(Text(tok), text, *bar)  # data: no markup
        from rich.console import Group

        top.update(Group(title, table))

    async def load(self, host: PaneHost, key: LoadKey) -> None:
        layer, head = key[1]
        engine = host.engine
        block = await engine.get(CircuitRequest.of(host.structure, layer, head, "ov", "token",
                                                   rows=host.choices.tokens, cols=host.choices.tokens,
                                                   limit=engine.max_block_bytes))
        if not host.fresh(key):
            return
        result: dict[str, Any] = {"full_ov": block}
        host.keep_result("ov", result)
        pair = None
        if host.compare.engine_b is not None:
            block_b = await host.compare.block_b(block)
            if not host.fresh(key):
                return
            if block_b is not None:
                same = list(block.row_ids) == list(block.col_ids)
                pair = await host.compare.figures(
                    block, block_b, f"full OV L{layer}.H{head}", "full OV",
                    xlabel="output token →  (rows: source)", diagonal=same)
                if not host.fresh(key):
                    return
                result["full_ov_b"] = block_b
        self.show_block(block, figure=pair[0] if pair else None)
        if pair:
            self.show_pair(*pair)
        ids = list(block.row_ids)
        if not ids:
            return
        source = host.choices.source_index % len(ids)
        top = await engine.get(TopOutputsRequest.of(host.structure, layer, head, int(ids[source]), k=10))
        if not host.fresh(key):
            return
        self.show_top(top)
        result["top_outputs"] = top


class SpectrumPane(Horizontal):
    def compose(self) -> ComposeResult:
        yield Chart(id="spectrum-ov", placeholder="waiting for the model…")
        yield Chart(id="spectrum-qk", placeholder="")

    def show(self, spectrum: Any, b: Any = None) -> None:
        """A head's eigenvalues; ``b``: model B's spectrum of the same kind, overlaid."""
        eig = np.asarray(spectrum.eigenvalues).astype(np.complex128)
        name = "full OV" if spectrum.kind == "ov" else "token QK"
        label = "copying" if spectrum.kind == "ov" else "QK positivity"
        title = f"{name} λ · {label} {spectrum.score:+.3f}"
        eig_b = None
        if b is not None:
            eig_b = np.asarray(b.eigenvalues).astype(np.complex128)
            title = f"{name} λ · {label} {spectrum.score:+.3f} → B {b.score:+.3f}"
        self.query_one(f"#spectrum-{spectrum.kind}", Chart).show(Scatter(
            eig.real, eig.imag, title=title,
            bx=None if eig_b is None else eig_b.real, by=None if eig_b is None else eig_b.imag))

    async def load(self, host: PaneHost, key: LoadKey) -> None:
        layer, head = key[1]
        ov, qk = await asyncio.gather(*(host.engine.get(SpectrumRequest.of(host.structure, layer, head, kind))
                                        for kind in ("ov", "qk")))
        if not host.fresh(key):
            return
        result: dict[str, Any] = {"ov": ov, "qk": qk}
        host.keep_result("spectrum", result)
        ov_b = qk_b = None
        if host.compare.engine_b is not None:
            ov_b, qk_b = await host.compare.spectra_b((layer, head))
            if not host.fresh(key):
                return
            if ov_b is not None:
                result.update(ov_b=ov_b, qk_b=qk_b)
        self.show(ov, ov_b)
        self.show(qk, qk_b)
