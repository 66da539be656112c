"""Text in, token ids out, and one prompt through the model: what the CLI, the API and the
explorer type (a prompt, an answer token, a patching request's inputs) resolved against the
model's tokenizer, and the prompt view of every head at once.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from headscope.engine.core.errors import InvalidRequestError, PromptError
from headscope.engine.core.path_nodes import node_key, path_node
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


def answer_token(model: LoadedModel, token: int | str, what: str, *, text_prompts: bool = False,
                 notes: list[str] | None = None) -> int:
    """An answer (or wrong) token as an id: an int, ``id:12`` or ``#12`` (an id, as the
    explorer shows ids), digits, or a token string as ``--rows`` takes it (the vocabulary's
    spelling, else text that encodes to exactly one token). Digits are an id when the prompts
    are ids; with ``text_prompts`` a vocabulary token spelled with those digits is the token
    (a numeric task asks for ``7``, not id 7), said in ``notes``. A word-level vocabulary
    encodes an unknown word as ``<unk>``: that is not the token asked for, and is refused.
    The range of an id is checked by ``PatchRequest.of``."""
    where = str(model.path)
    if isinstance(token, bool):
        raise InvalidRequestError(where, f"the {what} token is {token!r}: give a token id or string")
    if isinstance(token, numbers.Integral):  # numpy integers too
        return int(token)
    text = str(token)
    stripped = text.strip()
    explicit = next((stripped[len(p):].strip() for p in _ID_PREFIXES if stripped.startswith(p)), None)
    if explicit is not None:
        if not (explicit.isascii() and explicit.isdigit()):
            raise PromptError(where, f"the {what} token {text!r} is not an id: write id:12")
        return int(explicit)
    if not stripped:
        raise PromptError(where, f"the {what} token is empty")
    found = model.tokenizer.token_to_id(text)
    if stripped.isascii() and stripped.isdigit():
        if text_prompts and found is not None and int(found) != int(stripped):
            if notes is not None:
                notes.append(f"the {what} {text!r} is the token {text!r} (id {int(found)}), as the prompts "
                             f"are text; write id:{stripped} for the id {stripped}")
            return int(found)
        return int(stripped)
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


# How an answer names an id explicitly, whatever the prompts: ``id:7`` (``#7``: as the explorer
# shows ids).
_ID_PREFIXES = ("id:", "#")
# How tokenizers spell the token an unknown word becomes.
UNKNOWN_TOKENS = ("<unk>", "[UNK]")


def unknown_words(model: LoadedModel, text: str, ids: Sequence[int]) -> list[str]:
    """The words of ``text`` the tokenizer turned into its unknown token (``<unk>``): by word
    where a word-level vocabulary lines the words up with the tokens, else the unknown tokens."""
    where = [i for i, t in enumerate(ids) if label(model.tokenizer, t) in UNKNOWN_TOKENS]
    words = text.split()
    if len(words) == len(ids):
        return [words[i] for i in where]
    return [label(model.tokenizer, ids[i]) for i in where]


def _is_text(given: Any) -> bool:
    """A prompt given as text, or a batch of texts (not token ids)."""
    return isinstance(given, str) or (isinstance(given, Sequence) and bool(given)
                                      and all(isinstance(row, str) for row in given))


def _unknown_words_check(model: LoadedModel, clean: Any, corrupt: Any, clean_ids: list[list[int]] | None,
                         corrupt_ids: list[list[int]] | None, notes: list[str] | None) -> None:
    """Text prompts with words outside the vocabulary: refused when the two prompts then
    become the same tokens (they differed only in those words, so nothing is left to patch),
    else noted once, naming the words (as ``forward`` and the Prompt tab do)."""
    def texts(given: Any) -> list[str]:
        return [given] if isinstance(given, str) else list(given) if _is_text(given) else []

    found = {what: [w for text, row in zip(texts(given), ids or [], strict=False)
                    for w in unknown_words(model, text, row)]
             for what, given, ids in (("clean", clean, clean_ids), ("corrupt", corrupt, corrupt_ids))}
    words = list(dict.fromkeys(w for ws in found.values() for w in ws))
    if not words:
        return
    named = ", ".join(words)
    if _is_text(clean) and _is_text(corrupt) and texts(clean) != texts(corrupt) and clean_ids == corrupt_ids:
        raise PromptError(str(model.path), f"the clean and corrupt prompts differ only in words outside the "
                          f"vocabulary ({named}), which all become <unk>: use words of the vocabulary")
    if notes is not None:
        which = [what for what, ws in found.items() if ws]
        where = "clean and corrupt prompts" if len(which) == 2 else f"{which[0]} prompt"
        notes.append(f"words outside the vocabulary become <unk> in the {where}: {named}")


def prompt_ids(model: LoadedModel, given: str | Sequence[Any] | None, what: str) -> list[list[int]] | None:
    """A prompt as a batch of token id lists: text (encoded by the tokenizer), token ids, or
    a batch of either (a list of texts, of id lists, a 2-D array); None stays None (the task's
    own prompts)."""
    where = str(model.path)
    if given is None:
        return None
    if isinstance(given, str):
        if not given.strip():
            raise PromptError(where, f"the {what} prompt is empty")
        return [encode(model.tokenizer, given)]
    rows = given.tolist() if isinstance(given, np.ndarray) else list(given)
    if rows and all(isinstance(row, str) for row in rows):
        return [ids for text in rows for ids in prompt_ids(model, text, what) or []]
    if rows and all(isinstance(row, Sequence) and not isinstance(row, str) for row in rows):
        return [_ids(row, what, where) for row in rows]
    return [_ids(rows, what, where)]


def _ids(row: Sequence[Any], what: str, where: str) -> list[int]:
    """One prompt's token ids (Python or numpy integers), or the typed error naming the item."""
    bad = next((t for t in row if isinstance(t, bool) or not isinstance(t, numbers.Integral)), None)
    if bad is not None:
        raise InvalidRequestError(where, f"the {what} prompt has {bad!r}: give text, token ids, or a batch "
                                  "of either")
    return [int(t) for t in row]


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
    if isinstance(spec, np.ndarray):  # heads picked from an array (result.table()'s indices)
        spec = spec.tolist()

    def one(item: Any) -> tuple[int, int]:
        if isinstance(item, str):
            match = _HEAD.match(item.strip())
            if match is None:
                raise InvalidRequestError(where, f"{item!r} is not a head: write L1.H2 or 1.2")
            return int(match.group(1)), int(match.group(2))
        if not _is_pair(item):
            raise InvalidRequestError(where, f"{item!r} is not a head: write L1.H2 or (1, 2)")
        layer, head = item
        return int(layer), int(head)

    def group(item: Any) -> list[tuple[int, int]]:
        if isinstance(item, str):
            return [one(part) for part in item.split(",") if part.strip()]
        if _is_pair(item):  # one head alone
            return [one(item)]
        if not isinstance(item, Sequence):
            raise InvalidRequestError(where, f"{item!r} is not a head or a set of heads: write L1.H2 or (1, 2)")
        return [one(part) for part in item]

    if not isinstance(spec, str | Sequence):
        raise InvalidRequestError(where, f"{spec!r} is not a head or a set of heads: write L1.H2 or (1, 2)")
    if _is_pair(spec) or isinstance(spec, str) or (spec and not isinstance(spec[0], str) and _is_pair(spec[0])):
        return [group(spec)]
    return [group(item) for item in spec]


def _is_pair(item: Any) -> bool:
    return (isinstance(item, Sequence | np.ndarray) and len(item) == 2
            and all(isinstance(v, numbers.Integral) for v in item))


def edge_of(edge: tuple[Any, Any] | None, where: str | None = None) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """A path-patching edge ``(sender, receiver)``, each end a head (a pair, ``"L0.H1"``,
    ``"a0.h1"``) or a node (``"input"``, ``"m0"``, ``"logits"``; ``core.path_nodes``), as
    the pairs a path's row keeps (``path_nodes.node_key``)."""
    if edge is None:
        return None
    if not isinstance(edge, Sequence) or isinstance(edge, str) or len(edge) != 2:
        raise InvalidRequestError(where, f"{edge!r} is not an edge: give two nodes, e.g. ('L0.H1', 'L1.H2')")
    ends = []
    for end in edge:
        if isinstance(end, str) and not re.match(r"\s*[lL]\d", end):  # not "L0.H1": a node's name
            ends.append(node_key(path_node(end, where)))
            continue
        heads = head_sets(end if isinstance(end, str) else [end], where) or [[]]
        if len(heads) != 1 or len(heads[0]) != 1:
            raise InvalidRequestError(where, f"{edge!r} is not an edge: give two nodes, e.g. ('L0.H1', 'L1.H2')")
        ends.append(heads[0][0])
    return ends[0], ends[1]


def receiver_part(edge: tuple[Any, Any] | None) -> str | None:
    """The q, k or v a receiver named ``"a1.h2<k>"`` gives, if it does."""
    if edge is None or not isinstance(edge[1], str) or not edge[1].strip().endswith(">"):
        return None
    return path_node(edge[1]).part


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
    edge: tuple[Any, Any] | None = None,
    task: str | None = None,
    notes: list[str] | None = None,
) -> PatchRequest:
    """The inputs of ``patch`` / ``path-patch`` as the CLI, the API and the explorer give them
    (prompts as text or ids, answer tokens as ids or strings, heads as ``head_sets`` takes
    them, an ``edge``'s heads as pairs or ``"L0.H1"``) resolved against the model's tokenizer, as a
    validated ``PatchRequest``. ``notes``, when given, collects what the caller should say
    about the inputs (words that became ``<unk>``, digits read as a token)."""
    from headscope.engine.core.validation import check_patchable

    where = str(model.path)
    check_patchable(model.structure(), where)
    clean_ids, corrupt_ids = prompt_ids(model, clean, "clean"), prompt_ids(model, corrupt, "corrupt")
    _unknown_words_check(model, clean, corrupt, clean_ids, corrupt_ids, notes)
    text = _is_text(clean) or _is_text(corrupt)

    def token(given: int | str | None, what: str) -> int | None:
        return None if given is None else answer_token(model, given, what, text_prompts=text, notes=notes)

    return PatchRequest.of(
        model.structure(), clean=clean_ids, corrupt=corrupt_ids,
        answer=token(answer, "answer"), wrong=token(wrong, "wrong"),
        site=receiver_part(edge) or site, method=method, noising=noising, heads=head_sets(heads, where), by_position=by_position,
        verify=verify, seed=seed, seq_len=seq_len, batch=batch, edge=edge_of(edge, where), task=task, where=where)
