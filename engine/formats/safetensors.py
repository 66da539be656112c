"""Read and validate a safetensors header without torch, numpy or the safetensors package.

Layout of a ``.safetensors`` file: 8 bytes little-endian ``N``, then ``N`` bytes of a JSON
object (UTF-8, may be padded with spaces), then the data buffer. Each JSON entry is
``name -> {"dtype", "shape", "data_offsets": [begin, end]}`` with offsets relative to the
buffer; the optional ``"__metadata__"`` entry maps strings to strings.

Everything a later read relies on is checked here, before any tensor is touched: header
size limit, well-formed JSON object, known dtypes, ``prod(shape) * itemsize == end - begin``,
offsets inside the file and non-overlapping, file not truncated. A failure is a
``CorruptFileError`` naming the file.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from headscope.engine.core.errors import CorruptFileError, UnsafeFormatError
from headscope.engine.core.files import check_nesting, no_duplicate_keys, open_regular, os_reason

# Headers of real checkpoints are a few hundred KB at most; the reference implementation
# refuses headers above 100 MB, and so do we (a hostile length must not make us allocate).
MAX_HEADER_BYTES = 100_000_000

# Bytes per element of every dtype safetensors defines (sub-byte float formats excluded:
# no checkpoint we read uses them, and their byte length is not prod(shape) * itemsize).
DTYPE_SIZES: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}

# safetensors dtype -> the torch dtype name (how the UI and `structure()` report it).
DTYPE_NAMES: dict[str, str] = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3": "float8_e4m3fn",
    "I16": "int16",
    "U16": "uint16",
    "F16": "float16",
    "BF16": "bfloat16",
    "I32": "int32",
    "U32": "uint32",
    "F32": "float32",
    "I64": "int64",
    "U64": "uint64",
    "F64": "float64",
}

FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})

# First bytes of the pickle-based formats people rename or confuse with safetensors.
_ZIP_MAGIC = b"PK\x03\x04"  # torch.save (zip of pickles)
_PICKLE_PROTO = b"\x80"  # pickle protocol >= 2


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # safetensors spelling: "F32", "BF16", ...
    shape: tuple[int, ...]
    begin: int  # byte offsets relative to the data buffer
    end: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class SafetensorsHeader:
    path: str
    header_bytes: int  # N
    file_size: int
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str] = field(default_factory=dict)
    # (device, inode, size, mtime_ns) of the file when this header was read (read_header).
    identity: tuple[int, int, int, int] | None = field(default=None, compare=False)

    @property
    def data_start(self) -> int:
        return 8 + self.header_bytes

    @property
    def n_params(self) -> int:
        return sum(t.numel for t in self.tensors.values())

    def __contains__(self, name: object) -> bool:
        return name in self.tensors


def read_header(
    path: str | os.PathLike[str], max_header_bytes: int = MAX_HEADER_BYTES
) -> SafetensorsHeader:
    """Parse and validate the header of the safetensors file at ``path`` (reads the header only)."""
    p = Path(path)
    fd = open_regular(p, CorruptFileError, "safetensors file")  # no FIFO, no device
    try:
        with open(fd, "rb") as f:
            st = os.fstat(f.fileno())
            prefix = f.read(8)
            first = f.read(1)
            _refuse_pickle(p, prefix, first)
            n = _header_length(p, prefix, st.st_size, max_header_bytes)
            raw = first + f.read(n - 1)
    except OSError as e:
        raise CorruptFileError(p, f"cannot read safetensors file: {os_reason(e)}") from None
    if len(raw) != n:
        raise CorruptFileError(p, "truncated safetensors file: header is cut short")
    header = _validate(p, raw, n, st.st_size)
    return dataclasses.replace(header, identity=file_identity(st))


def file_identity(st: os.stat_result) -> tuple[int, int, int, int]:
    """What changes when a file is rewritten, in place or by rename: device, inode, size,
    modification time (ns)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def parse_header_bytes(
    blob: bytes, path: str = "<bytes>", max_header_bytes: int = MAX_HEADER_BYTES
) -> SafetensorsHeader:
    """Validate a whole safetensors file held in memory (tests, fuzzing)."""
    _refuse_pickle(path, blob[:8], blob[8:9])
    n = _header_length(path, blob[:8], len(blob), max_header_bytes)
    return _validate(path, blob[8 : 8 + n], n, len(blob))


def _refuse_pickle(path: str | os.PathLike[str], prefix: bytes, after: bytes = b"") -> None:
    """Refuse zip (torch.save) and pickle magic. ``after``: the byte after the 8-byte length:
    a header of 640, 896, 1152 or 1408 bytes starts with the bytes of pickle protocol 2-5
    (``80 02`` ...), but then the JSON's ``{`` follows, which never starts a pickle there."""
    pickle_magic = prefix[:1] == _PICKLE_PROTO and prefix[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05")
    if prefix.startswith(_ZIP_MAGIC) or (pickle_magic and after != b"{"):
        raise UnsafeFormatError(
            path,
            "this is a pickle / torch.save file, not safetensors: loading it could run code; "
            "convert it to safetensors in a trusted environment",
        )


def _header_length(path: str | os.PathLike[str], prefix: bytes, file_size: int, limit: int) -> int:
    if len(prefix) < 8:
        raise CorruptFileError(
            path,
            f"truncated safetensors file: {file_size} bytes, shorter than the 8-byte header length",
        )
    (n,) = struct.unpack("<Q", prefix)
    if n > limit:
        raise CorruptFileError(
            path, f"bad header length {n} bytes (limit {limit}): not a safetensors file or corrupt"
        )
    if n < 2:
        raise CorruptFileError(path, f"bad header length {n} bytes: too short for a JSON object")
    if 8 + n > file_size:
        raise CorruptFileError(
            path,
            f"truncated safetensors file: header claims {n} bytes, file has {file_size - 8} after the length",
        )
    return n


def _validate(
    path: str | os.PathLike[str], raw: bytes, n: int, file_size: int
) -> SafetensorsHeader:
    if not raw.startswith(b"{"):
        raise CorruptFileError(path, "bad JSON in safetensors header: does not start with '{'")
    check_nesting(raw, path, CorruptFileError, "safetensors header")
    try:
        text = raw.decode("utf-8")
        obj = json.loads(text, object_pairs_hook=no_duplicate_keys)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CorruptFileError(path, f"bad JSON in safetensors header: {_short(e)}") from None
    if not isinstance(obj, dict):
        raise CorruptFileError(path, "bad safetensors header: JSON is not an object")

    metadata = obj.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CorruptFileError(
            path, "bad safetensors header: __metadata__ must map strings to strings"
        )

    buffer_size = file_size - 8 - n
    tensors: dict[str, TensorInfo] = {}
    for name, entry in obj.items():
        tensors[name] = _header_entry(path, name, entry, buffer_size)

    # Like the reference implementation: in order of offset, tensors tile the data buffer
    # exactly (no overlap, no gap, nothing after the last one), so every later read
    # through safetensors sees the same file we validated.
    expected_begin = 0
    previous: TensorInfo | None = None
    for cur in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if cur.begin < expected_begin:
            other = previous.name if previous is not None else "?"
            raise CorruptFileError(
                path,
                f"bad safetensors header: overlapping offsets of tensors {other!r} and {cur.name!r}",
            )
        if cur.begin > expected_begin:
            raise CorruptFileError(
                path, f"bad safetensors header: gap in data offsets before tensor {cur.name!r}"
            )
        expected_begin, previous = cur.end, cur
    if expected_begin != buffer_size:
        raise CorruptFileError(
            path,
            f"bad safetensors file: {buffer_size - expected_begin} bytes after the last tensor",
        )
    return SafetensorsHeader(str(path), n, file_size, tensors, dict(metadata))


def _header_entry(
    path: str | os.PathLike[str], name: str, entry: object, buffer_size: int
) -> TensorInfo:
    where = f"tensor {name!r}"
    if not isinstance(entry, dict):
        raise CorruptFileError(path, f"bad safetensors header: {where} entry is not an object")
    dtype = entry.get("dtype")
    shape = entry.get("shape")
    offsets = entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        raise CorruptFileError(path, f"bad safetensors header: {where} has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
        raise CorruptFileError(path, f"bad safetensors header: {where} has invalid shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_uint(o) for o in offsets)):
        raise CorruptFileError(
            path, f"bad safetensors header: {where} has invalid data_offsets {offsets!r}"
        )
    begin, end = offsets
    if begin > end:
        raise CorruptFileError(
            path, f"bad safetensors header: {where} has data_offsets {offsets} with begin > end"
        )
    expected = math.prod(shape) * DTYPE_SIZES[dtype]
    if expected != end - begin:
        raise CorruptFileError(
            path,
            f"bad safetensors header: {where} shape {shape} of {dtype} needs {expected} bytes, offsets span {end - begin} (shape/byte mismatch)",
        )
    if end > buffer_size:
        raise CorruptFileError(
            path,
            f"truncated safetensors file: {where} ends at byte {end} of a {buffer_size}-byte data buffer",
        )
    return TensorInfo(name, dtype, tuple(shape), begin, end)


def _is_uint(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _short(e: BaseException) -> str:
    s = str(e) or type(e).__name__
    return s if len(s) <= 120 else s[:117] + "..."
