"""What the explorer needs from an engine.

``headscope.engine.service.engine.Engine`` satisfies this protocol, and so does the test fake
(``tests/fake_engine.FakeEngine``); ``tests/test_tui_engine_api.py`` checks both against it
(method names, async or not, parameter names and kinds), so the fake cannot drift from the
engine's signatures. Every request is a coroutine: the engine computes on its own threads
and the UI awaits it in a worker (docs/internals.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

    from headscope.engine.api.diff import ModelDiff
    from headscope.engine.core.results import (
        CacheStats,
        CircuitBlock,
        Composition,
        HeadScores,
        Profile,
        PromptView,
        ScoreNull,
        ScoreTable,
        SingularDirections,
        Spectrum,
        TopTokens,
        VirtualPath,
    )

Progress = Callable[[float], None] | None
# Defaults written ``...`` are the engine's own (e.g. ``engine.diff.EDGE_THRESHOLD``): the
# protocol fixes names, kinds and types, not default values.


class ExplorerEngine(Protocol):
    """One open model, as the explorer uses it."""

    # Header and config (layers, heads, positional, vocabulary, ...): there at once.
    structure: dict[str, Any]

    async def ready(self) -> None: ...

    async def set_raw(self, raw: bool) -> None: ...

    async def aclose(self) -> None: ...

    def focus(self, layer: int, head: int) -> None: ...

    def stats(self) -> CacheStats: ...

    async def tokenize(self, text: str) -> list[int]: ...

    async def circuit_block(self, layer: int, head: int, kind: Any, basis: Any = "token",
                            rows: Sequence[int] | None = None, cols: Sequence[int] | None = None,
                            offset: int = 0) -> CircuitBlock: ...

    async def top_outputs(self, layer: int, head: int, source_token: int,
                          k: int = 10) -> TopTokens: ...

    async def singular_directions(self, layer: int, head: int, kind: Any, k: int = 5,
                                  top: int = 10) -> SingularDirections: ...

    async def virtual_path(self, source: tuple[int, int], target: tuple[int, int],
                           rows: Sequence[int] | None = None,
                           cols: Sequence[int] | None = None) -> VirtualPath: ...

    async def score_null(self) -> ScoreNull: ...

    async def spectrum(self, layer: int, head: int, kind: Any) -> Spectrum: ...

    async def rotary_profile(self, layer: int, head: int, offsets: Sequence[int]) -> Profile: ...

    async def run_prompt(self, text: str, layer: int, head: int) -> PromptView: ...

    async def head_scores(self, layer: int, head: int) -> HeadScores: ...

    async def all_head_scores(self, progress: Progress = None) -> ScoreTable: ...

    async def all_ablation_effects(self, progress: Progress = None) -> np.ndarray: ...

    async def composition(self, kind: Any, progress: Progress = None,
                          partial: Callable[[Composition], None] | None = None) -> Composition: ...

    async def compare(self, other: Any, *, match_heads: bool = False,
                      threshold: float = ...) -> ModelDiff: ...


def protocol_members() -> dict[str, Any]:
    """The protocol's methods by name (what a conforming engine must define)."""
    return {name: value for name, value in vars(ExplorerEngine).items()
            if callable(value) and not name.startswith("_")}
