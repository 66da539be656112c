"""The explorer screen: the head tree, the focus line, the tabs, and what is loaded in them.

The app (tui/app.py) opens the engine and tells this screen when the model is ready
(``ModelReady`` / ``ModelFailed``, tui/base/messages.py). The screen is built in three parts,
each a class of its own concern, the later on the earlier:

- ``ExplorerTabs`` (tui/screens/explorer_tabs.py): the panes' host (``PaneHost``), the focused
  head (cursor moves are debounced), tab switching and each tab's load;
- ``ExplorerScores`` (tui/screens/explorer_scores.py): the score sweep, the null, the ablation
  sweep and the Summary, compare mode's diff, the weights changing;
- ``ExplorerScreen`` (here): the layout, the start once the model is ready, and what the
  user's keys and the widgets' messages do.

Each tab's pane loads what it shows itself (``load(host, key)`` on the panes of tui/widgets/,
found through ``VIEWS``); the directions panel loads its own (tui/widgets/reading.py). The
engine requests of the sweeps are issued from tui/session/sweeps.py.

What is not drawing lives in tui/session/ and is tested without Textual: the focused head
(``HeadFocus``), the scores, the ablation effects, the null and the Summary's order
(``ScoreBoard``), the tokens, OV source row, rotary offset, prompt, tree filter and directions
panel (``ViewChoices``), the load keys (``TabLoads``), compare mode (``CompareMode``),
timeline mode's state (``TimelineState``), the sweeps' engine requests (session/sweeps.py) and
the export document (session/export.py).
"""

from __future__ import annotations

import contextlib
import re
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, cast

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.widget import Widget
from textual.widgets import DataTable, Input, TabbedContent, TabPane

from headscope.engine.core.errors import HeadscopeError
from headscope.tui.base.labels import FILTER_THRESHOLD
from headscope.tui.base.messages import (
    CircuitEdgeChosen,
    CircuitTopChanged,
    EdgeChosen,
    ModelFailed,
    ModelReady,
    PatchHeadChosen,
    PatchRequested,
    PhaseChangeChosen,
    WhyHeadSelected,
)
from headscope.tui.screens.dialogs import InputScreen
from headscope.tui.screens.explorer_scores import ExplorerScores
from headscope.tui.screens.explorer_tabs import (
    LATE_TABS,
    NARROW,
    SHORT_TAB_TITLES,
    TAB_TITLES,
    TABS,
    VIEWS,
    ExplorerHost,
    Head,
)
from headscope.tui.screens.path import PathScreen
from headscope.tui.screens.timeline import SCORING_GROUP
from headscope.tui.session import sweeps
from headscope.tui.session.choices import TREE_FILTERS
from headscope.tui.session.export import export_document, saved_where, write_export
from headscope.tui.widgets.chart import Chart
from headscope.tui.widgets.circuit import OVPane, QKPane, SpectrumPane
from headscope.tui.widgets.compare import ChangesPane
from headscope.tui.widgets.focus_line import FocusLine
from headscope.tui.widgets.footer import ExplorerFooter
from headscope.tui.widgets.head_tree import HeadTree
from headscope.tui.widgets.panes import CompositionPane, PromptPane
from headscope.tui.widgets.reading import DirectionsPanel
from headscope.tui.widgets.status import StatusBar
from headscope.tui.widgets.summary import SummaryPane
from headscope.tui.widgets.timeline import TimelinePane

if TYPE_CHECKING:
    from headscope.tui.screens.timeline import TimelineHost

# The chart `z` zooms on each tab (the QK/OV token heatmap, not the positional one or the
# directions panel; the OV eigenvalues; the Prompt tab's pattern, A's in compare mode)
ZOOM_CHARTS: dict[str, str] = {"qk": "#qk-token", "ov": "#ov-heatmap", "spectrum": "#spectrum-ov",
                               "prompt": "#prompt-pattern"}

__all__ = ["SHORT_TAB_TITLES", "TABS", "TAB_TITLES", "VIEWS", "ExplorerHost", "ExplorerScreen"]


_SHOW_TAB = re.compile(r"screen\.show_tab\('(\w+)'\)")  # the tab keys' action (tui/base/keymap.py)


class ExplorerScreen(ExplorerScores):
    # Escape leaves any input or pane for the head tree; the footer shows it only away from
    # the tree (check_action), so it says how to get back.
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "leave_input", "Back to heads", key_display="esc", id="leave-input",
                tooltip="Leave the prompt box (or any pane) for the head tree"),
    ]

    _tab_keys_cache: tuple[object, dict[str, str]] | None = None  # (keymap, key → tab): _tab_keys

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "leave_input":
            return self.focused is not None and not isinstance(self.focused, HeadTree)
        return True

    def action_leave_input(self) -> None:
        self.query_one(HeadTree).focus()


    # -- layout ---------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        app = self.headscope
        # The screen's layout classes before its widgets mount: a class changed on the mounted
        # screen restyles all of its ~120 widgets (Textual's update_styles), 0.1-0.5 s each,
        # and the mount changed three of them, while a first `q` waited (issue 39 §3).
        self.update_classes({"compare": self.compare.path is not None,
                             **self._layout_classes(app.size.width)}, update=False)
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
                    # built on first show (ExplorerTabs.build_tab): empty until then
                    for tab in LATE_TABS:
                        yield TabPane(TAB_TITLES[tab], id=tab)
        # compact, and no "^p palette" (it is in the help screen): every key then fits in
        # 120 columns, SVG and Export included
        yield ExplorerFooter(compact=True, show_command_palette=False,
                             narrow=app.size.width < NARROW)

    def on_mount(self) -> None:
        app = self.headscope
        status = self.query_one(StatusBar)
        status.structure = self.structure
        status.raw = app.raw
        if self.compare.path is not None:
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

    def _layout_classes(self, width: int) -> dict[str, bool]:
        narrow = width < NARROW
        directions = self.choices.directions_shown(narrow, self.compare.enabled)
        return {"narrow": narrow, "directions-on": directions, "directions-off": not directions}

    def layout_for(self, width: int) -> None:
        self.update_classes(self._layout_classes(width))  # one restyle, none if unchanged
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
            self.query_one(ExplorerFooter).set_narrow(width < NARROW)

    def _apply_directions(self) -> None:
        visible = self.directions_visible
        self.update_classes({"directions-on": visible, "directions-off": not visible})

    def restyle(self) -> None:
        for chart in self.query(Chart):
            chart.refresh()
        for panel in self.query(DirectionsPanel):
            panel.redraw()
        for pane in self.query(OVPane):  # bars in the colour map's ends
            pane.redraw_top()
        for prompt in self.query(PromptPane):
            prompt.redraw()
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
        self.run_worker(self._start, group="startup", exit_on_error=False)

    async def _start(self) -> None:
        if self.choices.tokens_text and self.choices.tokens is None:
            await self.set_tokens(self.choices.tokens_text, reload=False)
        if self.head is None and self.n_layers and self.n_heads:
            # ``head=`` of the app if the model has it, else L0.H0 (and say why)
            head, why = self.head_focus.first(self.n_layers, self.n_heads)
            if why is not None:
                self.report(f"{self.headscope.path}: {why}")
            self.goto_head(head, immediate=True)
        else:
            self._load_active(force=True)
        if self.auto_sweep:
            self.start_sweep()
        if self.compare.error is not None:
            self.report(f"compare: {self.compare.error}")
        self.start_compare()


    # -- the directions panel (tui/widgets/reading.py) -----------------------------------
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


    # -- widgets' events ----------------------------------------------------------------
    def open_path(self, source: Head, target: Head) -> None:
        """The virtual heads of the composition edge ``source → target`` (a dialog; ``g``
        there focuses ``target``)."""
        if self.headscope.engine is None:
            return
        self.app.push_screen(PathScreen(self.engine, source, target, self.choices.tokens),
                             lambda head: head and self.goto_head(head, immediate=True))

    @on(EdgeChosen)
    def _edge_chosen(self, msg: EdgeChosen) -> None:
        self.open_path(msg.source, msg.target)

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


    # -- the Circuit tab (tui/widgets/circuit_tab.py) -------------------------------------------
    @on(CircuitTopChanged)
    def _circuit_top_changed(self, msg: CircuitTopChanged) -> None:
        pane = self.circuit_tab
        self.run_worker(partial(pane.faithfulness, self, msg.top), group="circuit-top", exclusive=True,
                        exit_on_error=False)

    @on(CircuitEdgeChosen)
    def _circuit_edge_chosen(self, msg: CircuitEdgeChosen) -> None:
        """The edge's target head (else its source) in its QK view (OV for a value input),
        and the two heads' composition score in a notification."""
        head = msg.target or msg.source
        if head is None:
            self.notify(f"{msg.edge}: no head at either end", timeout=3)
            return
        self.goto_head(head, immediate=True)
        self.action_show_tab("ov" if msg.input == "v" or msg.target is None else "qk")
        if msg.source is not None and msg.target is not None and msg.input is not None:
            self.run_worker(partial(self.circuit_tab.composition_of, self, msg), group="circuit-composition",
                            exclusive=True, exit_on_error=False)

    # -- the Patch tab (tui/widgets/patch.py) ------------------------------------------------
    def on_key(self, event: events.Key) -> None:
        # Keys reach the screen before the app's bindings: on the Patch tab, typing meant for
        # its form goes there (PatchPane.take_typing) instead of switching weights or themes.
        # Typed before the tab, built on its first show, has its form: kept for it, in order.
        tab = self._tab_key(event)
        if tab is not None:
            # A tab key runs here, in this screen's order of keys, not as the app's binding:
            # in a burst (`9cat` pasted or typed fast) the keys after it reached this handler
            # before the app had run its binding, so `a` ran the ablation sweep instead of
            # typing into the Patch form.
            event.stop()
            event.prevent_default()
            self.action_show_tab(tab)
            return
        if self.active_tab != "patch":
            return
        if not self.patch_pane.is_mounted or self.typing_pending:
            if event.is_printable:
                self.type_when_built(event)
                event.stop()
                event.prevent_default()
        elif self.patch_pane.take_typing(event):
            event.stop()
            event.prevent_default()

    def _tab_key(self, event: events.Key) -> str | None:
        """The tab an enabled ``screen.show_tab('…')`` binding of this key shows, if any.

        Most keys are no tab key: they are answered from ``_tab_keys`` (built once per keymap).
        ``active_bindings`` built the whole binding map (every binding of the focus chain
        copied, the keymap applied, each action's ``check_action``) on every key press, a held
        ``]`` included; it is asked only for a tab key now, so that a focused widget's own
        binding of the key, or a disabled binding, still wins as before."""
        if event.key not in self._tab_keys():
            return None
        bound = self.active_bindings.get(event.key)
        if bound is None or not bound.enabled:
            return None
        shown = _SHOW_TAB.fullmatch(bound.binding.action)
        return shown.group(1) if shown else None

    def _tab_keys(self) -> dict[str, str]:
        """Each key of the app's ``screen.show_tab('…')`` bindings → its tab, with the user's
        keymap applied as Textual applies it (to a copy of the app's bindings). Cached for the
        keymap it was built with: Textual's ``set_keymap`` / ``update_keymap`` replace the
        app's keymap object, so a new one builds the map again."""
        keymap = self.app._keymap  # Textual's, normalised: what its own binding chain applies
        cached = self._tab_keys_cache
        if cached is not None and cached[0] is keymap:
            return cached[1]
        bindings = self.app._bindings.copy()
        if keymap:
            bindings.apply_keymap(keymap)
        tabs = {key: shown.group(1) for key, bound in bindings.key_to_bindings.items()
                for binding in bound if (shown := _SHOW_TAB.fullmatch(binding.action))}
        self._tab_keys_cache = (keymap, tabs)
        return tabs

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
        if self.patch_pane.is_mounted:
            self.patch_pane.stopped()


    # -- the "why" view of the Prompt tab (tui/widgets/panes.py, tui/widgets/why.py) -------
    def action_why(self) -> None:
        """Open the why view at the pattern's cursor cell (on the Prompt tab), or close it."""
        pane = self.query_one(PromptPane)
        self.minimize()  # the why view takes the pattern's place, zoomed or not
        if self.active_tab == "prompt" and pane.why_open:
            pane.set_why_open(False)
            return
        self.action_show_tab("prompt")
        if pane.view is None:
            self.notify("w explains a cell of the Prompt tab's attention pattern: type a prompt "
                        "first (p)", timeout=3)
            return
        pane.set_why_open(True)
        if self.headscope.engine is not None:
            pane.start_why(self.engine)

    def action_explain_head(self) -> None:
        """Why at the pattern's strongest cell (``PromptPane.strongest_cell``)."""
        pane = self.query_one(PromptPane)
        self.minimize()
        self.action_show_tab("prompt")
        cell = pane.strongest_cell()
        if cell is None:
            self.notify("W explains the strongest cell of the Prompt tab's pattern: type a "
                        "prompt of two tokens or more first (p)", timeout=3)
            return
        pane.cursor = cell
        pane.draw_pattern()
        pane.set_why_open(True)
        if self.headscope.engine is not None:
            pane.start_why(self.engine)

    def action_why_cursor(self, d_query: int, d_key: int) -> None:
        pane = self.query_one(PromptPane)
        if self.active_tab != "prompt" or pane.move_cursor(d_query, d_key) is None:
            return
        if pane.why_open and self.headscope.engine is not None:
            pane.start_why(self.engine)

    @on(WhyHeadSelected)
    def _why_head_selected(self, msg: WhyHeadSelected) -> None:
        self.goto_head(msg.head, immediate=True)
        self.notify(f"L{msg.head[0]}.H{msg.head[1]} focused (it fed the {msg.side} side): "
                    "its why at the same cell · w: its pattern", timeout=2)


    # -- zoom: the tab's main chart on the whole screen ----------------------------------
    _focus_before_zoom: Widget | None = None

    def action_zoom(self) -> None:
        """The active tab's main chart on the whole screen (the footer stays), or back.

        At 80×24 the Prompt tab's 24-token pattern got 5 rows in its pane, too few for an
        induction stripe (issue 39 §3); zoomed, 17 (pooled 24→17, each cell its block's
        largest weight: a stripe cell keeps its brightness). Escape goes back too (Textual's
        ``ESCAPE_TO_MINIMIZE``), and so does any key that shows another tab or view."""
        if self.maximized is not None:
            self.minimize()
            return
        chart = ZOOM_CHARTS.get(self.active_tab)
        if chart is None or (self.active_tab == "prompt" and self.query_one(PromptPane).why_open):
            self.notify("z zooms the heatmap of the QK, OV, Prompt tabs (1, 2, 4; the eigenvalues "
                        "of 3)", timeout=2)
            return
        # Nothing keeps focus while zoomed: the focused widget, hidden, would hand focus on
        # along the focus chain (Textual's blur on Hide), to the prompt box, which then took
        # the next keys as typing. It gets focus back on the way out.
        self._focus_before_zoom = self.focused
        self.set_focus(None)
        self.maximize(self.query_one(chart, Chart), container=False)

    def minimize(self) -> None:
        if self.maximized is None:
            return
        super().minimize()
        back, self._focus_before_zoom = self._focus_before_zoom, None
        if back is not None and back.is_attached:
            self.set_focus(back)

    def action_show_tab(self, tab: str) -> None:
        self.minimize()  # the zoomed chart belongs to the tab left
        super().action_show_tab(tab)


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
        def chosen(text: str | None) -> None:
            if text is not None:
                self.run_worker(partial(self.set_tokens, text), group="tokens", exclusive=True,
                                exit_on_error=False)

        self.app.push_screen(
            InputScreen("Tokens for the QK/OV rows and columns", self.choices.tokens_text,
                        placeholder="e.g. the cat sat on the mat",
                        hint="words or a phrase; #12 #40 for token ids; empty: default set"),
            callback=chosen)

    async def set_tokens(self, text: str, reload: bool = True) -> None:
        """The QK/OV rows and columns typed as ``text`` (words, or ``#12 #40``)."""
        ids = await sweeps.tokens(text, self.report, self.headscope.model_ready.wait,
                                  lambda: self.engine)
        if ids is sweeps.NOT_TOKENISED:
            return
        self.choices.set_tokens(cast("list[int] | None", ids), text.strip())
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
        # a tab's load, the startup, or the timeline's steps being scored (timeline mode's own
        # worker: the engine's stats do not see it, and the bar showed `✓` beside "scoring")
        busy = any(not w.is_finished and ((w.group or "").startswith(("load-", "startup"))
                                          or w.group == SCORING_GROUP)
                   for w in self.app.workers)
        stats = None
        if app.engine is not None:
            try:
                stats = app.engine.stats()
            except (HeadscopeError, RuntimeError):  # engine closing; a bug should still surface
                stats = None
        status.tick(busy=busy, stats=stats, opening=app.opening, sweep=self.scores.progress)
