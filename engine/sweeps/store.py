"""The results store: sweep results on disk, so a model reopened shows its scores at once
(docs/internals.md, "The results store").

Where: ``$HEADSCOPE_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/headscope`` (default
``~/.cache/headscope``). One directory per checkpoint *entry*, named by its fingerprint
(``fingerprint``): the resolved checkpoint path, the size, mtime and header bytes of every
safetensors file the model reads, the bytes of ``config.json`` and of the shard index, the
size and mtime of the tokenizer's files (the sink scores read it), the processing mode
(raw/processed), ``FORMAT_VERSION`` and ``MATH_VERSION``. A changed checkpoint gets a new
fingerprint, so it never sees the old numbers; the old entry ages out.

Inside an entry, each result part is one file ``<name>.<index>.hsr`` (``index`` a layer or a
target layer of a composition, or ``all`` for a whole result): a magic line, a JSON header
(format, fingerprint, name, index, shape, dtype, BLAKE2 digest of the payload) and the array
as ``.npy`` bytes, read back with ``allow_pickle=False``. A file whose header, digest, shape
or dtype does not match what is asked for is ignored (the part is recomputed and the file
replaced), never trusted.

Writes go to a temporary file in the same directory, are fsync'd and renamed over the target
(``os.replace``): a reader sees the old file or the new one, never half of one. Two processes
on the same model may both compute a part; each rename is atomic and both write the same
numbers, so neither corrupts the other. Sweeps store each part as soon as it is finished, so
an interrupted sweep (Ctrl-C, a closed SSH session, ``kill``) keeps what it finished and the
next run computes only the rest.

The store is bounded (``max_bytes``, the ``cache_disk_mb`` setting): after a sweep the least
recently used entries are deleted until the total fits. A store that cannot be written (an
unwritable directory, a full disk) never fails a command: it warns once and the command
computes without persisting.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from headscope.engine.model.loading import Checkpoint, Model

__all__ = [
    "DEFAULT_DISK_MB",
    "FORMAT_VERSION",
    "MATH_VERSION",
    "EntryInfo",
    "LayerMemo",
    "ModelStore",
    "ResultStore",
    "cache_root",
    "default_store",
    "fingerprint",
]

FORMAT_VERSION = 1  # the layout of the files below
# Bump whenever a stored number would change (a score's definition, its precision, the
# random sequences of a seed): every entry written before is then ignored.
MATH_VERSION = 4  # 2: the composition baseline is drawn with numpy (default_rng(seed));
# 3: the null's random heads are drawn in the span of the stream's rows, its spectral
# products in float32; 4: ... drawn through
# the symmetric root of the rows' Gram matrix (forward.null.gram_root), not a QR
DEFAULT_DISK_MB = 512
MAGIC = b"HEADSCOPE-RESULT\n"
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json")  # formats.tokenizer
ENTRY_FILE = "entry.json"
SUFFIX = ".hsr"
MAX_HEADER = 1 << 16

Warn = Callable[[str], None]


def cache_root(env: dict[str, str] | None = None) -> Path:
    """``$HEADSCOPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/headscope``, else ``~/.cache/headscope``."""
    env = dict(os.environ) if env is None else env
    if env.get("HEADSCOPE_CACHE_DIR"):
        return Path(env["HEADSCOPE_CACHE_DIR"]).expanduser()
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "headscope"


def _stderr_warning(message: str) -> None:
    print(f"headscope: warning: {message}", file=sys.stderr)


# -- the fingerprint of a checkpoint -----------------------------------------------------


def _header_bytes(path: Path) -> bytes:
    """The first 8 bytes of a safetensors file and the JSON header they announce."""
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            return prefix
        n = int.from_bytes(prefix, "little")
        return prefix + f.read(min(n, 100 << 20))


def _file_part(path: Path, with_header: bool) -> bytes:
    st = path.stat()
    head = _header_bytes(path) if with_header else path.read_bytes()
    meta = f"{path.name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode()
    return meta + hashlib.blake2b(head, digest_size=16).digest()


def fingerprint(ckpt: Checkpoint, raw: bool) -> str:
    """A hex key of everything the stored numbers depend on (see the module docstring)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"headscope-store {FORMAT_VERSION} math {MATH_VERSION} raw {bool(raw)}\0".encode())
    h.update(str(Path(ckpt.path).resolve()).encode() + b"\0")
    for file in sorted(set(ckpt.files.values())):
        h.update(_file_part(Path(file), with_header=True))
    for name in ("config.json", "model.safetensors.index.json"):
        extra = Path(ckpt.directory) / name
        if extra.is_file():
            h.update(_file_part(extra, with_header=False))
    # The sink scores read the tokenizer (the natural sentences, which tokens are delimiters):
    # its files count by size and mtime (a tokenizer.json can be 30 MB; not read on each open).
    for name in TOKENIZER_FILES:
        extra = Path(ckpt.directory) / name
        if extra.is_file():
            st = extra.stat()
            h.update(f"{name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()


# -- one file ----------------------------------------------------------------------------


def _encode(key: str, name: str, index: str, array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)  # (ascontiguousarray would make a 0-d array 1-d)
    payload = buf.getvalue()
    header = {
        "format": FORMAT_VERSION,
        "fingerprint": key,
        "name": name,
        "index": index,
        "shape": list(array.shape),
        "dtype": array.dtype.str,
        "digest": hashlib.blake2b(payload, digest_size=16).hexdigest(),
    }
    head = json.dumps(header, sort_keys=True).encode()
    return MAGIC + len(head).to_bytes(4, "little") + head + payload


def _decode(blob: bytes, key: str, name: str, index: str, shape: tuple[int, ...] | None,
            dtype: np.dtype[Any]) -> np.ndarray | None:
    """The array in ``blob`` if every check passes, else None (never raises on bad bytes)."""
    if not blob.startswith(MAGIC) or len(blob) < len(MAGIC) + 4:
        return None
    at = len(MAGIC)
    n = int.from_bytes(blob[at : at + 4], "little")
    if n > MAX_HEADER or len(blob) < at + 4 + n:
        return None
    try:
        header = json.loads(blob[at + 4 : at + 4 + n])
    except (UnicodeDecodeError, ValueError):
        return None
    payload = blob[at + 4 + n :]
    expected = {
        "format": FORMAT_VERSION, "fingerprint": key, "name": name, "index": index,
        "dtype": dtype.str,
    }
    if not isinstance(header, dict) or any(header.get(k) != v for k, v in expected.items()):
        return None
    if shape is not None and header.get("shape") != list(shape):
        return None
    if header.get("digest") != hashlib.blake2b(payload, digest_size=16).hexdigest():
        return None
    try:
        array = np.load(io.BytesIO(payload), allow_pickle=False)
    except (ValueError, OSError, EOFError):
        return None
    if not isinstance(array, np.ndarray) or array.dtype != dtype:
        return None
    if list(array.shape) != header.get("shape"):
        return None
    return array


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a fsync'd temporary file and ``os.replace``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _dir_bytes(path: Path) -> int:
    total = 0
    with contextlib.suppress(OSError):
        for p in path.iterdir():
            with contextlib.suppress(OSError):
                total += p.stat().st_size
    return total


# -- the store -----------------------------------------------------------------------------


@dataclass(frozen=True)
class EntryInfo:
    """One model entry, as ``headscope cache ls`` shows it."""

    key: str
    path: str  # the checkpoint it was written for
    raw: bool
    bytes: int
    parts: dict[str, int]  # result name -> how many parts are stored
    last_used: float  # seconds since the epoch

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "path": self.path, "raw": self.raw, "bytes": self.bytes,
                "stored": dict(self.parts), "last_used": self.last_used}


class ResultStore:
    """The on-disk store under ``root`` (``cache_root()`` by default), at most ``max_bytes``."""

    def __init__(self, root: str | os.PathLike[str] | None = None, *,
                 max_bytes: int = DEFAULT_DISK_MB << 20, warn: Warn | None = None) -> None:
        self.root = Path(root) if root is not None else cache_root()
        self.max_bytes = int(max_bytes)
        self._warn = warn or _stderr_warning
        self.broken = False  # set after the first write error: stop trying, compute only
        self._warned = False
        # fingerprints taken, by checkpoint object and mode: a command that sweeps one model
        # several times (heads, then composition; diff's two tables and six sweeps) reads its
        # shard headers once. A checkpoint rewritten meanwhile is refused by its reads anyway.
        self._keys: dict[tuple[int, bool], tuple[Any, str]] = {}
        self._keys_lock = threading.Lock()

    def warn_once(self, error: BaseException | str) -> None:
        """Stop persisting and say so once (a broken store never fails a command)."""
        self.broken = True
        if not self._warned:
            self._warned = True
            self._warn(f"cannot use the results cache at {self.root} ({error}); "
                       "computing without it")

    def for_model(self, model: Model) -> ModelStore:
        """The entry of ``model`` (its fingerprint; disabled if it cannot be taken)."""
        slot = (id(model.checkpoint), bool(model.raw))
        with self._keys_lock:
            known = self._keys.get(slot)
        if known is not None and known[0] is model.checkpoint:
            return ModelStore(self, known[1], str(Path(model.checkpoint.path).resolve()), model.raw)
        entry = self.for_checkpoint(model.checkpoint, model.raw)
        if entry.key is not None:
            with self._keys_lock:  # holds the checkpoint: its id stays its own
                self._keys[slot] = (model.checkpoint, entry.key)
        return entry

    def for_checkpoint(self, ckpt: Checkpoint, raw: bool) -> ModelStore:
        """The entry of the checkpoint ``ckpt`` processed (``raw=False``) or raw, from its
        headers alone (``loading.inspect_checkpoint``): no tensor is read, no torch."""
        where = str(Path(ckpt.path).resolve())
        try:
            key = fingerprint(ckpt, raw)
        except OSError as err:
            self.warn_once(err)
            return ModelStore(self, None, where, bool(raw))
        return ModelStore(self, key, where, bool(raw))

    # -- listing, clearing, trimming

    def _entry_dirs(self) -> list[Path]:
        try:
            return [p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")]
        except OSError:
            return []

    def entries(self) -> list[EntryInfo]:
        """Every entry with its model path, size, stored parts and last use, newest first."""
        out = []
        for d in self._entry_dirs():
            meta = _read_entry(d)
            if meta is None:
                continue
            parts: dict[str, int] = {}
            for p in d.glob(f"*{SUFFIX}"):
                if not p.name.startswith("."):
                    name = p.name[: -len(SUFFIX)].rsplit(".", 1)[0]
                    parts[name] = parts.get(name, 0) + 1
            with contextlib.suppress(OSError):
                out.append(EntryInfo(d.name, str(meta.get("path", "?")), bool(meta.get("raw")),
                                     _dir_bytes(d), parts, (d / ENTRY_FILE).stat().st_mtime))
        return sorted(out, key=lambda e: -e.last_used)

    def clear(self, path: str | os.PathLike[str] | None = None) -> list[EntryInfo]:
        """Delete every entry (or those written for the checkpoint at ``path``); the removed."""
        target = None if path is None else str(Path(path).expanduser().resolve())
        removed = []
        for entry in self.entries():
            if target is None or str(Path(entry.path).resolve()) == target:
                _remove_dir(self.root / entry.key)
                removed.append(entry)
        if target is None:  # also directories without a readable entry.json
            for d in self._entry_dirs():
                _remove_dir(d)
        return removed

    def trim(self, keep: str | None = None) -> None:
        """Delete least recently used entries (never ``keep``) until the store fits."""
        _remove_stale_temporaries(self.root)
        entries = sorted(self.entries(), key=lambda e: e.last_used)
        total = sum(e.bytes for e in entries)
        for entry in entries:
            if total <= self.max_bytes:
                break
            if entry.key != keep:
                _remove_dir(self.root / entry.key)
                total -= entry.bytes


def _remove_stale_temporaries(root: Path, age: float = 3600.0) -> None:
    """Temporary files an old process left behind when it was killed mid-write (and the
    trash of an interrupted removal); young ones may still be being written."""
    now = time.time()
    with contextlib.suppress(OSError):
        for p in [*root.glob("*/.tmp-*"), *root.glob(".trash-*")]:
            with contextlib.suppress(OSError):
                if now - p.stat().st_mtime > age:
                    shutil.rmtree(p) if p.is_dir() else p.unlink()


def _read_entry(d: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads((d / ENTRY_FILE).read_bytes())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == FORMAT_VERSION else None


def _remove_dir(d: Path) -> None:
    """Rename out of the way first, then delete: a concurrent reader sees all or nothing."""
    trash = d.with_name(f".trash-{d.name}-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.replace(d, trash)
    except OSError:
        return
    shutil.rmtree(trash, ignore_errors=True)


class ModelStore:
    """One model's entry: load and save result parts, count what came from where.

    ``loaded`` / ``computed`` count parts served from disk / computed in this process (the
    explorer shows them; tests count them); a part read back after this entry wrote it
    counts as neither (it was computed now, not found in the cache). A disabled entry (``key is None``, or the store
    broken) loads nothing and saves nothing.
    """

    def __init__(self, store: ResultStore, key: str | None, path: str, raw: bool) -> None:
        self.store, self.key, self.path, self.raw = store, key, path, raw
        self.dir = store.root / key if key is not None else None
        self.loaded = 0
        self.computed = 0
        self._mine = threading.local()  # the same counts, of the calling thread only
        self._written: set[tuple[str, str]] = set()
        self._touched = False

    def counts(self) -> tuple[int, int]:
        """``(loaded, computed)`` of the calling thread: what one sweep took from where,
        while other requests (the explorer's, on other workers) use the same entry."""
        return getattr(self._mine, "loaded", 0), getattr(self._mine, "computed", 0)

    def _count(self, which: str) -> None:
        setattr(self, which, getattr(self, which) + 1)
        setattr(self._mine, which, getattr(self._mine, which, 0) + 1)

    @property
    def enabled(self) -> bool:
        return self.dir is not None and not self.store.broken

    def _file(self, name: str, index: str) -> Path:
        assert self.dir is not None
        return self.dir / f"{name}.{index}{SUFFIX}"

    def has(self, name: str, index: int | str = "all") -> bool:
        """Whether a file for the part exists (``load`` still checks it; a cheap guess)."""
        return self.enabled and self.key is not None and self._file(name, str(index)).exists()

    def load(self, name: str, index: int | str = "all", shape: tuple[int, ...] | None = None,
             dtype: Any = np.float32) -> np.ndarray | None:
        """The stored part, or None (absent, unreadable, or failing any check)."""
        if not self.enabled or self.key is None:
            return None
        try:
            blob = self._file(name, str(index)).read_bytes()
        except OSError:
            return None
        array = _decode(blob, self.key, name, str(index), shape, np.dtype(dtype))
        if array is not None and (name, str(index)) not in self._written:
            self._count("loaded")
            self._touch()
        return array

    def save(self, name: str, array: np.ndarray, index: int | str = "all") -> None:
        """Store a part atomically; on an error, warn once and carry on without the store."""
        self._count("computed")
        self._written.add((name, str(index)))
        if not self.enabled or self.key is None:
            return
        try:
            self._ensure_entry()
            _write_atomic(self._file(name, str(index)), _encode(self.key, name, str(index), array))
        except OSError as err:
            self.store.warn_once(err)

    def _ensure_entry(self) -> None:
        assert self.dir is not None
        if (self.dir / ENTRY_FILE).is_file():
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        meta = {"format": FORMAT_VERSION, "path": self.path, "raw": self.raw,
                "fingerprint": self.key, "created": time.time()}
        _write_atomic(self.dir / ENTRY_FILE, json.dumps(meta).encode())
        self._touched = True

    def _touch(self) -> None:
        """Mark the entry used (its ``entry.json`` mtime orders the LRU eviction)."""
        if self._touched or self.dir is None:
            return
        self._touched = True
        with contextlib.suppress(OSError):
            os.utime(self.dir / ENTRY_FILE)

    def finish(self) -> None:
        """After a sweep: keep the store within its size (evicting other entries first)."""
        if self.enabled:
            self.store.trim(keep=self.key)

    def memo(self, name: str, shape: tuple[int, ...], dtype: Any = np.float32) -> LayerMemo:
        return LayerMemo(self, name, shape, dtype)


class LayerMemo:
    """The per-layer parts of one sweep's result: ``get(i)`` a stored part of ``shape``
    (or None), ``put(i, value)`` stores one as soon as it is finished."""

    def __init__(self, entry: ModelStore, name: str, shape: tuple[int, ...], dtype: Any) -> None:
        self.entry, self.name, self.shape, self.dtype = entry, name, shape, np.dtype(dtype)

    def get(self, index: int, shape: tuple[int, ...] | None = None) -> np.ndarray | None:
        return self.entry.load(self.name, index, shape or self.shape, self.dtype)

    def put(self, index: int, value: Any) -> None:
        self.entry.save(self.name, np.asarray(value, dtype=self.dtype), index)


def default_store(max_mb: int | None = None, warn: Warn | None = None) -> ResultStore:
    """The store under ``cache_root()``, capped at ``max_mb`` MiB (default ``DEFAULT_DISK_MB``)."""
    return ResultStore(max_bytes=(max_mb or DEFAULT_DISK_MB) << 20, warn=warn)
