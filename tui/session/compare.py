"""Compare mode's state: model B, its diff against A, head matching and B's requests.

``headscope A --compare B`` opens B with the same engine factory as A; ``Engine.compare`` diffs
A → B (tui/widgets/compare.py reads the diff for the views). The explorer's views ask this object for
B's side of what they show: the request goes to B's head matched to A's focused one, once
B is open, and comes back ``None`` (not an exception) when B has nothing to show yet.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from headscope.engine.core.errors import CancelledError as EngineCancelled
from headscope.engine.core.errors import HeadscopeError

if TYPE_CHECKING:  # tui.plots (plotext, numpy) is imported once B's views are drawn
    from headscope.engine.api.diff import ModelDiff
    from headscope.engine.core.results import CircuitBlock, PromptView, Spectrum
    from headscope.tui.base.protocols import ExplorerEngine
    from headscope.tui.plots.figures import Heatmap

Head = tuple[int, int]
COMPARE_VIEWS = ("side", "diff")  # QK/OV: A | B side by side, or A | B − A


class CompareMode:
    """Model B next to model A (``path`` is ``None``: no compare mode)."""

    def __init__(self, path: str | None, match_heads: bool,
                 report: Callable[[str], None]) -> None:
        self.path = path
        # Match B's heads to A's by circuit similarity (independent runs number heads
        # arbitrarily): B's views then show the head matched to A's focused one.
        self.match_heads = match_heads
        self._report = report
        self.engine_b: ExplorerEngine | None = None
        self.error: str | None = None
        self.diff: ModelDiff | None = None
        self.view = "side"  # QK/OV: A | B side by side, or A | B − A
        self.changes_kind = "k"  # the Changes tab's composition-graph diff

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def open(self, factory: Callable[[str, bool], ExplorerEngine], raw: bool) -> None:
        """Open model B with A's engine factory; a failure is kept in ``error``."""
        if self.path is None:
            return
        try:
            self.engine_b = factory(self.path, raw)
        except HeadscopeError as err:
            self.error = str(err)
        except Exception as err:
            self.error = f"{self.path}: cannot open ({err!r})"

    async def set_raw(self, raw: bool) -> None:
        """Model B follows A to raw or processed weights (no model B: nothing to do); the
        diff A → B is then stale until computed again."""
        if self.engine_b is None:
            return
        await self.engine_b.set_raw(raw)
        self.diff = None

    def next_view(self) -> str:
        i = COMPARE_VIEWS.index(self.view)
        self.view = COMPARE_VIEWS[(i + 1) % len(COMPARE_VIEWS)]
        return self.view

    def next_changes_kind(self) -> None:
        self.changes_kind = {"q": "k", "k": "v", "v": "q"}[self.changes_kind]

    def head_b(self, head: Head) -> Head | None:
        """B's head shown beside A's ``head``: the same one, or with ``match_heads`` the
        matched one (``None`` until the diff has matched them)."""
        if not self.match_heads:
            return head
        matching = getattr(self.diff, "matching", None)
        return None if matching is None else (head[0], int(matching[head[0]][head[1]]))

    def title_b(self, what: str, head: Head) -> str:
        """``what L1.H2``: the B head shown beside A's ``head``, marked when matched."""
        layer, h = self.head_b(head) or head
        return f"{what} L{layer}.H{h}" + (" (matched)" if (layer, h) != head else "")

    async def figures(self, block: CircuitBlock, block_b: CircuitBlock, title: str, what: str,
                      *, xlabel: str = "", diagonal: bool = False) -> tuple[Heatmap, Heatmap]:
        """A's and B's heatmaps of ``block`` in the current view (side by side or B − A)."""
        from headscope.tui.plots.pairs import pair_figures  # numpy: once B's views are drawn

        head = (block.layer, block.head)
        return await pair_figures(block, block_b, self.view, title, self.title_b(what, head),
                                  xlabel=xlabel, diagonal=diagonal)

    async def block_b(self, block: CircuitBlock, offset: int = 0) -> CircuitBlock | None:
        """Model B's circuit block over the same rows and columns as A's ``block``."""
        from headscope.engine.core.requests import CircuitRequest  # (see ``_prompt_b``)

        return await self._from_b((block.layer, block.head), lambda h: self._b.get(CircuitRequest.of(
            self._b.structure, *h, block.kind, block.basis, rows=list(block.row_ids),
            cols=list(block.col_ids), offset=offset, limit=self._b.max_block_bytes)))

    async def spectra_b(self, head: Head) -> tuple[Spectrum | None, Spectrum | None]:
        """Model B's OV and QK spectra of the head shown beside A's (``None`` if unavailable)."""
        from headscope.engine.core.requests import SpectrumRequest  # (see ``_prompt_b``)

        both = await self._from_b(head, lambda h: asyncio.gather(
            *(self._b.get(SpectrumRequest.of(self._b.structure, *h, kind)) for kind in ("ov", "qk"))))
        return (None, None) if both is None else (both[0], both[1])

    async def prompt_b(self, text: str, head: Head) -> PromptView | None:
        """Model B's view of the prompt at the head shown beside A's (``None`` if unavailable)."""
        return await self._from_b(head, lambda h: self._prompt_b(text, h))

    async def _prompt_b(self, text: str, head: Head) -> PromptView:
        # the request types are imported where used: the app imports this module before its
        # first frame, and ``engine.core.requests`` was 12 ms of it (bench.firstframe)
        from headscope.engine.core.requests import PromptRequest

        found = await self._b.get(PromptRequest.of(self._b.structure, text, limit=self._b.max_block_bytes))
        return found.view(*head)

    @property
    def _b(self) -> ExplorerEngine:
        assert self.engine_b is not None  # only asked for in compare mode
        return self.engine_b

    async def _from_b(self, head: Head, request: Callable[[Head], Awaitable[Any]]) -> Any:
        """``request(B's head)`` for the head shown beside A's ``head``, once model B is open;
        ``None`` until the heads are matched (the diff's arrival then reloads the view), when
        cancelled, or on an error (reported, naming model B)."""
        matched = self.head_b(head)
        if matched is None:
            return None
        try:
            await self._b.ready()
            return await request(matched)
        except EngineCancelled:
            return None
        except HeadscopeError as err:
            self._report(f"model B: {err}")
            return None
