"""The explorer's tabs and focus: what every tab's pane reads from its host, which head is
focused, which tab is shown and what each tab loads.

``ExplorerTabs`` is the base of the explorer screen (tui/screens/explorer.py, ``ExplorerScreen``;
the scores, null, ablation and compare mode are in ``ExplorerScores`` between them,
tui/screens/explorer_scores.py). It plays ``tui.base.protocols.PaneHost`` for the panes: each
tab's pane loads what it shows itself (``load(host, key)`` on the panes of tui/widgets/, found
through ``VIEWS``). The focused head's cursor moves are debounced (``HeadFocus``).

Freshness: every load is tagged with what it was for (tab, head, weights generation, token
set, ...). A result that arrives after the user moved on is dropped; per-tab workers are
exclusive, so a newer request cancels the older one.
"""

from __future__ import annotations

import asyncio
import contextlib
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from rich.text import Text
from textual import events, on
from textual.screen import Screen
from textual.timer import Timer
from textual.widget import AwaitMount, Widget
from textual.widgets import TabbedContent, TabPane

from headscope.engine.core.errors import CancelledError as EngineCancelled
from headscope.engine.core.errors import HeadscopeError
from headscope.tui.base.messages import HeadChosen, HeadHighlighted, HeadScored
from headscope.tui.session import sweeps
from headscope.tui.session.choices import ViewChoices
from headscope.tui.session.focus import HeadFocus
from headscope.tui.session.loads import PER_HEAD, TabLoads, load_key
from headscope.tui.session.scores import ScoreBoard
from headscope.tui.widgets.circuit import OVPane, QKPane, SpectrumPane
from headscope.tui.widgets.circuit_tab import CircuitTab
from headscope.tui.widgets.compare import ChangesPane, focus_text
from headscope.tui.widgets.focus_line import FocusLine, head_lines, part_text
from headscope.tui.widgets.head_tree import HeadTree
from headscope.tui.widgets.panes import CompositionPane, PromptPane
from headscope.tui.widgets.patch import PatchPane
from headscope.tui.widgets.reading import DirectionsPanel
from headscope.tui.widgets.status import StatusBar
from headscope.tui.widgets.summary import SummaryPane
from headscope.tui.widgets.timeline import TimelinePane

if TYPE_CHECKING:
    from headscope.tui.base.protocols import ExplorerEngine, LoadKey
    from headscope.tui.screens.timeline import TimelineMode
    from headscope.tui.session.compare import CompareMode

Head = tuple[int, int]
TABS = ("qk", "ov", "spectrum", "prompt", "composition", "summary", "changes", "timeline",
        "patch", "circuit")
TAB_TITLES = {"qk": "1 QK", "ov": "2 OV", "spectrum": "3 Spectrum", "prompt": "4 Prompt",
              "composition": "5 Composition", "summary": "6 Summary", "changes": "7 Changes",
              "timeline": "8 Timeline", "patch": "9 Patch", "circuit": "0 Circuit"}
# Below NARROW columns: the longest names shortened, so that every tab of the strip is on
# screen at 80 columns (the strip scrolled, and with 5 active `1 QK` was off its left edge);
# headscope.tcss gives each tab one column of padding instead of two there. The widest
# strip, compare mode's nine tabs, is 61 of the 62 columns beside the tree.
SHORT_TAB_TITLES = {**TAB_TITLES, "spectrum": "3 Spec", "composition": "5 Comp",
                    "timeline": "8 Time", "summary": "6 Sum", "changes": "7 Chng", "circuit": "0 Circ"}


class TabView(Protocol):
    """A tab's pane: it asks the engine for what it shows, for the load ``key``."""

    async def load(self, host: Any, key: LoadKey) -> None: ...


# Each tab's view: the pane that loads and draws it (a TabView).
VIEWS: dict[str, type[Widget]] = {
    "qk": QKPane, "ov": OVPane, "spectrum": SpectrumPane, "prompt": PromptPane,
    "composition": CompositionPane, "summary": SummaryPane, "changes": ChangesPane,
    "timeline": TimelinePane, "patch": PatchPane, "circuit": CircuitTab}
NARROW = 100  # below this many columns, panes stack and the tree narrows
# Tabs whose pane is mounted the first time the tab is shown (``build_tab``), not with the
# screen: every widget in the DOM, shown or not, is restyled on each theme change (Textual
# re-applies the stylesheet to the whole screen), and these two panes were 46 of its ~130
# widgets (issue 39 §3: `t` took 1.8-2.3 s to settle). Their objects exist from the start
# (``patch_pane``, ``circuit_tab``): the Patch tab's inputs (its session) key other tabs' loads.
LATE_TABS = ("patch", "circuit")


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

class ExplorerTabs(Screen[None]):
    """The host of the tabs' panes: the focused head, the active tab and its loads."""

    active_tab: str

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
        # The late tabs' panes (LATE_TABS), mounted by build_tab; until then in no query.
        self.patch_pane = PatchPane(id="patch-pane")
        self.circuit_tab = CircuitTab(id="circuit-pane")
        self._late: dict[str, Widget] = {"patch": self.patch_pane, "circuit": self.circuit_tab}
        self._building: dict[str, AwaitMount] = {}
        self._early_keys: list[events.Key] = []  # typed at the Patch tab before its form


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

    @property
    def directions_visible(self) -> bool:
        return self.choices.directions_shown(self.has_class("narrow"), self.compare.enabled)


    # -- focus ----------------------------------------------------------------------------
    @on(HeadHighlighted)
    def _highlighted(self, msg: HeadHighlighted) -> None:
        if msg.head is None:
            self.head_focus.pending = None
            if msg.kind is not None and msg.kind != "layer":
                self._update_focus_line(msg.kind)
            return
        if msg.head == self.head and self.head_focus.other is not None:
            self._update_focus_line()  # back on the focused head (a filtered tree rebuilt)
        self._focus_after_debounce(msg.head)

    def _focus_after_debounce(self, head: Head) -> None:
        self.head_focus.pending = head
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
            self.start_head_scores(head)

    def start_head_scores(self, head: Head) -> None:
        """The scores of ``head`` before the sweep reaches it (``HeadScored``)."""
        self.run_worker(partial(self._head_scores, head, self.gen), group="head-scores",
                        exclusive=True, exit_on_error=False)

    async def _head_scores(self, head: Head, gen: int) -> None:
        await self.headscope.model_ready.wait()
        hs = await sweeps.head_scores(self.engine, head, self.report)
        if hs is not None:
            self.post_message(HeadScored(hs, gen))

    def goto_head(self, head: Head, *, immediate: bool = False) -> None:
        shown = self.query_one(HeadTree).select_head(head)
        if shown and not immediate and self.head is not None:
            # Waiting now, not when the tree's highlight arrives two messages later: a key
            # pressed in between (a held ``]``) steps on from here (HeadFocus.stepped).
            self._focus_after_debounce(head)
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
    def build_tab(self, tab: str) -> None:
        """Mount a late tab's pane (LATE_TABS) into its tab, the first time it is shown."""
        pane = self._late.get(tab)
        if pane is not None and tab not in self._building:
            self._building[tab] = self.query_one(f"#{tab}", TabPane).mount(pane)

    async def tab_built(self, tab: str) -> None:
        """Until ``tab``'s pane is mounted, its children and ``on_mount`` included."""
        self.build_tab(tab)
        building = self._building.get(tab)
        if building is not None and not self._late[tab].is_mounted:
            await building

    def type_when_built(self, key: events.Key) -> None:
        """A key typed at the Patch tab before its form was mounted: given to it (through
        ``on_key``) once it is, after any typed before it."""
        self._early_keys.append(key)
        if len(self._early_keys) == 1:
            self.run_worker(self._replay_keys, group="patch-typing", exit_on_error=False)

    @property
    def typing_pending(self) -> bool:
        """Keys wait for the Patch tab's form (``type_when_built``): later keys queue behind."""
        return bool(self._early_keys)

    async def _replay_keys(self) -> None:
        await self.tab_built("patch")
        keys, self._early_keys = self._early_keys, []
        for key in keys:
            self.post_message(events.Key(key.key, key.character))

    @on(TabbedContent.TabActivated)
    def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.tabbed_content.id != "tabs":
            return
        self.active_tab = event.pane.id or "qk"
        self.build_tab(self.active_tab)  # a click on the tab strip
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
        self.build_tab(tab)
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
            extra = (self.query_one(CompositionPane).kind, *self.patch_pane.session.key())
        elif tab == "changes":
            extra = (self.compare.changes_kind, id(self.compare.diff))
        elif tab == "timeline":
            timeline = self.headscope.timeline
            extra = (timeline.index, id(timeline.timeline), self.head)
        elif tab == "patch":
            extra = self.patch_pane.session.key()
        elif tab == "circuit":  # the Patch tab's inputs, the method
            extra = (*self.patch_pane.session.key()[:5], self.circuit_tab.method)
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
        self.run_worker(partial(self._load, key), group=f"load-{tab}", exclusive=True,
                        exit_on_error=False)

    async def _load(self, key: LoadKey) -> None:
        await self.headscope.model_ready.wait()
        tab = key[0]
        try:
            await self.tab_built(tab)
            view = cast(TabView, self._late[tab] if tab in self._late else self.query_one(VIEWS[tab]))
            await view.load(self, key)
        except EngineCancelled:
            self.loads.cancelled(key)
        except HeadscopeError as err:
            self.report(str(err))
        except Exception as err:  # keep running: an engine bug becomes a notification
            self.report(f"{tab}: unexpected error {err!r}")

    def _load_directions(self) -> None:
        """The focused head's singular directions in the active tab's panel (QK or OV; the
        panel loads them, tui/widgets/reading.py)."""
        tab = self.active_tab
        if tab not in ("qk", "ov") or self.head is None or not self.directions_visible \
                or self.headscope.engine is None or self.headscope.ready_failed:
            return
        self.query_one(f"#{tab}-directions", DirectionsPanel).want(
            self, (self.head, self.gen), self.headscope.model_ready.wait)

    def patch_request(self) -> dict[str, Any]:
        """The Patch tab's inputs (its pane's session) as ``PatchInputsRequest.of`` takes them."""
        return self.patch_pane.session.request()
