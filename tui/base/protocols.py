"""What the explorer needs from an engine, and what a tab's pane needs from its host.

``ExplorerEngine``: what the explorer needs from an engine: the lifecycle of one open model
and ``get(request)``. A pane builds its request with ``SomeRequest.of(engine.structure, ...)``
(``engine.core.requests``: validated where it is built, as the CLI's and the API's are) and
awaits ``engine.get(request, progress)``; adding a request type adds nothing here.

``headscope.engine.service.engine.Engine`` satisfies this protocol, and so does the test fake
(``tests/fake_engine.FakeEngine``); ``tests/tui/base/test_protocols.py`` checks both against it
(method names, async or not, parameter names and kinds), so the fake cannot drift from the
engine's signatures. Every request is a coroutine: the engine computes on its own threads
and the UI awaits it in a worker (docs/internals.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from headscope.engine.core.progress import Progress

if TYPE_CHECKING:
    from headscope.engine.api.diff import ModelDiff
    from headscope.engine.api.timeline import Timeline
    from headscope.engine.core.requests import Request
    from headscope.engine.core.results import (
        CacheStats,
        CircuitBlock,
        Composition,
        PromptView,
        Spectrum,
    )

# Defaults written ``...`` are the engine's own (e.g. ``engine.core.validation.EDGE_THRESHOLD``):
# the protocol fixes names, kinds and types, not default values.


class ExplorerEngine(Protocol):
    """One open model, as the explorer uses it."""

    # Header and config (layers, heads, positional, vocabulary, ...): there at once.
    structure: dict[str, Any]
    # The most bytes one materialised result may hold (a block's or a prompt's ``limit=``).
    max_block_bytes: int

    async def ready(self) -> None: ...

    async def set_raw(self, raw: bool) -> None: ...

    async def aclose(self) -> None: ...

    def focus(self, layer: int, head: int) -> None: ...

    def stats(self) -> CacheStats: ...

    async def get(self, request: Request, progress: Progress = None, *,
                  partial: Callable[[Composition], None] | None = None) -> Any: ...

    async def compare(self, other: Any, *, match_heads: bool = False,
                      threshold: float = ...) -> ModelDiff: ...


def protocol_members() -> dict[str, Any]:
    """The protocol's methods by name (what a conforming engine must define)."""
    return {name: value for name, value in vars(ExplorerEngine).items()
            if callable(value) and not name.startswith("_")}


Head = tuple[int, int]
LoadKey = tuple[Any, ...]  # (tab, head or None, weights generation, what else the view shows)


class CompareSide(Protocol):
    """Model B as a pane sees it (``tui.session.compare.CompareMode``): B's side of what the
    pane shows, ``None`` while B has nothing to show."""

    path: str | None
    error: str | None
    engine_b: ExplorerEngine | None
    diff: ModelDiff | None
    changes_kind: str

    async def block_b(self, block: CircuitBlock, offset: int = 0) -> CircuitBlock | None: ...

    async def figures(self, block: CircuitBlock, block_b: CircuitBlock, title: str, what: str,
                      *, xlabel: str = "", diagonal: bool = False) -> tuple[Any, Any]: ...

    async def spectra_b(self, head: Head) -> tuple[Spectrum | None, Spectrum | None]: ...

    async def prompt_b(self, text: str, head: Head) -> PromptView | None: ...


class TimelineSource(Protocol):
    """The series as the Timeline pane draws it (``tui.session.timeline.TimelineState``)."""

    sources: list[Any]
    index: int
    timeline: Timeline | None
    error: str | None
    done: int

    @property
    def step(self) -> int: ...


class PaneChoices(Protocol):
    """The user's choices a pane shows (``tui.session.choices.ViewChoices``)."""

    tokens: list[int] | None  # QK/OV rows and columns; None: the engine's default set
    qk_offset: int  # rotary QK: the offset Δ
    source_index: int  # the OV source row whose top outputs are listed
    prompt_text: str


class PaneHost(Protocol):
    """What a tab's pane needs from the screen it is on (``ExplorerScreen``): the engine, the
    model's shape, the focused head and the user's choices, where results are kept for the
    export, and whether a load is still wanted. Panes ask for nothing else: what the user
    does in a pane goes back as a message (tui/base/messages.py)."""

    @property
    def engine(self) -> ExplorerEngine: ...

    @property
    def structure(self) -> dict[str, Any]: ...

    @property
    def n_layers(self) -> int: ...

    @property
    def n_heads(self) -> int: ...

    @property
    def gen(self) -> int: ...

    @property
    def head(self) -> Head | None: ...

    @property
    def choices(self) -> PaneChoices: ...

    @property
    def compare(self) -> CompareSide: ...

    @property
    def timeline(self) -> TimelineSource: ...

    def fresh(self, key: LoadKey) -> bool:
        """Whether a load for ``key`` is still what its tab should show."""
        ...

    def keep_result(self, tab: str, data: Any) -> None:
        """``data`` is what ``tab`` shows now (``e`` exports it)."""
        ...

    def sweep_progress(self, fraction: float | None) -> None:
        """A sweep's progress for the status bar (``None``: done); called from any thread."""
        ...

    @property
    def has_scores(self) -> bool:
        """Some head's scores are known (the Summary tab has rows to show)."""
        ...

    def show_summary(self) -> None:
        """Draw the Summary tab from the scores known so far."""
        ...

    def patch_request(self) -> dict[str, Any]:
        """The Patch tab's inputs as ``PatchInputsRequest.of`` takes them (the current task)."""
        ...

    def report(self, message: str) -> None:
        """An error the user should see (a notification; the app keeps running)."""
        ...
