"""The explorer screen: the head tree, the focus line, the tabs, and what is loaded in them.

The app (tui/app.py) opens the engine and tells this screen when the model is ready
(``ModelReady`` / ``ModelFailed``, tui/base/messages.py); from then on the screen owns the
focused head (cursor moves are debounced), tab switching, the workers of the score sweeps and
the per-tab loads. Each tab's pane loads what it shows itself (``load(host, key)`` on the
panes of tui/widgets/, found through ``VIEWS``), with this screen as its host
(``tui.base.protocols.PaneHost``).

What is not drawing lives in tui/session/ and is tested without Textual: the focused head
(``HeadFocus``), the scores, the ablation effects, the null and the Summary's order
(``ScoreBoard``), the tokens, OV source row, rotary offset, prompt, tree filter and directions
panel (``ViewChoices``), the load keys (``TabLoads``), compare mode (``CompareMode``),
timeline mode's state (``TimelineState``) and the export document (session/export.py).

Freshness: every load is tagged with what it was for (tab, head, weights generation, token
set, ...). A result that arrives after the user moved on is dropped; per-tab workers are
exclusive, so a newer request cancels the older one. Sweep results come back as messages
tagged with the weights generation they were computed for.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import DataTable, Footer, Input, TabbedContent, TabPane

from headscope.engine.core.errors import CancelledError as EngineCancelled
from headscope.engine.core.errors import HeadscopeError
from headscope.engine.core.results import HeadScores
from headscope.tui.base.labels import ABLATION, FILTER_THRESHOLD, score_rows
from headscope.tui.base.messages import (
    AblationSwept,
    Compared,
    EdgeChosen,
    HeadChosen,
    HeadHighlighted,
    HeadScored,
    ModelFailed,
    ModelReady,
    NullLoaded,
    PatchHeadChosen,
    PatchRequested,
    PhaseChangeChosen,
    ScoresSwept,
)
from headscope.tui.screens.dialogs import InputScreen
from headscope.tui.screens.path import PathScreen
from headscope.tui.session.choices import TREE_FILTERS, ViewChoices, token_ids
from headscope.tui.session.export import export_document, saved_where, write_export
from headscope.tui.session.focus import HeadFocus
from headscope.tui.session.loads import PER_HEAD, TabLoads, load_key
from headscope.tui.session.scores import ScoreBoard
from headscope.tui.widgets.chart import Chart
from headscope.tui.widgets.compare import ChangesPane, focus_text, head_changes
from headscope.tui.widgets.focus_line import FocusLine, head_lines, part_text
from headscope.tui.widgets.head_tree import HeadTree
from headscope.tui.widgets.panes import (
    CompositionPane,
    OVPane,
    PromptPane,
    QKPane,
    SpectrumPane,
    SummaryPane,
)
from headscope.tui.widgets.patch import PatchPane
from headscope.tui.widgets.reading import DirectionsPanel
from headscope.tui.widgets.status import StatusBar
from headscope.tui.widgets.timeline import TimelinePane

if TYPE_CHECKING:
    from headscope.tui.base.protocols import ExplorerEngine, LoadKey
    from headscope.tui.screens.timeline import TimelineHost, TimelineMode
    from headscope.tui.session.compare import CompareMode

Head = tuple[int, int]
TABS = ("qk", "ov", "spectrum", "prompt", "composition", "summary", "changes", "timeline",
        "patch")
TAB_TITLES = {"qk": "1 QK", "ov": "2 OV", "spectrum": "3 Spectrum", "prompt": "4 Prompt",
              "composition": "5 Composition", "summary": "6 Summary", "changes": "7 Changes",
              "timeline": "8 Timeline", "patch": "9 Patch"}
# Below NARROW columns: the longest names shortened, so that every tab of the strip is on
# screen at 80 columns (the strip scrolled, and with 5 active `1 QK` was off its left edge);
# headscope.tcss gives each tab one column of padding instead of two there. The widest
# strip, compare mode's eight tabs, is 61 of the 62 columns beside the tree.
SHORT_TAB_TITLES = {**TAB_TITLES, "spectrum": "3 Spec", "composition": "5 Comp",
                    "timeline": "8 Time"}


class TabView(Protocol):
    """A tab's pane: it asks the engine for what it shows, for the load ``key``."""

    async def load(self, host: Any, key: LoadKey) -> None: ...


# Each tab's view: the pane that loads and draws it (a TabView).
VIEWS: dict[str, type[Widget]] = {
    "qk": QKPane, "ov": OVPane, "spectrum": SpectrumPane, "prompt": PromptPane,
    "composition": CompositionPane, "summary": SummaryPane, "changes": ChangesPane,
    "timeline": TimelinePane, "patch": PatchPane}
NARROW = 100  # below this many columns, panes stack and the tree narrows


class ExplorerHost(Protocol):
    """What the explorer needs from its app (``HeadscopeApp``): the engine's lifecycle, the
    modes, where files go, and errors as notifications."""

    engine: ExplorerEngine | None
    structure: dict[str, Any]
    compare: CompareMode
    timeline: TimelineMode
    raw: bool
    path: str
    open_error: str | None
    model_ready: asyncio.Event
    ready_failed: bool

    @property
    def opening(self) -> bool: ...

    def report(self, message: str) -> None: ...

    def output_dir(self) -> Path: ...

    def stem(self) -> str: ...

    def explorer_mounted(self) -> None: ...


class ExplorerScreen(Screen[None]):
    # Escape leaves any input or pane for the head tree; the footer shows it only away from
    # the tree (check_action), so it says how to get back.
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "leave_input", "Back to heads", key_display="esc", id="leave-input",
                tooltip="Leave the prompt box (or any pane) for the head tree"),
    ]

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "leave_input":
            return self.focused is not None and not isinstance(self.focused, HeadTree)
        return True

    def action_leave_input(self) -> None:
        self.query_one(HeadTree).focus()

    def __init__(self, *, debounce: float = 0.1, sweep: bool = True, prompt: str = "",
                 head: Head | None = None, tokens_text: str = "") -> None:
        super().__init__()
        self.debounce = debounce
        self.auto_sweep = sweep
        self.head_focus = HeadFocus(head)  # the focused head, and the cursor's move debounced
        self.active_tab = "qk"
        # Not drawing (tui/session/): the scores, ablation, null and Summary order of the
        # weights shown; the tokens, OV source row, rotary offset and prompt.
        self.scores = ScoreBoard()
        self.choices = ViewChoices(prompt=prompt, tokens_text=tokens_text)
        self.loads = TabLoads()  # the key each tab last asked for
        self.results: dict[str, Any] = {}  # each tab's data as shown (what e exports)
        self._debounce_timer: Timer | None = None

    # -- what the app owns ---------------------------------------------------------------
    @property
    def headscope(self) -> ExplorerHost:
        return cast("ExplorerHost", self.app)

    @property
    def engine(self) -> ExplorerEngine:
        engine = self.headscope.engine
        assert engine is not None  # asked for only once the model is open
        return engine

    @property
    def compare(self) -> CompareMode:
        return self.headscope.compare

    @property
    def structure(self) -> dict[str, Any]:
        return self.headscope.structure

    @property
    def n_layers(self) -> int:
        return int(self.structure.get("n_layers") or 0)

    @property
    def n_heads(self) -> int:
        return int(self.structure.get("n_heads") or 0)

    @property
    def timeline(self) -> TimelineMode:
        return self.headscope.timeline

    def report(self, message: str) -> None:
        self.headscope.report(message)

    # -- what the panes read (tui.base.protocols.PaneHost) ------------------------------------
    @property
    def gen(self) -> int:
        """The weights' generation: bumped when they change (raw/processed, a timeline step)."""
        return self.scores.gen

    @property
    def has_scores(self) -> bool:
        return bool(self.scores.rows)

    def keep_result(self, tab: str, data: Any) -> None:
        self.results[tab] = data

    def sweep_progress(self, fraction: float | None) -> None:
        # Called from engine threads: a plain assignment, read by the status tick.
        self.scores.progress = fraction

    # -- layout ---------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        app = self.headscope
        yield StatusBar(id="status")
        with Horizontal(id="main"):
            yield HeadTree(None if app.open_error else self.structure, id="tree")
            with Vertical(id="center"):
                yield FocusLine(id="focus-line")
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
                    if self.compare.enabled:
                        with TabPane(TAB_TITLES["changes"], id="changes"):
                            yield ChangesPane(id="changes-pane")
                    if self.headscope.timeline.enabled:
                        with TabPane(TAB_TITLES["timeline"], id="timeline"):
                            yield TimelinePane(id="timeline-pane")
                    with TabPane(TAB_TITLES["patch"], id="patch"):
                        yield PatchPane(id="patch-pane")
        # compact, and no "^p palette" (it is in the help screen): every key then fits in
        # 120 columns, SVG and Export included
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        app = self.headscope
        status = self.query_one(StatusBar)
        status.structure = self.structure
        status.raw = app.raw
        if self.compare.path is not None:
            self.add_class("compare")
            status.compare = Path(self.compare.path).name or self.compare.path
        self.layout_for(app.size.width)
        self.set_interval(0.15, self._tick)
        if self.choices.prompt_text:
            self.query_one("#prompt-input", Input).value = self.choices.prompt_text
        # Tabs are switched with 1-8 (and the mouse), so the tab strip takes no focus: `tab`
        # from the head tree goes straight to the active pane's list (the composition edges,
        # the Summary table), not to the strip first.
        self.query_one("#tabs", TabbedContent).query_one("ContentTabs").can_focus = False
        self.query_one(HeadTree).focus()
        app.explorer_mounted()

    def layout_for(self, width: int) -> None:
        self.set_class(width < NARROW, "narrow")
        with contextlib.suppress(NoMatches):
            self.query_one(HeadTree).set_compact(width < NARROW)
            titles = SHORT_TAB_TITLES if width < NARROW else TAB_TITLES
            tabs = self.query_one("#tabs", TabbedContent)
            for pane in tabs.query(TabPane):
                tab = tabs.get_tab(pane)
                if pane.id in titles and str(tab.label) != titles[pane.id]:
                    tab.label = titles[pane.id]
            self.query_one(CompositionPane).set_compact(width < NARROW)
            self.query_one(SummaryPane).set_compact(width < NARROW)
        self._apply_directions()

    @property
    def directions_visible(self) -> bool:
        return self.choices.directions_shown(self.has_class("narrow"), self.compare.enabled)

    def _apply_directions(self) -> None:
        visible = self.directions_visible
        self.set_class(visible, "directions-on")
        self.set_class(not visible, "directions-off")

    def restyle(self) -> None:
        for chart in self.query(Chart):
            chart.refresh()
        for panel in self.query(DirectionsPanel):
            panel.redraw()
        self.query_one(HeadTree).refresh_badges()

    # -- the model opening ----------------------------------------------------------------
    @on(ModelFailed)
    def _model_failed(self, msg: ModelFailed) -> None:
        self.query_one(StatusBar).error = msg.error
        for chart in self.query(Chart):
            chart.message(msg.charts)

    @on(ModelReady)
    def _model_ready(self) -> None:
        self.query_one(StatusBar).structure = self.structure
        self.run_worker(self._start(), group="startup", exit_on_error=False)

    async def _start(self) -> None:
        if self.choices.tokens_text and self.choices.tokens is None:
            await self._set_tokens(self.choices.tokens_text, reload=False)
        if self.head is None and self.n_layers and self.n_heads:
            self.goto_head(self._first_head(), immediate=True)
        else:
            self._load_active(force=True)
        if self.auto_sweep:
            self.start_sweep()
        if self.compare.error is not None:
            self.report(f"compare: {self.compare.error}")
        self.start_compare()

    def _first_head(self) -> Head:
        """``head=`` of the app if the model has it, else L0.H0 (and say why)."""
        head, why = self.head_focus.first(self.n_layers, self.n_heads)
        if why is not None:
            self.report(f"{self.headscope.path}: {why}")
        return head

    # -- compare mode -----------------------------------------------------------------------
    def start_compare(self) -> None:
        if self.compare.engine_b is None:
            return
        self.run_worker(self._compare(self.gen), group="compare", exclusive=True,
                        exit_on_error=False)

    async def _compare(self, gen: int) -> None:
        """Diff A → B on the engine's workers; ``Compared`` then updates the views."""
        with contextlib.suppress(NoMatches):
            self.query_one(ChangesPane).waiting("comparing A and B (scores, circuits, "
                                                "composition of both)…")
        try:
            diff = await self.engine.compare(self.compare.engine_b,
                                             match_heads=self.compare.match_heads)
        except EngineCancelled:
            return
        except HeadscopeError as err:
            self.report(f"compare: {err}")
            with contextlib.suppress(NoMatches):
                self.query_one(ChangesPane).waiting(f"cannot compare: {err}")
            return
        self.post_message(Compared(diff, gen))

    @on(Compared)
    def _compared(self, msg: Compared) -> None:
        """Badges, focus line and Changes tab from the diff."""
        if not self.scores.current(msg.gen):
            return
        self.compare.diff = msg.diff
        self.results["changes"] = msg.diff
        self.query_one(HeadTree).set_deltas(head_changes(msg.diff))
        self._update_focus_line()
        if self.compare.match_heads and self.active_tab in PER_HEAD:
            self._load_active(force=True)  # B's side waited for the matching
        if self.active_tab == "changes":
            self._load_active(force=True)

    # -- scores -----------------------------------------------------------------------------
    def start_sweep(self) -> None:
        self.run_worker(self._sweep(self.gen), group="sweep", exclusive=True,
                        exit_on_error=False)

    async def _sweep(self, gen: int) -> None:
        table = await self._swept(self.engine.all_head_scores)
        if table is not None:
            self.post_message(ScoresSwept(score_rows(table), gen))
        # ablation effects an earlier run stored (`a`, or `heads --ablation`) are shown at
        # once, in the Summary and on the focus line; the sweep itself stays opt-in (`a`)
        try:
            effects = await self.engine.stored_ablation_effects()
        except (EngineCancelled, HeadscopeError):
            effects = None
        if effects is not None:
            self.post_message(AblationSwept(effects, gen, stored=True))

    @on(ScoresSwept)
    def _scores_swept(self, msg: ScoresSwept) -> None:
        if self.scores.current(msg.gen):
            self.set_scores(msg.rows)

    async def _swept(self, sweep: Callable[..., Awaitable[Any]]) -> Any:
        """Run an engine sweep, its progress in the status bar; ``None`` if it was cancelled
        or failed (reported)."""
        def progress(fraction: float) -> None:
            self.sweep_progress(float(fraction))

        self.sweep_progress(0.0)
        try:
            return await sweep(progress=progress)
        except EngineCancelled:
            return None
        except HeadscopeError as err:
            self.report(str(err))
            return None
        finally:
            self.sweep_progress(None)

    def set_scores(self, rows: list[HeadScores]) -> None:
        self.scores.add(rows)
        self.query_one(HeadTree).set_scores(rows)
        self.show_summary()
        self._update_focus_line()
        self.want_null()  # after the scores, never before them

    async def _head_scores(self, head: Head, gen: int) -> None:
        await self.headscope.model_ready.wait()
        try:
            hs = await self.engine.head_scores(*head)
        except EngineCancelled:
            return
        except HeadscopeError as err:
            self.report(str(err))
            return
        self.post_message(HeadScored(hs, gen))

    @on(HeadScored)
    def _head_scored(self, msg: HeadScored) -> None:
        if self.scores.current(msg.gen):
            self.scores.add([msg.scores])
            self.query_one(HeadTree).set_scores([msg.scores])
            self._update_focus_line()
            self.want_null()

    def action_ablation_sweep(self) -> None:
        """Zero-ablate every head in turn (engine worker); the Summary tab shows the result."""
        if self.headscope.engine is None:
            return
        self.action_show_tab("summary")
        if self.scores.ablation is not None:
            self.sort_summary(ABLATION)
            return
        if any(w.group == "ablation" and not w.is_finished for w in self.app.workers):
            self.notify("the ablation sweep is already running", timeout=2)
            return
        self.notify("zero-ablating every head: loss on the repeated half of random tokens…",
                    title="ablation sweep", timeout=3)
        self.run_worker(self._ablation_sweep(self.gen), group="ablation", exit_on_error=False)

    async def _ablation_sweep(self, gen: int) -> None:
        await self.headscope.model_ready.wait()
        effects = await self._swept(self.engine.all_ablation_effects)
        if effects is not None:
            self.post_message(AblationSwept(effects, gen))

    @on(AblationSwept)
    def _ablation_swept(self, msg: AblationSwept) -> None:
        if not self.scores.current(msg.gen):
            return
        # kept, and the Summary sorted by it; no tab switch if the user moved on
        top = self.scores.set_ablation(msg.effects)
        if msg.stored:
            pass  # read back from the results store: no news to announce
        elif top is not None:
            self.notify(f"zeroing L{top[0]}.H{top[1]} costs the most: "
                        f"{self.scores.ablation_of(top):+.2f} nats", title="ablation sweep")
        else:  # a NaN anywhere in the weights makes the clean loss itself NaN
            self.notify("no ablation effect is finite: the model's own loss is not "
                        "(non-finite weights, marked ! in the tree)", title="ablation sweep",
                        severity="warning")
        self._update_focus_line()
        if self.active_tab == "summary":
            self.show_summary()

    def show_summary(self) -> None:
        rows, ablation = self.scores.summary()
        self.query_one(SummaryPane).show(
            rows, ablation if self.scores.ablation is not None else None,
            self.scores.summary_sort, self.scores.null)
        self.results["summary"] = self.scores.summary_records(rows, ablation)

    def sort_summary(self, key: str) -> None:
        self.scores.summary_sort = key
        self.show_summary()
        if self.active_tab != "summary":
            self.action_show_tab("summary")

    def action_cycle_sort(self) -> None:
        self.sort_summary(self.scores.next_sort())

    # -- focus ----------------------------------------------------------------------------
    @on(HeadHighlighted)
    def _highlighted(self, msg: HeadHighlighted) -> None:
        if msg.head is None:
            self.head_focus.pending = None
            if msg.kind is not None and msg.kind != "layer":
                self._update_focus_line(msg.kind)
            return
        self.head_focus.pending = msg.head
        if msg.head == self.head and self.head_focus.other is not None:
            self._update_focus_line()  # back on the focused head (a filtered tree rebuilt)
        if self._debounce_timer is not None:
            self._debounce_timer.stop()
        self._debounce_timer = self.set_timer(self.debounce, self._apply_pending)

    @property
    def head(self) -> Head | None:
        """The focused head (the per-head tabs show it)."""
        return self.head_focus.head

    @property
    def focus_pending(self) -> bool:
        """A cursor move in the tree waits for its debounce before the head is focused."""
        return self.head_focus.waiting

    def _apply_pending(self) -> None:
        head = self.head_focus.due()
        if head is not None:
            self.set_head(head)

    @on(HeadChosen)
    def _chosen(self, msg: HeadChosen) -> None:
        if self._debounce_timer is not None:
            self._debounce_timer.stop()
        self.set_head(msg.head)

    def set_head(self, head: Head) -> None:
        engine = self.headscope.engine
        if engine is None:
            return
        self.head_focus.head = head
        with contextlib.suppress(Exception):  # a priority hint only; never fatal
            engine.focus(*head)
        self.choices.source_index = 0
        self._update_focus_line()
        self._load_active()
        if head not in self.scores.rows:
            self.run_worker(self._head_scores(head, self.gen), group="head-scores",
                            exclusive=True, exit_on_error=False)

    def goto_head(self, head: Head, *, immediate: bool = False) -> None:
        self.query_one(HeadTree).select_head(head)
        if immediate or self.head is None:
            if self._debounce_timer is not None:
                self._debounce_timer.stop()
            self.set_head(head)

    def action_step_head(self, step: int) -> None:
        if not self.n_layers or not self.n_heads:
            return
        self.goto_head(self.head_focus.stepped(step, self.n_layers, self.n_heads))

    def _update_focus_line(self, other: str | None = None) -> None:
        line = self.query_one("#focus-line", FocusLine)
        self.head_focus.other = other
        if other is not None:
            line.show([Text(part_text(other, self.structure))])
            return
        if self.head is None:
            line.show([Text()])
            return
        diff = self.compare.diff
        versus = focus_text(diff, self.head, self.size.width < NARROW) \
            if diff is not None else None
        self.query_one(StatusBar).focus_text = f"L{self.head[0]}.H{self.head[1]}"
        line.show(head_lines(self.head, self.scores.row(self.head), self.scores.null,
                             self.scores.ablation_of(self.head), versus))

    # -- tabs and loading ---------------------------------------------------------------
    @on(TabbedContent.TabActivated)
    def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.tabbed_content.id != "tabs":
            return
        self.active_tab = event.pane.id or "qk"
        self._load_active()

    def action_show_tab(self, tab: str) -> None:
        if tab == "changes" and not self.compare.enabled:
            self.notify("no model B: open with headscope A --compare B", severity="warning")
            return
        if tab == "timeline" and not self.headscope.timeline.enabled:
            self.notify("no timeline: open a series with headscope --timeline PATH",
                        severity="warning")
            return
        focused, previous = self.app.focused, self.active_tab
        remembered: dict[str, Any] = self.__dict__.setdefault("_tab_focus", {})
        if focused is not None and any(a.id == previous for a in focused.ancestors):
            remembered[previous] = focused  # its tab is hidden: focus it again on return
        self.query_one("#tabs", TabbedContent).active = tab
        self.active_tab = tab
        self._load_active()
        # Focus never stays on a hidden widget: coming back to 5 after the edge list had focus
        # left focus nowhere, so `tab` went to the tree and `enter` did nothing until a second
        # `tab`. Back on a tab, its widget that had focus has it again; else the tree.
        back = remembered.get(tab)
        if back is not None and back.is_attached and back.focusable:
            self.call_after_refresh(back.focus)
        elif focused is None or any(a.id == previous for a in focused.ancestors):
            self.call_after_refresh(self.query_one(HeadTree).focus)

    def _key(self, tab: str) -> LoadKey:
        extra: tuple = ()
        if tab in ("qk", "ov"):
            extra = (*self.choices.qk_ov_key(), self.compare.view)
        elif tab == "prompt":
            extra = (self.choices.prompt_text,)
        elif tab == "composition":  # its path effects are on the current task
            extra = (self.query_one(CompositionPane).kind, *self.query_one(PatchPane).session.key())
        elif tab == "changes":
            extra = (self.compare.changes_kind, id(self.compare.diff))
        elif tab == "timeline":
            timeline = self.headscope.timeline
            extra = (timeline.index, id(timeline.timeline), self.head)
        elif tab == "patch":
            extra = self.query_one(PatchPane).session.key()
        return load_key(tab, self.head, self.gen, extra)

    def fresh(self, key: LoadKey) -> bool:
        """Whether a load for ``key`` is still what its tab should show."""
        return self._key(key[0]) == key

    def _load_active(self, force: bool = False) -> None:
        tab = self.active_tab
        if self.headscope.engine is None or self.headscope.ready_failed:
            return
        if tab in PER_HEAD and self.head is None:
            return
        if tab in ("qk", "ov"):
            self._load_directions()
        key = self._key(tab)
        if not self.loads.ask(key, force):
            return
        self.run_worker(self._load(key), group=f"load-{tab}", exclusive=True,
                        exit_on_error=False)

    async def _load(self, key: LoadKey) -> None:
        await self.headscope.model_ready.wait()
        tab = key[0]
        try:
            view = cast(TabView, self.query_one(VIEWS[tab]))
            await view.load(self, key)
        except EngineCancelled:
            self.loads.cancelled(key)
        except HeadscopeError as err:
            self.report(str(err))
        except Exception as err:  # keep running: an engine bug becomes a notification
            self.report(f"{tab}: unexpected error {err!r}")

    # -- the directions panel (tui/widgets/reading.py) -----------------------------------
    def _load_directions(self) -> None:
        """The focused head's singular directions in the active tab's panel (QK or OV): from
        the panel's cache, else asked of the engine in a worker (a loading note meanwhile)."""
        tab = self.active_tab
        if tab not in ("qk", "ov") or self.head is None or not self.directions_visible \
                or self.headscope.engine is None or self.headscope.ready_failed:
            return
        panel = self.query_one(f"#{tab}-directions", DirectionsPanel)
        key = (self.head, self.gen)
        if panel.key == key:  # shown, or on its way
            return
        cached = panel.cache.get(key)
        if cached is not None:
            panel.show(key, cached)
            return
        panel.loading(key)
        self.run_worker(self._directions(panel, key), group=f"directions-{tab}",
                        exclusive=True, exit_on_error=False)

    async def _directions(self, panel: DirectionsPanel, key: tuple[Head, int]) -> None:
        await self.headscope.model_ready.wait()
        await panel.load(self, key)

    def action_toggle_directions(self) -> None:
        """Show or hide the directions panel (from another tab: the OV tab, with it)."""
        if self.active_tab not in ("qk", "ov"):
            self.choices.directions = True
            self._apply_directions()
            self.action_show_tab("ov")
            return
        self.choices.directions = not self.directions_visible
        self._apply_directions()
        self._load_directions()

    def action_step_direction(self, step: int) -> None:
        """The next or previous singular direction in the panel (shown first if hidden)."""
        if self.active_tab not in ("qk", "ov"):
            self.notify("( ) step the singular directions on the QK and OV tabs (1, 2)",
                        timeout=2)
            return
        if not self.directions_visible:
            self.action_toggle_directions()
            return
        self.query_one(f"#{self.active_tab}-directions", DirectionsPanel).step(step)

    def open_path(self, source: Head, target: Head) -> None:
        """The virtual heads of the composition edge ``source → target`` (a dialog; ``g``
        there focuses ``target``)."""
        if self.headscope.engine is None:
            return
        self.app.push_screen(PathScreen(self.engine, source, target, self.choices.tokens),
                             lambda head: head and self.goto_head(head, immediate=True))

    # -- widgets' events ----------------------------------------------------------------
    @on(EdgeChosen)
    def _edge_chosen(self, msg: EdgeChosen) -> None:
        self.open_path(msg.source, msg.target)

    # -- the Patch tab (tui/widgets/patch.py) ------------------------------------------------
    def patch_request(self) -> dict[str, Any]:
        return self.query_one(PatchPane).session.request()

    @on(PatchRequested)
    def _patch_requested(self) -> None:
        if self.active_tab != "patch":
            self.action_show_tab("patch")
        self._load_active(force=True)

    @on(PatchHeadChosen)
    def _patch_head_chosen(self, msg: PatchHeadChosen) -> None:
        self.goto_head(msg.head, immediate=True)
        self.notify(f"L{msg.head[0]}.H{msg.head[1]} focused: 1 QK, 2 OV, 4 Prompt show it",
                    timeout=2)

    def action_stop_patch(self) -> None:
        """Stop the patching run (its worker; the engine drops the job at its next check)."""
        if not any(w.group == "load-patch" and not w.is_finished for w in self.app.workers):
            self.notify("no patching run to stop (9: the Patch tab)", timeout=2)
            return
        self.app.workers.cancel_group(self, "load-patch")
        self.loads.cancelled(self._key("patch"))
        self.query_one(PatchPane).stopped()

    @on(PhaseChangeChosen)
    def _phase_change_chosen(self, msg: PhaseChangeChosen) -> None:
        """A phase change of the Timeline tab: its head, at its step."""
        self.goto_head(msg.head, immediate=True)
        self.timeline.scrub(cast("TimelineHost", self.app), to=msg.index)

    @on(Input.Submitted, "#prompt-input")
    def _prompt_submitted(self, event: Input.Submitted) -> None:
        self.choices.prompt_text = event.value
        if self.active_tab != "prompt":
            self.action_show_tab("prompt")
        self._load_active()
        # Out of the box: the number keys switch tabs again (p comes back to edit).
        self.query_one(HeadTree).focus()

    @on(DataTable.RowSelected)
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        table_id = event.data_table.id
        if table_id in ("summary-table", "changes-table") and event.row_key.value:
            layer, head = (int(x) for x in str(event.row_key.value).split("."))
            self.goto_head((layer, head), immediate=True)

    @on(DataTable.HeaderSelected, "#summary-table")
    def _summary_header(self, event: DataTable.HeaderSelected) -> None:
        """A click on a column header sorts by it (``head``: back to layer order)."""
        key = event.column_key.value
        if key == ABLATION and self.scores.ablation is None:
            self.notify("press a first: the ablation sweep fills that column", timeout=3)
            return
        self.scores.summary_sort = None if key == "head" else key
        self.show_summary()

    # -- actions --------------------------------------------------------------------------
    def action_step_threshold(self, step: int) -> None:
        """Raise or lower the composition graph's edge threshold by one step (0 … 90 %)."""
        threshold = self.query_one(CompositionPane).step_threshold(step)
        if self.active_tab != "composition":
            self.notify(f"composition threshold {threshold:.0%} of the strongest edge",
                        timeout=1.5)

    def action_cycle_filter(self) -> None:
        """Head tree: every head → induction → prev-token → copying → sink ≥ 0.3 → every head."""
        self.set_tree_filter(self.choices.next_tree_filter())

    def set_tree_filter(self, key: str | None, threshold: float = FILTER_THRESHOLD) -> None:
        self.choices.tree_filter = key
        label = dict(TREE_FILTERS).get(key or "", key or "")
        self.query_one(HeadTree).set_filter(key, label, threshold, keep=self.head)
        self.want_null()

    # -- the random-head null: each score's z (docs/math.md, "Calibrated scores") ----------
    def want_null(self) -> None:
        """Ask the engine for the null once (its worker computes it, or reads it from the
        results store); the scores are shown meanwhile, the z's join them when it arrives."""
        if not self.scores.wants_null() or self.headscope.engine is None:
            return
        if any(w.group == "score-null" and not w.is_finished for w in self.app.workers):
            return
        self.run_worker(self._load_null(self.gen), group="score-null", exit_on_error=False)

    async def _load_null(self, gen: int) -> None:
        await self.headscope.model_ready.wait()
        try:
            null = await self.engine.score_null()
        except EngineCancelled:
            return
        except HeadscopeError as err:
            self.scores.null_failed_for(gen)  # said once; asked again only for other weights
            self.report(str(err))
            return
        self.post_message(NullLoaded(null, gen))

    @on(NullLoaded)
    def _null_loaded(self, msg: NullLoaded) -> None:
        if not self.scores.current(msg.gen):
            self.want_null()  # the weights changed while it ran: theirs
            return
        self.scores.null = msg.null
        self.query_one(HeadTree).set_null(msg.null)
        self.show_summary()
        self._update_focus_line(self.head_focus.other)

    def _new_weights(self) -> None:
        """The weights changed (raw/processed, a timeline step): a new generation, whose
        scores, ablation effects and null are still to come."""
        self.scores.new_weights()
        self.app.workers.cancel_group(self, "score-null")
        self.app.workers.cancel_group(self, "ablation")  # the old weights' sweep: stop its work
        tree = self.query_one(HeadTree)
        tree.set_null(None)
        tree.scores.clear()
        tree.refresh_badges()

    def action_edit_prompt(self) -> None:
        self.action_show_tab("prompt")
        self.query_one("#prompt-input", Input).focus()

    def action_toggle_compare_view(self) -> None:
        if self.compare.engine_b is None:
            self.notify("no model B: open with headscope A --compare B", severity="warning")
            return
        view = self.compare.next_view()
        self.notify("A | B side by side" if view == "side" else "A | B − A", timeout=1.5)
        if self.active_tab not in ("qk", "ov"):
            self.action_show_tab("qk")
        self._load_active()

    def action_composition(self) -> None:
        if self.active_tab == "changes":
            self.compare.next_changes_kind()
            self._load_active()
            return
        if self.active_tab == "composition":
            kind = self.query_one(CompositionPane).kind
            self.show_composition({"q": "k", "k": "v", "v": "q"}[kind])
        else:
            self.action_show_tab("composition")

    def show_composition(self, kind: str) -> None:
        self.query_one(CompositionPane).kind = kind
        self.action_show_tab("composition")

    def action_toggle_raw(self) -> None:
        if self.headscope.engine is None:
            return
        self.run_worker(self._set_raw(not self.headscope.raw), group="raw", exclusive=True,
                        exit_on_error=False)

    async def _set_raw(self, raw: bool) -> None:
        app = self.headscope
        await app.model_ready.wait()
        try:
            await self.engine.set_raw(raw)
            await self.compare.set_raw(raw)  # B follows A; its diff is then stale
        except HeadscopeError as err:
            self.report(str(err))
            return
        app.raw = raw
        self._new_weights()
        status = self.query_one(StatusBar)
        status.raw = raw
        app.structure = {**app.structure, "processed": not raw}
        self.notify("raw weights" if raw else "processed weights (folded LN, centred)")
        self._load_active()
        if self.head is not None:
            self.run_worker(self._head_scores(self.head, self.gen), group="head-scores",
                            exclusive=True, exit_on_error=False)
        if self.auto_sweep:
            self.start_sweep()
        self.start_compare()

    def weights_replaced(self, rows: list[HeadScores] | None) -> None:
        """The app's engine now has other weights (timeline mode: another step): what was
        shown is stale. ``rows``: the new weights' scores, when already known."""
        for group in ("sweep", "head-scores", "directions-qk", "directions-ov",
                      *(f"load-{t}" for t in TABS)):
            self.app.workers.cancel_group(self, group)
        self._new_weights()
        self.loads.forget()
        self.query_one(StatusBar).structure = self.structure
        if rows:
            self.set_scores(rows)
        self._load_active()
        if self.head is not None and self.head not in self.scores.rows:
            self.run_worker(self._head_scores(self.head, self.gen), group="head-scores",
                            exclusive=True, exit_on_error=False)

    def action_step_source(self, step: int) -> None:
        block = (self.results.get("ov") or {}).get("full_ov")
        self.choices.step_source(step, len(block.row_ids) if block is not None else 0)
        self._load_active()

    def action_step_offset(self, step: int) -> None:
        if self.structure.get("positional") != "rotary":
            return
        self.choices.step_offset(step)
        self._load_active()

    def action_choose_tokens(self) -> None:
        self.app.push_screen(
            InputScreen("Tokens for the QK/OV rows and columns", self.choices.tokens_text,
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
        ids = token_ids(text)
        if text and ids is None:  # words: the model's tokenizer says which tokens
            await self.headscope.model_ready.wait()
            try:
                ids = await self.engine.tokenize(text)
            except HeadscopeError as err:
                self.report(str(err))
                return
        self.choices.set_tokens(ids, text)
        if not reload:
            return
        if self.active_tab not in ("qk", "ov"):
            self.action_show_tab("qk")
        self._load_active()

    def action_export(self) -> None:
        app = self.headscope
        tab = self.active_tab
        data = self.results.get(tab)
        if data is None:
            self.notify(f"nothing to export on the {tab} tab yet", severity="warning")
            return
        doc = export_document(app.path, app.raw, tab, self.head, data)
        try:
            path = write_export(app.output_dir() / f"{app.stem()}.json", doc)
        except OSError as err:
            self.report(f"cannot export: {err}")
            return
        self.notify(saved_where(path), title="export saved")

    # -- status ---------------------------------------------------------------------------
    def _tick(self) -> None:
        app = self.headscope
        if not self.app.is_running:
            return
        try:
            status = self.query_one(StatusBar)
        except NoMatches:  # shutting down
            return
        busy = any(not w.is_finished and (w.group or "").startswith(("load-", "startup"))
                   for w in self.app.workers)
        stats = None
        if app.engine is not None:
            try:
                stats = app.engine.stats()
            except (HeadscopeError, RuntimeError):  # engine closing; a bug should still surface
                stats = None
        status.tick(busy=busy, stats=stats, opening=app.opening, sweep=self.scores.progress)
