"""The Patch tab's state, without Textual: its inputs, the result shown, the heads sorted by
what patching them recovers, the selected head; and the path effects beside the Composition
tab's edges (docs/math.md, "Patching").

Inputs: the clean and corrupt prompts start as the chosen built-in task's, the seeded
induction task by default or the first-occurrence task (``InductionPromptsRequest``, shown
as ``#id`` tokens); left as they are, with no answer and wrong token, the request is the
task itself (its batch of sequences and its metric, the numbers ``headscope patch [--task
…]`` prints). Choosing another task puts its prompts in the boxes. Edited, they are the user's prompts: words for the
model's tokenizer or ``#id`` tokens, and the metric is the logit difference answer − wrong
(both tokens are then needed, as ``headscope patch --clean … --answer … --wrong …``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from headscope.engine.core.validation import PATCH_METHODS, PATCH_SITES
from headscope.tui.session.choices import token_ids

if TYPE_CHECKING:
    from collections.abc import Sequence

    from headscope.engine.core.results import PatchResult

Head = tuple[int, int]
SITES = PATCH_SITES
METHODS = PATCH_METHODS
# the built-in tasks (core.validation.PATCH_TASKS after "logit_diff"), what each measures and
# what its corrupt run changes, in words short enough for the 80-column form
TASKS = {"induction": ("mean log p of the repeated half", "corrupt: 2nd half redrawn"),
         "first-occurrence": ("mean log p where the first occurrence was redrawn",
                              "1st half: even positions redrawn")}
# |recovered| below this: patching the path changes the metric by less than 5 % of the gap
# between the clean and the corrupt runs ("unused on this task" beside a strong weight score)
NEAR_ZERO = 0.05
PATH_EDGES = 8  # the Composition tab's top edges that get a path effect


@dataclass(frozen=True)
class PatchInputs:
    """What the Patch tab's form holds (as typed)."""

    clean: str = ""
    corrupt: str = ""
    answer: str = ""
    wrong: str = ""
    site: str = "out"
    method: str = "exact"
    task: str = "induction"  # the built-in task the prompts start as (TASKS)


@dataclass(frozen=True)
class PatchedHead:
    """One row of the sorted list."""

    head: Head
    recovered: float | None
    patched: float | None
    estimate: float | None = None

    @property
    def label(self) -> str:
        return f"L{self.head[0]}.H{self.head[1]}"


def ids_text(ids: Sequence[int]) -> str:
    """``#12 #40 …``: token ids as the prompt boxes take them."""
    return " ".join(f"#{int(i)}" for i in ids)


def _prompt(text: str) -> str | list[int]:
    ids = token_ids(text)
    return ids if ids is not None else text


def sorted_heads(result: PatchResult) -> list[PatchedHead]:
    """Every single-head row, most recovered first (undefined ones last, in layer order)."""
    rows = [PatchedHead(r.heads[0], r.recovered, r.patched, r.estimate)
            for r in result.rows if len(r.heads) == 1]

    def order(row: PatchedHead) -> tuple[int, float, Head]:
        value = row.recovered
        if value is None or not math.isfinite(value):
            return (1, 0.0, row.head)
        return (0, -value, row.head)

    return sorted(rows, key=order)


class PatchSession:
    """Inputs, result, sorted list and selection of the Patch tab."""

    def __init__(self) -> None:
        self.inputs = PatchInputs()
        self.prompts: dict[str, tuple[str, str]] = {}  # each built-in task's prompts, as text
        self.result: PatchResult | None = None
        self.rows: list[PatchedHead] = []
        self.cursor = 0
        self.shown_key: tuple[Any, ...] | None = None  # the request the result is for
        self.progress: float | None = None  # a run under way: how far

    # -- inputs ---------------------------------------------------------------------------
    @property
    def task(self) -> tuple[str, str] | None:
        """The chosen task's prompts, as text (None: not known yet)."""
        return self.prompts.get(self.inputs.task)

    @property
    def has_task(self) -> bool:
        return self.task is not None

    def set_task(self, clean: Sequence[int], corrupt: Sequence[int]) -> PatchInputs:
        """The chosen task's first sequence pair; the prompt boxes take it if empty."""
        text = self.prompts[self.inputs.task] = (ids_text(clean), ids_text(corrupt))
        if not self.inputs.clean and not self.inputs.corrupt:
            self.inputs = replace(self.inputs, clean=text[0], corrupt=text[1])
        return self.inputs

    def choose_task(self, task: str) -> bool:
        """Another built-in task: the boxes take its prompts (empty until they are known:
        empty boxes stand for the task), answer and wrong are cleared; whether it changed."""
        if task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}")
        before = self.inputs
        self.inputs = replace(self.inputs, task=task, clean="", corrupt="", answer="", wrong="")
        self.reset_task()
        return self.inputs != before

    def edit(self, **changes: str) -> bool:
        """Change some inputs (as typed); whether anything changed."""
        changes = {k: v.strip() if k in ("answer", "wrong") else v for k, v in changes.items()}
        new = replace(self.inputs, **changes)
        if new.site not in SITES:
            raise ValueError(f"site must be one of {', '.join(SITES)}")
        if new.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}")
        changed = new != self.inputs
        self.inputs = new
        return changed

    def reset_task(self) -> None:
        """Back to the chosen task's prompts (empty answer and wrong)."""
        if self.task is not None:
            self.inputs = replace(self.inputs, clean=self.task[0], corrupt=self.task[1],
                                  answer="", wrong="")

    @property
    def is_task(self) -> bool:
        """The prompts are the chosen task's, untouched, and no tokens are given: the request
        is the whole task (its batch and its metric)."""
        i = self.inputs
        if i.answer or i.wrong:
            return False
        if self.task is None:  # not known yet: empty boxes stand for it
            return not i.clean and not i.corrupt
        return (i.clean, i.corrupt) == self.task

    def request(self) -> dict[str, Any]:
        """The inputs as ``PatchInputsRequest.of`` takes them (for every head, or for edges)."""
        i = self.inputs
        if self.is_task:
            prompts: dict[str, Any] = {"clean": None, "corrupt": None}
        else:
            prompts = {"clean": _prompt(i.clean), "corrupt": _prompt(i.corrupt)}
        tokens = {"answer": i.answer or None, "wrong": i.wrong or None}
        return {**prompts, **tokens, "task": i.task if self.is_task else None}

    def key(self) -> tuple[Any, ...]:
        """The identity of the request (part of the tab's load key)."""
        req = self.request()
        values = (tuple(v) if isinstance(v, list) else v for v in req.values())
        return (*values, self.inputs.site, self.inputs.method)

    def task_text(self) -> str:
        """What is measured, in words."""
        if self.is_task:
            return f"{self.inputs.task} task: {TASKS[self.inputs.task][0]}"
        i = self.inputs
        if i.answer and i.wrong:
            return f"logit[{i.answer}] − logit[{i.wrong}] at the last position"
        return "your prompts: give an answer and a wrong token (their logit difference)"

    def form_problem(self) -> str | None:
        """What the form lacks before it can be run, in the form's own words (the engine's
        error named the CLI's flags, ``--answer``); None: it can run."""
        if self.is_task:
            return None
        i = self.inputs
        empty = [box for box in ("clean", "corrupt") if not getattr(i, box).strip()]
        if empty:
            return f"the {' and '.join(empty)} box{'es are' if len(empty) > 1 else ' is'} empty"
        missing = [box for box in ("answer", "wrong") if not getattr(i, box)]
        if missing:
            boxes = " and ".join(f"the {box} box" for box in missing)
            return (f"fill in {boxes}: your prompts are measured by logit[answer] − "
                    "logit[wrong] at the last position")
        return None

    def clear_result(self) -> None:
        """No result shown (the inputs changed into ones that cannot run, or the run failed):
        the old numbers must not stand beside the error as if they were the new ones."""
        self.result, self.rows, self.cursor, self.shown_key = None, [], 0, None

    # -- the result -----------------------------------------------------------------------
    def set_result(self, result: PatchResult, key: tuple[Any, ...]) -> None:
        keep = self.selected
        self.result = result
        self.shown_key = key
        self.rows = sorted_heads(result)
        heads = [r.head for r in self.rows]
        self.cursor = heads.index(keep.head) if keep is not None and keep.head in heads else 0

    @property
    def selected(self) -> PatchedHead | None:
        if not self.rows:
            return None
        return self.rows[min(max(self.cursor, 0), len(self.rows) - 1)]

    def select(self, index: int) -> PatchedHead | None:
        if self.rows:
            self.cursor = min(max(int(index), 0), len(self.rows) - 1)
        return self.selected

    def summary(self) -> str:
        """One line: the metric on the clean and corrupt runs, what recovered means."""
        r = self.result
        if r is None:
            return ""
        line = (f"clean {r.clean:+.3f} corrupt {r.corrupt:+.3f} "
                f"({r.batch}×{r.tokens} tokens)")
        return f"{line} · {r.note}" if r.note else line

    def records(self) -> dict[str, Any]:
        """What ``e`` exports: the JSON ``headscope patch --json`` prints for the result
        (``api.report.patch_dict``; imported here, not before the first frame), its heads
        most recovered first as the list shows them."""
        from headscope.engine.api.report import patch_dict

        r = self.result
        if r is None:
            return {}
        doc = patch_dict(r)
        order = {h.head: i for i, h in enumerate(self.rows)}
        doc["heads"] = sorted(doc["heads"], key=lambda row: order.get(
            (row.get("layer"), row.get("head")), len(order)))
        return doc


# -- the Composition tab's path effects -------------------------------------------------------


def path_edges(edges: Sequence[tuple[int, int, int, int, float]], top: int = PATH_EDGES
               ) -> list[tuple[Head, Head]]:
    """The strongest ``top`` composition edges (strongest first) as (sender, receiver)."""
    return [((e[0], e[1]), (e[2], e[3])) for e in list(edges)[:top]]


def path_effects(result: PatchResult) -> dict[tuple[Head, Head], float | None]:
    """Each edge's recovered fraction from a path-patching result (rows (sender, receiver))."""
    return {(r.heads[0], r.heads[1]): r.recovered for r in result.rows if len(r.heads) == 2}


def used(strong: bool, effect: float | None) -> bool:
    """A strong weight score whose path does move the metric (|recovered| ≥ NEAR_ZERO)."""
    return strong and effect is not None and math.isfinite(effect) and abs(effect) >= NEAR_ZERO


def unused(strong: bool, effect: float | None) -> bool:
    """A strong weight score whose path barely moves the metric: unused on this task."""
    return strong and effect is not None and abs(effect) < NEAR_ZERO
