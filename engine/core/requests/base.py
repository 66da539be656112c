"""The request every other one is: ``Request`` (key, head, label, origin, what a sweep publishes),
the registry of computations (``@computes``) and the helpers every request's ``of`` uses."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from headscope.engine.core.validation import (
    DEFAULT_BLOCK,
    Structure,
)

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


def _block(n: int, rows: Sequence[int] | None, cols: Sequence[int] | None,
           default: Sequence[int] | None = None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Rows and cols as id tuples (``None``: ``default`` if given, e.g. the model's
    ``structure["default_tokens"]``, else the first ``DEFAULT_BLOCK`` ids)."""
    default = tuple(int(i) for i in default) if default else tuple(range(min(n, DEFAULT_BLOCK)))
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



def _hashed(prefix: str, request: Request) -> str:
    fields = json.dumps([getattr(request, f.name) for f in dataclasses.fields(request)], separators=(",", ":"))
    return f"{prefix}-" + hashlib.blake2b(fields.encode(), digest_size=12).hexdigest()


def as_mapping(request: Request) -> Mapping[str, Any]:
    """A request's fields by name (for reports and logs)."""
    return {f.name: getattr(request, f.name) for f in dataclasses.fields(request)}
