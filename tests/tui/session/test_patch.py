"""The Patch tab's state without Textual (tui/session/patch.py): the induction task as the
default inputs, the request the engine gets, the sorted list and its selection, the path
effects beside the composition edges."""

from __future__ import annotations

import pytest

from headscope.engine.core.results import PatchResult, PatchRow
from headscope.engine.core.validation import BUILTIN_TASKS, PATCH_METHODS, PATCH_SITES
from headscope.tui.session.patch import (
    METHODS,
    NEAR_ZERO,
    SITES,
    TASKS,
    PatchSession,
    path_edges,
    path_effects,
    sorted_heads,
    unused,
)


def result(values: dict[tuple[int, int], float | None], method: str = "exact") -> PatchResult:
    rows = tuple(PatchRow((head,), None if v is None else -6.0 + 5.5 * v, v)
                 for head, v in values.items())
    return PatchResult(method=method, site="out", metric="induction", noising=False,  # type: ignore[arg-type]
                       clean=-0.5, corrupt=-6.0, rows=rows, n_layers=2, n_heads=2, tokens=8,
                       batch=4)


def test_the_tab_offers_exactly_the_engines_tasks_sites_and_methods() -> None:
    """A task the engine gains gets its words in the Patch tab's task box (or this fails)."""
    assert tuple(TASKS) == BUILTIN_TASKS
    assert SITES == PATCH_SITES and METHODS == PATCH_METHODS


def test_the_task_is_the_request_until_the_inputs_are_edited() -> None:
    s = PatchSession()
    before = s.key()
    assert s.is_task and s.request() == {"clean": None, "corrupt": None, "answer": None,
                                         "wrong": None, "task": "induction"}
    s.set_task([5, 6, 5, 6], [5, 6, 9, 10])
    assert (s.inputs.clean, s.inputs.corrupt) == ("#5 #6 #5 #6", "#5 #6 #9 #10")
    assert s.is_task and s.key() == before  # the first load's key stays the tab's
    assert "induction task" in s.task_text()
    # the task's tokens with an answer and a wrong token: those ids, a logit difference
    s.edit(answer=" 7 ", wrong="#8")
    assert not s.is_task
    assert s.request() == {"clean": [5, 6, 5, 6], "corrupt": [5, 6, 9, 10], "answer": "7",
                           "wrong": "#8", "task": None}
    assert "logit[7] − logit[#8]" in s.task_text()
    # words go to the model's tokenizer as they are
    s.edit(clean="the cat sat", corrupt="the dog sat", answer="", wrong="")
    assert s.request()["clean"] == "the cat sat" and s.request()["answer"] is None
    assert s.key() != before
    s.reset_task()
    assert s.is_task and s.key() == before


def test_site_and_method_are_checked_and_part_of_the_key() -> None:
    s = PatchSession()
    key = s.key()
    assert s.edit(site="k") and s.key() != key
    assert not s.edit(site="k")  # nothing changed
    s.edit(method="attribution")
    assert s.key()[-2:] == ("k", "attribution")
    with pytest.raises(ValueError, match="site must be one of"):
        s.edit(site="mlp")
    with pytest.raises(ValueError, match="method must be one of"):
        s.edit(method="path")


def test_heads_sorted_by_recovered_undefined_last_and_the_selection_kept() -> None:
    r = result({(0, 0): 0.02, (0, 1): None, (1, 0): 0.15, (1, 1): 0.71})
    assert [h.label for h in sorted_heads(r)] == ["L1.H1", "L1.H0", "L0.H0", "L0.H1"]
    s = PatchSession()
    s.set_result(r, s.key())
    assert s.selected is not None and s.selected.head == (1, 1)
    assert s.select(2) is not None and s.selected.head == (0, 0)
    assert s.select(99) is not None and s.selected.head == (0, 1)  # clamped
    s.select(1)
    # a new result keeps the head selected, wherever it now sorts
    s.set_result(result({(0, 0): 0.9, (0, 1): 0.0, (1, 0): 0.15, (1, 1): 0.71}), s.key())
    assert s.selected.head == (1, 0) and s.cursor == 2
    assert "clean -0.500 corrupt -6.000 (4×8 tokens)" in s.summary()
    records = s.records()  # headscope patch --json's shape, most recovered first
    assert {"method", "site", "metric", "clean", "corrupt", "heads"} <= set(records)
    assert records["heads"][0] == {"layer": 0, "head": 0, "patched": pytest.approx(-1.05),
                                   "recovered": 0.9}
    assert [(h["layer"], h["head"]) for h in records["heads"]] == [h.head for h in s.rows]


def test_path_effects_and_unused_edges() -> None:
    edges = [(0, 1, 1, 2, 0.4), (0, 0, 1, 2, 0.3), (0, 2, 1, 0, 0.1)]
    assert path_edges(edges, top=2) == [((0, 1), (1, 2)), ((0, 0), (1, 2))]
    rows = (PatchRow(((0, 1), (1, 2)), -3.0, 0.5), PatchRow(((0, 0), (1, 2)), -6.0, 0.01),
            PatchRow(((0, 2), (1, 0)), None, None))
    found = PatchResult(method="path", site="k", metric="induction", noising=False,
                        clean=-0.5, corrupt=-6.0, rows=rows, n_layers=2, n_heads=3, tokens=8,
                        batch=4)
    effects = path_effects(found)
    assert effects[((0, 1), (1, 2))] == 0.5 and effects[((0, 2), (1, 0))] is None
    assert unused(True, 0.01) and unused(True, -NEAR_ZERO / 2)
    assert not unused(True, 0.5) and not unused(False, 0.0)
    assert not unused(True, None)  # undefined is not "unused": nothing is known


def test_choosing_a_task_puts_its_prompts_in_the_boxes() -> None:
    s = PatchSession()
    s.set_task([5, 6, 5, 6], [5, 6, 9, 10])
    s.edit(clean="the cat", corrupt="the dog", answer="cat", wrong="dog")
    assert s.choose_task("first-occurrence")
    # its prompts are not known yet: empty boxes stand for the task
    assert (s.inputs.clean, s.inputs.answer, s.inputs.wrong) == ("", "", "")
    assert s.is_task and s.request()["task"] == "first-occurrence"
    assert "first-occurrence task" in s.task_text()
    s.set_task([5, 6, 5, 6], [11, 6, 5, 6])
    assert (s.inputs.clean, s.inputs.corrupt) == ("#5 #6 #5 #6", "#11 #6 #5 #6")
    key = s.key()
    assert s.choose_task("induction") and s.inputs.corrupt == "#5 #6 #9 #10" and s.key() != key
    assert not s.choose_task("induction")  # nothing changed
    with pytest.raises(ValueError, match="task must be one of"):
        s.choose_task("logit_diff")
