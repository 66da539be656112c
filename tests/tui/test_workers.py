"""Every Textual worker the app starts is handed a function, never a coroutine made ahead.

An exclusive worker that a newer one replaces before it starts is cancelled unrun; a coroutine
made for it is then never awaited, and Python prints a RuntimeWarning on the terminal when the
app exits (tests/tui/widgets/test_chart.py shows one). Textual's own ``@work`` decorator hands
``run_worker`` a ``functools.partial`` for the same reason (textual/_work_decorator.py)."""

from __future__ import annotations

import ast
from pathlib import Path

TUI = Path(__file__).resolve().parents[2] / "tui"


def eager_coroutines(tree: ast.AST) -> list[int]:
    """Lines of ``run_worker(f(...), ...)`` calls whose work is a call other than ``partial``."""
    lines = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "run_worker" and node.args
                and isinstance(work := node.args[0], ast.Call)
                and not (isinstance(work.func, ast.Name) and work.func.id == "partial")):
            lines.append(node.lineno)
    return lines


def test_the_check_finds_a_coroutine_made_ahead() -> None:
    assert eager_coroutines(ast.parse("self.run_worker(self._load(key), exclusive=True)")) == [1]
    assert eager_coroutines(ast.parse("self.run_worker(partial(self._load, key))\n"
                                      "self.run_worker(self._start)")) == []


def test_no_worker_is_handed_a_coroutine() -> None:
    found = {f"{path.relative_to(TUI)}:{line}"
             for path in sorted(TUI.rglob("*.py"))
             for line in eager_coroutines(ast.parse(path.read_text(), str(path)))}
    assert not found, f"run_worker given a coroutine (pass partial(fn, ...) instead): {sorted(found)}"
