"""The Patch tab: activation or attribution patching of every head, on a built-in task (the
induction task, or the first-occurrence task whose corrupt run changes the first copy) or on
the user's prompts (docs/math.md, "Patching").

The form (the task, whose prompts fill the boxes; clean and corrupt prompts, answer and wrong
tokens, site, method) is the state of ``tui.session.patch.PatchSession``; choosing a task
puts its prompts in the boxes; submitting a box or choosing a task, site or method posts
``PatchRequested`` and the explorer loads the tab for the new inputs (``load``): the engine
patches on its workers (a ``PatchInputsRequest``), with its progress here and in the status bar, and
``x`` stops it. The result is drawn as a layer × head heatmap of ``recovered`` (the diverging
map of every heatmap, right in 256 and 16 colours: ``tui.plots``) beside the heads sorted by
it; ``enter`` on one focuses that head (``PatchHeadChosen``).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Input, Label, Select, Static

from headscope.engine.core.errors import CancelledError as EngineCancelled
from headscope.engine.core.errors import HeadscopeError
from headscope.engine.core.requests import InductionPromptsRequest, PatchInputsRequest
from headscope.tui.base.messages import PatchHeadChosen, PatchRequested
from headscope.tui.plots.figures import Heatmap
from headscope.tui.session.patch import METHODS, SITES, TASKS, PatchedHead, PatchSession
from headscope.tui.widgets.chart import Chart

if TYPE_CHECKING:
    from headscope.tui.base.protocols import LoadKey, PaneHost

BOXES = ("clean", "corrupt", "answer", "wrong")
# What the map's values mean, short enough for the 80-column layout's narrow chart (the
# formula, (m - m_corrupt) / (m_clean - m_corrupt), is in the README and docs/math.md).
XLABEL = "1 = clean run, 0 = corrupt run"
HINT = "type: the form · enter in a box runs it · x stops · enter on a head focuses it"
# The app's keys that keep their meaning on this tab while its form has no focus (by binding
# id, so a user's keymap follows): the tab keys, stopping the run, the focused head, help,
# export and screenshot. Any other printable key is typing meant for the form (a new user
# typed a prompt with the head tree focused and `r` switched to raw weights, issue 39 §3).
PATCH_TAB_KEYS = frozenset({
    "tab-qk", "tab-ov", "tab-spectrum", "tab-prompt", "tab-composition", "tab-summary",
    "tab-changes", "tab-timeline", "tab-patch", "tab-circuit", "stop-patch",
    "prev-head", "next-head", "help", "export", "screenshot",
})


def _cell(value: float | None, digits: int = 3) -> Text:
    if value is None or not np.isfinite(value):
        return Text("—", style="dim", justify="right")
    return Text(f"{value:+.{digits}f}", justify="right")


class PatchPane(Vertical):
    """The Patch tab's form, heatmap and sorted list (the state is ``self.session``)."""

    DEFAULT_CSS = """
    PatchPane { height: 1fr; }
    PatchPane #patch-form { height: auto; border-left: blank; }
    /* focus clearly visible, as on the other panes: a heavy bar beside the form while a box
       of it has focus, and the focused box in the cursor colour (one background step,
       234→235, went unnoticed) */
    PatchPane #patch-form:focus-within { border-left: heavy $primary; }
    PatchPane #patch-form Input:focus { background: $block-cursor-background; }
    PatchPane .patch-row { height: 1; }
    PatchPane .patch-label { width: 8; color: $text-muted; }
    PatchPane .patch-label-short { width: 7; color: $text-muted; padding-left: 1; }
    PatchPane #patch-clean, PatchPane #patch-corrupt { width: 1fr; }
    PatchPane #patch-answer, PatchPane #patch-wrong { width: 1fr; min-width: 6; }
    PatchPane #patch-task { width: 21; }
    PatchPane #patch-task-note { width: 1fr; color: $text-muted; padding-left: 1; }
    PatchPane #patch-site { width: 13; margin-left: 1; }
    PatchPane #patch-method { width: 17; margin-left: 1; }
    PatchPane #patch-status { height: auto; max-height: 4; }
    PatchPane #patch-body { height: 1fr; }
    PatchPane #patch-map { width: 1fr; height: 1fr; }
    PatchPane #patch-table { width: 30; height: 1fr; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.session = PatchSession()
        self.status = ""  # the two lines under the form: what is measured, then news
        self._last_box = "clean"  # where typing from outside the form goes

    def compose(self) -> ComposeResult:
        with Vertical(id="patch-form"):
            with Horizontal(classes="patch-row"):
                yield Label("task", classes="patch-label")
                yield Select([(name, name) for name in TASKS], id="patch-task",
                             value="induction", allow_blank=False, compact=True)
                yield Label(TASKS["induction"][1], id="patch-task-note")
            with Horizontal(classes="patch-row"):
                yield Label("clean", classes="patch-label")
                yield Input(id="patch-clean", compact=True,
                            placeholder="the task's prompt (loading…) or yours")
            with Horizontal(classes="patch-row"):
                yield Label("corrupt", classes="patch-label")
                yield Input(id="patch-corrupt", compact=True,
                            placeholder="a prompt of the same length")
            with Horizontal(classes="patch-row"):
                yield Label("answer", classes="patch-label")
                yield Input(id="patch-answer", compact=True, placeholder="token")
                yield Label("wrong", classes="patch-label-short")
                yield Input(id="patch-wrong", compact=True, placeholder="token")
                yield Select([(f"site {s}", s) for s in SITES], id="patch-site",
                             value="out", allow_blank=False, compact=True)
                yield Select([(f"method {m}", m) for m in METHODS], id="patch-method",
                             value="exact", allow_blank=False, compact=True)
        yield Static(id="patch-status")
        with Horizontal(id="patch-body"):
            yield Chart(id="patch-map", placeholder="patching not run yet: press 9")
            table: DataTable[Any] = DataTable(id="patch-table", cursor_type="row",
                                              zebra_stripes=True)
            yield table

    def on_mount(self) -> None:
        table = self.query_one("#patch-table", DataTable)
        table.add_column("head", key="head")
        table.add_column("recovered", key="recovered")
        table.add_column("metric", key="metric")
        for box in BOXES:
            self.query_one(f"#patch-{box}", Input).tooltip = {
                "clean": "The clean prompt: words (the model's tokenizer) or #id tokens. "
                         "Left as the chosen task's with no answer/wrong: the whole task "
                         "(seeded repeated tokens, mean log p of the repeated half)",
                "corrupt": "The corrupt prompt: the same number of tokens as the clean one",
                "answer": "Answer token (an id, #id or a one-token string): the metric is "
                          "logit[answer] − logit[wrong] at the last position",
                "wrong": "Wrong token (an id, #id or a one-token string)",
            }[box]
        self.query_one("#patch-task", Select).tooltip = (
            "The built-in task the prompts start as. induction: the corrupt run redraws the "
            "second copy (the heads that read it matter). first-occurrence: it redraws every "
            "other token of the first copy instead, so an induction head must find the "
            "earlier token again: the path through its keys carries the answer "
            "(the Composition tab's path column follows the task)")
        self.set_interval(0.2, self._progress_tick)
        self._set_status(HINT)

    # -- the form -------------------------------------------------------------------------
    def fill(self, *, only_empty: bool = False) -> None:
        """The boxes show the session's inputs (``only_empty``: not over what was typed)."""
        inputs = self.session.inputs
        for box in BOXES:
            widget = self.query_one(f"#patch-{box}", Input)
            value = getattr(inputs, box)
            if widget.value != value and not (only_empty and widget.value):
                widget.value = value
                widget.cursor_position = 0
        for name in ("site", "method", "task"):
            select = self.query_one(f"#patch-{name}", Select)
            if select.value != getattr(inputs, name):
                with select.prevent(Select.Changed):
                    select.value = getattr(inputs, name)
        self.query_one("#patch-task-note", Label).update(TASKS[inputs.task][1])

    @on(events.DescendantFocus)
    def _box_focused(self, event: events.DescendantFocus) -> None:
        box = event.widget.id or ""
        if isinstance(event.widget, Input) and box.removeprefix("patch-") in BOXES:
            self._last_box = box.removeprefix("patch-")

    def take_typing(self, event: events.Key) -> bool:
        """A key pressed while this tab is shown: printable typing meant for the form goes to
        its last box (the clean prompt at first) instead of running an app binding. Kept: the
        keys of ``PATCH_TAB_KEYS``, and any key a box, the table or a choice of the form
        handles itself. Whether the key was taken."""
        if not event.is_printable or event.character is None:
            return False
        screen = self.screen
        focused = screen.focused
        if isinstance(focused, Input):
            if self not in focused.ancestors:
                return False
            # A box types every printable key it gets, so one that reached the screen went to
            # the widget focused when it arrived: the rest of a burst typed before the first
            # key moved the focus here (`the cat` kept only its `t`). The box's, in order.
            focused.post_message(events.Key(event.key, event.character))
            return True
        active = screen.active_bindings.get(event.key)
        if active is not None and (active.binding.id in PATCH_TAB_KEYS
                                   or active.node is self or self in active.node.ancestors):
            return False
        box = self.query_one(f"#patch-{self._last_box}", Input)
        # Focused now (``focus()`` waits a turn), so the box has its Focus event, which selects
        # its text (Input's select_on_focus), before the key, which replaces it.
        screen.set_focus(box)
        box.post_message(events.Key(event.key, event.character))
        return True

    def _read_form(self) -> bool:
        """The session takes the boxes' values; whether any changed."""
        values = {box: self.query_one(f"#patch-{box}", Input).value for box in BOXES}
        for name in ("site", "method"):
            value = self.query_one(f"#patch-{name}", Select).value
            if isinstance(value, str):
                values[name] = value
        return self.session.edit(**values)

    @on(Input.Submitted, "#patch-form Input")
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._read_form()
        self.post_message(PatchRequested())
        self.query_one("#patch-table", DataTable).focus()

    @on(Select.Changed, "#patch-form Select")
    def _chosen(self, event: Select.Changed) -> None:
        event.stop()
        # Select posts Changed when it mounts too: only a new choice runs
        if event.select.id == "patch-task":
            changed = isinstance(event.value, str) and self.session.choose_task(event.value)
            if changed:
                self.fill()  # the chosen task's prompts (empty until the engine gives them)
        else:
            changed = self._read_form()
        if changed:
            self.post_message(PatchRequested())

    # -- the list -------------------------------------------------------------------------
    @on(DataTable.RowHighlighted, "#patch-table")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        row = self.session.select(event.cursor_row)
        if row is not None:
            self._set_status(self._detail(row))

    @on(DataTable.RowSelected, "#patch-table")
    def _selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        row = self.session.select(event.cursor_row)
        if row is not None:
            self.post_message(PatchHeadChosen(row.head))

    def _detail(self, row: PatchedHead) -> str:
        result = self.session.result
        if result is None:
            return HINT
        if row.patched is None:  # the patched run was not finite (the summary's note says so)
            return f"{row.label}: not finite (its patched run overflows or meets a NaN) · enter: focus it"
        rec = "undefined" if row.recovered is None else f"{row.recovered:+.3f}"
        metric = "—" if row.patched is None else f"{row.patched:+.3f}"
        est = "≈" if result.method == "attribution" else ""
        return f"{row.label}: recovered {est}{rec} (metric {est}{metric}) · enter: focus it"

    def _set_status(self, text: str) -> None:
        summary = self.session.summary()
        lines = [self.session.task_text() + (f" · {summary}" if summary else ""), text]
        self.status = "\n".join(lines)
        self.query_one("#patch-status", Static).update(Text(self.status))

    def _progress_tick(self) -> None:
        fraction = self.session.progress
        if fraction is not None:
            self._set_status(f"patching every head… {fraction:.0%} (x stops)")

    # -- loading --------------------------------------------------------------------------
    async def load(self, host: PaneHost, key: LoadKey) -> None:
        """Patch for the session's inputs (the load key's), on the engine's workers."""
        engine = host.engine
        session = self.session
        if not session.has_task:
            clean, corrupt = await engine.get(InductionPromptsRequest.of(host.structure, session.inputs.task))
            session.set_task(clean, corrupt)
            self.fill(only_empty=True)  # the user may have typed while the model opened
        request = session.request()
        inputs = session.inputs
        if session.result is None:
            self.query_one("#patch-map", Chart).message("patching every head…")

        def progress(fraction: float) -> None:
            # called from the engine's threads: plain assignments, read by the ticks
            session.progress = float(fraction)
            host.sweep_progress(float(fraction))

        problem = session.form_problem()
        if problem is not None:
            self.failed(problem)
            return
        session.progress = 0.0
        self._set_status("patching every head… (x stops)")
        try:
            result = await engine.get(PatchInputsRequest.of(host.structure, **request, site=inputs.site,
                                                             method=inputs.method), progress)
        except EngineCancelled:
            self._set_status("stopped: enter in a box (or 9) runs it again")
            raise
        except HeadscopeError as err:
            self.failed(f"cannot patch: {err.reason}")  # the path is in the title bar
            raise
        finally:
            session.progress = None
            host.sweep_progress(None)
        if not host.fresh(key):
            return
        session.set_result(result, session.key())
        self.show()
        host.keep_result("patch", session.records())

    def failed(self, why: str) -> None:
        """No result for these inputs: say why, and take the old heatmap and list away."""
        self.session.clear_result()
        self.query_one("#patch-table", DataTable).clear()
        self.query_one("#patch-map", Chart).message(f"no result: {why}")
        self._set_status(why)

    def stopped(self) -> None:
        """The run was stopped (x): say so."""
        self.session.progress = None
        self._set_status("stopped: enter in a box (or 9) runs it again")

    def show(self) -> None:
        """The heatmap and the sorted list of the session's result."""
        session = self.session
        result = session.result
        if result is None:
            return
        values = np.asarray(result.table(), dtype=np.float64)
        est = "estimated " if result.method == "attribution" else ""
        title = f"{est}recovered · {result.site} · {result.method}"
        if not np.isfinite(values).any():
            self.query_one("#patch-map", Chart).message(
                f"{title}: undefined ({result.note or 'no finite value'})")
        else:
            # a head with no finite number (not patched alone, or its patched run not finite:
            # the note says which) is a "?", never the colour of 0 ("no effect")
            self.query_one("#patch-map", Chart).show(Heatmap(
                values,
                tuple(f"L{i}" for i in range(result.n_layers)),
                tuple(f"H{i}" for i in range(result.n_heads)),
                title=title, xlabel=XLABEL, missing="?"))
        table = self.query_one("#patch-table", DataTable)
        table.clear()
        for row in session.rows:
            table.add_row(row.label, _cell(row.recovered), _cell(row.patched, 2),
                          key=f"{row.head[0]}.{row.head[1]}")
        with contextlib.suppress(Exception):
            table.move_cursor(row=session.cursor)
        selected = session.selected
        self._set_status(self._detail(selected) if selected is not None else HINT)
