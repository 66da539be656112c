"""QK attribution of one query row (docs/math.md, "QK attribution"): the request's
computation, and the request from the inputs the CLI and the API take (a prompt as text, as
the Prompt tab tokenises it, or ids; a head as ``L1.H2`` or a pair)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from headscope.engine.core.errors import InvalidRequestError, PromptError
from headscope.engine.core.progress import Cancelled, check_cancelled
from headscope.engine.core.requests import QKAttributionRequest, computes
from headscope.engine.sweeps.prompts import encode, head_sets

if TYPE_CHECKING:
    from headscope.engine.core.attribution import QKAttribution
    from headscope.engine.model.loading import LoadedModel


@computes(QKAttributionRequest)
def qk_row(model: LoadedModel, req: QKAttributionRequest, *, cancelled: Cancelled = None,
           **_: Any) -> QKAttribution:
    """Every key of the query row, split into (query source, key source) terms (one pass to
    the head's layer: ``forward.qk_attribution``)."""
    from headscope.engine.forward.qk_attribution import qk_attribution

    check_cancelled(cancelled)
    return qk_attribution(model.weights, req.tokens, req.layer, req.head_index, req.query, confirm=req.confirm)


def scope_error(model: LoadedModel) -> InvalidRequestError | None:
    """The refusal of a model whose scores are not a sum of terms (soft-capping, ALiBi,
    post-LN, ...), naming what is not decomposed; None when QK attribution applies."""
    from headscope.engine.forward.qk_attribution import out_of_scope

    reason = out_of_scope(model.cfg)
    if reason is None:
        return None
    return InvalidRequestError(str(model.path), f"QK attribution of {model.cfg.architecture}: {reason}")


def qk_attribution_request(model: LoadedModel, head: str | Sequence[int], *, prompt: str | None = None,
                           tokens: Sequence[int] | None = None, query: int, key: int | None = None,
                           confirm: int = 0) -> QKAttributionRequest:
    """The validated request from a head (``"L1.H2"``, ``"1.2"`` or ``(1, 2)``), a prompt
    (text, tokenised and cut to n_ctx as the Prompt tab does, or ids: exactly one), the query
    position and optionally the key (checked: ``0 <= key <= query``); ``confirm``: each side's
    top N sources removed exactly too."""
    where = str(model.path)
    if (prompt is None) == (tokens is None):
        raise InvalidRequestError(where, "give the prompt as text or as token ids (one of the two)")
    layer, index = head_sets(head if isinstance(head, str) else [tuple(head)], where)[0][0]
    if prompt is not None:
        if not prompt.strip():
            raise PromptError(where, "the prompt is empty")
        ids = encode(model.tokenizer, prompt)[: model.cfg.n_ctx]
        if not ids:
            raise PromptError(where, "the prompt encodes to no tokens")
    else:
        ids = [int(t) for t in tokens]  # type: ignore[union-attr]
    refused = scope_error(model)
    if refused is not None:
        raise refused
    return QKAttributionRequest.of(model.structure(), layer, index, ids, query, key, confirm=confirm, where=where)
