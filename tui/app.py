"""The headscope terminal explorer (README.md, "A two-minute tour"; docs/internals.md).

The app renders what ``engine.service.Engine`` computes and never computes on the UI
thread: every engine call is awaited in an async worker (the engine runs on its own
threads), plots are built in worker threads by ``Chart``. The engine comes from a factory
(``engine_factory(path, raw)``) so tests inject a fake one.

Freshness: every load is tagged with what it was for (tab, head, weights generation, token
set, ...). A result that arrives after the user moved on is dropped; cursor moves are
debounced; per-tab workers are exclusive, so a newer request cancels the older one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from rich.text import Text
from textual import on
from textual.app import App, ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import DataTable, Footer, Input, Static, TabbedContent, TabPane

from headscope.engine.errors import CancelledError as EngineCancelled
from headscope.engine.errors import HeadscopeError
from headscope.engine.export import atomic_write_text
from headscope.engine.results import HeadScores
from headscope.sample_models import bundled_model
from headscope.themes import (
    ALIASES,
    COLORMAPS,
    DEFAULT_THEME,
    STYLESHEET,
    THEME_NAMES,
    THEMES,
    colormap_for,
)

from .adapt import ABLATION, ABLATION_LABEL, SCORES, jsonable, score, score_rows, stats_line
from .compare import COMPARE_VIEWS, ChangesPane, focus_text, head_changes, pair_figures
from .keymap import APP_BINDINGS
from .palette import HeadscopeCommands
from .screens import HelpScreen, InputScreen
from .settings import Settings, load_settings
from .widgets.chart import Chart
from .widgets.head_tree import HeadTree
from .widgets.status import StatusBar
from .widgets.views import (
    CompositionPane,
    OVPane,
    PromptPane,
    QKPane,
    SpectrumPane,
    SummaryPane,
)

Head = tuple[int, int]
EngineFactory = Callable[[str, bool], Any]
TABS = ("qk", "ov", "spectrum", "prompt", "composition", "summary", "changes")
TAB_TITLES = {"qk": "1 QK", "ov": "2 OV", "spectrum": "3 Spectrum", "prompt": "4 Prompt",
              "composition": "5 Composition", "summary": "6 Summary", "changes": "7 Changes"}
POSITIONS_SHOWN = 32  # positional QK: the first positions
ROTARY_OFFSETS = 32  # rotary profile over Δ in [-32, 32]
NARROW = 100  # below this many columns, panes stack and the tree narrows
WIDE_WITH_ABLATION = 140  # ...and the focus line with the ablation effect needs short labels
THRESHOLD_STEP = 0.1  # composition graph: edges ≥ threshold × the strongest edge
TREE_FILTERS: tuple[tuple[str, str], ...] = (
    ("induction_score", "induction"), ("prev_token_score", "prev-token"), ("copying_score", "copying"))
SHORT_LABELS = {"copying_score": "copy", "qk_positivity": "QK+", "prev_token_score": "prev",
                "induction_score": "ind"}  # the focus line on a narrow terminal: no room for dup-tok
FILTER_THRESHOLD = 0.3  # the middling badge strength: what "has the behaviour" means


def default_engine_factory(path: str, raw: bool, cache_mb: int = 256, cache_disk_mb: int = 0) -> Any:
    from headscope.engine.service import Engine
    from headscope.engine.store import default_store

    store = default_store(cache_disk_mb) if cache_disk_mb > 0 else None
    return Engine(path, raw=raw, cache_bytes=cache_mb << 20, store=store)


class HeadscopeApp(App[None]):
    TITLE = "headscope"
    CSS_PATH: ClassVar[list[str | Path]] = [STYLESHEET, Path(__file__).with_name("headscope.tcss")]
    BINDINGS: ClassVar[list[BindingType]] = list(APP_BINDINGS)
    COMMANDS = App.COMMANDS | {HeadscopeCommands}

    def __init__(self, path: str | os.PathLike[str] | None = None, *, raw: bool = False,
                 theme: str | None = None, engine_factory: EngineFactory | None = None,
                 output_dir: str | os.PathLike[str] | None = None,
                 keymap: dict[str, str] | None = None, debounce: float = 0.1,
                 sweep: bool = True, prompt: str = "",
                 compare: str | os.PathLike[str] | None = None, match_heads: bool = False,
                 head: Head | None = None, settings: Settings | None = None) -> None:
        super().__init__()
        self.settings_error: str | None = None
        if settings is None:
            try:
                settings = load_settings()
            except HeadscopeError as err:  # a bad config file must not stop the explorer
                settings, self.settings_error = Settings(), str(err)
        self.settings = settings
        self.path = str(path) if path is not None else str(bundled_model())
        self.raw = raw
        # The real engine starts importing torch on a thread as soon as it exists; that
        # import competes for the GIL, so it is created after the first frame is painted,
        # and the first frame's tree comes from the header (read_structure, no torch).
        self._deferred_engine = engine_factory is None
        self.engine_factory = engine_factory or (
            lambda p, r: default_engine_factory(p, r, settings.cache_mb, settings.cache_disk_mb))
        theme = theme or settings.theme
        self._initial_theme = ALIASES.get(theme or "", theme) or DEFAULT_THEME
        # Themes are set before the first mount: set in on_mount, the switch from Textual's
        # default theme re-applied the whole stylesheet to every widget (~50 ms of the first
        # frame).
        for t in THEMES:
            self.register_theme(t)
        self.theme = self._initial_theme if self._initial_theme in self.available_themes \
            else DEFAULT_THEME
        self._output_dir = Path(output_dir) if output_dir is not None else None
        self._keymap_arg = {**settings.keymap, **(keymap or {})}
        self.keymap_in_use: dict[str, str] = {}
        self.debounce = debounce
        self.auto_sweep = sweep
        self.prompt_text = prompt
        self.initial_head = head  # focused once the model is open (checked against its shape)
        # Compare mode: model B, opened by the same factory; Engine.compare diffs A → B.
        self.compare_path = str(compare) if compare is not None else None
        # Match B's heads to A's by circuit similarity (independent runs number heads
        # arbitrarily): B's views then show the head matched to A's focused one.
        self.match_heads = match_heads
        self.engine_b: Any = None
        self.compare_error: str | None = None
        self.diff: Any = None
        self.compare_view = "side"
        self.changes_kind = "k"
        self.engine: Any = None
        self.open_error: str | None = None
        self.structure: dict[str, Any] = {"path": self.path}
        self.head: Head | None = None
        self.active_tab = "qk"
        self.tokens: list[int] | None = None
        self.tokens_text = " ".join(settings.tokens)
        self.source_index = 0
        self.offset = 0
        self.comp_kind = "k"
        self.comp_edges: list[tuple[int, int, int, int, float]] = []
        self.comp_selected: tuple[int, int, int, int] | None = None
        self.comp_threshold = 0.5  # draw edges ≥ this fraction of the strongest one
        self.tree_filter: str | None = None
        # settings.colormap "colorblind": the blue/orange map whatever the theme.
        self.colormap_override: str | None = None
        self._colorblind = settings.colormap == "colorblind"
        self.rows: dict[Head, HeadScores] = {}
        self.summary_sort: str | None = None
        # Zero-ablation effect of every head [L, H] (the opt-in sweep, key a), this _gen's.
        self.ablation: np.ndarray | None = None
        self.results: dict[str, Any] = {}
        self.sweep_progress: float | None = None
        self.errors: list[str] = []
        self._gen = 0  # bumped when the weights change (raw/processed)
        self._tokens_gen = 0
        self._loaded: dict[str, tuple] = {}
        self._comp_cache: dict[tuple[str, int], Any] = {}
        self._pending: Head | None = None
        self._debounce_timer: Timer | None = None
        self._model_ready = asyncio.Event()
        self._main_screen: Screen[Any] | None = None
        self._ready_failed = False

    # -- engine ---------------------------------------------------------------------------
    def _open_engine(self) -> None:
        try:
            self.engine = self.engine_factory(self.path, self.raw)
            self.structure = dict(self.engine.structure)
        except HeadscopeError as err:
            self.engine, self.open_error = None, str(err)
        except Exception as err:  # an engine bug must not take the explorer down
            self.engine, self.open_error = None, f"{self.path}: cannot open ({err!r})"
        if self.compare_path is not None and self.engine is not None:
            try:
                self.engine_b = self.engine_factory(self.compare_path, self.raw)
            except HeadscopeError as err:
                self.compare_error = str(err)
            except Exception as err:
                self.compare_error = f"{self.compare_path}: cannot open ({err!r})"

    def _read_structure(self) -> None:
        from headscope.engine.loading import read_structure  # header + config only: no torch

        try:
            self.structure = dict(read_structure(self.path))
        except HeadscopeError as err:
            self.open_error = str(err)
        except Exception as err:
            self.open_error = f"{self.path}: cannot read ({err!r})"

    @property
    def colormap_name(self) -> str:
        if self.colormap_override:
            return self.colormap_override
        if self._colorblind:
            return "blue-orange" if self.current_theme.dark else "blue-orange-light"
        return colormap_for(self.theme)

    @property
    def n_layers(self) -> int:
        return int(self.structure.get("n_layers") or 0)

    @property
    def n_heads(self) -> int:
        return int(self.structure.get("n_heads") or 0)

    # -- layout ---------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        if self._deferred_engine:
            self._read_structure()
        else:
            self._open_engine()
        yield StatusBar(id="status")
        with Horizontal(id="main"):
            yield HeadTree(None if self.open_error else self.structure, id="tree")
            with Vertical(id="center"):
                yield Static(id="focus-line")
                with TabbedContent(id="tabs", initial="qk"):
                    with TabPane(TAB_TITLES["qk"], id="qk"):
                        yield QKPane(id="qk-pane")
                    with TabPane(TAB_TITLES["ov"], id="ov"):
                        yield OVPane(id="ov-pane")
                    with TabPane(TAB_TITLES["spectrum"], id="spectrum"):
                        yield SpectrumPane(id="spectrum-pane")
                    with TabPane(TAB_TITLES["prompt"], id="prompt"):
                        yield PromptPane(id="prompt-pane")
                    with TabPane(TAB_TITLES["composition"], id="composition"):
                        yield CompositionPane(id="composition-pane")
                    with TabPane(TAB_TITLES["summary"], id="summary"):
                        yield SummaryPane(id="summary-pane")
                    if self.compare_path is not None:
                        with TabPane(TAB_TITLES["changes"], id="changes"):
                            yield ChangesPane(id="changes-pane")
        yield Footer()

    @property
    def main(self) -> Screen[Any]:
        """The explorer's own screen (queries must not land on a help or input dialog)."""
        return self._main_screen or self.screen

    def on_mount(self) -> None:
        self._main_screen = self.screen
        self.theme_changed_signal.subscribe(self, lambda _theme: self._restyle())
        if self.settings_error:
            self.notify(self.settings_error, severity="warning", timeout=8)
        self.keymap_in_use = dict(self._keymap_arg)
        if self.keymap_in_use:
            self.set_keymap(self.keymap_in_use)
        status = self.main.query_one(StatusBar)
        status.structure = self.structure
        status.raw = self.raw
        if self.compare_path is not None:
            self.screen.add_class("compare")
            status.compare = Path(self.compare_path).name or self.compare_path
        self._layout_for(self.size.width)
        self.set_interval(0.15, self._tick)
        if self.prompt_text:
            self.main.query_one("#prompt-input", Input).value = self.prompt_text
        self.main.query_one(HeadTree).focus()
        if self._deferred_engine and self.open_error is None:
            self.call_after_refresh(lambda: self.set_timer(0.02, self._open_deferred))
            return
        self._after_open()

    def _open_deferred(self) -> None:
        # Quit (q sets _exit) or torn down (a closed terminal, a test's teardown: only
        # is_running says so) before the engine was created: open nothing, leak no threads.
        if self._exit or not self.is_running:
            return
        self._open_engine()
        self._after_open()

    def _after_open(self) -> None:
        status = self.main.query_one(StatusBar)
        if self.engine is None:
            self._report(self.open_error or "cannot open the model")
            status.error = self.open_error or ""
            for chart in self.main.query(Chart):
                chart.message("no model: " + (self.open_error or ""))
            return
        self.run_worker(self._startup(), group="startup", exit_on_error=False)

    def _first_head(self) -> Head:
        """``head=`` of the constructor if the model has it, else L0.H0 (and say why)."""
        if self.initial_head is None:
            return (0, 0)
        layer, head = self.initial_head
        if 0 <= layer < self.n_layers and 0 <= head < self.n_heads:
            return (layer, head)
        self._report(f"{self.path}: no head L{layer}.H{head} (the model has {self.n_layers} "
                     f"layers × {self.n_heads} heads); showing L0.H0")
        return (0, 0)

    def on_resize(self, event: Any) -> None:
        self._layout_for(event.size.width)

    def _layout_for(self, width: int) -> None:
        self.screen.set_class(width < NARROW, "narrow")

    async def _startup(self) -> None:
        try:
            await self.engine.ready()
        except HeadscopeError as err:
            self._ready_failed = True
            self._report(str(err))
            self.main.query_one(StatusBar).error = str(err)
            for chart in self.main.query(Chart):
                chart.message(str(err))
            return
        self.structure = dict(getattr(self.engine, "structure", self.structure))
        self.main.query_one(StatusBar).structure = self.structure
        self._model_ready.set()
        if self.tokens_text and self.tokens is None:
            await self._set_tokens(self.tokens_text, reload=False)
        if self.head is None and self.n_layers and self.n_heads:
            self.goto_head(self._first_head(), immediate=True)
        else:
            self._load_active(force=True)
        if self.auto_sweep:
            self.start_sweep()
        if self.compare_error is not None:
            self._report(f"compare: {self.compare_error}")
        self.start_compare()

    def start_compare(self) -> None:
        if self.engine_b is None:
            return
        self.run_worker(self._compare(self._gen), group="compare", exclusive=True,
                        exit_on_error=False)

    async def _compare(self, gen: int) -> None:
        """Diff A → B on the engine's workers; then badges, focus line and Changes tab."""
        with contextlib.suppress(NoMatches):
            self.main.query_one(ChangesPane).waiting("comparing A and B (scores, circuits, "
                                                     "composition of both)…")
        try:
            diff = await self.engine.compare(self.engine_b, match_heads=self.match_heads)
        except EngineCancelled:
            return
        except HeadscopeError as err:
            self._report(f"compare: {err}")
            with contextlib.suppress(NoMatches):
                self.main.query_one(ChangesPane).waiting(f"cannot compare: {err}")
            return
        if gen != self._gen:
            return
        self.diff = diff
        self.results["changes"] = diff
        self.main.query_one(HeadTree).set_deltas(head_changes(diff))
        self._update_focus_line()
        if self.match_heads and self.active_tab in ("qk", "ov", "spectrum", "prompt"):
            self._load_active(force=True)  # B's side waited for the matching
        if self.active_tab == "changes":
            self._load_active(force=True)

    def start_sweep(self) -> None:
        self.run_worker(self._sweep(self._gen), group="sweep", exclusive=True,
                        exit_on_error=False)

    async def _sweep(self, gen: int) -> None:
        table = await self._swept(self.engine.all_head_scores)
        if table is not None and gen == self._gen:
            self.set_scores(score_rows(table))

    async def _swept(self, sweep: Callable[..., Awaitable[Any]]) -> Any:
        """Run an engine sweep, its progress in the status bar; ``None`` if it was cancelled
        or failed (reported)."""
        def progress(fraction: float) -> None:
            # Called from engine threads: a plain assignment, read by the status tick.
            self.sweep_progress = float(fraction)

        self.sweep_progress = 0.0
        try:
            return await sweep(progress=progress)
        except EngineCancelled:
            return None
        except HeadscopeError as err:
            self._report(str(err))
            return None
        finally:
            self.sweep_progress = None

    def set_scores(self, rows: list[HeadScores]) -> None:
        for r in rows:
            self.rows[(r.layer, r.head)] = r
        self.main.query_one(HeadTree).set_scores(rows)
        self._show_summary()
        self._update_focus_line()

    # -- focus ----------------------------------------------------------------------------
    @on(HeadTree.HeadHighlighted)
    def _highlighted(self, msg: HeadTree.HeadHighlighted) -> None:
        if msg.head is None:
            self._pending = None
            if msg.data is not None and msg.data.kind != "layer":
                self._update_focus_line(msg.data.kind)
            return
        self._pending = msg.head
        if self._debounce_timer is not None:
            self._debounce_timer.stop()
        self._debounce_timer = self.set_timer(self.debounce, self._apply_pending)

    def _apply_pending(self) -> None:
        if self._pending is not None and self._pending != self.head:
            self.set_head(self._pending)

    @on(HeadTree.HeadChosen)
    def _chosen(self, msg: HeadTree.HeadChosen) -> None:
        if self._debounce_timer is not None:
            self._debounce_timer.stop()
        self.set_head(msg.head)

    def set_head(self, head: Head) -> None:
        if self.engine is None:
            return
        self.head = head
        with contextlib.suppress(Exception):  # a priority hint only; never fatal
            self.engine.focus(*head)
        self.source_index = 0
        self._update_focus_line()
        self._load_active()
        if head not in self.rows:
            self.run_worker(self._head_scores(head, self._gen), group="head-scores",
                            exclusive=True, exit_on_error=False)

    def goto_head(self, head: Head, *, immediate: bool = False) -> None:
        self.main.query_one(HeadTree).select_head(head)
        if immediate or self.head is None:
            if self._debounce_timer is not None:
                self._debounce_timer.stop()
            self.set_head(head)

    async def _head_scores(self, head: Head, gen: int) -> None:
        await self._model_ready.wait()
        try:
            hs = await self.engine.head_scores(*head)
        except EngineCancelled:
            return
        except HeadscopeError as err:
            self._report(str(err))
            return
        if gen == self._gen:
            self.rows[head] = hs
            self.main.query_one(HeadTree).set_scores([hs])
            self._update_focus_line()

    def _update_focus_line(self, other: str | None = None) -> None:
        line = self.main.query_one("#focus-line", Static)
        if other is not None:
            s = self.structure
            text = {"embed": f"Embed: W_E [{s.get('d_vocab')}, {s.get('d_model')}]"
                             + (f", W_pos [{s.get('n_ctx')}, {s.get('d_model')}]"
                                if s.get("positional") == "learned" else ""),
                    "unembed": f"Unembed: W_U [{s.get('d_model')}, {s.get('d_vocab')}]"
                               + (" — tied: W_Eᵀ" if s.get("tied_unembed") else ""),
                    "mlp": f"MLP: d_mlp {s.get('d_mlp')}"}.get(other, "")
            line.update(text)
            return
        if self.head is None:
            line.update("")
            return
        layer, head = self.head
        # Spans start with a visible character (see StatusBar.render): head │ score · score.
        text = Text()
        text.append(f"L{layer}.H{head} ", style="bold")
        row = self.rows.get(self.head)
        versus = focus_text(self.diff, self.head, self.size.width < NARROW) \
            if self.diff is not None else None
        if versus is not None:  # compare mode: A → B instead of A's scores alone
            text.append_text(versus)
        elif row is not None:
            text.append("│ ", style="dim")
            ablation = self._ablation_of(self.head)
            # The ablation effect, once swept, takes the room dup-tok leaves on a narrow line.
            short = self.size.width < (NARROW if math.isnan(ablation) else WIDE_WITH_ABLATION)
            shown = [(k, SHORT_LABELS[k]) for k, _ in SCORES if k in SHORT_LABELS] if short \
                else list(SCORES)
            for i, (key, label) in enumerate(shown):
                v = score(row, key)
                if i:
                    text.append("· ", style="dim")
                text.append(f"{label} {v:+.2f} " if v == v else f"{label} — ")
            if not math.isnan(ablation):
                text.append("· ", style="dim")
                text.append(f"{'abl' if short else ABLATION_LABEL} {ablation:+.2f} ")
        if row is not None and row.nonfinite:
            text.append("non-finite weights", style="bold red")
        self.main.query_one(StatusBar).focus_text = f"L{layer}.H{head}"
        line.update(text)

    def action_step_head(self, step: int) -> None:
        if not self.n_layers or not self.n_heads:
            return
        heads = [(layer, h) for layer in range(self.n_layers) for h in range(self.n_heads)]
        i = heads.index(self.head) if self.head in heads else -step
        self.goto_head(heads[(i + step) % len(heads)])

    # -- tabs and loading ---------------------------------------------------------------
    @on(TabbedContent.TabActivated)
    def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.tabbed_content.id != "tabs":
            return
        self.active_tab = event.pane.id or "qk"
        self._load_active()

    def action_show_tab(self, tab: str) -> None:
        if tab == "changes" and self.compare_path is None:
            self.notify("no model B: open with headscope A --compare B", severity="warning")
            return
        self.main.query_one("#tabs", TabbedContent).active = tab
        self.active_tab = tab
        self._load_active()

    def _key(self, tab: str) -> tuple:
        per_head = tab in ("qk", "ov", "spectrum", "prompt")
        extra: tuple = ()
        if tab in ("qk", "ov"):
            extra = (self._tokens_gen, self.offset, self.source_index, self.compare_view)
        elif tab == "prompt":
            extra = (self.prompt_text,)
        elif tab == "composition":
            extra = (self.comp_kind,)
        elif tab == "changes":
            extra = (self.changes_kind, id(self.diff))
        return (tab, self.head if per_head else None, self._gen, *extra)

    def _fresh(self, key: tuple) -> bool:
        return self._key(key[0]) == key

    def _load_active(self, force: bool = False) -> None:
        tab = self.active_tab
        if self.engine is None or self._ready_failed:
            return
        if tab in ("qk", "ov", "spectrum", "prompt") and self.head is None:
            return
        key = self._key(tab)
        if not force and self._loaded.get(tab) == key:
            return
        self._loaded[tab] = key
        self.run_worker(self._load(key), group=f"load-{tab}", exclusive=True,
                        exit_on_error=False)

    async def _load(self, key: tuple) -> None:
        await self._model_ready.wait()
        tab = key[0]
        try:
            await getattr(self, f"_load_{tab}")(key)
        except EngineCancelled:
            if self._loaded.get(tab) == key:
                self._loaded.pop(tab, None)
        except HeadscopeError as err:
            self._report(str(err))
        except Exception as err:  # keep running: an engine bug becomes a notification
            self._report(f"{tab}: unexpected error {err!r}")

    async def _load_qk(self, key: tuple) -> None:
        layer, head = key[1]
        pane = self.main.query_one(QKPane)
        rotary = self.structure.get("positional") == "rotary"
        block = await self.engine.circuit_block(
            layer, head, "qk", "token", rows=self.tokens, cols=self.tokens,
            offset=self.offset if rotary else 0)
        if not self._fresh(key):
            return
        self.results["qk"] = {"token": block}
        if self.engine_b is not None:
            block_b = await self._block_b(block, offset=self.offset if rotary else 0)
            if not self._fresh(key):
                return
            if block_b is not None:
                a_fig, b_fig = await pair_figures(
                    block, block_b, self.compare_view, f"token QK L{layer}.H{head}",
                    self._title_b("token QK", (layer, head)),
                    xlabel="key token →  (rows: query token)")
                if not self._fresh(key):
                    return
                pane.show_pair(a_fig, b_fig)
                self.results["qk"]["token_b"] = block_b
                return  # the positional pane is hidden in compare mode
        pane.show_token(block, self.offset if rotary else None)
        pos_chart = pane.query_one("#qk-position", Chart)
        if self.structure.get("positional") == "learned":
            n = list(range(min(int(self.structure.get("n_ctx") or 0), POSITIONS_SHOWN)))
            pos = await self.engine.circuit_block(layer, head, "qk", "position", rows=n, cols=n)
            if not self._fresh(key):
                return
            pane.show_position(pos)
            self.results["qk"]["position"] = pos
        elif rotary:
            offsets = list(range(-ROTARY_OFFSETS, ROTARY_OFFSETS + 1))
            profile = await self.engine.rotary_profile(layer, head, offsets)
            if not self._fresh(key):
                return
            pane.show_profile(profile, layer, head, self.offset)
            self.results["qk"]["profile"] = profile
        else:
            pos_chart.message("no positional embedding: QK depends on tokens only")

    async def _load_ov(self, key: tuple) -> None:
        layer, head = key[1]
        pane = self.main.query_one(OVPane)
        block = await self.engine.circuit_block(layer, head, "ov", "token",
                                                rows=self.tokens, cols=self.tokens)
        if not self._fresh(key):
            return
        self.results["ov"] = {"full_ov": block}
        pair = None
        if self.engine_b is not None:
            block_b = await self._block_b(block)
            if not self._fresh(key):
                return
            if block_b is not None:
                same = list(block.row_ids) == list(block.col_ids)
                pair = await pair_figures(
                    block, block_b, self.compare_view, f"full OV L{layer}.H{head}",
                    self._title_b("full OV", (layer, head)),
                    xlabel="output token →  (rows: source)", diagonal=same)
                if not self._fresh(key):
                    return
                self.results["ov"]["full_ov_b"] = block_b
        pane.show_block(block, figure=pair[0] if pair else None)
        if pair:
            pane.show_pair(*pair)
        ids = list(block.row_ids)
        if not ids:
            return
        self.source_index %= len(ids)
        top = await self.engine.top_outputs(layer, head, int(ids[self.source_index]), k=10)
        if not self._fresh(key):
            return
        pane.show_top(top)
        self.results["ov"]["top_outputs"] = top

    async def _load_spectrum(self, key: tuple) -> None:
        layer, head = key[1]
        pane = self.main.query_one(SpectrumPane)
        ov, qk = await asyncio.gather(self.engine.spectrum(layer, head, "ov"),
                                      self.engine.spectrum(layer, head, "qk"))
        if not self._fresh(key):
            return
        self.results["spectrum"] = {"ov": ov, "qk": qk}
        ov_b = qk_b = None
        if self.engine_b is not None:
            ov_b, qk_b = await self._spectra_b((layer, head))
            if not self._fresh(key):
                return
            if ov_b is not None:
                self.results["spectrum"].update(ov_b=ov_b, qk_b=qk_b)
        pane.show(ov, ov_b)
        pane.show(qk, qk_b)

    async def _spectra_b(self, head: Head) -> tuple[Any, Any]:
        """Model B's OV and QK spectra of the head shown beside A's (``None`` if unavailable)."""
        both = await self._from_b(head, lambda h: asyncio.gather(
            self.engine_b.spectrum(*h, "ov"), self.engine_b.spectrum(*h, "qk")))
        return (None, None) if both is None else (both[0], both[1])

    async def _load_prompt(self, key: tuple) -> None:
        layer, head = key[1]
        if not self.prompt_text.strip():
            for chart in ("#prompt-pattern", "#prompt-pattern-b"):
                self.main.query_one(chart, Chart).message("no prompt yet: press p, type, enter")
            return
        view = await self.engine.run_prompt(self.prompt_text, layer, head)
        if not self._fresh(key):
            return
        view_b = await self._prompt_b((layer, head)) if self.engine_b is not None else None
        if not self._fresh(key):
            return
        self.main.query_one(PromptPane).show(view, view_b)
        self.results["prompt"] = view if view_b is None else {"a": view, "b": view_b}

    async def _prompt_b(self, head: Head) -> Any:
        """Model B's view of the prompt at the head shown beside A's (``None`` if unavailable)."""
        return await self._from_b(head, lambda h: self.engine_b.run_prompt(self.prompt_text, *h))

    async def _load_composition(self, key: tuple) -> None:
        kind = self.comp_kind
        cache_key = (kind, self._gen)
        comp = self._comp_cache.get(cache_key)
        chart = self.main.query_one("#comp-graph", Chart)
        if comp is None:
            chart.message(f"computing {kind.upper()}-composition for every pair of heads…")

            def progress(fraction: float) -> None:
                self.sweep_progress = float(fraction)

            try:
                comp = await self.engine.composition(kind, progress=progress)
            finally:
                self.sweep_progress = None
            self._comp_cache[cache_key] = comp
        if not self._fresh(key):
            return
        self.comp_selected = None
        pane = self.main.query_one(CompositionPane)
        self.comp_edges = pane.show(comp, self.n_layers, self.n_heads, None, self.comp_threshold)
        pane.detail(comp, None)
        self.results["composition"] = comp

    def head_b(self, head: Head) -> Head | None:
        """B's head shown beside A's ``head``: the same one, or with ``match_heads`` the
        matched one (``None`` until the diff has matched them)."""
        if not self.match_heads:
            return head
        matching = getattr(self.diff, "matching", None)
        return None if matching is None else (head[0], int(matching[head[0]][head[1]]))

    def _title_b(self, what: str, head: Head) -> str:
        """``what L1.H2``: the B head shown beside A's ``head``, marked when matched."""
        layer, h = self.head_b(head) or head
        return f"{what} L{layer}.H{h}" + (" (matched)" if (layer, h) != head else "")

    async def _block_b(self, block: Any, offset: int = 0) -> Any:
        """Model B's circuit block over the same rows and columns as A's ``block``."""
        return await self._from_b((block.layer, block.head), lambda h: self.engine_b.circuit_block(
            *h, block.kind, block.basis, rows=list(block.row_ids), cols=list(block.col_ids),
            offset=offset))

    async def _from_b(self, head: Head, request: Callable[[Head], Awaitable[Any]]) -> Any:
        """``request(B's head)`` for the head shown beside A's ``head``, once model B is open;
        ``None`` until the heads are matched (``_compare`` then reloads the view), when
        cancelled, or on an error (reported, naming model B)."""
        matched = self.head_b(head)
        if matched is None:
            return None
        try:
            await self.engine_b.ready()
            return await request(matched)
        except EngineCancelled:
            return None
        except HeadscopeError as err:
            self._report(f"model B: {err}")
            return None

    async def _load_changes(self, key: tuple) -> None:
        pane = self.main.query_one(ChangesPane)
        if self.diff is None:
            if self.engine_b is None:
                pane.waiting(f"no model B: {self.compare_error or 'not opened'}")
            return  # _compare shows it when the diff arrives
        name_b = Path(self.compare_path or "").name or "B"
        pane.show(self.diff, self.changes_kind, self.n_layers, self.n_heads, name_b)

    async def _load_summary(self, key: tuple) -> None:
        if self.rows:
            self._show_summary()

    def _ablation_of(self, head: Head) -> float:
        """The head's zero-ablation effect, NaN until the sweep (``a``) has run."""
        return math.nan if self.ablation is None else float(self.ablation[head])

    def _summary_value(self, row: HeadScores, key: str) -> float:
        return self._ablation_of((row.layer, row.head)) if key == ABLATION else score(row, key)

    def _show_summary(self) -> None:
        rows = sorted(self.rows.values(), key=lambda r: (r.layer, r.head))
        if self.summary_sort is not None:
            k = self.summary_sort
            value = partial(self._summary_value, key=k)
            rows.sort(key=lambda r: (math.isnan(value(r)), -value(r) if not math.isnan(value(r))
                                     else 0.0))
        ablation = [self._ablation_of((r.layer, r.head)) for r in rows]
        self.main.query_one(SummaryPane).show(
            rows, ablation if self.ablation is not None else None, self.summary_sort)
        self.results["summary"] = [{**dataclasses.asdict(r), "ablation_effect": a}
                                   for r, a in zip(rows, ablation, strict=True)]

    # -- widgets' events ----------------------------------------------------------------
    @on(Input.Submitted, "#prompt-input")
    def _prompt_submitted(self, event: Input.Submitted) -> None:
        self.prompt_text = event.value
        if self.active_tab != "prompt":
            self.action_show_tab("prompt")
        self._load_active()

    @on(DataTable.RowSelected)
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        table_id = event.data_table.id
        if table_id in ("summary-table", "changes-table") and event.row_key.value:
            layer, head = (int(x) for x in str(event.row_key.value).split("."))
            self.goto_head((layer, head), immediate=True)
        elif table_id == "comp-edges":
            edge = self._edge(event.row_key.value)
            if edge is not None:
                self.goto_head((edge[2], edge[3]), immediate=True)

    @on(DataTable.HeaderSelected, "#summary-table")
    def _summary_header(self, event: DataTable.HeaderSelected) -> None:
        """A click on a column header sorts by it (``head``: back to layer order)."""
        key = event.column_key.value
        if key == ABLATION and self.ablation is None:
            self.notify("press a first: the ablation sweep fills that column", timeout=3)
            return
        self.summary_sort = None if key == "head" else key
        self._show_summary()

    @on(DataTable.RowHighlighted, "#comp-edges")
    def _edge_highlighted(self, event: DataTable.RowHighlighted) -> None:
        edge = self._edge(event.row_key.value)
        comp = self.results.get("composition")
        if edge is None or comp is None:
            return
        self.comp_selected = edge[:4]
        pane = self.main.query_one(CompositionPane)
        pane.show(comp, self.n_layers, self.n_heads, self.comp_selected, self.comp_threshold)
        pane.detail(comp, edge)

    def _edge(self, row_key: str | None) -> tuple[int, int, int, int, float] | None:
        try:
            return self.comp_edges[int(row_key or "")]
        except (ValueError, IndexError):
            return None

    # -- actions --------------------------------------------------------------------------
    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.keymap_in_use))

    def action_step_threshold(self, step: int) -> None:
        """Raise or lower the composition graph's edge threshold by one step (0 … 90 %)."""
        self.comp_threshold = round(min(0.9, max(0.0, self.comp_threshold + step * THRESHOLD_STEP)), 2)
        comp = self.results.get("composition")
        if comp is not None:
            self.main.query_one(CompositionPane).show(
                comp, self.n_layers, self.n_heads, self.comp_selected, self.comp_threshold)
        if self.active_tab != "composition":
            self.notify(f"composition threshold {self.comp_threshold:.0%} of the strongest edge",
                        timeout=1.5)

    def action_cycle_filter(self) -> None:
        """Head tree: every head → induction → prev-token → copying ≥ 0.3 → every head."""
        keys = [k for k, _ in TREE_FILTERS]
        i = keys.index(self.tree_filter) if self.tree_filter in keys else -1
        self.set_tree_filter(keys[i + 1] if i + 1 < len(keys) else None)

    def set_tree_filter(self, key: str | None, threshold: float = FILTER_THRESHOLD) -> None:
        self.tree_filter = key
        label = dict(TREE_FILTERS).get(key or "", key or "")
        self.main.query_one(HeadTree).set_filter(key, label, threshold)

    def action_edit_prompt(self) -> None:
        self.action_show_tab("prompt")
        self.main.query_one("#prompt-input", Input).focus()

    def action_toggle_compare_view(self) -> None:
        if self.engine_b is None:
            self.notify("no model B: open with headscope A --compare B", severity="warning")
            return
        i = COMPARE_VIEWS.index(self.compare_view)
        self.compare_view = COMPARE_VIEWS[(i + 1) % len(COMPARE_VIEWS)]
        self.notify("A | B side by side" if self.compare_view == "side" else "A | B − A",
                    timeout=1.5)
        if self.active_tab not in ("qk", "ov"):
            self.action_show_tab("qk")
        self._load_active()

    def action_composition(self) -> None:
        if self.active_tab == "changes":
            self.changes_kind = {"q": "k", "k": "v", "v": "q"}[self.changes_kind]
            self._load_active()
            return
        if self.active_tab == "composition":
            self.show_composition({"q": "k", "k": "v", "v": "q"}[self.comp_kind])
        else:
            self.action_show_tab("composition")

    def show_composition(self, kind: str) -> None:
        self.comp_kind = kind
        self.action_show_tab("composition")

    def action_toggle_raw(self) -> None:
        if self.engine is None:
            return
        self.run_worker(self._set_raw(not self.raw), group="raw", exclusive=True,
                        exit_on_error=False)

    async def _set_raw(self, raw: bool) -> None:
        await self._model_ready.wait()
        try:
            await self.engine.set_raw(raw)
            if self.engine_b is not None:
                await self.engine_b.set_raw(raw)
        except HeadscopeError as err:
            self._report(str(err))
            return
        self.raw = raw
        self._gen += 1
        self.rows.clear()
        self.ablation = None
        self.workers.cancel_group(self, "ablation")  # the old weights' sweep: stop its work
        self.main.query_one(HeadTree).scores.clear()
        self.main.query_one(HeadTree).refresh_badges()
        status = self.main.query_one(StatusBar)
        status.raw = raw
        self.structure = {**self.structure, "processed": not raw}
        self.notify("raw weights" if raw else "processed weights (folded LN, centred)")
        self._load_active()
        if self.head is not None:
            self.run_worker(self._head_scores(self.head, self._gen), group="head-scores",
                            exclusive=True, exit_on_error=False)
        if self.auto_sweep:
            self.start_sweep()
        if self.engine_b is not None:
            self.diff = None
            self.start_compare()

    def action_cycle_theme(self) -> None:
        names = list(THEME_NAMES)
        i = names.index(self.theme) if self.theme in names else -1
        self.theme = names[(i + 1) % len(names)]
        self.notify(f"theme {self.theme}", timeout=1.5)

    def set_colormap(self, name: str | None) -> None:
        self.colormap_override = name
        self._restyle()

    def action_cycle_colormap(self) -> None:
        names = list(COLORMAPS)
        i = names.index(self.colormap_name) if self.colormap_name in names else -1
        self.set_colormap(names[(i + 1) % len(names)])
        self.notify(f"colour map {self.colormap_name}", timeout=1.5)

    def _restyle(self) -> None:
        for chart in self.main.query(Chart):
            chart.refresh()
        self.main.query_one(HeadTree).refresh_badges()

    def action_step_source(self, step: int) -> None:
        self.source_index += step
        block = (self.results.get("ov") or {}).get("full_ov")
        n = len(block.row_ids) if block is not None else 0
        if n:
            self.source_index %= n
        self._load_active()

    def action_step_offset(self, step: int) -> None:
        if self.structure.get("positional") != "rotary":
            return
        self.offset = max(-ROTARY_OFFSETS, min(ROTARY_OFFSETS, self.offset + step))
        self._load_active()

    def action_cycle_sort(self) -> None:
        keys = [k for k, _ in SCORES] + ([ABLATION] if self.ablation is not None else [])
        i = keys.index(self.summary_sort) if self.summary_sort in keys else -1
        self.sort_summary(keys[(i + 1) % len(keys)])

    def action_ablation_sweep(self) -> None:
        """Zero-ablate every head in turn (engine worker); the Summary tab shows the result."""
        if self.engine is None:
            return
        self.action_show_tab("summary")
        if self.ablation is not None:
            self.sort_summary(ABLATION)
            return
        if any(w.group == "ablation" and not w.is_finished for w in self.workers):
            self.notify("the ablation sweep is already running", timeout=2)
            return
        self.notify("zero-ablating every head: loss on the repeated half of random tokens…",
                    title="ablation sweep", timeout=3)
        self.run_worker(self._ablation_sweep(self._gen), group="ablation", exit_on_error=False)

    async def _ablation_sweep(self, gen: int) -> None:
        await self._model_ready.wait()
        effects = await self._swept(self.engine.all_ablation_effects)
        if effects is None or gen != self._gen:
            return
        self.ablation = effects
        top = np.unravel_index(np.nanargmax(effects), effects.shape) if np.isfinite(effects).any() \
            else None
        if top is not None:
            self.notify(f"zeroing L{top[0]}.H{top[1]} costs the most: "
                        f"{float(effects[top]):+.2f} nats", title="ablation sweep")
        else:  # a NaN anywhere in the weights makes the clean loss itself NaN
            self.notify("no ablation effect is finite: the model's own loss is not "
                        "(non-finite weights, marked ! in the tree)", title="ablation sweep",
                        severity="warning")
        self._update_focus_line()
        self.summary_sort = ABLATION  # shown sorted; no tab switch if the user moved on
        if self.active_tab == "summary":
            self._show_summary()

    def sort_summary(self, key: str) -> None:
        self.summary_sort = key
        self._show_summary()
        if self.active_tab != "summary":
            self.action_show_tab("summary")

    def action_choose_tokens(self) -> None:
        self.push_screen(
            InputScreen("Tokens for the QK/OV rows and columns", self.tokens_text,
                        placeholder="e.g. the cat sat on the mat",
                        hint="words or a phrase; #12 #40 for token ids; empty: default set"),
            callback=self._tokens_chosen)

    def _tokens_chosen(self, text: str | None) -> None:
        if text is None:
            return
        self.run_worker(self._set_tokens(text), group="tokens", exclusive=True,
                        exit_on_error=False)

    async def _set_tokens(self, text: str, reload: bool = True) -> None:
        text = text.strip()
        if not text:
            ids = None
        elif all(p.startswith("#") and p[1:].isdigit() for p in text.split()):
            ids = [int(p[1:]) for p in text.split()]
        else:
            await self._model_ready.wait()
            try:
                ids = await self.engine.tokenize(text)
            except HeadscopeError as err:
                self._report(str(err))
                return
        if ids is not None:
            ids = list(dict.fromkeys(int(i) for i in ids))  # unique, in order
        self.tokens, self.tokens_text = ids, text
        self._tokens_gen += 1
        self.source_index = 0
        if not reload:
            return
        if self.active_tab not in ("qk", "ov"):
            self.action_show_tab("qk")
        self._load_active()

    def output_dir(self) -> Path:
        """Where screenshots and exports go: never next to the checkpoint."""
        chosen = self._output_dir or os.environ.get("HEADSCOPE_OUTPUT_DIR") or Path.cwd()
        out = Path(chosen).expanduser().resolve()
        model = Path(self.path).expanduser().resolve()
        model_dir = model if model.is_dir() else model.parent
        if out == model_dir or model_dir in out.parents:
            out = Path(tempfile.gettempdir()) / "headscope"
        out.mkdir(parents=True, exist_ok=True)
        return out

    def action_choose_output_dir(self) -> None:
        def chosen(text: str | None) -> None:
            if text:
                self._output_dir = Path(text)
                self.notify(f"output directory {self.output_dir()}")

        self.push_screen(InputScreen("Output directory for screenshots and exports",
                                     str(self.output_dir())), callback=chosen)

    def _stem(self) -> str:
        name = Path(self.path).name or "model"
        head = f"_L{self.head[0]}H{self.head[1]}" if self.head else ""
        return f"headscope_{name}_{self.active_tab}{head}_{time.strftime('%Y%m%d-%H%M%S')}"

    def action_screenshot_svg(self) -> None:
        try:
            out = self.save_screenshot(f"{self._stem()}.svg", path=str(self.output_dir()))
        except OSError as err:
            self._report(f"cannot save screenshot: {err}")
            return
        self.notify(f"saved {out}", title="screenshot")

    def action_export(self) -> None:
        tab = self.active_tab
        data = self.results.get(tab)
        if data is None:
            self.notify(f"nothing to export on the {tab} tab yet", severity="warning")
            return
        doc = {"model": self.path, "processed": not self.raw, "view": tab,
               "head": list(self.head) if self.head and tab not in ("composition", "summary")
               else None, "data": jsonable(data)}
        try:
            path = self.output_dir() / f"{self._stem()}.json"
            atomic_write_text(path, json.dumps(doc, indent=1))  # never a partial file
        except OSError as err:
            self._report(f"cannot export: {err}")
            return
        self.notify(f"saved {path}", title="export")

    # -- status ---------------------------------------------------------------------------
    def _tick(self) -> None:
        if not self.is_running or self._main_screen is None:
            return
        try:
            status = self.main.query_one(StatusBar)
        except NoMatches:  # shutting down
            return
        busy = any(not w.is_finished and (w.group or "").startswith(("load-", "startup"))
                   for w in self.workers)
        activity = hits = misses = in_flight = progress = None
        if self.engine is not None:
            try:
                activity, hits, misses, in_flight, progress = stats_line(self.engine.stats())
                status.origin = self.engine.stats().origin
            except (HeadscopeError, RuntimeError):  # engine closing; a bug should still surface
                activity = None
        if not self._model_ready.is_set() and self.engine is not None and not self._ready_failed:
            activity = activity or "opening model…"
        status.busy = busy
        status.activity = activity
        status.progress = self.sweep_progress if self.sweep_progress is not None else progress
        status.cache = (hits or 0, misses or 0, in_flight or 0)
        if busy or activity or in_flight or status.progress is not None:
            status.frame += 1

    def _report(self, message: str) -> None:
        """Engine errors become notifications; the app keeps running."""
        self.errors.append(message)
        self.notify(message, severity="error", timeout=8)

    async def action_quit(self) -> None:
        for engine in (self.engine, self.engine_b):
            if engine is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(engine.aclose(), timeout=2)
        self.exit()


def run_app(path: str | os.PathLike[str] | None = None, *, raw: bool = False,
            theme: str | None = None, compare: str | os.PathLike[str] | None = None,
            **options: Any) -> None:
    """Open ``path`` (default: the bundled attn-only-2l) in the explorer; blocks until quit.

    ``compare``: a second checkpoint B of the same architecture, explored alongside (tui/compare.py);
    ``match_heads=True`` (in ``options``) pairs B's heads with A's by circuit similarity.
    """
    HeadscopeApp(path, raw=raw, theme=theme, compare=compare, **options).run()
