"""The explorer's engine protocol (tui/engine_api.py) against the real engine and the fake.

Checked without opening a model: for every method of the protocol, the class defines it, it
is a coroutine function exactly when the protocol's is, and its parameters have the same names
and kinds (positional, keyword-only, ...) in the same order. A renamed or added parameter in
``Engine`` fails here until the fake (and the protocol) follow.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from headscope.engine.service.engine import Engine
from headscope.tui.base.protocols import ExplorerEngine, protocol_members
from tests.fake_engine import FakeEngine


def shape(fn: Any) -> list[tuple[str, inspect._ParameterKind]]:
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()
            if p.name != "self"]


def mismatches(cls: type) -> list[str]:
    out = []
    for name, proto in protocol_members().items():
        impl = getattr(cls, name, None)
        if impl is None or not callable(impl):
            out.append(f"{cls.__name__}.{name}: missing")
            continue
        if inspect.iscoroutinefunction(impl) != inspect.iscoroutinefunction(proto):
            out.append(f"{cls.__name__}.{name}: async is "
                       f"{inspect.iscoroutinefunction(impl)}, the protocol's "
                       f"{inspect.iscoroutinefunction(proto)}")
        if shape(impl) != shape(proto):
            out.append(f"{cls.__name__}.{name}{inspect.signature(impl)} != "
                       f"protocol {inspect.signature(proto)}")
    return out


def test_the_protocol_lists_what_the_explorer_calls() -> None:
    names = set(protocol_members())
    assert {"ready", "circuit_block", "top_outputs", "spectrum", "rotary_profile", "run_prompt",
            "head_scores", "all_head_scores", "all_ablation_effects", "composition", "compare",
            "set_raw", "tokenize", "focus", "stats", "aclose"} <= names
    assert "structure" in ExplorerEngine.__annotations__


@pytest.mark.parametrize("cls", [Engine, FakeEngine])
def test_engine_matches_the_protocol(cls: type) -> None:
    assert mismatches(cls) == []


def test_a_drifted_fake_is_caught() -> None:
    class Drifted(FakeEngine):
        async def circuit_block(self, layer: int, head: int, kind: str,  # type: ignore[override]
                                basis: str, rows: Any = None, columns: Any = None,
                                offset: int = 0) -> Any:
            raise AssertionError

        def spectrum(self, layer: int, head: int, kind: str) -> Any:  # type: ignore[override]
            raise AssertionError

        async def compare(self, other: Any, match_heads: bool = False,  # type: ignore[override]
                          threshold: float = 0.0) -> Any:
            raise AssertionError

    found = mismatches(Drifted)
    assert any(m.startswith("Drifted.circuit_block") for m in found)
    assert any(m.startswith("Drifted.spectrum: async") for m in found)
    assert any(m.startswith("Drifted.compare") for m in found)
    assert len(found) == 3


def test_a_missing_method_is_caught() -> None:
    class Partial:

        async def ready(self) -> None:
            return None

    found = mismatches(Partial)
    assert "Partial.ready: missing" not in found
    assert "Partial.circuit_block: missing" in found
