"""``compute(model, request)``: the one way from a request (``core.requests``) to its result.

Below both facades: the explorer's ``Engine`` runs it on its workers (and caches what it
returns), the Python API and ``api.report`` call it directly. Each request type has exactly
one computation, registered with ``@computes(SomeRequest)`` in the module that implements it:
``head_views`` (one head's views), ``scores`` (model-wide sweeps), ``prompts`` (tokenising, a
prompt through the model), ``patch_runs`` (patching) and ``edges`` (edge attribution).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from headscope.engine.core.errors import InvalidRequestError
from headscope.engine.core.progress import Cancelled, Progress
from headscope.engine.core.requests import COMPUTATIONS, Request

# imported for their @computes registrations
from headscope.engine.sweeps import (  # noqa: F401
    attribution,
    edges,
    head_views,
    patch_runs,
    prompts,
    scores,
)

if TYPE_CHECKING:
    from headscope.engine.model.loading import LoadedModel
    from headscope.engine.sweeps.store import ModelStore

__all__ = ["compute"]


def compute(model: LoadedModel, request: Request, *, progress: Progress = None, cancelled: Cancelled = None,
            store: ModelStore | None = None, **options: Any) -> Any:
    """The result of ``request`` on ``model``. ``progress(fraction)`` and ``cancelled()`` as
    every long computation takes them; ``store``: the model's entry in the results store (read
    and written by stored requests only); ``options``: what a computation takes beyond its
    request (a composition's ``on_tile``, a sweep's ``cluster``)."""
    fn = COMPUTATIONS.get(type(request))
    if fn is None:
        raise InvalidRequestError(str(model.path), f"nothing computes a {type(request).__name__}")
    return fn(model, request, progress=progress, cancelled=cancelled,
              store=store if request.stored else None, **options)
