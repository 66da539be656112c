"""The results store: sweep results on disk, so a model reopened shows its scores at once
(docs/internals.md, "The results store").

Where: ``$HEADSCOPE_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/headscope`` (default
``~/.cache/headscope``). One directory per checkpoint *entry*, named by its fingerprint
(``fingerprint``): the resolved checkpoint path, the size, mtime and header bytes of every
safetensors file the model reads (of a GGUF file: its metadata and tensor infos), the bytes of every config file the loader reads
(``CONFIG_FILES``: ``config.json``, the native ``headscope.json``, the shard index), the
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

Only what the store wrote is ever deleted or read: an entry is a real directory (never a
symlink) named by a fingerprint, holding an ``entry.json`` of this format or only files of
the store's own kinds (``OWN_FILE``); anything else under the root (another program's
cache, when ``$HEADSCOPE_CACHE_DIR`` is ``~/.cache``) is left alone, and clean-ups never
follow a symlink out of the root. Every file read is read through ``core.files.read_bytes``:
a regular file only (a FIFO would hang, a link to ``/dev/zero`` would never end) and at most
the bytes its header says it holds.

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
import math
import os
import re
import shutil
import stat
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from headscope.engine.core.errors import CorruptFileError, HeadscopeError, escape_line
from headscope.engine.core.files import (
    MAX_CONFIG_BYTES,
    TMP_PREFIX,
    os_reason,
    read_bytes,
    write_atomic,
)
from headscope.engine.formats.tokenizer import TOKENIZER_CONFIG_FILE, TOKENIZER_FILES
from headscope.engine.model.adapters.native import CONFIG_FILE as NATIVE_CONFIG_FILE

if TYPE_CHECKING:
    from headscope.engine.model.loading import Checkpoint, LoadedModel

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
# Every file whose bytes the loader reads to set a number (model.loading, adapters.native).
CONFIG_FILES = ("config.json", NATIVE_CONFIG_FILE, "model.safetensors.index.json")
# Every file the tokenizer reads (formats.tokenizer), in this order (it is hashed).
TOKENIZER_READS = (*TOKENIZER_FILES, TOKENIZER_CONFIG_FILE)
ENTRY_FILE = "entry.json"
SUFFIX = ".hsr"
MAX_HEADER = 1 << 16
MAX_ENTRY_BYTES = 1 << 16  # entry.json: a path and a few fields
MAX_NPY_HEADER = 1 << 12  # np.save's header for the shapes stored here (~128 bytes)
MAX_UNSHAPED_BYTES = 64 << 20  # a part read without an expected shape (spectra, timelines)
ENTRY_NAME = re.compile(r"[0-9a-f]{32}")  # a fingerprint: blake2b, 16 bytes, hex
OWN_FILE = re.compile(rf"(entry\.json|[^/]+\.[^./]+\.hsr|{re.escape(TMP_PREFIX)}.*)", re.DOTALL)

Warn = Callable[[str], None]


def cache_root(env: dict[str, str] | None = None) -> Path:
    """``$HEADSCOPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/headscope``, else ``~/.cache/headscope``."""
    env = dict(os.environ) if env is None else env
    if env.get("HEADSCOPE_CACHE_DIR"):
        return Path(env["HEADSCOPE_CACHE_DIR"]).expanduser()
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "headscope"


def _stderr_warning(message: str) -> None:
    print(f"headscope: warning: {escape_line(message)}", file=sys.stderr)


# -- the fingerprint of a checkpoint -----------------------------------------------------


def _header_bytes(path: Path) -> bytes:
    """The first 8 bytes of a safetensors file and the JSON header they announce."""
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            return prefix
        n = int.from_bytes(prefix, "little")
        return prefix + f.read(min(n, 100 << 20))


def _gguf_header_bytes(path: Path, data_start: int) -> bytes:
    """A GGUF file's header: its metadata and tensor infos, everything before the data."""
    with open(path, "rb") as f:
        return f.read(min(data_start, 100 << 20))


def _file_part(path: Path, head: bytes) -> bytes:
    """A file's name, size, mtime and the digest of ``head`` (its header, or all of it); the
    name as bytes (``os.fsencode``: a name need not be UTF-8)."""
    st = path.stat()
    meta = os.fsencode(path.name) + f"\0{st.st_size}\0{st.st_mtime_ns}\0".encode()
    return meta + hashlib.blake2b(head, digest_size=16).digest()


def fingerprint(ckpt: Checkpoint, raw: bool) -> str:
    """A hex key of everything the stored numbers depend on (see the module docstring)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"headscope-store {FORMAT_VERSION} math {MATH_VERSION} raw {bool(raw)}\0".encode())
    h.update(os.fsencode(Path(ckpt.path).resolve()) + b"\0")  # a path's bytes: need not be UTF-8
    for file in sorted(set(ckpt.files.values())):
        h.update(_file_part(Path(file), _header_bytes(Path(file))))
    if ckpt.gguf is not None:  # one file, holding the config and the vocabulary in its header
        gguf_file = Path(ckpt.path)
        h.update(_file_part(gguf_file, _gguf_header_bytes(gguf_file, ckpt.gguf.header.data_start)))
    for name in CONFIG_FILES:
        extra = Path(ckpt.directory) / name
        if extra.exists():  # a FIFO or device is refused by read_bytes, not skipped
            h.update(_file_part(extra, read_bytes(extra, MAX_CONFIG_BYTES, CorruptFileError, extra.name)))
    # The sink scores read the tokenizer (the natural sentences, which tokens are delimiters):
    # its files count by size and mtime (a tokenizer.json can be 30 MB; not read on each open).
    for name in TOKENIZER_READS:
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


def _dir_bytes(path: Path) -> int:
    total = 0
    with contextlib.suppress(OSError):
        for p in path.iterdir():
            with contextlib.suppress(OSError):
                total += p.lstat().st_size
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

    def warn_once(self, error: BaseException | str, file: Path | None = None) -> None:
        """Stop persisting and say so once (a broken store never fails a command); ``file``:
        the part that could not be written (the parts stored before it are kept)."""
        self.broken = True
        if not self._warned:
            self._warned = True
            reason = os_reason(error) if isinstance(error, OSError) else error
            if file is not None:
                self._warn(f"cannot write {file} ({reason}); computing the rest without the "
                           "results cache (the parts already stored are kept)")
            else:
                self._warn(f"cannot use the results cache at {self.root} ({reason}); "
                           "computing without it")

    def for_model(self, model: LoadedModel) -> ModelStore:
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
        """The directories under the root that may be entries: real directories (a symlink
        is never one; following it could read or delete outside the store) named by a
        fingerprint."""
        return [self.root / name for name in _real_dirs(self.root) if ENTRY_NAME.fullmatch(name)]

    def entries(self) -> list[EntryInfo]:
        """Every entry with its model path, size, stored parts and last use, newest first."""
        out = []
        for d in self._entry_dirs():
            meta = _read_entry(d)
            if meta is None:
                continue
            info = _entry_info(d, meta)
            if info is not None:
                out.append(info)
        return sorted(out, key=lambda e: -e.last_used)

    def clear(self, path: str | os.PathLike[str] | None = None) -> list[EntryInfo]:
        """Delete every entry (or those written for the checkpoint at ``path``); the removed.

        Only what the store wrote: entries, and (with no ``path``) fingerprint-named
        directories whose ``entry.json`` is damaged but which hold nothing but the store's
        own files. Every other directory or file under the root is left alone.
        """
        target = None if path is None else str(Path(path).expanduser().resolve())
        removed = []
        for entry in self.entries():
            if target is None or str(Path(entry.path).resolve()) == target:
                _remove_dir(self.root / entry.key)
                removed.append(entry)
        if target is None:  # entries whose entry.json cannot be read
            for d in self._entry_dirs():
                if _read_entry(d) is None and _only_own_files(d):
                    size = _dir_bytes(d)
                    _remove_dir(d)
                    removed.append(EntryInfo(d.name, f"(damaged entry {d.name})", False, size,
                                             {}, 0.0))
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


def _real_dirs(root: Path) -> list[str]:
    """Names of the real directories in ``root`` (``lstat``: symlinks are not followed)."""
    try:
        with os.scandir(root) as it:
            return [e.name for e in it if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _only_own_files(d: Path) -> bool:
    """Whether ``d`` holds only files the store writes (and no directory, no symlink)."""
    try:
        with os.scandir(d) as it:
            return all(e.is_file(follow_symlinks=False) and OWN_FILE.fullmatch(e.name)
                       for e in it)
    except OSError:
        return False


def _entry_info(d: Path, meta: dict[str, Any]) -> EntryInfo | None:
    parts: dict[str, int] = {}
    for p in d.glob(f"*{SUFFIX}"):
        if not p.name.startswith("."):
            name = p.name[: -len(SUFFIX)].rsplit(".", 1)[0]
            parts[name] = parts.get(name, 0) + 1
    try:
        used = os.lstat(d / ENTRY_FILE).st_mtime
    except OSError:
        return None
    return EntryInfo(d.name, str(meta.get("path", "?")), bool(meta.get("raw")), _dir_bytes(d),
                     parts, used)


def _remove_stale_temporaries(root: Path, age: float = 3600.0) -> None:
    """Temporary files an old process left behind when it was killed mid-write (and the
    trash of an interrupted removal); young ones may still be being written.

    Never through a symlink: a linked directory in the root is not searched, a linked
    ``.tmp-*`` is unlinked itself (its target is untouched), and ``shutil.rmtree`` does not
    follow the links inside what it deletes.
    """
    now = time.time()
    candidates = [root / name for name in _real_dirs(root) if name.startswith(".trash-")]
    for name in _real_dirs(root):
        if ENTRY_NAME.fullmatch(name):
            with contextlib.suppress(OSError), os.scandir(root / name) as it:
                candidates += [Path(e.path) for e in it if e.name.startswith(TMP_PREFIX)]
    for p in candidates:
        with contextlib.suppress(OSError):
            st = os.lstat(p)
            if now - st.st_mtime > age:
                shutil.rmtree(p) if stat.S_ISDIR(st.st_mode) else p.unlink()


def _read_part(path: Path, limit: int) -> bytes | None:
    """The bytes of a store file: a regular file of at most ``limit`` bytes, else None."""
    try:
        return read_bytes(path, limit, CorruptFileError, "stored result")
    except HeadscopeError:
        return None


def _read_entry(d: Path) -> dict[str, Any] | None:
    """``entry.json`` of the directory ``d`` if it is this store's, for this directory."""
    blob = _read_part(d / ENTRY_FILE, MAX_ENTRY_BYTES)
    if blob is None:
        return None
    try:
        meta = json.loads(blob)
    except ValueError:
        return None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
        return None
    return meta if meta.get("fingerprint") == d.name else None


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
        dtype = np.dtype(dtype)
        if shape is None:
            limit = max(MAX_UNSHAPED_BYTES, self.store.max_bytes)
        else:  # exactly what the file holds, with room for its two headers
            limit = (len(MAGIC) + 4 + MAX_HEADER + MAX_NPY_HEADER
                     + math.prod(shape) * dtype.itemsize)
        blob = _read_part(self._file(name, str(index)), limit)
        if blob is None:
            return None
        array = _decode(blob, self.key, name, str(index), shape, dtype)
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
        file = self._file(name, str(index))
        try:
            self._ensure_entry()
            write_atomic(file, _encode(self.key, name, str(index), array))
        except OSError as err:  # a full disk (ENOSPC), a read-only one: no partial file is left
            self.store.warn_once(err, file)

    def _ensure_entry(self) -> None:
        assert self.dir is not None
        if (self.dir / ENTRY_FILE).is_file():
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        meta = {"format": FORMAT_VERSION, "path": self.path, "raw": self.raw,
                "fingerprint": self.key, "created": time.time()}
        write_atomic(self.dir / ENTRY_FILE, json.dumps(meta).encode())
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
