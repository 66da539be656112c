"""Read and validate the header of a llama.cpp GGUF file (no torch, no tensor data).

Layout (GGUF versions 2 and 3, little-endian): the magic ``GGUF``, a ``u32`` version, ``u64``
tensor and metadata counts, the metadata key/value pairs (typed: integers, floats, bools,
strings, arrays), one info record per tensor (name, dims, ggml type, offset), then, aligned to
``general.alignment`` (32 by default), the data buffer the offsets point into.

Everything a later read relies on is checked here, as ``formats.safetensors`` does for
safetensors: every count and length is bounded (and by the bytes left in the file) before
anything is allocated, strings are UTF-8, arrays are not nested deeper than one level, every
tensor has a known ggml type, a row length that is a whole number of its type's blocks, an
aligned offset, and bytes inside the file that overlap no other tensor's. A failure is a
``CorruptFileError`` naming the file. Nothing here evaluates anything from the file.
"""

from __future__ import annotations

import itertools
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from headscope.engine.core.errors import CorruptFileError, UnsupportedFormatError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_KV = 100_000  # real files have a few dozen keys
MAX_TENSORS = 1_000_000  # real files have a few thousand tensors
MAX_ARRAY = 50_000_000  # the largest real arrays are vocabularies and merge lists (~10^5..10^6)
MAX_STRING = 100_000_000  # a chat template is a few KB; bounded anyway by the file size
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_DIM = 1 << 40
DEFAULT_ALIGNMENT = 32

# Metadata value types of the GGUF spec: id -> (name, struct format or None).
_UINT8, _INT8, _UINT16, _INT16, _UINT32, _INT32, _FLOAT32, _BOOL, _STRING, _ARRAY = range(10)
_UINT64, _INT64, _FLOAT64 = 10, 11, 12
_SCALARS: dict[int, str] = {
    _UINT8: "<B", _INT8: "<b", _UINT16: "<H", _INT16: "<h", _UINT32: "<I", _INT32: "<i",
    _FLOAT32: "<f", _BOOL: "<?", _UINT64: "<Q", _INT64: "<q", _FLOAT64: "<d",
}  # fmt: skip


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]  # row-major (PyTorch/numpy order): ggml's ne reversed
    ggml_type: int
    type_name: str  # "F32", "Q4_K", ...
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class GGUFHeader:
    path: str
    version: int
    file_size: int
    alignment: int
    data_start: int
    metadata: dict[str, Any] = field(repr=False)
    tensors: dict[str, GGUFTensorInfo] = field(repr=False)

    def get(self, key: str, default: Any = None) -> Any:
        """A metadata value; an array of strings decoded (on its first use: ``StringArray``)."""
        value = self.metadata.get(key, default)
        return value.strings() if isinstance(value, StringArray) else value


class StringArray:
    """A metadata array of strings as the bytes read (each item's u64 length and UTF-8 bytes,
    every length checked against the file while the header was parsed), decoded into a list
    of ``str`` on first use (``GGUFHeader.get``). A vocabulary is 32,000 to 256,000 strings
    and decoding them was most of the header's parse; ``info`` and the config never use them."""

    __slots__ = ("_offsets", "_strings", "n", "raw")

    def __init__(self, raw: bytes, n: int) -> None:
        self.raw, self.n = raw, n
        self._strings: list[str] | None = None
        self._offsets: list[int] | None = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> str:
        """One string, decoded alone (the default token set reads a few dozen of a table's
        32k-256k: ``formats.vocabulary``); the item offsets are found once, by their lengths."""
        if self._strings is not None:
            return self._strings[i]
        if not -self.n <= i < self.n:
            raise IndexError(i)
        if self._offsets is None:
            raw, unpack, pos = self.raw, _U64.unpack_from, 0
            offsets = []
            append = offsets.append
            for _ in range(self.n):
                append(pos)
                pos += 8 + unpack(raw, pos)[0]
            self._offsets = offsets
        pos = self._offsets[i]
        (k,) = _U64.unpack_from(self.raw, pos)
        return self.raw[pos + 8 : pos + 8 + k].decode("utf-8", errors="replace")

    def strings(self) -> list[str]:
        """The strings (undecodable bytes as U+FFFD: some vocabularies hold partial UTF-8)."""
        if self._strings is None:
            raw, unpack, pos = self.raw, _U64.unpack_from, 0
            out: list[str] = []
            append = out.append
            for _ in range(self.n):
                (k,) = unpack(raw, pos)
                append(raw[pos + 8 : pos + 8 + k].decode("utf-8", errors="replace"))
                pos += 8 + k
            self._strings = out
        return self._strings


# The ggml types of headscope's own kernels (engine.formats.dequant) and F64, by ggml id:
# (name, values per block, bytes per block), llama.cpp's numbers (tests/engine/formats/
# test_gguf.py checks them against the gguf package's table). A header with only these types is
# read without importing the gguf package (with numpy, yaml and sentencepiece: ~60 ms of a
# 0.5 s ``headscope info``); any other type reads the package's table.
KNOWN_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 8: ("Q8_0", 32, 34),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
    28: ("F64", 1, 8), 30: ("BF16", 1, 2),
}  # fmt: skip


class GGMLTypes(dict[int, tuple[str, int, int]]):
    """ggml type id -> (name, elements per block, bytes per block): ``KNOWN_TYPES``, and from
    the first id outside them on, the ``gguf`` package's table (llama.cpp's own, so new types
    need no change here; ImportError without the package)."""

    def __contains__(self, ggml_type: object) -> bool:
        return super().__contains__(ggml_type) or (self._load() and super().__contains__(ggml_type))

    def __missing__(self, ggml_type: int) -> tuple[str, int, int]:
        if self._load() and super().__contains__(ggml_type):
            return self[ggml_type]
        raise KeyError(ggml_type)

    def _load(self) -> bool:
        """Add the package's table (once); whether it was added now."""
        if getattr(self, "loaded", False):
            return False
        from gguf.constants import GGML_QUANT_SIZES

        self.update({int(t): (t.name, block, size) for t, (block, size) in GGML_QUANT_SIZES.items()})
        self.loaded = True
        return True


def quant_sizes() -> GGMLTypes:
    """ggml type id -> (name, elements per block, bytes per block) (``GGMLTypes``)."""
    return GGMLTypes(KNOWN_TYPES)


def is_gguf(path: str | os.PathLike[str]) -> bool:
    """Whether the file starts with the GGUF magic (whatever its name)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


READ_CHUNK = 1 << 20  # the header is read in chunks this size (a vocabulary: a few MB)
LIST_ITEMS = 1 << 21  # numeric arrays up to this many items are lists (per-layer values, scores)
MAX_STRINGS = 1 << 22  # string arrays are lists of str (~60 bytes each): vocabularies have ~10^5


class _Cursor:
    """Sequential reads of a file's header that never run past its end: read in chunks, not
    memory-mapped, so a file truncated while it is read is a short read (a ``CorruptFileError``
    naming it), not a SIGBUS. ``size`` is the size when it was opened; every count is bounded
    by it before anything is allocated."""

    def __init__(self, f: Any, path: str, size: int) -> None:
        self.f, self.path, self.size, self.pos = f, path, size, 0
        self.window, self.base = b"", 0  # the bytes read from file offset ``base`` on

    def left(self) -> int:
        return self.size - self.pos

    def take(self, n: int, what: str) -> bytes:
        if n > self.left():
            raise CorruptFileError(
                self.path,
                f"truncated GGUF file: {what} needs {n:,} bytes at offset {self.pos:,}, "
                f"only {self.left():,} left",
            )
        at = self.pos - self.base
        if at + n <= len(self.window):
            data = self.window[at : at + n]
        elif n >= READ_CHUNK:  # a large array: read it whole, not through the window
            data = self.window[at:] + self._read(n - (len(self.window) - at), what)
            self.window, self.base = b"", self.pos + n
        else:
            self.fill(n, what)
            data = self.window[:n]
        self.pos += n
        return data

    def fill(self, n: int, what: str) -> None:
        """Make the window start at ``pos`` and hold at least ``n`` bytes."""
        keep = self.window[self.pos - self.base :]
        self.window = keep + self._read(max(n, READ_CHUNK) - len(keep), what, at_least=n - len(keep))
        self.base = self.pos

    def _read(self, n: int, what: str, at_least: int | None = None) -> bytes:
        need = n if at_least is None else at_least
        data = self.f.read(n)
        while len(data) < need:
            more = self.f.read(n - len(data))
            if not more:
                raise CorruptFileError(
                    self.path,
                    f"truncated GGUF file: it ended while {what} was read (it was {self.size:,} bytes when "
                    "opened: rewritten or truncated since?)",
                )
            data += more
        return data

    def scalar(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def u32(self, what: str) -> int:
        return self.scalar("<I", what)

    def u64(self, what: str) -> int:
        return self.scalar("<Q", what)

    def count(self, what: str, limit: int, min_item: int) -> int:
        """A u64 count, bounded by ``limit`` and by the bytes left (each item >= ``min_item``)."""
        n = self.u64(what)
        if n > limit or n * min_item > self.left():
            raise CorruptFileError(
                self.path,
                f"bad GGUF header: {what} is {n:,}, impossible for a file of {self.size:,} bytes "
                f"(limit {limit:,})",
            )
        return n

    def string(self, what: str, strict: bool = True) -> str:
        """A UTF-8 string; names must decode, values (token strings of some vocabularies hold
        partial UTF-8 sequences) get U+FFFD for undecodable bytes."""
        n = self.count(f"length of {what}", MAX_STRING, 1)
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8", errors="strict" if strict else "replace")
        except UnicodeDecodeError:
            raise CorruptFileError(self.path, f"bad GGUF header: {what} is not UTF-8") from None


def read_gguf_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """Parse and validate the header of the GGUF file at ``path`` (reads no tensor data)."""
    p = str(Path(path))
    try:
        with open(p, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise CorruptFileError(p, "not a GGUF file (wrong magic; expected 'GGUF'): the file is empty")
            return _parse(_Cursor(f, p, size))
    except (OSError, ValueError) as e:
        raise CorruptFileError(p, f"cannot read GGUF file: {getattr(e, 'strerror', None) or e}") from None


def _parse(c: _Cursor) -> GGUFHeader:
    if c.size < 4 or c.take(4, "magic") != MAGIC:
        raise CorruptFileError(c.path, "not a GGUF file (wrong magic; expected 'GGUF')")
    version = c.u32("version")
    if version not in VERSIONS:
        hint = " (a big-endian file?)" if version > 0xFFFF else ""
        raise CorruptFileError(
            c.path, f"unsupported GGUF version {version}{hint}; headscope reads versions 2 and 3"
        )
    # Minimal sizes: a tensor info is >= 8 (name length) + 4 + 4 + 8 bytes, a key/value >= 8 + 4.
    n_tensors = c.count("tensor count", MAX_TENSORS, 24)
    n_kv = c.count("metadata count", MAX_KV, 12)
    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        key = c.string(f"metadata key #{i}")
        if key in metadata:
            raise CorruptFileError(c.path, f"bad GGUF header: duplicate metadata key {key!r}")
        value_type = c.u32(f"type of {key!r}")
        metadata[key] = _value(c, value_type, key, depth=0)
    alignment = _alignment(c, metadata)
    sizes = quant_sizes()
    try:
        infos = [_tensor_info(c, i, sizes) for i in range(n_tensors)]
    except ImportError:  # a type outside KNOWN_TYPES, and no gguf package for its size
        raise UnsupportedFormatError(
            c.path, "reading GGUF files needs llama.cpp's gguf package: pip install gguf"
        ) from None
    data_start = -(-c.pos // alignment) * alignment
    tensors = _place(c, infos, data_start, alignment)
    return GGUFHeader(c.path, version, c.size, alignment, data_start, metadata, tensors)


def _value(c: _Cursor, value_type: int, key: str, depth: int) -> Any:
    if value_type in _SCALARS:
        return c.scalar(_SCALARS[value_type], f"value of {key!r}")
    if value_type == _STRING:
        return c.string(f"value of {key!r}", strict=False)
    if value_type == _ARRAY and depth == 0:
        item_type = c.u32(f"array type of {key!r}")
        if item_type in _SCALARS:
            fmt = _SCALARS[item_type]
            item = struct.calcsize(fmt)
            n = c.count(f"length of array {key!r}", MAX_ARRAY, item)
            return _numbers(c.take(n * item, f"array {key!r}"), fmt)
        if item_type == _STRING:
            n = c.count(f"length of array {key!r}", MAX_ARRAY, 8)
            if n > MAX_STRINGS:
                raise CorruptFileError(
                    c.path, f"bad GGUF header: array {key!r} has {n:,} strings; headscope reads at most "
                            f"{MAX_STRINGS:,} (the largest vocabularies have a few hundred thousand)")
            return _strings(c, n, key)
        if item_type == _ARRAY:
            n = c.count(f"length of array {key!r}", MAX_ARRAY, 12)
            return [_value(c, _ARRAY, key, depth + 1) for _ in range(n)]
        raise CorruptFileError(c.path, f"bad GGUF header: array {key!r} has unknown item type {item_type}")
    if value_type == _ARRAY:
        raise CorruptFileError(c.path, f"bad GGUF header: arrays nested too deep in {key!r}")
    raise CorruptFileError(c.path, f"bad GGUF header: metadata {key!r} has unknown type {value_type}")


_U64 = struct.Struct("<Q")


def _numbers(raw: bytes, fmt: str) -> list[Any] | np.ndarray:
    """A numeric array: a list up to ``LIST_ITEMS`` items (per-layer values, a vocabulary's
    scores: what the model reader uses), beyond that a read-only numpy array over the bytes
    read (1 to 8 bytes an item, as in the file, instead of ~40 as a list of Python numbers)."""
    array = np.frombuffer(raw, dtype=np.dtype(fmt))
    return array.tolist() if len(array) <= LIST_ITEMS else array


def _strings(c: _Cursor, n: int, key: str) -> StringArray:
    """``n`` strings (a vocabulary or merge list: up to ~10^6): their lengths walked and checked
    in one tight loop over the cursor's window, their bytes kept undecoded (``StringArray``).
    An item that runs past the window is read through ``take`` (which refills it, and raises
    at the end of the file), after the bytes since ``mark`` are kept from the old window."""
    unpack = _U64.unpack_from
    pieces: list[bytes] = []
    mark = c.pos  # the array's bytes from ``mark`` to ``pos`` are in the window, not in ``pieces``
    for i in range(n):
        at = c.pos - c.base
        if at + 8 <= len(c.window):
            (k,) = unpack(c.window, at)
            _check_item(c, k, c.pos + 8, i, key)
            if at + 8 + k <= len(c.window):
                c.pos += 8 + k
                continue
        pieces.append(c.window[mark - c.base : c.pos - c.base])
        length = c.take(8, f"length of item {i} of {key!r}")
        (k,) = _U64.unpack(length)
        _check_item(c, k, c.pos, i, key)
        pieces += (length, c.take(k, f"item {i} of {key!r}"))
        mark = c.pos
    pieces.append(c.window[mark - c.base : c.pos - c.base])
    return StringArray(b"".join(pieces), n)


def _check_item(c: _Cursor, k: int, at: int, i: int, key: str) -> None:
    """Item ``i``'s length ``k``, its bytes starting at file offset ``at``, fits the file."""
    if k > MAX_STRING or k > c.size - at:
        raise CorruptFileError(
            c.path, f"truncated GGUF file: item {i} of {key!r} claims {k:,} bytes at offset {at:,}"
        )


def _alignment(c: _Cursor, metadata: dict[str, Any]) -> int:
    a = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if isinstance(a, bool) or not isinstance(a, int) or a < 1 or a > 1 << 20 or a & (a - 1):
        raise CorruptFileError(c.path, f"bad GGUF header: general.alignment {a!r} is not a power of two")
    return a


def _tensor_info(c: _Cursor, i: int, sizes: GGMLTypes) -> GGUFTensorInfo:
    name = c.string(f"name of tensor #{i}")
    n_dims = c.u32(f"dims of {name!r}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise CorruptFileError(c.path, f"bad GGUF header: tensor {name!r} has {n_dims} dimensions (1..{MAX_DIMS})")
    ne = [c.u64(f"dims of {name!r}") for _ in range(n_dims)]
    if any(d < 1 or d > MAX_DIM for d in ne):
        raise CorruptFileError(c.path, f"bad GGUF header: tensor {name!r} has impossible shape {ne}")
    ggml_type = c.u32(f"type of {name!r}")
    offset = c.u64(f"offset of {name!r}")
    if ggml_type not in sizes:
        raise CorruptFileError(c.path, f"tensor {name!r} has unknown ggml type {ggml_type}")
    type_name, block, type_size = sizes[ggml_type]
    if ne[0] % block:
        raise CorruptFileError(
            c.path,
            f"bad GGUF header: tensor {name!r} has rows of {ne[0]} elements, not a whole number "
            f"of {type_name} blocks of {block}",
        )
    numel = math.prod(ne)
    if numel > MAX_DIM:
        raise CorruptFileError(c.path, f"bad GGUF header: tensor {name!r} has {numel:,} elements")
    nbytes = numel // block * type_size
    return GGUFTensorInfo(name, tuple(reversed(ne)), ggml_type, type_name, offset, nbytes)


def _place(
    c: _Cursor, infos: list[GGUFTensorInfo], data_start: int, alignment: int
) -> dict[str, GGUFTensorInfo]:
    """Absolute offsets; every tensor aligned, inside the file, overlapping no other."""
    tensors: dict[str, GGUFTensorInfo] = {}
    for t in infos:
        if t.name in tensors:
            raise CorruptFileError(c.path, f"bad GGUF header: duplicate tensor {t.name!r}")
        if t.offset % alignment:
            raise CorruptFileError(c.path, f"bad GGUF header: tensor {t.name!r} is not aligned to {alignment} bytes")
        begin = data_start + t.offset
        if begin + t.nbytes > c.size:
            raise CorruptFileError(
                c.path,
                f"truncated GGUF file: tensor {t.name!r} needs bytes {begin:,}..{begin + t.nbytes:,} "
                f"but the file has {c.size:,}",
            )
        tensors[t.name] = GGUFTensorInfo(t.name, t.shape, t.ggml_type, t.type_name, begin, t.nbytes)
    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in tensors.values())
    for (_, end, a), (start, _, b) in itertools.pairwise(spans):
        if start < end:
            raise CorruptFileError(c.path, f"bad GGUF header: tensors {a!r} and {b!r} overlap")
    return tensors
