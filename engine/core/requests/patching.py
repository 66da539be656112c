"""Patching (docs/math.md, "Patching"): the built-in tasks' prompts, a ``PatchRequest`` of
resolved ids, and the explorer's ``PatchInputsRequest`` of inputs as typed."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from headscope.engine.core.errors import IndexOutOfRangeError, InvalidRequestError, PromptError
from headscope.engine.core.path_nodes import check_path, key_node
from headscope.engine.core.requests.base import Head, Request, _where
from headscope.engine.core.validation import (
    BUILTIN_TASKS,
    MAX_SEED,
    PATCH_BATCH,
    PATCH_HALF,
    PATCH_METHODS,
    PATCH_SITES,
    PATH_INPUTS,
    SEED,
    Structure,
    check_head_sets,
    check_ids,
    check_patchable,
)

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
            # each end a head or a node's key pair (core.path_nodes: input, m{l}, logits)
            sender, receiver = key_node(edge[0]), key_node(edge[1], site if site in PATH_INPUTS else None)
            if receiver.kind in ("mlp", "logits"):
                site = receiver.kind  # the receiver is its own input
            elif site not in PATH_INPUTS:
                raise InvalidRequestError(where, f"a path patches the receiver's q, k or v, not {site!r}")
            check_path(sender, receiver, n_layers=int(structure["n_layers"]), n_heads=int(structure["n_heads"]),
                       has_mlp=structure.get("d_mlp") is not None, where=where)
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
