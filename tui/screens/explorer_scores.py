"""The explorer's scores: the sweeps, one head's scores, the random-head null, the ablation
sweep and the Summary they fill; compare mode's diff; the weights changing under them.

``ExplorerScores`` sits between the tabs' host (``ExplorerTabs``, tui/screens/explorer_tabs.py)
and the screen (``ExplorerScreen``, tui/screens/explorer.py). Its workers await the engine
through tui/session/sweeps.py (every engine request of this part is issued there) and post
the results as messages tagged with the weights generation they were computed for
(tui/base/messages.py); the handlers here drop a result for older weights. What is kept
(scores, effects, null, the Summary's order) is ``ScoreBoard``'s (tui/session/scores.py).
"""

from __future__ import annotations

import contextlib
from functools import partial
from typing import TYPE_CHECKING

from textual import on
from textual.css.query import NoMatches
from textual.widgets import DataTable

from headscope.tui.base.labels import ABLATION
from headscope.tui.base.messages import (
    AblationSwept,
    Compared,
    HeadScored,
    NullLoaded,
    ScoresSwept,
)
from headscope.tui.screens.explorer_tabs import TABS, ExplorerTabs
from headscope.tui.session import sweeps
from headscope.tui.session.loads import PER_HEAD
from headscope.tui.widgets.compare import ChangesPane, head_changes
from headscope.tui.widgets.head_tree import HeadTree
from headscope.tui.widgets.reading import DirectionsPanel
from headscope.tui.widgets.status import StatusBar
from headscope.tui.widgets.summary import SummaryPane

if TYPE_CHECKING:
    from headscope.engine.core.results import HeadScores


class ExplorerScores(ExplorerTabs):
    """The scores of the weights shown, and what fills them in."""

    # -- the score sweep ----------------------------------------------------------------
    def start_sweep(self) -> None:
        self.run_worker(partial(self._sweep, self.gen), group="sweep", exclusive=True,
                        exit_on_error=False)

    async def _sweep(self, gen: int) -> None:
        rows = await sweeps.all_scores(self.engine, self.sweep_progress, self.report)
        if rows is not None:
            self.post_message(ScoresSwept(rows, gen))
        # ablation effects an earlier run stored (`a`, or `heads --ablation`) are shown at
        # once, in the Summary and on the focus line; the sweep itself stays opt-in (`a`)
        effects = await sweeps.stored_ablation(self.engine)
        if effects is not None:
            self.post_message(AblationSwept(effects, gen, stored=True))

    @on(ScoresSwept)
    def _scores_swept(self, msg: ScoresSwept) -> None:
        if self.scores.current(msg.gen):
            self.set_scores(msg.rows)

    def set_scores(self, rows: list[HeadScores]) -> None:
        self.scores.add(rows)
        self.query_one(HeadTree).set_scores(rows)
        self.show_summary()
        self._update_focus_line()
        self.want_null()  # after the scores, never before them

    @on(HeadScored)
    def _head_scored(self, msg: HeadScored) -> None:
        if self.scores.current(msg.gen):
            self.scores.add([msg.scores])
            self.query_one(HeadTree).set_scores([msg.scores])
            self._update_focus_line()
            self.want_null()


    # -- the random-head null: each score's z (docs/math.md, "Calibrated scores") ----------
    def want_null(self) -> None:
        """Ask the engine for the null once (its worker computes it, or reads it from the
        results store); the scores are shown meanwhile, the z's join them when it arrives."""
        if not self.scores.wants_null() or self.headscope.engine is None:
            return
        if any(w.group == "score-null" and not w.is_finished for w in self.app.workers):
            return
        self.run_worker(partial(self._load_null, self.gen), group="score-null", exit_on_error=False)

    async def _load_null(self, gen: int) -> None:
        await self.headscope.model_ready.wait()
        # a failure is said once; asked again only for other weights
        null = await sweeps.score_null(self.engine, self.report,
                                       lambda: self.scores.null_failed_for(gen))
        if null is not None:
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


    # -- the ablation sweep and the Summary ------------------------------------------------
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
        self.run_worker(partial(self._ablation_sweep, self.gen), group="ablation", exit_on_error=False)

    async def _ablation_sweep(self, gen: int) -> None:
        await self.headscope.model_ready.wait()
        effects = await sweeps.ablation(self.engine, self.sweep_progress, self.report)
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

    @on(DataTable.HeaderSelected, "#summary-table")
    def _summary_header(self, event: DataTable.HeaderSelected) -> None:
        """A click on a column header sorts by it (``head``: back to layer order)."""
        key = event.column_key.value
        if key == ABLATION and self.scores.ablation is None:
            self.notify("press a first: the ablation sweep fills that column", timeout=3)
            return
        self.scores.summary_sort = None if key == "head" else key
        self.show_summary()


    # -- compare mode -----------------------------------------------------------------------
    def start_compare(self) -> None:
        if self.compare.engine_b is None:
            return
        self.run_worker(partial(self._compare, self.gen), group="compare", exclusive=True,
                        exit_on_error=False)

    async def _compare(self, gen: int) -> None:
        """Diff A → B on the engine's workers; ``Compared`` then updates the views."""
        self._changes_note("comparing A and B (scores, circuits, composition of both)…")
        diff = await sweeps.diff(self.engine, self.compare.engine_b, self.compare.match_heads,
                                 self.report, self._changes_note)
        if diff is not None:
            self.post_message(Compared(diff, gen))

    def _changes_note(self, note: str) -> None:
        with contextlib.suppress(NoMatches):
            self.query_one(ChangesPane).waiting(note)

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


    # -- new weights (raw/processed, a timeline step) ----------------------------------------
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

    def action_toggle_raw(self) -> None:
        if self.headscope.engine is None:
            return
        self.run_worker(partial(self._set_raw, not self.headscope.raw), group="raw", exclusive=True,
                        exit_on_error=False)

    async def _set_raw(self, raw: bool) -> None:
        app = self.headscope
        await app.model_ready.wait()
        if not await sweeps.set_raw(self.engine, self.compare.set_raw, raw, self.report):
            return
        app.raw = raw
        self._new_weights()
        status = self.query_one(StatusBar)
        status.raw = raw
        app.structure = {**app.structure, "processed": not raw}
        self.notify("raw weights" if raw else "processed weights (folded LN, centred)")
        self._load_active()
        if self.head is not None:
            self.start_head_scores(self.head)
        if self.auto_sweep:
            self.start_sweep()
        self.start_compare()

    def weights_replaced(self, rows: list[HeadScores] | None) -> None:
        """The app's engine now has other weights (timeline mode: another step): what was
        shown is stale. ``rows``: the new weights' scores, when already known."""
        for group in ("sweep", "head-scores", *(f"load-{t}" for t in TABS)):
            self.app.workers.cancel_group(self, group)
        for panel in self.query(DirectionsPanel):
            panel.stop()
        self._new_weights()
        self.loads.forget()
        self.query_one(StatusBar).structure = self.structure
        if rows:
            self.set_scores(rows)
        self._load_active()
        if self.head is not None and self.head not in self.scores.rows:
            self.start_head_scores(self.head)
