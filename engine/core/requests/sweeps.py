"""Model-wide sweeps (behaviour, score table, null, composition, ablation) and prompts
(a prompt through the model, tokenising)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from headscope.engine.core.errors import InvalidRequestError, PromptError
from headscope.engine.core.requests.base import Request, _where
from headscope.engine.core.requests.heads import AblationRequest, HeadScoresRequest
from headscope.engine.core.validation import (
    COMPOSITION_KINDS,
    NULL_SAMPLES,
    SEED,
    TOP_EDGES,
    Structure,
    check_prompt,
)

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
