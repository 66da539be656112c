"""Every request headscope answers is validated here, once: the CLI, the explorer's ``Engine``,
the Python API and exports all call these checks before anything is computed.

One set of score names (the public JSON names of ``headscope heads --json``; scripts use
them, keep them stable), one set of limits, and one error type per mistake:

- a layer, head, token id or position out of range: ``IndexOutOfRangeError``;
- a kind, basis, sort key or option that does not exist, or does not apply to this model:
  ``InvalidRequestError``;
- a result bigger than the byte limit: ``ResourceLimitError``;
- an empty prompt or token list: ``PromptError``.

Checks read only the model's ``structure`` (``read_structure`` / ``Model.structure()``:
header and config), so they run before torch is imported. Where a request is computed,
cached and drawn: docs/internals.md, "The path of a request".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from headscope.engine.core.errors import (
    IndexOutOfRangeError,
    InvalidRequestError,
    PromptError,
    ResourceLimitError,
)

__all__ = [
    "ABLATION_EFFECT",
    "BASES",
    "BUILTIN_TASKS",
    "CIRCUIT_KINDS",
    "COMPOSITION_KINDS",
    "DEFAULT_BLOCK",
    "MAX_RESULT_BYTES",
    "PATCH_METHODS",
    "PATCH_SITES",
    "PATH_INPUTS",
    "PATH_SAMPLE",
    "SCORE_NAMES",
    "SEED",
    "TOP_EDGES",
    "WEIGHT_SCORE_NAMES",
    "Z_NAMES",
    "CircuitRequest",
    "PatchRequest",
    "PathRequest",
    "check_composition_kind",
    "check_head",
    "check_head_sets",
    "check_patchable",
    "check_path",
    "check_prompt",
    "check_result_bytes",
    "check_rotary",
    "check_sort_key",
    "check_spectrum_kind",
    "check_svd",
    "check_token",
    "check_tokens",
    "circuit_request",
    "patch_request",
    "prompt_bytes",
]

# The head scores, by their public names: HeadScores/ScoreTable fields, `heads --json` keys,
# export columns, diff rows (`<name>_a`, `<name>_b`, `<name>_delta`). docs/math.md defines them.
SCORE_NAMES: tuple[str, ...] = (
    "copying_score",
    "qk_positivity",
    "prev_token_score",
    "duplicate_token_score",
    "induction_score",
    "attention_sink_score",
    "delimiter_sink_score",
)
# The scores of the weights alone (no forward pass): `heads --no-behaviour`, `diff --no-behaviour`.
WEIGHT_SCORE_NAMES: tuple[str, ...] = ("copying_score", "qk_positivity")
# Each score calibrated against random heads (docs/math.md, "Calibrated scores"): `heads --json`.
Z_NAMES: tuple[str, ...] = tuple(f"{name}_z" for name in SCORE_NAMES)
ABLATION_EFFECT = "ablation_effect"  # opt-in (a forward pass per head), not part of HeadScores

DEFAULT_BLOCK = 24  # rows/cols of a circuit block when the caller names none
MAX_RESULT_BYTES = 256 << 20  # the most one result (a circuit block, a prompt's patterns) may hold
SEED = 0  # seed of the behavioural / composition-baseline sequences (reproducible scores)
# A composition edge counts (for "lost" / "gained") when its score beats the random-factor
# baseline by this much. Trained circuits sit 0.05-0.15 above a baseline of ~0.09 at the
# sample models' shapes, and the margin shrinks as d_head grows (the bundled attn-only-2l,
# d_head 32: its previous-token → induction edges are +0.08), so 0.1 missed them.
EDGE_THRESHOLD = 0.05
TOP_EDGES = 50  # composition edges a Composition result lists, strongest first
PATH_SAMPLE = 256  # token ids sampled for a K-path's diagonal rate
NULL_SAMPLES = 64  # random heads per calibration null (engine.forward.null, circuits.directions)

CIRCUIT_KINDS = ("qk", "ov")
BASES = ("token", "position")
COMPOSITION_KINDS = ("q", "k", "v")

Structure = Mapping[str, Any]


@dataclass(frozen=True)
class CircuitRequest:
    """A validated circuit block: ids in range, size within the limit, offset 0 unless rotary."""

    layer: int
    head: int
    kind: str
    basis: str
    rows: tuple[int, ...]
    cols: tuple[int, ...]
    offset: int


def check_head(structure: Structure, layer: int, head: int, where: str | None) -> None:
    n_layers, n_heads = int(structure["n_layers"]), int(structure["n_heads"])
    if not 0 <= int(layer) < n_layers:
        raise IndexOutOfRangeError(
            where, f"layer {layer} out of range (model has {n_layers} layers: 0..{n_layers - 1})"
        )
    if not 0 <= int(head) < n_heads:
        raise IndexOutOfRangeError(
            where, f"head {head} out of range (layer has {n_heads} heads: 0..{n_heads - 1})"
        )


def check_result_bytes(n_bytes: int, what: str, where: str | None, limit: int | None = None) -> None:
    """``ResourceLimitError`` if a result would hold more than ``limit`` (default
    ``MAX_RESULT_BYTES``) bytes."""
    limit = MAX_RESULT_BYTES if limit is None else int(limit)
    if n_bytes > limit:
        raise ResourceLimitError(
            where,
            f"{what} would materialise {_size(n_bytes)}, over the limit of {_size(limit)}; "
            "ask for a smaller block",
        )


def _size(n_bytes: int) -> str:
    if n_bytes >= 1 << 20:
        return f"{n_bytes / 2**20:.1f} MiB"
    return f"{n_bytes / 2**10:.1f} KiB" if n_bytes >= 1 << 10 else f"{n_bytes} bytes"


def _check_ids(ids: Sequence[int], n: int, what: str, where: str | None) -> None:
    for i in ids:
        if not 0 <= int(i) < n:
            raise IndexOutOfRangeError(where, f"{what} {i} out of range 0..{n - 1}")


def circuit_request(
    structure: Structure,
    layer: int,
    head: int,
    kind: str,
    basis: str = "token",
    rows: Sequence[int] | None = None,
    cols: Sequence[int] | None = None,
    offset: int = 0,
    *,
    where: str | None,
    limit: int | None = None,
) -> CircuitRequest:
    """Validate a ``rows × cols`` block of a head's QK or OV circuit (``None``: the first
    ``DEFAULT_BLOCK`` ids). The position basis is QK-only and learned-positions-only."""
    check_head(structure, layer, head, where)
    if kind not in CIRCUIT_KINDS or basis not in BASES:
        raise InvalidRequestError(where, f"unknown circuit {kind!r} in basis {basis!r}")
    if basis == "position" and kind != "qk":
        raise InvalidRequestError(where, "the position basis exists for the QK circuit only")
    positional = structure["positional"]
    if basis == "position" and positional != "learned":
        raise InvalidRequestError(
            where,
            f"{positional} positions have no positional QK matrix; use the token basis "
            "with an offset (rotary) or rotary_profile",
        )
    n = int(structure["n_ctx"] if basis == "position" else structure["d_vocab"])
    default = tuple(range(min(n, DEFAULT_BLOCK)))
    row_ids = default if rows is None else tuple(int(i) for i in rows)
    col_ids = default if cols is None else tuple(int(i) for i in cols)
    _check_ids((*row_ids, *col_ids), n, basis, where)
    check_result_bytes(4 * len(row_ids) * len(col_ids), f"a {len(row_ids)}×{len(col_ids)} block", where, limit)
    return CircuitRequest(
        layer=int(layer),
        head=int(head),
        kind=kind,
        basis=basis,
        rows=row_ids,
        cols=col_ids,
        offset=int(offset) if positional == "rotary" else 0,
    )


def check_spectrum_kind(kind: str, where: str | None) -> None:
    if kind not in CIRCUIT_KINDS:
        raise InvalidRequestError(where, f"spectrum kind must be 'ov' or 'qk', not {kind!r}")


def check_composition_kind(kind: str, where: str | None) -> None:
    if kind not in COMPOSITION_KINDS:
        raise InvalidRequestError(where, f"composition kind must be q, k or v, not {kind!r}")


def check_rotary(structure: Structure, where: str | None) -> None:
    if structure["positional"] != "rotary":
        raise InvalidRequestError(where, "rotary_profile needs a rotary model")


def check_token(structure: Structure, token: int, where: str | None) -> None:
    _check_ids((token,), int(structure["d_vocab"]), "token", where)


def check_tokens(structure: Structure, tokens: Sequence[int], where: str | None) -> None:
    """A token sequence for a forward pass: non-empty, ids in the vocabulary, within n_ctx."""
    if not tokens:
        raise PromptError(where, "empty token list: give at least one token")
    _check_ids(tokens, int(structure["d_vocab"]), "token", where)
    n_ctx = int(structure["n_ctx"])
    if len(tokens) > n_ctx:
        raise IndexOutOfRangeError(where, f"{len(tokens)} tokens exceed the context of {n_ctx}")


def check_prompt(text: str, where: str | None) -> None:
    if not text or not text.strip():
        raise PromptError(where, "empty prompt: type some text first")


def prompt_bytes(structure: Structure, n_tokens: int) -> int:
    """float32 bytes of a prompt's patterns ``[L, H, n, n]`` and head outputs ``[L, H, n, d_model]``."""
    heads = int(structure["n_layers"]) * int(structure["n_heads"])
    return 4 * heads * n_tokens * (n_tokens + int(structure["d_model"]))


def check_sort_key(key: str | None, columns: Sequence[str]) -> None:
    """A ``--sort`` key must be one of the score columns (a near miss names the closest)."""
    if key is not None and key not in columns:
        import difflib

        close = difflib.get_close_matches(key, columns, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}? The keys: " if close else "choose from "
        raise InvalidRequestError(None, f"unknown sort key {key!r}; {hint}{', '.join(columns)}")


def check_svd(structure: Structure, layer: int, head: int, kind: str, k: int, top: int,
              where: str | None) -> None:
    """Singular directions of a head: a QK or OV circuit, ``k >= 1`` directions (at most
    ``d_head`` exist) and ``1 <= top <= d_vocab`` tokens a side."""
    check_head(structure, layer, head, where)
    check_spectrum_kind(kind, where)
    if int(k) < 1:
        raise InvalidRequestError(where, f"--k must be at least 1, not {k}")
    d_vocab = int(structure["d_vocab"])
    if not 1 <= int(top) <= d_vocab:
        raise InvalidRequestError(where, f"--top must be in 1..{d_vocab}, not {top}")


@dataclass(frozen=True)
class PathRequest:
    """A validated composition path: ``source`` in an earlier layer than ``target``."""

    source: tuple[int, int]
    target: tuple[int, int]
    rows: tuple[int, ...]
    cols: tuple[int, ...]


def check_path(
    structure: Structure,
    source: tuple[int, int],
    target: tuple[int, int],
    rows: Sequence[int] | None = None,
    cols: Sequence[int] | None = None,
    *,
    where: str | None,
    limit: int | None = None,
) -> PathRequest:
    """Two heads, the first in an earlier layer, and a token block of the K-path (``None``:
    the first ``DEFAULT_BLOCK`` ids)."""
    check_head(structure, *source, where)
    check_head(structure, *target, where)
    if int(source[0]) >= int(target[0]):
        raise InvalidRequestError(
            where, f"a path runs from an earlier layer to a later one, not L{source[0]} to L{target[0]}"
        )
    n = int(structure["d_vocab"])
    default = tuple(range(min(n, DEFAULT_BLOCK)))
    row_ids = default if rows is None else tuple(int(i) for i in rows)
    col_ids = default if cols is None else tuple(int(i) for i in cols)
    _check_ids((*row_ids, *col_ids), n, "token", where)
    check_result_bytes(4 * len(row_ids) * len(col_ids), f"a {len(row_ids)}×{len(col_ids)} block", where, limit)
    return PathRequest((int(source[0]), int(source[1])), (int(target[0]), int(target[1])), row_ids, col_ids)


# -- patching (docs/math.md, "Patching") -------------------------------------------------------

PATCH_SITES = ("out", "q", "k", "v", "pattern")
PATCH_METHODS = ("exact", "attribution")
PATH_INPUTS = ("q", "k", "v")
PATCH_TASKS = ("logit_diff", "induction", "first-occurrence")
BUILTIN_TASKS = PATCH_TASKS[1:]  # the tasks that make their own inputs ("logit_diff": the user's prompts)
PATCH_BATCH = 4  # built-in tasks: sequences, and half-length at most (behaviour's defaults)
PATCH_HALF = 32


@dataclass(frozen=True)
class PatchRequest:
    """A validated patching request (``headscope patch`` / ``path-patch``, ``Model.patch``,
    the explorer's Patch tab). ``task`` a built-in task (``"induction"``, ``"first-occurrence"``:
    ``forward.patching.induction_task``): the tokens are made from ``seed``, ``seq_len`` and
    ``batch`` where the forward pass runs; ``"logit_diff"``: ``clean`` and ``corrupt`` are
    ``[batch][pos]`` ids of the same shape and ``answer``/``wrong`` the logit difference's
    tokens. ``edge`` (path patching): ``(sender, receiver)``, ``site`` the receiver's input."""

    task: str
    site: str = "out"
    method: str = "exact"
    noising: bool = False
    clean: tuple[tuple[int, ...], ...] = ()
    corrupt: tuple[tuple[int, ...], ...] = ()
    answer: int | None = None
    wrong: int | None = None
    heads: tuple[tuple[tuple[int, int], ...], ...] | None = None  # sets patched together
    by_position: bool = False
    verify: int = 0
    seed: int = SEED
    seq_len: int | None = None
    batch: int = PATCH_BATCH
    edge: tuple[tuple[int, int], tuple[int, int]] | None = None

    def key(self) -> str:
        """Everything the numbers depend on, as one canonical string (the results store's
        part name hashes it with the checkpoint's fingerprint)."""
        import json

        return json.dumps([self.task, self.site, self.method, self.noising, self.clean, self.corrupt,
                           self.answer, self.wrong, self.heads, self.by_position, self.verify,
                           self.seed, self.seq_len, self.batch, self.edge], separators=(",", ":"))


def check_head_sets(structure: Structure, heads: Sequence[Sequence[tuple[int, int]]], where: str | None
                    ) -> list[tuple[tuple[int, int], ...]]:
    """Sets of heads to patch together: each non-empty, each head in range, repeats dropped."""
    sets = []
    for group in heads:
        found = tuple(dict.fromkeys((int(layer), int(head)) for layer, head in group))
        if not found:
            raise InvalidRequestError(where, "an empty set of heads to patch")
        for layer, head in found:
            check_head(structure, layer, head, where)
        sets.append(found)
    if not sets:
        raise InvalidRequestError(where, "no heads to patch")
    return sets


def check_patchable(structure: Structure, where: str | None) -> None:
    """Patching reads a next-token metric at the last position: causal models only."""
    if not structure.get("causal", True):
        raise InvalidRequestError(
            where, f"{structure.get('architecture', 'this model')} is an encoder (every position sees "
            "the whole input): patching measures a next-token metric at the last position, which "
            "only a causal model has")


def patch_request(
    structure: Structure,
    *,
    clean: Sequence[Sequence[int]] | None = None,
    corrupt: Sequence[Sequence[int]] | None = None,
    answer: int | None = None,
    wrong: int | None = None,
    site: str = "out",
    method: str = "exact",
    noising: bool = False,
    heads: Sequence[Sequence[tuple[int, int]]] | None = None,
    by_position: bool = False,
    verify: int = 0,
    seed: int = SEED,
    seq_len: int | None = None,
    batch: int = PATCH_BATCH,
    edge: tuple[tuple[int, int], tuple[int, int]] | None = None,
    task: str | None = None,
    where: str | None,
) -> PatchRequest:
    """Validate a patching request. No prompt (``clean is None``) is a built-in task
    (``task``, default ``"induction"``); with prompts, both must be given, of the same shape,
    with ``answer`` and ``wrong``, and no ``task``."""
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
    if not 0 <= int(verify) <= int(structure["n_layers"]) * int(structure["n_heads"]):
        raise InvalidRequestError(where, f"--verify must be between 0 and the number of heads, not {verify}")
    sets = None if heads is None else check_head_sets(structure, heads, where)
    common = dict(site=site, method=method, noising=bool(noising), heads=None if sets is None else tuple(sets),
                  by_position=bool(by_position), verify=int(verify),
                  edge=None if edge is None else (tuple(map(int, edge[0])), tuple(map(int, edge[1]))))
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
        return PatchRequest(task=task or "induction", seed=int(seed), seq_len=half, batch=int(batch), **common)  # type: ignore[arg-type]
    if clean is None or corrupt is None:
        raise InvalidRequestError(where, "give both a clean and a corrupt input (or neither, for the induction task)")
    rows = []
    for name, given in (("clean", clean), ("corrupt", corrupt)):
        batch_rows = [tuple(int(t) for t in row) for row in given]
        if not batch_rows or any(not row for row in batch_rows):
            raise PromptError(where, f"the {name} input is empty")
        for row in batch_rows:
            _check_ids(row, d_vocab, f"{name} token id", where)
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
    _check_ids((answer,), d_vocab, "answer token id", where)
    _check_ids((wrong,), d_vocab, "wrong token id", where)
    return PatchRequest(task="logit_diff", clean=a, corrupt=b, answer=int(answer), wrong=int(wrong), **common)  # type: ignore[arg-type]
