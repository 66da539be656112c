"""One head's views: a circuit block, top outputs, spectra, a rotary profile, scores, its
ablation, its singular directions, and the virtual path between two heads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from headscope.engine.core.errors import InvalidRequestError
from headscope.engine.core.requests.base import Head, Request, _block, _where
from headscope.engine.core.validation import (
    BASES,
    CIRCUIT_KINDS,
    SEED,
    Structure,
    check_head,
    check_ids,
    check_result_bytes,
    check_token,
)

# -- one head's views ------------------------------------------------------------------------


@dataclass(frozen=True)
class CircuitRequest(Request):
    """A ``rows × cols`` block of a head's QK or full OV circuit in the token or position basis:
    ids in range, size within the limit, ``offset`` 0 unless rotary."""

    name: ClassVar[str] = "circuit_block"
    prefetched: ClassVar[bool] = True
    layer: int
    head_index: int
    kind: str
    basis: str
    rows: tuple[int, ...]
    cols: tuple[int, ...]
    offset: int

    @classmethod
    def of(cls, structure: Structure, layer: int, head: int, kind: str, basis: str = "token",
           rows: Sequence[int] | None = None, cols: Sequence[int] | None = None, offset: int = 0, *,
           where: Any = ..., limit: int | None = None) -> CircuitRequest:
        where = _where(structure, where)
        check_head(structure, layer, head, where)
        if kind not in CIRCUIT_KINDS or basis not in BASES:
            raise InvalidRequestError(where, f"unknown circuit {kind!r} in basis {basis!r}")
        if basis == "position" and kind != "qk":
            raise InvalidRequestError(where, "the position basis exists for the QK circuit only")
        positional = structure["positional"]
        if basis == "position" and positional != "learned":
            raise InvalidRequestError(
                where, f"{positional} positions have no positional QK matrix; use the token basis "
                "with an offset (rotary) or rotary_profile")
        n = int(structure["n_ctx"] if basis == "position" else structure["d_vocab"])
        row_ids, col_ids = _block(n, rows, cols, structure.get("default_tokens") if basis == "token" else None)
        check_ids((*row_ids, *col_ids), n, basis, where)
        check_result_bytes(4 * len(row_ids) * len(col_ids), f"a {len(row_ids)}×{len(col_ids)} block",
                           where, limit)
        return cls(int(layer), int(head), kind, basis, row_ids, col_ids,
                   int(offset) if positional == "rotary" else 0)


@dataclass(frozen=True)
class TopOutputsRequest(Request):
    """The ``k`` output tokens the full OV circuit raises most when the head attends to ``source``."""

    name: ClassVar[str] = "top_outputs"
    layer: int
    head_index: int
    source: int
    k: int = 10

    @classmethod
    def of(cls, structure: Structure, layer: int, head: int, source: int, k: int = 10, *,
           where: Any = ...) -> TopOutputsRequest:
        where = _where(structure, where)
        check_head(structure, layer, head, where)
        check_token(structure, source, where)
        return cls(int(layer), int(head), int(source), max(1, min(int(k), int(structure["d_vocab"]))))


def _circuit_kind(kind: str, where: str | None) -> None:
    if kind not in CIRCUIT_KINDS:
        raise InvalidRequestError(where, f"spectrum kind must be 'ov' or 'qk', not {kind!r}")


@dataclass(frozen=True)
class SpectrumRequest(Request):
    """Eigenvalues of the full OV (``"ov"``) or token QK (``"qk"``) circuit, and its score
    (kept in the results store per head)."""

    name: ClassVar[str] = "spectrum"
    stored: ClassVar[bool] = True
    prefetched: ClassVar[bool] = True
    layer: int
    head_index: int
    kind: str

    @classmethod
    def of(cls, structure: Structure, layer: int, head: int, kind: str, *,
           where: Any = ...) -> SpectrumRequest:
        where = _where(structure, where)
        check_head(structure, layer, head, where)
        _circuit_kind(kind, where)
        return cls(int(layer), int(head), kind)


@dataclass(frozen=True)
class ProfileRequest(Request):
    """Rotary models: the head's QK score as a function of the query-key offset Δ."""

    name: ClassVar[str] = "rotary_profile"
    layer: int
    head_index: int
    offsets: tuple[int, ...]

    @classmethod
    def of(cls, structure: Structure, layer: int, head: int, offsets: Sequence[int], *,
           where: Any = ...) -> ProfileRequest:
        where = _where(structure, where)
        if structure["positional"] != "rotary":
            raise InvalidRequestError(where, "rotary_profile needs a rotary model")
        check_head(structure, layer, head, where)
        return cls(int(layer), int(head), tuple(int(o) for o in offsets))


@dataclass(frozen=True)
class HeadScoresRequest(Request):
    """Every score of one head: its two spectra and its row of the behavioural tables."""

    name: ClassVar[str] = "head_scores"
    stored: ClassVar[bool] = True  # its behaviour tables and spectra are
    layer: int
    head_index: int
    seed: int = SEED

    @classmethod
    def of(cls, structure: Structure, layer: int, head: int, *, where: Any = ...) -> HeadScoresRequest:
        check_head(structure, layer, head, _where(structure, where))
        return cls(int(layer), int(head))


@dataclass(frozen=True)
class AblationRequest(Request):
    """Loss increase on the seeded repeated sequence when the head's output is zeroed."""

    name: ClassVar[str] = "ablation"
    layer: int
    head_index: int
    seed: int = SEED

    @classmethod
    def of(cls, structure: Structure, layer: int, head: int, seed: int = SEED, *,
           where: Any = ...) -> AblationRequest:
        check_head(structure, layer, head, _where(structure, where))
        return cls(int(layer), int(head), int(seed))


@dataclass(frozen=True)
class DirectionsRequest(Request):
    """The top ``k`` singular directions of a head's full OV / token QK circuit, ``top``
    tokens a side: ``k >= 1`` (at most ``d_head`` exist), ``1 <= top <= d_vocab``."""

    name: ClassVar[str] = "directions"
    layer: int
    head_index: int
    kind: str
    k: int = 5
    top: int = 10

    @classmethod
    def of(cls, structure: Structure, layer: int, head: int, kind: str, k: int = 5, top: int = 10, *,
           where: Any = ...) -> DirectionsRequest:
        where = _where(structure, where)
        check_head(structure, layer, head, where)
        _circuit_kind(kind, where)
        if int(k) < 1:
            raise InvalidRequestError(where, f"--k must be at least 1, not {k}")
        d_vocab = int(structure["d_vocab"])
        if not 1 <= int(top) <= d_vocab:
            raise InvalidRequestError(where, f"--top must be in 1..{d_vocab}, not {top}")
        return cls(int(layer), int(head), kind, int(k), int(top))


@dataclass(frozen=True)
class PathRequest(Request):
    """The V- and K-composition virtual heads of ``source → target`` (``source`` in an
    earlier layer) and a ``rows × cols`` token block of the K-path. Belongs to ``target``."""

    name: ClassVar[str] = "virtual_heads"
    source: Head
    target: Head
    rows: tuple[int, ...]
    cols: tuple[int, ...]
    seed: int = SEED

    @property
    def head(self) -> Head | None:
        return self.target

    def label(self) -> str:
        return f"L{self.source[0]}H{self.source[1]}→L{self.target[0]}H{self.target[1]}"

    @classmethod
    def of(cls, structure: Structure, source: Sequence[int], target: Sequence[int],
           rows: Sequence[int] | None = None, cols: Sequence[int] | None = None, *,
           seed: int = SEED, where: Any = ..., limit: int | None = None) -> PathRequest:
        where = _where(structure, where)
        check_head(structure, *source, where)
        check_head(structure, *target, where)
        if int(source[0]) >= int(target[0]):
            raise InvalidRequestError(
                where, f"a path runs from an earlier layer to a later one, not L{source[0]} to L{target[0]}")
        n = int(structure["d_vocab"])
        row_ids, col_ids = _block(n, rows, cols, structure.get("default_tokens"))
        check_ids((*row_ids, *col_ids), n, "token", where)
        check_result_bytes(4 * len(row_ids) * len(col_ids), f"a {len(row_ids)}×{len(col_ids)} block",
                           where, limit)
        return cls((int(source[0]), int(source[1])), (int(target[0]), int(target[1])), row_ids, col_ids,
                   int(seed))
