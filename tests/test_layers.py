"""The layers of docs/internals.md ("Layers") hold: import-linter's contracts in pyproject.toml
pass, and no module imports itself back through any chain of imports.

Both count imports inside functions and under ``TYPE_CHECKING``. ``tests/test_engine_imports.py``
proves separately that the lazy imports which point down (to defer torch) really defer.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("headscope.engine", "headscope.tui")


def test_import_contracts_hold() -> None:
    # import-linter in this interpreter (not whatever `lint-imports` is on PATH), so it lints
    # the headscope this venv imports
    run = "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())"
    proc = subprocess.run([sys.executable, "-c", run, "--no-cache"], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the components with more than one module are cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_strongly_connected_finds_a_cycle() -> None:
    # the checker itself: a three-module ring is found, a chain is not
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_module_imports_itself_back() -> None:
    # acyclic_siblings only compares siblings; this also catches a package and its own
    # children importing each other (a registry in __init__ that its modules import)
    graph = grimp.build_graph(*PACKAGES, include_external_packages=False,
                              exclude_type_checking_imports=False)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    cycles = strongly_connected(edges)
    assert cycles == [], "\n".join(" -> ".join(c) for c in cycles)


def test_forward_and_circuits_are_independent_siblings() -> None:
    # the weight algebra and the forward pass share plumbing through core and model only
    # (pyproject's "forward | circuits" layer): neither imports the other, even lazily
    graph = grimp.build_graph("headscope.engine", include_external_packages=False,
                              exclude_type_checking_imports=False)
    for a, b in (("forward", "circuits"), ("circuits", "forward")):
        found = graph.find_matching_direct_imports(
            import_expression=f"headscope.engine.{a}.** -> headscope.engine.{b}.**")
        assert found == [], found
