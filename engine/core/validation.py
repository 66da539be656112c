"""The limits, names and shared checks of every request (``core.requests`` builds and validates
each request type with these; the CLI, the explorer's ``Engine``, the Python API and exports
all go through it before anything is computed).

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
    "MAX_SEED",
    "PATCH_METHODS",
    "PATCH_SITES",
    "PATH_INPUTS",
    "PATH_SAMPLE",
    "SCORE_NAMES",
    "SEED",
    "TOP_EDGES",
    "WEIGHT_SCORE_NAMES",
    "Z_NAMES",
    "Structure",
    "check_head",
    "check_head_sets",
    "check_ids",
    "check_patchable",
    "check_prompt",
    "check_result_bytes",
    "check_sort_key",
    "check_token",
    "check_tokens",
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
MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed's range
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


def check_ids(ids: Sequence[int], n: int, what: str, where: str | None) -> None:
    for i in ids:
        if not 0 <= int(i) < n:
            raise IndexOutOfRangeError(where, f"{what} {i} out of range 0..{n - 1}")


def check_token(structure: Structure, token: int, where: str | None) -> None:
    check_ids((token,), int(structure["d_vocab"]), "token", where)


def check_tokens(structure: Structure, tokens: Sequence[int], where: str | None) -> None:
    """A token sequence for a forward pass: non-empty, ids in the vocabulary, within n_ctx."""
    if not tokens:
        raise PromptError(where, "empty token list: give at least one token")
    check_ids(tokens, int(structure["d_vocab"]), "token", where)
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


# -- patching (docs/math.md, "Patching") -------------------------------------------------------

PATCH_SITES = ("out", "q", "k", "v", "pattern")
PATCH_METHODS = ("exact", "attribution")
PATH_INPUTS = ("q", "k", "v")
PATCH_TASKS = ("logit_diff", "induction", "first-occurrence")
BUILTIN_TASKS = PATCH_TASKS[1:]  # the tasks that make their own inputs ("logit_diff": the user's prompts)
PATCH_BATCH = 4  # built-in tasks: sequences, and half-length at most (behaviour's defaults)
PATCH_HALF = 32




def check_head_sets(structure: Structure, heads: Sequence[Sequence[Sequence[int]]], where: str | None
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
