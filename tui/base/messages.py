"""Every Textual ``Message`` of the UI, in one place (docs/internals.md, "The explorer").

Who posts what to whom:

- the app → the explorer: ``ModelReady``, ``ModelFailed`` (the engine opened the model, or not);
- the explorer's workers → the explorer: ``ScoresSwept``, ``HeadScored``, ``AblationSwept``,
  ``NullLoaded``, ``Compared``, each tagged with the weights generation ``gen`` it was computed
  for (a result for older weights is dropped);
- timeline mode → the Timeline pane: ``TimelineComputed``;
- widgets → the explorer (they bubble up from the pane): ``HeadHighlighted``, ``HeadChosen``
  (the head tree), ``EdgeChosen`` (the composition pane), ``PhaseChangeChosen`` (the timeline
  pane), ``PatchRequested`` and ``PatchHeadChosen`` (the patch pane), ``WhyHeadSelected`` and
  ``WhyKeyMoved`` (the "why" view of QK attribution). Widgets say what the user chose; the
  explorer decides what that does.

Payload types are imported for type checking only: this module is imported before the first
frame and must stay free of numpy and the engine's results.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual.message import Message

if TYPE_CHECKING:
    import numpy as np

    from headscope.engine.api.diff import ModelDiff
    from headscope.engine.api.timeline import Timeline
    from headscope.engine.core.results import HeadScores, ScoreNull

Head = tuple[int, int]


# -- the app → the explorer ---------------------------------------------------------------
@dataclass
class ModelReady(Message, bubble=False):
    """The engine has opened the model (the app → the explorer)."""


@dataclass
class ModelFailed(Message, bubble=False):
    """The model could not be opened or made ready (the app → the explorer): ``error`` for
    the status bar, ``charts`` for every chart."""

    error: str
    charts: str


# -- the explorer's workers → the explorer -----------------------------------------------------
@dataclass
class ScoresSwept(Message, bubble=False):
    """Every head's scores, for the weights of generation ``gen``."""

    rows: list[HeadScores]
    gen: int


@dataclass
class HeadScored(Message, bubble=False):
    """One head's scores (before the sweep reached it), for generation ``gen``."""

    scores: HeadScores
    gen: int


@dataclass
class AblationSwept(Message, bubble=False):
    """The zero-ablation effect of every head [L, H], for generation ``gen`` (``stored``: read
    back from the results store, not swept now)."""

    effects: np.ndarray
    gen: int
    stored: bool = False


@dataclass
class NullLoaded(Message, bubble=False):
    """The scores of random heads (``ScoreNullRequest``), for generation ``gen``."""

    null: ScoreNull
    gen: int


@dataclass
class Compared(Message, bubble=False):
    """The diff A → B (compare mode), for generation ``gen``."""

    diff: ModelDiff
    gen: int


# -- timeline mode → the Timeline pane ---------------------------------------------------------
@dataclass
class TimelineComputed(Message, bubble=False):
    """The timeline of the series (timeline mode → the Timeline tab's pane)."""

    timeline: Timeline


# -- widgets → the explorer (bubbling) -----------------------------------------------------------
class HeadHighlighted(Message):
    """The tree's cursor is on a head (``head``; the explorer debounces it), or on another
    node (``head`` None; ``kind``: "embed", "layer", "mlp", "unembed", ...)."""

    def __init__(self, head: Head | None, kind: str | None) -> None:
        super().__init__()
        self.head = head
        self.kind = kind


class HeadChosen(Message):
    """Enter on a head in the tree: focus it at once (no debounce)."""

    def __init__(self, head: Head) -> None:
        super().__init__()
        self.head = head


@dataclass
class EdgeChosen(Message):
    """Enter on a composition edge ``source → target``: open its virtual heads."""

    source: Head
    target: Head


@dataclass
class PhaseChangeChosen(Message):
    """Enter on a phase change of the Timeline tab: focus ``head`` at step index ``index``."""

    head: Head
    index: int


@dataclass
class PatchRequested(Message):
    """The Patch tab's inputs changed (a prompt box submitted, the task, site or method chosen):
    the explorer runs patching for them (the pane → the explorer)."""


@dataclass
class PatchHeadChosen(Message):
    """Enter on a head of the Patch tab (its heatmap's sorted list): focus ``head``."""

    head: Head


@dataclass
class WhyHeadSelected(Message):
    """Enter on a source head of the "why" view (its ranked terms or a side's totals): jump to
    ``head``, which feeds the explained head's ``side`` (``"query"`` or ``"key"``)."""

    head: Head
    side: str


@dataclass
class WhyKeyMoved(Message):
    """The "why" view moved to key position ``key`` of head ``head``'s query row ``query``
    (from its cached row, no engine call): the explorer may move its pattern cursor along."""

    head: Head
    query: int
    key: int


@dataclass
class CircuitEdgeChosen(Message):
    """Enter on an edge of the circuit pane's list: show its heads' QK/OV views and their
    composition score beside the edge's causal evidence. ``edge`` is its name
    (``a0.h1->a1.h2<k>``); ``source`` and ``target`` its heads (None for ``input``, an MLP,
    the logits); ``input`` the target head's input it enters (``q``/``k``/``v``, else None)."""

    edge: str
    source: Head | None
    target: Head | None
    input: str | None


@dataclass
class CircuitTopChanged(Message):
    """The circuit pane's N changed (its keys): the circuit of the top ``top`` edges is drawn
    at once; its faithfulness needs the engine (the pane → the explorer)."""

    top: int
