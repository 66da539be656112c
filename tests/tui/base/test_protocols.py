"""The explorer's engine protocol (tui/base/protocols.py) against the real engine and the fake.

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
    # the lifecycle, one way in for every request, and the diff of two models
    assert names == {"ready", "set_raw", "aclose", "focus", "stats", "get", "compare"}
    assert {"structure", "max_block_bytes"} <= set(ExplorerEngine.__annotations__)


def test_the_fake_answers_every_request_type() -> None:
    from headscope.engine.core.requests import PatchRequest, request_types
    from tests.fake_engine import ANSWERS

    # the explorer never sends a bare PatchRequest (its inputs are text: PatchInputsRequest)
    # nor the parts the engine assembles head scores from (BehaviourRequest)
    explorer_sends = {t for t in request_types() if t.__name__ not in ("PatchRequest", "BehaviourRequest")}
    assert set(ANSWERS) == explorer_sends
    assert PatchRequest not in ANSWERS
    assert all(callable(getattr(FakeEngine, name)) for name in ANSWERS.values())


@pytest.mark.parametrize("cls", [Engine, FakeEngine])
def test_engine_matches_the_protocol(cls: type) -> None:
    assert mismatches(cls) == []


def test_a_drifted_fake_is_caught() -> None:
    class Drifted(FakeEngine):
        async def get(self, request: Any, on_progress: Any = None) -> Any:  # type: ignore[override]
            raise AssertionError

        async def stats(self) -> Any:  # type: ignore[override]
            raise AssertionError

        async def compare(self, other: Any, match_heads: bool = False,  # type: ignore[override]
                          threshold: float = 0.0) -> Any:
            raise AssertionError

    found = mismatches(Drifted)
    assert any(m.startswith("Drifted.get") for m in found)
    assert any(m.startswith("Drifted.stats: async") for m in found)
    assert any(m.startswith("Drifted.compare") for m in found)
    assert len(found) == 3


def test_a_missing_method_is_caught() -> None:
    class Partial:

        async def ready(self) -> None:
            return None

    found = mismatches(Partial)
    assert "Partial.ready: missing" not in found
    assert "Partial.get: missing" in found
