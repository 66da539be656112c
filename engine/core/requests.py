"""Every request headscope answers, one frozen dataclass each, validated where it is built.

``SomeRequest.of(structure, ...)`` is the one place that names a request's fields and their
errors: the CLI, the explorer's ``Engine``, the Python API and ``api.report`` all build
requests this way, so the same bad request gives the same error type and the same one line
whichever way it comes in (the table: docs/internals.md, "The path of a request"). The
plain constructor does not validate (it is for requests derived from a valid one: a
neighbouring head's view, one edge of a path patch).

Each request has a stable ``key()`` (the in-memory cache key; for a ``stored`` request also
its part name in the results store) and a ``head``: the ``(layer, head)`` it belongs to, or
None for a model-wide request, by which the ``Engine`` prioritises and cancels. Its
computation is registered with ``@computes(SomeRequest)`` (``engine.sweeps``) and run by
``sweeps.dispatch.compute``. Checks read only the model's ``structure`` (header and config):
no torch is imported to refuse a request.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from headscope.engine.core.errors import IndexOutOfRangeError, InvalidRequestError, PromptError
from headscope.engine.core.validation import (
    BASES,
    BUILTIN_TASKS,
    CIRCUIT_KINDS,
    COMPOSITION_KINDS,
    DEFAULT_BLOCK,
    MAX_SEED,
    NULL_SAMPLES,
    PATCH_BATCH,
    PATCH_HALF,
    PATCH_METHODS,
    PATCH_SITES,
    PATH_INPUTS,
    SEED,
    TOP_EDGES,
    Structure,
    check_head,
    check_head_sets,
    check_ids,
    check_patchable,
    check_prompt,
    check_result_bytes,
    check_token,
    check_tokens,
)

__all__ = [
    "COMPUTATIONS",
    "AblationRequest",
    "AblationSweepRequest",
    "BehaviourRequest",
    "CircuitRequest",
    "CompositionRequest",
    "DirectionsRequest",
    "EdgesRequest",
    "FaithfulnessRequest",
    "HeadScoresRequest",
    "InductionPromptsRequest",
    "PatchInputsRequest",
    "PatchRequest",
    "PathRequest",
    "ProfileRequest",
    "PromptRequest",
    "QKAttributionRequest",
    "Request",
    "ScoreNullRequest",
    "ScoreTableRequest",
    "SpectrumRequest",
    "TokenizeRequest",
    "TopOutputsRequest",
    "computes",
]

Head = tuple[int, int]
R = TypeVar("R", bound="Request")

# request type -> its computation ``fn(model, request, *, progress, cancelled, store, **options)``
COMPUTATIONS: dict[type[Request], Callable[..., Any]] = {}


def computes(kind: type[Request]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as the one computation of ``kind`` requests."""
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        if kind in COMPUTATIONS:
            raise TypeError(f"{kind.__name__} already computed by {COMPUTATIONS[kind].__qualname__}")
        COMPUTATIONS[kind] = fn
        return fn

    return register


def _where(structure: Structure, where: Any) -> str | None:
    """Errors name the model as the CLI does (``structure["path"]``) unless told otherwise."""
    if where is not ...:
        return where  # type: ignore[return-value]
    path = structure.get("path")
    return None if path is None else str(path)


def _block(n: int, rows: Sequence[int] | None, cols: Sequence[int] | None
           ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Rows and cols as id tuples (``None``: the first ``DEFAULT_BLOCK`` ids)."""
    default = tuple(range(min(n, DEFAULT_BLOCK)))
    return (default if rows is None else tuple(int(i) for i in rows),
            default if cols is None else tuple(int(i) for i in cols))


@dataclass(frozen=True)
class Request:
    """What every request has: a name, a key, a head (or None), and whether it is stored."""

    name: ClassVar[str] = "request"
    stored: ClassVar[bool] = False  # its computation reads and writes the results store
    prefetched: ClassVar[bool] = False  # the Engine computes it ahead for the neighbouring heads
    # where its numbers came from, for ``Engine.stats().origin`` ("{kind}": a field)
    origin_text: ClassVar[str | None] = None

    @property
    def head(self) -> Head | None:
        layer, head = getattr(self, "layer", None), getattr(self, "head_index", None)
        return None if layer is None or head is None else (int(layer), int(head))

    def key(self) -> str:
        """Everything the result depends on, as one canonical string."""
        fields = [getattr(self, f.name) for f in dataclasses.fields(self)]
        return json.dumps([self.name, *fields], separators=(",", ":"))

    def at(self: R, layer: int, head: int) -> R:
        """The same view of another head (prefetch); only per-head requests have one."""
        return dataclasses.replace(self, layer=int(layer), head_index=int(head))  # type: ignore[call-arg]

    def published(self, result: Any) -> Iterable[tuple[Request, Any]]:
        """Other requests this result answers too (a sweep fills the per-head cache)."""
        return ()

    def label(self) -> str:
        """What the status bar says while it runs."""
        where = "" if self.head is None else f"L{self.head[0]}H{self.head[1]} "
        return where + self.name.replace("_", " ")

    def origin(self) -> str | None:
        """What ``Engine.stats().origin`` calls this request's numbers (None: not reported)."""
        return None if self.origin_text is None else self.origin_text.format(**as_mapping(self))


# -- one head's views ------------------------------------------------------------------------


@dataclass(frozen=True)
class CircuitRequest(Request):
    """A ``rows × cols`` block of a head's QK or full OV circuit in the token or position basis:
    ids in range, size within the limit, ``offset`` 0 unless rotary."""

    name: ClassVar[str] = "circuit_block"
    prefetched: ClassVar[bool] = True
    layer: int
    head_index: int
    kind: str
    basis: str
    rows: tuple[int, ...]
    cols: tuple[int, ...]
    offset: int

    @classmethod
    def of(cls, structure: Structure, layer: int, head: int, kind: str, basis: str = "token",
           rows: Sequence[int] | None = None, cols: Sequence[int] | None = None, offset: int = 0, *,
           where: Any = ..., limit: int | None = None) -> CircuitRequest:
        where = _where(structure, where)
        check_head(structure, layer, head, where)
        if kind not in CIRCUIT_KINDS or basis not in BASES:
            raise InvalidRequestError(where, f"unknown circuit {kind!r} in basis {basis!r}")
        if basis == "position" and kind != "qk":
            raise InvalidRequestError(where, "the position basis exists for the QK circuit only")
        positional = structure["positional"]
        if basis == "position" and positional != "learned":
            raise InvalidRequestError(
                where, f"{positional} positions have no positional QK matrix; use the token basis "
                "with an offset (rotary) or rotary_profile")
        n = int(structure["n_ctx"] if basis == "position" else structure["d_vocab"])
        row_ids, col_ids = _block(n, rows, cols)
        check_ids((*row_ids, *col_ids), n, basis, where)
        check_result_bytes(4 * len(row_ids) * len(col_ids), f"a {len(row_ids)}×{len(col_ids)} block",
                           where, limit)
        return cls(int(layer), int(head), kind, basis, row_ids, col_ids,
                   int(offset) if positional == "rotary" else 0)


@dataclass(frozen=True)
class TopOutputsRequest(Request):
    """The ``k`` output tokens the full OV circuit raises most when the head attends to ``source``."""

    name: ClassVar[str] = "top_outputs"
    layer: int
    head_index: int
    source: int
    k: int = 10

    @classmethod
    def of(cls, structure: Structure, layer: int, head: int, source: int, k: int = 10, *,
           where: Any = ...) -> TopOutputsRequest:
        where = _where(structure, where)
        check_head(structure, layer, head, where)
        check_token(structure, source, where)
        return cls(int(layer), int(head), int(source), max(1, min(int(k), int(structure["d_vocab"]))))


def _circuit_kind(kind: str, where: str | None) -> None:
    if kind not in CIRCUIT_KINDS:
        raise InvalidRequestError(where, f"spectrum kind must be 'ov' or 'qk', not {kind!r}")


@dataclass(frozen=True)
class SpectrumRequest(Request):
    """Eigenvalues of the full OV (``"ov"``) or token QK (``"qk"``) circuit, and its score
    (kept in the results store per head)."""

    name: ClassVar[str] = "spectrum"
    stored: ClassVar[bool] = True
    prefetched: ClassVar[bool] = True
    layer: int
    head_index: int
    kind: str

    @classmethod
    def of(cls, structure: Structure, layer: int, head: int, kind: str, *,
           where: Any = ...) -> SpectrumRequest:
        where = _where(structure, where)
        check_head(structure, layer, head, where)
        _circuit_kind(kind, where)
        return cls(int(layer), int(head), kind)


@dataclass(frozen=True)
class ProfileRequest(Request):
    """Rotary models: the head's QK score as a function of the query-key offset Δ."""

    name: ClassVar[str] = "rotary_profile"
    layer: int
    head_index: int
    offsets: tuple[int, ...]

    @classmethod
    def of(cls, structure: Structure, layer: int, head: int, offsets: Sequence[int], *,
           where: Any = ...) -> ProfileRequest:
        where = _where(structure, where)
        if structure["positional"] != "rotary":
            raise InvalidRequestError(where, "rotary_profile needs a rotary model")
        check_head(structure, layer, head, where)
        return cls(int(layer), int(head), tuple(int(o) for o in offsets))


@dataclass(frozen=True)
class HeadScoresRequest(Request):
    """Every score of one head: its two spectra and its row of the behavioural tables."""

    name: ClassVar[str] = "head_scores"
    stored: ClassVar[bool] = True  # its behaviour tables and spectra are
    layer: int
    head_index: int
    seed: int = SEED

    @classmethod
    def of(cls, structure: Structure, layer: int, head: int, *, where: Any = ...) -> HeadScoresRequest:
        check_head(structure, layer, head, _where(structure, where))
        return cls(int(layer), int(head))


@dataclass(frozen=True)
class AblationRequest(Request):
    """Loss increase on the seeded repeated sequence when the head's output is zeroed."""

    name: ClassVar[str] = "ablation"
    layer: int
    head_index: int
    seed: int = SEED

    @classmethod
    def of(cls, structure: Structure, layer: int, head: int, seed: int = SEED, *,
           where: Any = ...) -> AblationRequest:
        check_head(structure, layer, head, _where(structure, where))
        return cls(int(layer), int(head), int(seed))


@dataclass(frozen=True)
class DirectionsRequest(Request):
    """The top ``k`` singular directions of a head's full OV / token QK circuit, ``top``
    tokens a side: ``k >= 1`` (at most ``d_head`` exist), ``1 <= top <= d_vocab``."""

    name: ClassVar[str] = "directions"
    layer: int
    head_index: int
    kind: str
    k: int = 5
    top: int = 10

    @classmethod
    def of(cls, structure: Structure, layer: int, head: int, kind: str, k: int = 5, top: int = 10, *,
           where: Any = ...) -> DirectionsRequest:
        where = _where(structure, where)
        check_head(structure, layer, head, where)
        _circuit_kind(kind, where)
        if int(k) < 1:
            raise InvalidRequestError(where, f"--k must be at least 1, not {k}")
        d_vocab = int(structure["d_vocab"])
        if not 1 <= int(top) <= d_vocab:
            raise InvalidRequestError(where, f"--top must be in 1..{d_vocab}, not {top}")
        return cls(int(layer), int(head), kind, int(k), int(top))


@dataclass(frozen=True)
class PathRequest(Request):
    """The V- and K-composition virtual heads of ``source → target`` (``source`` in an
    earlier layer) and a ``rows × cols`` token block of the K-path. Belongs to ``target``."""

    name: ClassVar[str] = "virtual_heads"
    source: Head
    target: Head
    rows: tuple[int, ...]
    cols: tuple[int, ...]
    seed: int = SEED

    @property
    def head(self) -> Head | None:
        return self.target

    def label(self) -> str:
        return f"L{self.source[0]}H{self.source[1]}→L{self.target[0]}H{self.target[1]}"

    @classmethod
    def of(cls, structure: Structure, source: Sequence[int], target: Sequence[int],
           rows: Sequence[int] | None = None, cols: Sequence[int] | None = None, *,
           seed: int = SEED, where: Any = ..., limit: int | None = None) -> PathRequest:
        where = _where(structure, where)
        check_head(structure, *source, where)
        check_head(structure, *target, where)
        if int(source[0]) >= int(target[0]):
            raise InvalidRequestError(
                where, f"a path runs from an earlier layer to a later one, not L{source[0]} to L{target[0]}")
        n = int(structure["d_vocab"])
        row_ids, col_ids = _block(n, rows, cols)
        check_ids((*row_ids, *col_ids), n, "token", where)
        check_result_bytes(4 * len(row_ids) * len(col_ids), f"a {len(row_ids)}×{len(col_ids)} block",
                           where, limit)
        return cls((int(source[0]), int(source[1])), (int(target[0]), int(target[1])), row_ids, col_ids,
                   int(seed))


# -- model-wide sweeps ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BehaviourRequest(Request):
    """The behavioural and sink scores of every head (one batched forward pass)."""

    name: ClassVar[str] = "behaviour"
    stored: ClassVar[bool] = True
    seed: int = SEED


@dataclass(frozen=True)
class ScoreTableRequest(Request):
    """Every score of every head (a sweep): fills the per-head ``HeadScoresRequest`` cache."""

    name: ClassVar[str] = "all_head_scores"
    stored: ClassVar[bool] = True
    origin_text: ClassVar[str | None] = "head scores"
    seed: int = SEED

    def published(self, result: Any) -> Iterable[tuple[Request, Any]]:
        return ((HeadScoresRequest(layer, head, self.seed), result.head(layer, head))
                for layer in range(result.n_layers) for head in range(result.n_heads))


@dataclass(frozen=True)
class ScoreNullRequest(Request):
    """Every score on ``samples`` random heads of the model's shapes and norms."""

    name: ClassVar[str] = "score_null"
    stored: ClassVar[bool] = True
    seed: int = SEED
    samples: int = NULL_SAMPLES


@dataclass(frozen=True)
class CompositionRequest(Request):
    """Q/K/V composition scores between all pairs of heads and the ``top`` strongest edges."""

    name: ClassVar[str] = "composition"
    stored: ClassVar[bool] = True
    origin_text: ClassVar[str | None] = "composition {kind}"
    kind: str
    seed: int = SEED
    top: int = TOP_EDGES

    @classmethod
    def of(cls, structure: Structure, kind: str, seed: int = SEED, top: int = TOP_EDGES, *,
           where: Any = ...) -> CompositionRequest:
        if kind not in COMPOSITION_KINDS:
            raise InvalidRequestError(_where(structure, where),
                                      f"composition kind must be q, k or v, not {kind!r}")
        return cls(kind, int(seed), int(top))


@dataclass(frozen=True)
class AblationSweepRequest(Request):
    """``[n_layers, n_heads]`` zero-ablation effects of every head; ``stored_only``: only
    what the results store already holds (None unless every layer is there)."""

    name: ClassVar[str] = "all_ablation_effects"
    stored: ClassVar[bool] = True
    origin_text: ClassVar[str | None] = "ablation effects"

    def origin(self) -> str | None:
        return None if self.stored_only else super().origin()
    seed: int = SEED
    stored_only: bool = False

    def published(self, result: Any) -> Iterable[tuple[Request, Any]]:
        if result is None:
            return ()
        return ((AblationRequest(layer, head, self.seed), float(result[layer, head]))
                for layer in range(result.shape[0]) for head in range(result.shape[1]))


# -- prompts -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptRequest(Request):
    """One prompt through the model (cut to n_ctx), every head at once; ``limit``: the most
    bytes its patterns may hold."""

    name: ClassVar[str] = "prompt"
    text: str
    limit: int | None = None

    @classmethod
    def of(cls, structure: Structure, text: str, *, where: Any = ..., limit: int | None = None
           ) -> PromptRequest:
        check_prompt(text, _where(structure, where))
        return cls(text, None if limit is None else int(limit))


@dataclass(frozen=True)
class TokenizeRequest(Request):
    """Token ids of ``text`` with the model's tokenizer."""

    name: ClassVar[str] = "tokenize"
    text: str

    @classmethod
    def of(cls, structure: Structure, text: str, *, where: Any = ...) -> TokenizeRequest:
        if not text or not text.strip():
            raise PromptError(_where(structure, where), "empty text: type some tokens first")
        return cls(text)


# -- patching (docs/math.md, "Patching") --------------------------------------------------------


@dataclass(frozen=True)
class InductionPromptsRequest(Request):
    """The first clean and corrupt sequence of a seeded built-in task (what the Patch tab shows)."""

    name: ClassVar[str] = "induction_prompts"
    task: str
    seed: int
    seq_len: int
    batch: int

    @classmethod
    def of(cls, structure: Structure, task: str = "induction", *, where: Any = ...
           ) -> InductionPromptsRequest:
        req = PatchRequest.of(structure, task=task, where=where)
        return cls(req.task, req.seed, int(req.seq_len or 0), req.batch)


@dataclass(frozen=True)
class PatchRequest(Request):
    """Activation, attribution or path patching (``headscope patch`` / ``path-patch``,
    ``Model.patch``, the explorer's Patch tab). ``task`` a built-in task (``"induction"``,
    ``"first-occurrence"``: ``forward.patch_tasks.induction_task``): the tokens are made from
    ``seed``, ``seq_len`` and ``batch`` where the forward pass runs; ``"logit_diff"``:
    ``clean`` and ``corrupt`` are ``[batch][pos]`` ids of the same shape and
    ``answer``/``wrong`` the logit difference's tokens. ``edge`` (path patching):
    ``(sender, receiver)``, ``site`` the receiver's input. Its key is its results-store part:
    a hash of every input, in the entry of the checkpoint's fingerprint."""

    name: ClassVar[str] = "patch"
    stored: ClassVar[bool] = True
    origin_text: ClassVar[str | None] = "patching"
    task: str
    site: str = "out"
    method: str = "exact"
    noising: bool = False
    clean: tuple[tuple[int, ...], ...] = ()
    corrupt: tuple[tuple[int, ...], ...] = ()
    answer: int | None = None
    wrong: int | None = None
    heads: tuple[tuple[Head, ...], ...] | None = None  # sets patched together
    by_position: bool = False
    verify: int = 0
    seed: int = SEED
    seq_len: int | None = None
    batch: int = PATCH_BATCH
    edge: tuple[Head, Head] | None = None

    def key(self) -> str:
        inputs = json.dumps([self.task, self.site, self.method, self.noising, self.clean, self.corrupt,
                             self.answer, self.wrong, self.heads, self.by_position, self.verify,
                             self.seed, self.seq_len, self.batch, self.edge], separators=(",", ":"))
        return "patch-" + hashlib.blake2b(inputs.encode(), digest_size=12).hexdigest()

    @classmethod
    def of(cls, structure: Structure, *, clean: Sequence[Sequence[int]] | None = None,
           corrupt: Sequence[Sequence[int]] | None = None, answer: int | None = None,
           wrong: int | None = None, site: str = "out", method: str = "exact", noising: bool = False,
           heads: Sequence[Sequence[Sequence[int]]] | None = None, by_position: bool = False,
           verify: int = 0, seed: int = SEED, seq_len: int | None = None, batch: int = PATCH_BATCH,
           edge: Sequence[Sequence[int]] | None = None, task: str | None = None,
           where: Any = ...) -> PatchRequest:
        """No prompt (``clean is None``) is a built-in task (``task``, default
        ``"induction"``); with prompts, both must be given, of the same shape, with
        ``answer`` and ``wrong``, and no ``task``."""
        where = _where(structure, where)
        check_patchable(structure, where)
        if task is not None and task not in BUILTIN_TASKS:
            raise InvalidRequestError(where, f"--task must be one of {', '.join(BUILTIN_TASKS)}, not {task!r}")
        if task is not None and (clean is not None or corrupt is not None):
            raise InvalidRequestError(where, f"--task {task} makes its own inputs: no --clean/--corrupt with it")
        n_ctx, d_vocab = int(structure["n_ctx"]), int(structure["d_vocab"])
        if edge is not None:
            if site not in PATH_INPUTS:
                raise InvalidRequestError(where, f"a path patches the receiver's q, k or v, not {site!r}")
            check_head(structure, *edge[0], where)
            check_head(structure, *edge[1], where)
            if int(edge[0][0]) >= int(edge[1][0]):
                raise InvalidRequestError(where, f"a path runs from an earlier layer to a later one: "
                                          f"L{edge[0][0]}.H{edge[0][1]} is not below L{edge[1][0]}.H{edge[1][1]}")
            if method != "exact" or heads is not None or by_position or verify:
                raise InvalidRequestError(where, "path patching takes one edge and no --method, --heads, "
                                          "--by-position or --verify")
        elif site not in PATCH_SITES:
            raise InvalidRequestError(where, f"--site must be one of {', '.join(PATCH_SITES)}, not {site!r}")
        if method not in PATCH_METHODS:
            raise InvalidRequestError(where, f"--method must be exact or attribution, not {method!r}")
        if method == "attribution" and (heads is not None or by_position):
            raise InvalidRequestError(where, "attribution estimates every head alone: no --heads or --by-position")
        if verify and method != "attribution":
            raise InvalidRequestError(where, "--verify checks attribution's estimates: it needs --method attribution")
        if not 0 <= int(seed) <= MAX_SEED:
            raise InvalidRequestError(where, f"the seed must be between 0 and 2**63-1, not {seed}")
        if not 0 <= int(verify) <= int(structure["n_layers"]) * int(structure["n_heads"]):
            raise InvalidRequestError(where, f"--verify must be between 0 and the number of heads, not {verify}")
        common: dict[str, Any] = dict(
            site=site, method=method, noising=bool(noising),
            heads=None if heads is None else tuple(check_head_sets(structure, heads, where)),
            by_position=bool(by_position), verify=int(verify),
            edge=None if edge is None else ((int(edge[0][0]), int(edge[0][1])), (int(edge[1][0]), int(edge[1][1]))))
        if clean is None and corrupt is None:
            if answer is not None or wrong is not None:
                raise InvalidRequestError(where, "--answer and --wrong go with --clean and --corrupt prompts "
                                          f"(the {task or 'induction'} task scores the second half)")
            half = min(PATCH_HALF, n_ctx // 2) if seq_len is None else int(seq_len)
            if not 2 <= half <= n_ctx // 2:
                raise InvalidRequestError(where, f"--seq-len must be between 2 and {n_ctx // 2} (half the "
                                          f"context of {n_ctx}), not {half}")
            if not 1 <= int(batch) <= 64:
                raise InvalidRequestError(where, f"--batch must be between 1 and 64, not {batch}")
            return cls(task=task or "induction", seed=int(seed), seq_len=half, batch=int(batch), **common)
        if clean is None or corrupt is None:
            raise InvalidRequestError(where, "give both a clean and a corrupt input (or neither, for the induction task)")
        rows = []
        for name, given in (("clean", clean), ("corrupt", corrupt)):
            batch_rows = [tuple(int(t) for t in row) for row in given]
            if not batch_rows or any(not row for row in batch_rows):
                raise PromptError(where, f"the {name} input is empty")
            for row in batch_rows:
                check_ids(row, d_vocab, f"{name} token id", where)
                if len(row) > n_ctx:
                    raise IndexOutOfRangeError(where, f"the {name} input's {len(row)} tokens exceed the context of {n_ctx}")
            if len({len(row) for row in batch_rows}) > 1:
                raise InvalidRequestError(where, f"the {name} sequences differ in length")
            rows.append(tuple(batch_rows))
        a, b = rows
        if len(a[0]) != len(b[0]) or len(a) != len(b):
            raise InvalidRequestError(where, f"the clean and corrupt inputs must have the same length: clean "
                                      f"is {len(a[0])} tokens, corrupt {len(b[0])}")
        if answer is None or wrong is None:
            raise InvalidRequestError(where, "the logit difference needs --answer and --wrong tokens")
        check_ids((answer,), d_vocab, "answer token id", where)
        check_ids((wrong,), d_vocab, "wrong token id", where)
        return cls(task="logit_diff", clean=a, corrupt=b, answer=int(answer), wrong=int(wrong), **common)


# -- QK attribution (docs/math.md, "QK attribution") ---------------------------------------------


@dataclass(frozen=True)
class QKAttributionRequest(Request):
    """Why head ``layer``.``head_index`` scores each key from position ``query`` on the prompt
    ``tokens`` (ids): the whole query row, every key the query sees, at once (the explorer
    moves along the row without another request). ``of`` checks the key asked for too, though
    the row does not depend on it: a key after the query is refused with the allowed range."""

    name: ClassVar[str] = "qk_attribution"
    layer: int
    head_index: int
    tokens: tuple[int, ...]
    query: int

    def label(self) -> str:
        return f"L{self.layer}H{self.head_index} why q={self.query}"

    @classmethod
    def of(cls, structure: Structure, layer: int, head: int, tokens: Sequence[int], query: int,
           key: int | None = None, *, where: Any = ...) -> QKAttributionRequest:
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
        return cls(int(layer), int(head), ids, int(query))


@dataclass(frozen=True)
class PatchInputsRequest(Request):
    """Patching with the inputs as the explorer's Patch tab has them: prompts as text or ids,
    ``answer``/``wrong`` as token strings or ids, or none of them (``task``). Where it runs
    they are resolved against the tokenizer (``sweeps.prompts.patch_request``) into one
    ``PatchRequest`` (every head at ``site``), or with ``edges`` one per edge (path patching
    into the receiver's ``site``, one row per edge): each is computed, and kept in the results
    store, as that ``PatchRequest``."""

    name: ClassVar[str] = "patch"
    stored: ClassVar[bool] = True
    origin_text: ClassVar[str | None] = "patching"
    clean: str | tuple[int, ...] | None = None
    corrupt: str | tuple[int, ...] | None = None
    answer: str | int | None = None
    wrong: str | int | None = None
    site: str = "out"
    method: str = "exact"
    task: str | None = None
    edges: tuple[tuple[Head, Head], ...] | None = None

    @classmethod
    def of(cls, structure: Structure, *, clean: str | Sequence[int] | None = None,
           corrupt: str | Sequence[int] | None = None, answer: str | int | None = None,
           wrong: str | int | None = None, site: str = "out", method: str = "exact",
           task: str | None = None, edges: Sequence[Sequence[Sequence[int]]] | None = None,
           where: Any = ...) -> PatchInputsRequest:
        """The checks that need no tokenizer; the rest are ``PatchRequest.of``'s, where it runs."""
        where = _where(structure, where)
        check_patchable(structure, where)
        if edges is not None and not edges:
            raise InvalidRequestError(where, "no edges to path-patch")

        def prompt(given: str | Sequence[int] | None) -> str | tuple[int, ...] | None:
            return given if given is None or isinstance(given, str) else tuple(int(t) for t in given)

        return cls(prompt(clean), prompt(corrupt), answer, wrong, site, method, task,
                   None if edges is None else tuple(((int(s[0]), int(s[1])), (int(r[0]), int(r[1])))
                                                    for s, r in edges))


# -- edge attribution (docs/math.md, "Edge attribution") ----------------------------------------

EDGE_METHODS = ("eap", "eap-ig")
EDGE_STEPS = 5  # eap-ig's default interpolation steps


def edge_count(structure: Structure) -> int:
    """How many edges the model's graph has (``core.edge_graph``'s, counted without building
    it: a 7B graph has over a million). ``structure`` may say ``attn_only`` and
    ``parallel_attn_mlp`` (``sweeps.edges.edge_structure`` adds them); without, a model with no
    ``d_mlp`` is attention-only and attention and MLP run in sequence."""
    layers, heads = int(structure["n_layers"]), int(structure["n_heads"])
    has_mlp = not structure.get("attn_only", structure.get("d_mlp") is None)
    parallel = has_mlp and bool(structure.get("parallel_attn_mlp", False))
    per_layer = heads + int(has_mlp)
    total = 0
    for layer in range(layers):
        before = 1 + layer * per_layer  # input and every node of earlier layers
        total += 3 * heads * before
        if has_mlp:
            total += before + (0 if parallel else heads)
    return total + 1 + layers * per_layer  # into the logits: every node


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


def _hashed(prefix: str, request: Request) -> str:
    fields = json.dumps([getattr(request, f.name) for f in dataclasses.fields(request)], separators=(",", ":"))
    return f"{prefix}-" + hashlib.blake2b(fields.encode(), digest_size=12).hexdigest()


@dataclass(frozen=True)
class EdgesRequest(Request):
    """EAP or EAP-IG scores of every edge (``headscope edges``, ``Model.edges``, the Circuit
    tab), with the top ``verify`` edges by |score| also patched exactly. Inputs and metric as
    ``PatchRequest``'s (a built-in ``task``, or ``logit_diff`` prompts with ``answer`` and
    ``wrong``); ``steps`` is 0 for ``eap``. Stored under its key (a hash of every field)."""

    name: ClassVar[str] = "edges"
    stored: ClassVar[bool] = True
    origin_text: ClassVar[str | None] = "edge attribution"
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
class FaithfulnessRequest(Request):
    """The faithfulness of the top-N circuits (``tops``) of one edge attribution (its
    ``scores_request``), and with ``curve`` the curve over ``CURVE_FRACTIONS`` of the edges
    (``headscope faithfulness``, ``Model.faithfulness``, the Circuit tab's N). Stored under its
    key; the attribution under its own."""

    name: ClassVar[str] = "faithfulness"
    stored: ClassVar[bool] = True
    origin_text: ClassVar[str | None] = "faithfulness"
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
    tops: tuple[int, ...] = ()
    curve: bool = False

    def key(self) -> str:
        return _hashed("faithfulness", self)

    def label(self) -> str:
        return "faithfulness" + ("" if not self.tops else f" of the top {', '.join(map(str, self.tops))}")

    def scores_request(self) -> EdgesRequest:
        """The attribution whose top edges make the circuits."""
        return EdgesRequest(task=self.task, clean=self.clean, corrupt=self.corrupt, answer=self.answer,
                            wrong=self.wrong, seed=self.seed, seq_len=self.seq_len, batch=self.batch,
                            method=self.method, steps=self.steps)

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


def request_types() -> tuple[type[Request], ...]:
    """Every request type defined here (each must have exactly one computation)."""
    return tuple(cls for cls in globals().values()
                 if isinstance(cls, type) and issubclass(cls, Request) and cls is not Request)


def as_mapping(request: Request) -> Mapping[str, Any]:
    """A request's fields by name (for reports and logs)."""
    return {f.name: getattr(request, f.name) for f in dataclasses.fields(request)}
