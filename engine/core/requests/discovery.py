"""Why a head attends and which edges carry a behaviour: QK attribution of one query row
(docs/math.md, "QK attribution"), edge attribution and faithfulness ("Edge attribution")."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from headscope.engine.core.errors import IndexOutOfRangeError, InvalidRequestError
from headscope.engine.core.requests.base import Request, _hashed, _where
from headscope.engine.core.requests.patching import PatchRequest
from headscope.engine.core.validation import (
    PATCH_BATCH,
    SEED,
    Structure,
    check_head,
    check_tokens,
)

# -- QK attribution (docs/math.md, "QK attribution") ---------------------------------------------


@dataclass(frozen=True)
class QKAttributionRequest(Request):
    """Why head ``layer``.``head_index`` scores each key from position ``query`` on the prompt
    ``tokens`` (ids): the whole query row, every key the query sees, at once (the explorer
    moves along the row without another request). ``of`` checks the key asked for too, though
    the row does not depend on it: a key after the query is refused with the allowed range.
    ``confirm = N``: each side's top N sources at each key also removed exactly (a second pass
    to the layer; ``QKAttribution.removals``)."""

    name: ClassVar[str] = "qk_attribution"
    layer: int
    head_index: int
    tokens: tuple[int, ...]
    query: int
    confirm: int = 0

    def key(self) -> str:
        # without ``confirm`` when it is 0: the key of a plain row, as before the field
        fields = [getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.name != "confirm" or self.confirm]
        return json.dumps([self.name, *fields], separators=(",", ":"))

    def label(self) -> str:
        return f"L{self.layer}H{self.head_index} why q={self.query}" + (" (exact)" if self.confirm else "")

    @classmethod
    def of(cls, structure: Structure, layer: int, head: int, tokens: Sequence[int], query: int,
           key: int | None = None, *, confirm: int = 0, where: Any = ...) -> QKAttributionRequest:
        where = _where(structure, where)
        check_head(structure, layer, head, where)
        ids = tuple(int(t) for t in tokens)
        check_tokens(structure, ids, where)
        n = len(ids)
        if not 0 <= int(query) < n:
            raise IndexOutOfRangeError(where, f"query {query} out of range (the prompt has {n} tokens: 0..{n - 1})")
        if key is not None and not 0 <= int(key) <= int(query):
            why = "is after the query (causal attention)" if int(key) > int(query) else "out of range"
            raise IndexOutOfRangeError(where, f"key {key} {why}: query {query} sees keys 0..{query}")
        if isinstance(confirm, bool) or int(confirm) != confirm or int(confirm) < 0:
            raise InvalidRequestError(where, f"--confirm must be a whole number of at least 0, not {confirm!r}")
        return cls(int(layer), int(head), ids, int(query), int(confirm))



# -- edge attribution (docs/math.md, "Edge attribution") ----------------------------------------

EDGE_METHODS = ("eap", "eap-ig")
EDGE_STEPS = 5  # eap-ig's default interpolation steps


def edge_count(structure: Structure) -> int:
    """How many edges the model's graph has (``core.edge_graph``'s ``n_edges``, counted
    without building it). ``structure`` may say ``attn_only`` and ``parallel_attn_mlp``
    (``sweeps.edges.edge_structure`` adds them); without, a model with no ``d_mlp`` is
    attention-only and attention and MLP run in sequence."""
    # imported here: edge_graph imports numpy, which the explorer's first frame must not wait
    # for (tests/tui/screens/test_opening.py); the requests are imported before it
    from headscope.engine.core.edge_graph import edge_graph

    attn_only = bool(structure.get("attn_only", structure.get("d_mlp") is None))
    return edge_graph(int(structure["n_layers"]), int(structure["n_heads"]), attn_only=attn_only,
                      parallel=bool(structure.get("parallel_attn_mlp", False))).n_edges


def _edge_inputs(structure: Structure, where: str | None, *, clean: Sequence[Sequence[int]] | None,
                 corrupt: Sequence[Sequence[int]] | None, answer: int | None, wrong: int | None,
                 task: str | None, seed: int, seq_len: int | None, batch: int, method: str,
                 steps: int) -> dict[str, Any]:
    """The inputs of edge attribution, checked as ``PatchRequest.of`` checks patching's (the
    same errors), and its method: ``eap`` or ``eap-ig`` with ``steps >= 1``."""
    inputs = PatchRequest.of(structure, clean=clean, corrupt=corrupt, answer=answer, wrong=wrong, seed=seed,
                             seq_len=seq_len, batch=batch, task=task, where=where)
    if inputs.task == "logit_diff" and inputs.clean == inputs.corrupt:
        raise InvalidRequestError(where, "the clean and corrupt inputs are the same: no edge carries a "
                                  "difference (every score is 0, faithfulness is undefined)")
    if method not in EDGE_METHODS:
        raise InvalidRequestError(where, f"--method must be eap or eap-ig, not {method!r}")
    if isinstance(steps, bool) or int(steps) != steps or int(steps) < 1:
        raise InvalidRequestError(where, f"--steps must be a whole number of at least 1, not {steps!r}")
    return dict(task=inputs.task, clean=inputs.clean, corrupt=inputs.corrupt, answer=inputs.answer,
                wrong=inputs.wrong, seed=inputs.seed, seq_len=inputs.seq_len, batch=inputs.batch,
                method=method, steps=int(steps) if method == "eap-ig" else 0)


@dataclass(frozen=True)
class _EdgeInputs(Request):
    """What an edge attribution is computed from, shared by ``EdgesRequest`` and
    ``FaithfulnessRequest`` (in this order: their store keys hash the fields in order).
    Inputs and metric as ``PatchRequest``'s; ``steps`` is 0 for ``eap``."""

    task: str
    clean: tuple[tuple[int, ...], ...] = ()
    corrupt: tuple[tuple[int, ...], ...] = ()
    answer: int | None = None
    wrong: int | None = None
    seed: int = SEED
    seq_len: int | None = None
    batch: int = PATCH_BATCH
    method: str = "eap-ig"
    steps: int = EDGE_STEPS


@dataclass(frozen=True)
class EdgesRequest(_EdgeInputs):
    """EAP or EAP-IG scores of every edge (``headscope edges``, ``Model.edges``, the Circuit
    tab), with the top ``verify`` edges by |score| also patched exactly. Inputs and metric as
    ``PatchRequest``'s (a built-in ``task``, or ``logit_diff`` prompts with ``answer`` and
    ``wrong``); ``steps`` is 0 for ``eap``. Stored under its key (a hash of every field)."""

    name: ClassVar[str] = "edges"
    stored: ClassVar[bool] = True
    origin_text: ClassVar[str | None] = "edge attribution"
    verify: int = 0

    def key(self) -> str:
        return _hashed("edges", self)

    def label(self) -> str:
        return f"{self.method} edge attribution"

    @classmethod
    def of(cls, structure: Structure, *, clean: Sequence[Sequence[int]] | None = None,
           corrupt: Sequence[Sequence[int]] | None = None, answer: int | None = None, wrong: int | None = None,
           task: str | None = None, method: str = "eap-ig", steps: int = EDGE_STEPS, verify: int = 0,
           seed: int = SEED, seq_len: int | None = None, batch: int = PATCH_BATCH, where: Any = ...
           ) -> EdgesRequest:
        where = _where(structure, where)
        inputs = _edge_inputs(structure, where, clean=clean, corrupt=corrupt, answer=answer, wrong=wrong,
                              task=task, seed=seed, seq_len=seq_len, batch=batch, method=method, steps=steps)
        n_edges = edge_count(structure)
        if isinstance(verify, bool) or not 0 <= int(verify) <= n_edges:
            raise InvalidRequestError(where, f"--verify must be between 0 and the graph's {n_edges} edges, "
                                      f"not {verify}")
        return cls(**inputs, verify=int(verify))


@dataclass(frozen=True)
class FaithfulnessRequest(_EdgeInputs):
    """The faithfulness of the top-N circuits (``tops``) of one edge attribution (its
    ``scores_request``), and with ``curve`` the curve over ``CURVE_FRACTIONS`` of the edges
    (``headscope faithfulness``, ``Model.faithfulness``, the Circuit tab's N). Stored under its
    key; the attribution under its own."""

    name: ClassVar[str] = "faithfulness"
    stored: ClassVar[bool] = True
    origin_text: ClassVar[str | None] = "faithfulness"
    tops: tuple[int, ...] = ()
    curve: bool = False

    def key(self) -> str:
        return _hashed("faithfulness", self)

    def label(self) -> str:
        return "faithfulness" + ("" if not self.tops else f" of the top {', '.join(map(str, self.tops))}")

    def scores_request(self) -> EdgesRequest:
        """The attribution whose top edges make the circuits."""
        return EdgesRequest(**{f.name: getattr(self, f.name) for f in dataclasses.fields(_EdgeInputs)})

    @classmethod
    def of(cls, structure: Structure, *, tops: Sequence[int] = (), curve: bool = False,
           clean: Sequence[Sequence[int]] | None = None, corrupt: Sequence[Sequence[int]] | None = None,
           answer: int | None = None, wrong: int | None = None, task: str | None = None,
           method: str = "eap-ig", steps: int = EDGE_STEPS, seed: int = SEED, seq_len: int | None = None,
           batch: int = PATCH_BATCH, where: Any = ...) -> FaithfulnessRequest:
        where = _where(structure, where)
        inputs = _edge_inputs(structure, where, clean=clean, corrupt=corrupt, answer=answer, wrong=wrong,
                              task=task, seed=seed, seq_len=seq_len, batch=batch, method=method, steps=steps)
        tops = (tops,) if isinstance(tops, int) else tuple(tops)
        if not tops and not curve:
            raise InvalidRequestError(where, "give --top N (the circuit of the top N edges) or --curve")
        n_edges = edge_count(structure)
        for n in tops:
            if isinstance(n, bool) or int(n) != n or not 1 <= int(n) <= n_edges:
                raise InvalidRequestError(where, f"--top {n} is not within the graph's {n_edges} edges "
                                          f"(1 .. {n_edges})")
        return cls(**inputs, tops=tuple(int(n) for n in tops), curve=bool(curve))
