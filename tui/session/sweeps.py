"""The explorer's engine requests that are not one tab's view, each issued from one place.

The score sweep, the ablation sweep and the scores stored by an earlier run, one head's
scores, the random-head null, the diff A → B (compare mode), the raw/processed switch and
tokenising the user's token set. Each function awaits one engine request and turns what can
go wrong into what the explorer does with it: a cancelled request gives ``None`` (the user
moved on, nothing to say), a ``HeadscopeError`` is reported (one line, a notification) and
gives ``None``. No Textual here: the explorer's workers await these and post the results as
messages tagged with the weights generation (tui/base/messages.py); the tests drive them
with the fake engine directly (tests/tui/session/test_sweeps.py).

Each builds its request (``engine.core.requests``) and awaits ``engine.get``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from headscope.engine.core.errors import CancelledError as EngineCancelled
from headscope.engine.core.errors import HeadscopeError
from headscope.engine.core.requests import (
    AblationSweepRequest,
    HeadScoresRequest,
    Request,
    ScoreNullRequest,
    ScoreTableRequest,
    TokenizeRequest,
)
from headscope.tui.base.labels import score_rows
from headscope.tui.session.choices import token_ids

if TYPE_CHECKING:
    import numpy as np

    from headscope.engine.api.diff import ModelDiff
    from headscope.engine.core.results import HeadScores, ScoreNull
    from headscope.tui.base.protocols import ExplorerEngine

Head = tuple[int, int]
Report = Callable[[str], None]  # an error the user should see
ShowProgress = Callable[[float | None], None]  # a sweep's fraction done; None: finished
T = TypeVar("T")


async def _asked(request: Awaitable[T], report: Report, prefix: str = "") -> T | None:
    """``request``'s result; ``None`` if it was cancelled or failed (reported)."""
    try:
        return await request
    except EngineCancelled:
        return None
    except HeadscopeError as err:
        report(f"{prefix}{err}")
        return None


async def swept(engine: ExplorerEngine, request: Request, show: ShowProgress,
                report: Report) -> Any:
    """Run an engine sweep, its progress shown (``show``, called from the engine's threads);
    ``None`` if it was cancelled or failed (reported)."""
    def progress(fraction: float) -> None:
        show(float(fraction))

    show(0.0)
    try:
        return await _asked(engine.get(request, progress), report)
    finally:
        show(None)


async def all_scores(engine: ExplorerEngine, show: ShowProgress,
                     report: Report) -> list[HeadScores] | None:
    """Every head's scores (``ScoreTableRequest``), in layer order."""
    table = await swept(engine, ScoreTableRequest(), show, report)
    return None if table is None else score_rows(table)


async def stored_ablation(engine: ExplorerEngine) -> np.ndarray | None:
    """The ablation effects an earlier run stored (``a``, or ``heads --ablation``), if any:
    shown at once; the sweep itself stays opt-in. Quiet when it cannot be read."""
    try:
        return await engine.get(AblationSweepRequest(stored_only=True))
    except (EngineCancelled, HeadscopeError):
        return None


async def ablation(engine: ExplorerEngine, show: ShowProgress,
                   report: Report) -> np.ndarray | None:
    """Every head's zero-ablation effect [L, H] (``AblationSweepRequest``)."""
    return await swept(engine, AblationSweepRequest(), show, report)


async def head_scores(engine: ExplorerEngine, head: Head, report: Report) -> HeadScores | None:
    """One head's scores, before the sweep reaches it."""
    return await _asked(engine.get(HeadScoresRequest.of(engine.structure, *head)), report)


async def score_null(engine: ExplorerEngine, report: Report,
                     failed: Callable[[], None]) -> ScoreNull | None:
    """The scores of random heads (``ScoreNullRequest``); ``failed()`` when the engine
    cannot compute it (then it is said once, not asked again for these weights)."""
    try:
        return await engine.get(ScoreNullRequest())
    except EngineCancelled:
        return None
    except HeadscopeError as err:
        failed()
        report(str(err))
        return None


async def diff(engine: ExplorerEngine, engine_b: Any, match_heads: bool, report: Report,
               failed: Callable[[str], None]) -> ModelDiff | None:
    """The diff A → B (compare mode); ``failed(why)`` for the Changes tab's note."""
    try:
        return await engine.compare(engine_b, match_heads=match_heads)
    except EngineCancelled:
        return None
    except HeadscopeError as err:
        report(f"compare: {err}")
        failed(f"cannot compare: {err}")
        return None


async def set_raw(engine: ExplorerEngine, set_raw_b: Callable[[bool], Awaitable[None]],
                  raw: bool, report: Report) -> bool:
    """Switch A to raw (or processed) weights, then B (``set_raw_b``: compare mode's);
    whether it happened."""
    try:
        await engine.set_raw(raw)
        await set_raw_b(raw)  # B follows A; its diff is then stale
    except HeadscopeError as err:
        report(str(err))
        return False
    return True


NOT_TOKENISED = object()  # tokens(): the text could not be tokenised (reported)


async def tokens(text: str, report: Report, ready: Callable[[], Awaitable[Any]],
                 engine: Callable[[], ExplorerEngine]) -> list[int] | object | None:
    """The token ids of the user's token set: ``#12 #40`` as written, words through the
    model's tokenizer (``engine()``, once ``ready()``), ``None`` for the empty text (the
    default set); ``NOT_TOKENISED`` if the tokenizer failed (reported)."""
    text = text.strip()
    ids = token_ids(text)
    if text and ids is None:  # words: the model's tokenizer says which tokens
        await ready()
        try:
            found = engine()
            return await found.get(TokenizeRequest.of(found.structure, text))
        except HeadscopeError as err:
            report(str(err))
            return NOT_TOKENISED
    return ids
