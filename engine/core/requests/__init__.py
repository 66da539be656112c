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

Split by what a request asks about (``base``: the ``Request`` type and the registry; ``heads``:
one head's views; ``sweeps``: model-wide sweeps and prompts; ``patching``; ``discovery``: QK
and edge attribution); every name is importable from here.
"""

from __future__ import annotations

from headscope.engine.core.requests import discovery, heads, patching, sweeps
from headscope.engine.core.requests.base import COMPUTATIONS, Request, as_mapping, computes
from headscope.engine.core.requests.discovery import (
    EDGE_METHODS,
    EDGE_STEPS,
    EdgesRequest,
    FaithfulnessRequest,
    QKAttributionRequest,
    edge_count,
)
from headscope.engine.core.requests.heads import (
    AblationRequest,
    CircuitRequest,
    DirectionsRequest,
    HeadScoresRequest,
    PathRequest,
    ProfileRequest,
    SpectrumRequest,
    TopOutputsRequest,
)
from headscope.engine.core.requests.patching import (
    InductionPromptsRequest,
    PatchInputsRequest,
    PatchRequest,
)
from headscope.engine.core.requests.sweeps import (
    AblationSweepRequest,
    BehaviourRequest,
    CompositionRequest,
    PromptRequest,
    ScoreNullRequest,
    ScoreTableRequest,
    TokenizeRequest,
)

__all__ = [
    "COMPUTATIONS",
    "EDGE_METHODS",
    "EDGE_STEPS",
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
    "as_mapping",
    "computes",
    "edge_count",
    "request_types",
]

_MODULES = (heads, sweeps, patching, discovery)


def request_types() -> tuple[type[Request], ...]:
    """Every request type (each must have exactly one computation)."""
    return tuple(cls for module in _MODULES for cls in vars(module).values()
                 if isinstance(cls, type) and issubclass(cls, Request) and cls is not Request
                 and cls.__module__ == module.__name__ and not cls.__name__.startswith("_"))
