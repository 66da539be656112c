"""Text in, token ids out, and one prompt through the model: what the CLI, the API and the
explorer type (a prompt, an answer token, a patching request's inputs) resolved against the
model's tokenizer, and the prompt view of every head at once.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from headscope.engine.core.errors import InvalidRequestError, PromptError
from headscope.engine.core.progress import Cancelled, check_cancelled
from headscope.engine.core.requests import PatchRequest, PromptRequest, TokenizeRequest, computes
from headscope.engine.core.results import PromptView, readonly
from headscope.engine.core.validation import PATCH_BATCH, SEED, check_result_bytes, prompt_bytes

if TYPE_CHECKING:
    from headscope.engine.model.loading import LoadedModel


def label(tokenizer: Any, token: int) -> str:
    """The token's string, or its id when the tokenizer cannot decode it."""
    decode = getattr(tokenizer, "decode_token", None)
    if decode is None:
        return str(token)
    try:
        return str(decode(token))
    except Exception:
        return str(token)


def encode(tokenizer: Any, text: str) -> list[int]:
    ids = tokenizer.encode(text)
    ids = getattr(ids, "ids", ids)
    return [int(i) for i in ids]


class PromptRun:
    """One prompt through the model, every head at once; per-head views are slices."""

    def __init__(
        self,
        tokens: tuple[str, ...],
        ids: tuple[int, ...],
        patterns: np.ndarray,  # [L, H, q, k]
        dla: np.ndarray,  # [L, H, pos]
        predicted: tuple[int, ...],
        top: tuple[tuple[int, str, float], ...],
        truncated: bool,
    ) -> None:
        self.tokens, self.ids, self.patterns, self.dla = tokens, ids, patterns, dla
        self.predicted, self.top, self.truncated = predicted, top, truncated
        self.nbytes = int(patterns.nbytes + dla.nbytes) + 64 * len(ids)

    def view(self, layer: int, head: int) -> PromptView:
        return PromptView(
            tokens=self.tokens,
            ids=self.ids,
            pattern=self.patterns[layer, head],
            dla=self.dla[layer, head],
            predicted=self.predicted,
            top_predictions=self.top,
            truncated=self.truncated,
            layer=layer,
            head=head,
        )


def answer_token(model: LoadedModel, token: int | str, what: str) -> int:
    """An answer (or wrong) token as an id: an int, digits (``12``, or ``#12`` as the explorer
    shows ids), or a token string as ``--rows`` takes it (the vocabulary's spelling, else text
    that encodes to exactly one token). A word-level vocabulary encodes an unknown word as
    ``<unk>``: that is not the token asked for, and is refused. The range of an id is checked
    by ``PatchRequest.of``."""
    where = str(model.path)
    if isinstance(token, int):
        return token
    text = str(token)
    digits = text.strip()[1:] if text.strip().startswith("#") else text.strip()
    if digits.isascii() and digits.isdigit():
        return int(digits)
    if not text.strip():
        raise PromptError(where, f"the {what} token is empty")
    found = model.tokenizer.token_to_id(text)
    if found is not None:
        return int(found)
    ids = encode(model.tokenizer, text)
    if len(ids) != 1:
        raise PromptError(where, f"the {what} token {text!r} is {len(ids)} tokens "
                          f"({', '.join(label(model.tokenizer, i) for i in ids) or 'none'}): "
                          "give one token, by its string or its id")
    spelled = model.tokenizer.decode_token(ids[0])
    if spelled.strip().lower() != text.strip().lower():
        raise PromptError(where, f"the {what} token {text!r} is not in the vocabulary "
                          f"(it encodes to {spelled!r})")
    return ids[0]


def prompt_ids(model: LoadedModel, given: str | Sequence[Any] | None, what: str) -> list[list[int]] | None:
    """A prompt as a batch of token id lists: text (encoded by the tokenizer), token ids, or
    already a batch of id lists; None stays None (the task's own prompts)."""
    if given is None:
        return None
    if isinstance(given, str):
        if not given.strip():
            raise PromptError(str(model.path), f"the {what} prompt is empty")
        return [encode(model.tokenizer, given)]
    rows = list(given)
    if rows and not isinstance(rows[0], str) and isinstance(rows[0], Sequence):
        return [[int(t) for t in row] for row in rows]
    return [[int(t) for t in rows]]


@computes(PromptRequest)
def run_prompt(model: LoadedModel, req: PromptRequest, *, cancelled: Cancelled = None, top_k: int = 10,
               **_: Any) -> PromptRun:
    """Tokenise ``req.text`` (cut to n_ctx) and run it: patterns, DLA and predictions of every
    head (``forward.prompt.prompt_pass``), labelled."""
    from headscope.engine.forward.prompt import prompt_pass

    cfg = model.cfg
    where = str(model.path)
    ids = encode(model.tokenizer, req.text)
    if not ids:
        raise PromptError(where, "the prompt encodes to no tokens")
    truncated = len(ids) > cfg.n_ctx
    ids = ids[: cfg.n_ctx]
    n = len(ids)
    check_result_bytes(prompt_bytes(model.structure(), n), f"a {n}-token prompt", where, req.limit)
    check_cancelled(cancelled)
    found = prompt_pass(model.weights, ids, top_k)
    tok = model.tokenizer
    return PromptRun(
        tokens=tuple(label(tok, i) for i in ids),
        ids=tuple(ids),
        patterns=readonly(found.patterns, np.float32),
        dla=readonly(found.dla, np.float32),
        predicted=found.predicted,
        top=tuple((i, label(tok, i), p) for i, p in found.top),
        truncated=truncated,
    )


@computes(TokenizeRequest)
def tokenized(model: LoadedModel, req: TokenizeRequest, **_: Any) -> list[int]:
    """Token ids of ``req.text`` with the model's tokenizer (for choosing heatmap tokens)."""
    return encode(model.tokenizer, req.text)


def forward_tokens(model: LoadedModel, tokens: Sequence[int]) -> Any:
    """The reference forward pass on validated token ids (``validation.check_tokens``)."""
    from headscope.engine.forward import transformer as forward

    return forward.run(model.weights, list(tokens))


# -- patching's inputs, as the CLI, the API and the explorer give them ---------------------------

# Heads to patch together: "L1.H1,L1.H2" (one set), or (layer, head) pairs (one set), or a
# list of either (one set each).
HeadSpec = str | Sequence[Any]
_HEAD = re.compile(r"^[Ll]?(\d+)\.[Hh]?(\d+)$")


def head_sets(spec: HeadSpec | None, where: str | None = None) -> list[list[tuple[int, int]]] | None:
    """``--heads`` / ``Model.patch(heads=...)`` as sets of ``(layer, head)`` patched together:
    ``"L1.H1,L1.H2"`` is one set; ``[(1, 1), (1, 2)]`` is one set; a list of such strings or
    lists is a set each. ``None``: every head alone."""
    if spec is None:
        return None

    def one(item: Any) -> tuple[int, int]:
        if isinstance(item, str):
            match = _HEAD.match(item.strip())
            if match is None:
                raise InvalidRequestError(where, f"{item!r} is not a head: write L1.H2 or 1.2")
            return int(match.group(1)), int(match.group(2))
        layer, head = item
        return int(layer), int(head)

    def group(item: Any) -> list[tuple[int, int]]:
        if isinstance(item, str):
            return [one(part) for part in item.split(",") if part.strip()]
        return [one(part) for part in item]

    if isinstance(spec, str) or (spec and not isinstance(spec[0], str) and _is_pair(spec[0])):
        return [group(spec)]
    return [group(item) for item in spec]


def _is_pair(item: Any) -> bool:
    return isinstance(item, Sequence) and len(item) == 2 and all(isinstance(v, int) for v in item)


def patch_request(
    model: LoadedModel,
    clean: str | Sequence[Any] | None = None,
    corrupt: str | Sequence[Any] | None = None,
    *,
    answer: int | str | None = None,
    wrong: int | str | None = None,
    site: str = "out",
    method: str = "exact",
    noising: bool = False,
    heads: HeadSpec | None = None,
    by_position: bool = False,
    verify: int = 0,
    seed: int = SEED,
    seq_len: int | None = None,
    batch: int = PATCH_BATCH,
    edge: tuple[tuple[int, int], tuple[int, int]] | None = None,
    task: str | None = None,
) -> PatchRequest:
    """The inputs of ``patch`` / ``path-patch`` as the CLI, the API and the explorer give them
    (prompts as text or ids, answer tokens as ids or strings, heads as ``head_sets`` takes
    them) resolved against the model's tokenizer, as a validated ``PatchRequest``."""
    from headscope.engine.core.validation import check_patchable

    where = str(model.path)
    check_patchable(model.structure(), where)
    return PatchRequest.of(
        model.structure(), clean=prompt_ids(model, clean, "clean"),
        corrupt=prompt_ids(model, corrupt, "corrupt"),
        answer=None if answer is None else answer_token(model, answer, "answer"),
        wrong=None if wrong is None else answer_token(model, wrong, "wrong"),
        site=site, method=method, noising=noising, heads=head_sets(heads, where), by_position=by_position,
        verify=verify, seed=seed, seq_len=seq_len, batch=batch, edge=edge, task=task, where=where)
