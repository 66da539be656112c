"""Weight sources: where canonical float32 arrays come from (docs/internals.md).

``WeightSource`` is the one interface the circuits, the scores and (through
``engine.forward.torch_weights``) the forward pass read weights through: numpy float32 arrays.
``DictWeights`` holds tensors in memory (tests, training, conversions);
``CheckpointWeights`` (below) reads a safetensors checkpoint lazily. Nothing here imports
torch: tensors handed to ``DictWeights`` are converted duck-typed (``as_float32``).

Arrays a source returns are read-only (``get_fresh`` aside): they may be cached and shared.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from headscope.engine.core.cache import ByteLRU
from headscope.engine.core.config import ModelConfig
from headscope.engine.core.errors import (
    CheckpointChangedError,
    CorruptFileError,
    HeadscopeError,
    IndexOutOfRangeError,
    MissingTensorError,
    out_of_memory,
)
from headscope.engine.formats.safetensors import (
    SafetensorsHeader,
    TensorInfo,
    file_identity,
    read_header,
)
from headscope.engine.formats.widening import (
    STORED_AS,
    StagingBuffers,
    pread_into,
    widen,
    widens_by_copy,
)
from headscope.engine.model.adapters.base import (
    Heads,
    Product,
    Rows,
    Spec,
    Whole,
    Zeros,
    spec_parts,
)
from headscope.engine.model.readplan import (
    DONTNEED,
    SEQUENTIAL,
    WILLNEED,
    PlannedReads,
    advise,
)
from headscope.engine.model.spec_arrays import affine, deinterleaved, head_view, shared_tensors

__all__ = ["HEAD_TENSORS", "KV_TENSORS", "CheckpointWeights", "CircuitWeights", "DictWeights", "WeightSource",
           "as_float32", "file_sorted", "read_only", "stored_kv", "stored_kv_name", "tensor_bytes", "will_need"]

# Attention tensors that are stored per head along dim 0 in canonical form.
HEAD_TENSORS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V")


@runtime_checkable
class WeightSource(Protocol):
    cfg: ModelConfig

    def has(self, name: str) -> bool: ...

    def get(self, name: str) -> np.ndarray: ...

    def get_head(self, name: str, head: int) -> np.ndarray: ...


@runtime_checkable
class CircuitWeights(WeightSource, Protocol):
    """What the weight-only circuits read: a ``WeightSource`` (``ProcessedWeights``,
    ``CheckpointWeights``, ``DictWeights``) with

    - ``get(name, keep=False)``: not kept in a cache if not already there (a vocabulary-sized
      array read once);
    - ``release()``: drop the cached whole-layer arrays (after a sweep over the layers);
    - ``tied_embedding()``: ``(E, a, b)`` with ``W_U = a Eᵀ``, ``W_E = b E`` before processing
      (one stored tensor ``E``), or None;
    - ``embed_rows(ids)`` / ``unembed_cols(cols)``: rows of ``W_E`` / columns of ``W_U`` without
      building the whole matrix (``centred=False``: without processing's centring over the
      vocabulary, which shifts all logits of a position alike: enough for a logit difference,
      and it need not read the whole stored matrix for its mean);
    - ``fold_gains(prefix)``: the norm (gain, bias) processing folds away (None, None raw);
    - ``plan``: the processing applied (``processing.Plan``), None for raw weights;
    - ``middles``, ``middles_lock``: products the circuits form once per model and keep.
    """

    path: str | None
    plan: Any
    middles: dict[str, np.ndarray] | None
    middles_lock: threading.Lock

    def get(self, name: str, *, keep: bool = True) -> np.ndarray: ...

    def release(self) -> None: ...

    def tied_embedding(self) -> tuple[np.ndarray, float, float] | None: ...

    def embed_rows(self, ids: np.ndarray) -> np.ndarray: ...

    def unembed_cols(self, cols: np.ndarray, *, centred: bool = True) -> np.ndarray: ...

    def fold_gains(self, prefix: str) -> tuple[np.ndarray | None, np.ndarray | None]: ...


def as_float32(t: Any) -> np.ndarray:
    """``t`` (a numpy array, or anything with torch's ``detach``/``float``/``numpy``) as a float32
    numpy array; a float32 CPU tensor is shared, not copied. Duck-typed: the model layer never
    imports torch."""
    if isinstance(t, np.ndarray):
        return t.astype(np.float32, copy=False)
    if hasattr(t, "detach"):
        t = t.detach()
        if str(getattr(t, "dtype", "")) != "torch.float32":
            t = t.float()
        return np.asarray(t.cpu().numpy())
    return np.asarray(t, dtype=np.float32)


def read_only(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a`` (``a`` itself, e.g. a caller's array or a tensor's memory,
    keeps its flags)."""
    view = a.view()
    view.setflags(write=False)
    return view


class DictWeights:
    """Canonical tensors held in a dict (numpy arrays or torch tensors, converted on ``get``).
    GQA ``_W_K``/``_W_V``/``_b_K``/``_b_V`` are expanded."""

    plan = None  # raw weights: nothing folded (see ProcessedWeights.plan)

    def __init__(self, cfg: ModelConfig, tensors: Mapping[str, Any], path: str | None = None):
        self.cfg = cfg
        self.path = path
        self._t = dict(tensors)
        self.middles: dict[str, np.ndarray] | None = None
        self.middles_lock = threading.Lock()

    def has(self, name: str) -> bool:
        return name in self._t or _kv_name(name) in self._t

    def get(self, name: str, *, keep: bool = True) -> np.ndarray:
        if name in self._t:
            return read_only(as_float32(self._t[name]))
        kv = _kv_name(name)
        if kv in self._t:
            group = self.cfg.n_heads // self.cfg.kv_heads
            return read_only(np.repeat(as_float32(self._t[kv]), group, axis=0))
        raise MissingTensorError(self.path, f"missing tensor {name!r}")

    def get_head(self, name: str, head: int) -> np.ndarray:
        if name in self._t:
            return read_only(as_float32(self._t[name][head]))
        kv = _kv_name(name)
        if kv in self._t:
            return read_only(as_float32(self._t[kv][self.cfg.kv_head_of(head)]))
        raise MissingTensorError(self.path, f"missing tensor {name!r}")

    def release(self) -> None:
        """Nothing is cached here."""

    def tied_embedding(self) -> tuple[np.ndarray, float, float] | None:
        return None

    def embed_rows(self, ids: np.ndarray) -> np.ndarray:
        return self.get("embed.W_E")[np.asarray(ids, dtype=np.intp)]

    def unembed_cols(self, cols: np.ndarray, *, centred: bool = True) -> np.ndarray:
        return np.ascontiguousarray(self.get("unembed.W_U")[:, np.asarray(cols, dtype=np.intp)])

    def fold_gains(self, prefix: str) -> tuple[np.ndarray | None, np.ndarray | None]:
        return None, None


def tensor_bytes(t: np.ndarray) -> int:
    """Bytes an array's elements hold (what the weight caches charge for it)."""
    return int(t.nbytes)


def _source_with(w: Any, method: str) -> Any:
    """The first of ``w`` and the sources it wraps (``TorchWeights.source``,
    ``ProcessedWeights.raw``, ...) with ``method``, or None."""
    for _ in range(4):
        if w is None:
            return None
        if callable(getattr(w, method, None)):
            return w
        w = getattr(w, "source", None) or getattr(w, "raw", None)
    return None


def will_need(w: Any, prefix: str) -> None:
    """Tell the kernel that the tensors whose canonical names start with ``prefix`` (e.g.
    ``blocks.3.``) will be read soon (``CheckpointWeights.advise_will_need``), for any source
    (a no-op for those held in memory)."""
    found = _source_with(w, "advise_will_need")
    if found is not None:
        found.advise_will_need(prefix)


def file_sorted(w: Any, names: list[str]) -> list[str]:
    """``names`` in the order their stored bytes lie in the checkpoint's files
    (``CheckpointWeights.file_position``); unchanged for sources without files."""
    found = _source_with(w, "file_position")
    if found is None:
        return list(names)
    keys = {name: found.file_position(name) for name in names}
    if any(k is None for k in keys.values()):
        return list(names)
    return sorted(names, key=lambda n: keys[n])


def _changed(file: str, was: tuple[int, ...], now: tuple[int, ...]) -> CheckpointChangedError:
    changed = [name for name, a, b in zip(("device", "inode", "size", "modification time"),
                                          was, now, strict=True) if a != b]
    return CheckpointChangedError(
        file,
        f"the file changed on disk since the model was opened ({', '.join(changed)} differ: "
        "rewritten or replaced); reopen the model to see the new weights",
    )


KV_TENSORS = ("W_K", "W_V", "b_K", "b_V")


def _kv_name(name: str) -> str:
    """``blocks.0.attn.W_K`` -> ``blocks.0.attn._W_K`` (the un-expanded GQA tensor)."""
    prefix, _, last = name.rpartition(".")
    return f"{prefix}._{last}" if last in KV_TENSORS else name


def stored_kv_name(name: str) -> str | None:
    """``blocks.0.attn._W_K`` -> ``blocks.0.attn.W_K`` (the canonical tensor whose stored
    heads it holds, TransformerLens' name for them), None for any other name."""
    prefix, _, last = name.rpartition(".")
    return f"{prefix}.{last[1:]}" if last[:1] == "_" and last[1:] in KV_TENSORS else None


def stored_kv(w: WeightSource, name: str) -> Any:
    """``w.get(name)`` of a K/V weight or bias (``blocks.L.attn.W_K``) with one head per
    stored K/V head, ``[kv_heads, ...]``: under grouped-query attention the canonical tensor
    repeats each for its group's query heads (``ModelConfig.kv_head_of``), and a forward pass
    needs each once. Read as ``_W_K`` where the source has it (a checkpoint: no expanded copy
    is built, 2 × 268 MB a layer at 70B widths), else cut from the canonical tensor."""
    group = w.cfg.n_heads // w.cfg.kv_heads
    if group == 1:
        return w.get(name)
    kv = _kv_name(name)
    return w.get(kv) if w.has(kv) else w.get(name)[::group]


class CheckpointWeights(PlannedReads):
    """A ``WeightSource`` reading a safetensors checkpoint lazily (docs/internals.md).

    ``specs`` (from an adapter) say where each canonical tensor lives; ``files`` map each
    checkpoint tensor name to the (already validated, inside-the-model-directory) file
    holding it. Files are opened on first use and read with ``pread`` (see ``_read``); ``get_head`` reads
    only the rows/columns of one head; bf16/fp16/float8 are widened to float32 per tensor or
    per slice, never for the whole model. Converted arrays live in a small LRU cache bounded
    by bytes. Safe to call from several threads.

    The weight-only circuits read the raw model through the same surface as
    ``ProcessedWeights``: ``get(name, keep=...)``, ``release()``, ``tied_embedding()``,
    ``embed_rows(ids)``, ``unembed_cols(cols)``, ``fold_gains(prefix)``, ``plan`` (None: nothing
    folded) and ``middles`` under ``middles_lock`` (kept ``d_model²`` products, formed once).
    """

    plan = None  # raw weights: nothing folded (see ProcessedWeights.plan)

    def __init__(
        self,
        cfg: ModelConfig,
        specs: Mapping[str, Spec],
        files: Mapping[str, str],
        path: str | None = None,
        cache_bytes: int = 64 << 20,
        headers: Mapping[str, SafetensorsHeader] | None = None,
    ) -> None:
        self.cfg = cfg
        self.specs = dict(specs)
        self.files = dict(files)
        self.path = path
        self.cache_bytes = cache_bytes
        self.reads = 0  # tensor/slice reads from disk (tests count them)
        self._handles: dict[str, Any] = {}  # open files (read with pread: thread-safe)
        # Headers validated when the checkpoint was inspected: the files must still be the
        # ones they describe when tensors are read (see _check_unchanged).
        self._headers: dict[str, SafetensorsHeader] = dict(headers or {})
        self._identity: dict[str, tuple[int, int, int, int]] = {}  # see file_identity
        # big tensors (embeddings) would evict everything: a quarter of the budget at most
        self._cache = ByteLRU(cache_bytes, tensor_bytes, max_entry=cache_bytes // 4)
        self._lock = threading.RLock()
        self._unembed_means: dict[str, np.ndarray] = {}  # unembed_block's, per stored tensor
        # Stored tensors that hold several canonical ones, or whose heads are columns (GPT-2's
        # fused c_attn: W_Q, W_K, W_V and every head are column ranges of one [768, 2304]
        # tensor): each read of a part reads all of it, so the widened whole is kept (in the
        # LRU, as any entry) and parts are cut from it. Without it a gpt2-small `heads` read
        # each c_attn 11 times (1.5 GB of reads for a 0.5 GB model).
        self._shared = shared_tensors(self.specs)
        self.middles: dict[str, np.ndarray] | None = None  # the circuits' kept products
        self.middles_lock = threading.Lock()  # the sweep and the null may both ask at once
        # The read plan (engine.model.readplan): the stored tensors of attention weights are
        # the hot ones (read again by a forward pass, composition, the explorer).
        self._hot = frozenset(part.tensor for name, spec in self.specs.items() if ".attn." in name
                              for part in spec_parts(spec))
        self.staging = StagingBuffers()
        # Called with (file, tensor, offset, bytes) for every read from disk: what a test
        # asserts the read order and the bytes read per pass with.
        self.on_read: Callable[[str, str, int, int], None] | None = None
        self.advising: threading.Thread | None = None  # the last advise_will_need's thread

    def has(self, name: str) -> bool:
        if name in self.specs:
            return True
        public = stored_kv_name(name)  # ``_W_K``/``_b_K``: if weight and bias are cut per head
        if public is None:
            return False
        prefix, _, last = public.rpartition(".")
        return all(isinstance(self.specs.get(f"{prefix}.{kind}_{last[-1]}"), Heads | Zeros) for kind in "Wb")

    # --- the read plan (engine.model.readplan) ------------------------------------------

    def plan_sizes(self) -> tuple[int, int]:
        """The read plan's sizes, from the headers: the stored tensors of attention weights
        are the hot ones (read again by a forward pass, composition, the explorer)."""
        try:
            headers = [self._header(file) for file in sorted(set(self.files.values()))]
        except (OSError, CorruptFileError):  # reads will say what is wrong
            headers = []
        total = sum(info.nbytes for h in headers for info in h.tensors.values())
        hot = sum(info.nbytes for h in headers for name, info in h.tensors.items()
                  if name in self._hot)
        return total, hot

    def _header(self, file: str) -> SafetensorsHeader:
        with self._lock:
            header = self._headers.get(file)
            if header is None:
                header = self._headers[file] = read_header(file)
            return header

    def file_position(self, name: str) -> tuple[str, int] | None:
        """``(file, offset)`` of the first stored byte of canonical tensor ``name`` (None if
        it has none): the order a sweep reads tensors in (``file_sorted``)."""
        spec = self.specs.get(name)
        parts = [] if spec is None else spec_parts(spec)
        if not parts or parts[0].tensor not in self.files:
            return None
        file = self.files[parts[0].tensor]
        try:
            header = self._header(file)
        except (OSError, CorruptFileError):
            return None
        info = header.tensors.get(parts[0].tensor)
        return None if info is None else (file, header.data_start + info.begin)

    def advise_will_need(self, prefix: str) -> None:
        """When the checkpoint is streamed (``read_plan``), ask the kernel to start reading
        the stored tensors of every canonical name starting with ``prefix`` (a layer the
        pass reaches next), on a thread: the advice may wait for the disk queue."""
        if not self.read_plan.streaming:
            return
        tensors = sorted({part.tensor for name, spec in self.specs.items() if name.startswith(prefix)
                          for part in spec_parts(spec)})
        ranges = []
        for tensor in tensors:
            file = self.files.get(tensor)
            if file is None:
                continue
            try:
                handle, info, data_start = self._locate(file, tensor)
            except (OSError, HeadscopeError):
                continue  # the read itself will say what is wrong
            ranges.append((handle.fileno(), data_start + info.begin, info.nbytes))
        ranges.sort(key=lambda r: r[1])

        def run() -> None:
            for fd, offset, n in ranges:
                advise(fd, offset, n, WILLNEED)

        self.advising = threading.Thread(target=run, name="headscope-will-need", daemon=True)
        self.advising.start()

    def _consumed(self, file: str, handle: Any, tensor: str, offset: int, n: int) -> None:
        """Bytes just read from disk into memory of our own: counted, reported to ``on_read``,
        and dropped from the page cache if the plan says so."""
        with self._lock:
            self.reads += 1
        hook = self.on_read
        if hook is not None:
            hook(file, tensor, offset, n)
        if self.read_plan.drops(tensor in self._hot):
            advise(handle.fileno(), offset, n, DONTNEED)

    def get(self, name: str, *, keep: bool = True) -> np.ndarray:
        """The canonical array (read-only); ``keep=False``: not kept in the cache if it was
        not there (a vocabulary-sized array a caller reads once)."""
        if keep:
            return self._cached((name, None), lambda: self._build(name))
        hit = self._cache.get((name, None))
        return hit if hit is not None else read_only(self._build(name))

    def get_fresh(self, name: str) -> np.ndarray:
        """``get(name)`` as an array no one else holds (not cached, writable): the caller may
        edit it in place, e.g. to process a vocabulary-sized tensor without a second copy."""
        hit = self._cache.get((name, None))
        return hit.copy() if hit is not None else self._build(name)

    def get_columns(self, name: str, start: int, stop: int) -> np.ndarray:
        """``get(name)[:, start:stop]`` of a 2-D canonical tensor (float32, not cached). Where
        it is stored whole and transposed (a Hugging Face ``Linear`` weight ``[out, in]``: every
        MLP matrix of Llama-like models) its columns are stored rows: only those are read and
        widened, so the forward pass can apply a 70B layer's MLP (2.8 GB in float32) in blocks
        (``engine.forward.transformer.mlp``); those come back in memory of their own (writable:
        ``ProcessedWeights.get_columns`` scales them in place). Anything else is cut from the
        whole array (a read-only view where the whole is kept)."""
        whole = self._cache.get((name, None))
        spec = self.specs.get(name)
        if whole is not None or type(spec) is not Whole or not spec.transpose:
            return (whole if whole is not None else self.get(name))[:, start:stop]
        with np.errstate(all="ignore"):
            return affine(self._read(spec.tensor, (slice(start, stop),)), spec).T

    def get_head(self, name: str, head: int) -> np.ndarray:
        if not 0 <= head < self.cfg.n_heads:
            raise IndexOutOfRangeError(self.path, f"head {head} out of range 0..{self.cfg.n_heads - 1}")
        return self._cached((name, head), lambda: self._build_head(name, head))

    def release(self) -> None:
        """Drop the cached arrays (a sweep that read every layer keeps only its last ones)."""
        self._cache.clear()

    def close(self) -> None:
        with self._lock:
            for handle in self._handles.values():
                handle.close()
            self._handles.clear()
            self._cache.clear()
            self.staging.clear()
            self._unembed_means.clear()

    # --- what the weight-only circuits read without building vocabulary-sized arrays ------

    def fold_gains(self, prefix: str) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The norm gain and bias processing folds away: none in a raw model."""
        return None, None


    def tied_embedding(self) -> tuple[np.ndarray, float, float] | None:
        """``(E, a, b)`` when ``W_U = a Eᵀ`` and ``W_E = b E`` for one stored tensor ``E``
        (read fresh, float32 ``[d_vocab, d_model]``)."""
        u, e = self.specs.get("unembed.W_U"), self.specs.get("embed.W_E")
        if not (type(u) is Whole and type(e) is Whole and u.tensor == e.tensor):
            return None
        if not u.transpose or e.transpose or u.add != 0.0 or e.add != 0.0:
            return None
        return self._read(e.tensor), u.scale, e.scale

    def embed_rows(self, ids: np.ndarray) -> np.ndarray:
        """``get("embed.W_E")[ids]``, reading only those rows (runs of consecutive ids) when
        the embedding is stored whole and untransposed."""
        ids = np.asarray(ids, dtype=np.intp)
        spec = self.specs.get("embed.W_E")
        whole = self._cache.get(("embed.W_E", None))
        if whole is not None or type(spec) is not Whole or spec.transpose:
            return (whole if whole is not None else self.get("embed.W_E"))[ids]
        with np.errstate(all="ignore"):
            return affine(self._stored_rows(spec.tensor, ids), spec)

    def _stored_rows(self, tensor: str, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` of a stored ``[vocab, d_model]`` tensor (float32, in the order of
        ``ids``), each run of consecutive ids one read."""
        uniq = np.unique(ids)
        runs = np.split(uniq, np.flatnonzero(np.diff(uniq) != 1) + 1) if uniq.size else []
        if not runs:
            return np.zeros((0, self.cfg.d_model), np.float32)
        t = np.concatenate([self._read(tensor, (slice(int(r[0]), int(r[-1]) + 1),)) for r in runs])
        return t[np.searchsorted(uniq, ids)]

    def unembed_block(self, cols: np.ndarray, *, with_mean: bool = True
                      ) -> tuple[np.ndarray, np.ndarray | None] | None:
        """``(get("unembed.W_U")[:, cols], its mean column)`` (the mean in float64, ``[d_model,
        1]``; None unless ``with_mean``) without a float32 copy of the whole unembedding, when
        it is stored whole; else None. The mean is computed from one read of the stored tensor
        and kept (``d_model`` numbers); after that, a stored ``[vocab, d_model]`` tensor (GPT-2,
        Llama: ``transpose``) gives only the rows of ``cols``, so each OV view at 7B reads 24
        rows, not 0.25 GB."""
        spec = self.specs.get("unembed.W_U")
        if type(spec) is not Whole:
            return None
        mean = self._unembed_mean(spec) if with_mean else None
        cols = np.asarray(cols, dtype=np.intp)
        block = self._stored_rows(spec.tensor, cols).T if spec.transpose else self._read(spec.tensor)[:, cols]
        with np.errstate(all="ignore"):
            if spec.scale != 1.0:
                block = block * np.float32(spec.scale)
            if spec.add != 0.0:
                block = block + np.float32(spec.add)
        return block, mean

    def _unembed_mean(self, spec: Whole) -> np.ndarray:
        """The stored unembedding's mean column (float64 ``[d_model, 1]``, after its scale and
        offset), computed once per open checkpoint: the file cannot change under it
        (``CheckpointChangedError`` on the next read)."""
        with self._lock:
            found = self._unembed_means.get(spec.tensor)
        if found is None:
            stored = self._read(spec.tensor)  # [vocab, d_model] when transposed, else [d_model, vocab]
            with np.errstate(all="ignore"):
                found = stored.mean(0 if spec.transpose else 1, dtype=np.float64)[:, None]
                del stored
                if spec.scale != 1.0:
                    found = found * spec.scale
                if spec.add != 0.0:
                    found = found + spec.add
            with self._lock:
                self._unembed_means[spec.tensor] = found
        return found

    def unembed_cols(self, cols: np.ndarray, *, centred: bool = True) -> np.ndarray:
        """``get("unembed.W_U")[:, cols]`` without building the whole unembedding (raw
        weights: nothing is centred, whatever ``centred`` says)."""
        cols = np.asarray(cols, dtype=np.intp)
        whole = self._cache.get(("unembed.W_U", None))
        found = None if whole is not None else self.unembed_block(cols, with_mean=False)
        if found is None:
            return np.ascontiguousarray((whole if whole is not None else self.get("unembed.W_U"))[:, cols])
        return np.ascontiguousarray(found[0], dtype=np.float32)

    # --- building canonical arrays ------------------------------------------------------

    def _spec(self, name: str) -> Spec:
        spec = self.specs.get(name)
        if spec is None:
            raise MissingTensorError(self.path, f"no tensor {name!r} in this {self.cfg.architecture} model")
        return spec

    def _build(self, name: str) -> np.ndarray:
        public = stored_kv_name(name)  # ``_W_K``: the stored K/V heads, not repeated per group
        spec = self._spec(public or name)
        if isinstance(spec, Zeros):
            shape = spec.shape if public is None else (self.cfg.kv_heads, *spec.shape[1:])
            return np.zeros(shape, np.float32)
        if isinstance(spec, Product):
            return self._build_whole(spec.left) @ self._build_whole(spec.right)
        if isinstance(spec, Rows):
            return self._build_rows(spec)
        if isinstance(spec, Whole):
            return self._build_whole(spec)
        stored = self.cfg.kv_heads if spec.kv else self.cfg.n_heads
        expand = spec.kv and stored != self.cfg.n_heads and public is None
        # Widen the stored tensor in one sequential pass, then cut every head out of it as one
        # strided view: stacking per-head transposed slices of a bf16 tensor was the slowest
        # step of a 7B sweep.
        # a fused stored tensor (GPT-2's c_attn) is read once and kept: its heads are cut out
        # of the kept array, copied once here (not a copy of all of it per Q, K and V first)
        t = self._read(spec.tensor, borrow=True)
        whole = (spec.offset == 0 and spec.stride == spec.size and spec.size * stored == t.shape[spec.axis]
                 and not expand)
        if whole and not t.flags.writeable:  # a kept stored tensor (``W_O``'s, cut along columns)
            t = np.array(t)  # one copy in stored order: the same layout as a fresh read (below)
        heads = self._cut(spec, head_view(t, spec, stored), batched=True)
        if expand:
            return np.repeat(heads, self.cfg.n_heads // stored, axis=0)
        if whole and heads.size == t.size:
            # Every value of the stored tensor is in exactly one head (a Hugging Face ``[out,
            # in]`` Linear weight): the canonical ``[H, d_model, d_head]`` is that memory seen
            # with other strides, no copy. Each head is a transposed matrix BLAS reads as it
            # is, and torch's projection einsum reads all heads as one transposed ``[d_model,
            # H·d_head]``, which a contiguous layout made it copy (at 7B the re-layout copy was
            # ~5 % of `heads`, the einsum's own copy more). Whatever the source, the layout is
            # the same, so the same weights give the same products.
            return heads
        out = np.ascontiguousarray(heads)
        return out if out.flags.writeable else out.copy()  # the caller's own, even of a kept array

    def _build_whole(self, spec: Whole) -> np.ndarray:
        # Widened contiguously (one sequential pass), then transposed as a view: no second
        # float32 copy, and no element-by-element transposing widen (the slow step a 7B
        # model's tied unembedding once took).
        t = affine(self._read(spec.tensor), spec)
        return t.T if spec.transpose else t

    def _build_rows(self, spec: Rows) -> np.ndarray:
        """Part of a fused tensor: only its rows are read."""
        t = self._read(spec.tensor, (slice(spec.offset, spec.offset + spec.size),))
        return np.ascontiguousarray(t.T) if spec.transpose else t

    def _build_head(self, name: str, head: int) -> np.ndarray:
        spec = self._spec(name)
        if isinstance(spec, Zeros) and len(spec.shape) >= 2 and spec.shape[0] == self.cfg.n_heads:
            return np.zeros(spec.shape[1:], np.float32)
        if not isinstance(spec, Heads):
            raise MissingTensorError(self.path, f"{name!r} is not a per-head tensor")
        stored = self.cfg.kv_head_of(head) if spec.kv else head
        start = spec.offset + stored * spec.stride
        index = [slice(None)] * len(spec.shape)
        index[spec.axis] = slice(start, start + spec.size)
        return np.ascontiguousarray(self._cut(spec, self._read(spec.tensor, tuple(index))))

    @staticmethod
    def _cut(spec: Heads, block: np.ndarray, batched: bool = False) -> np.ndarray:
        """One head's ``block`` (or all heads, ``batched``: a leading head dim) in canonical layout."""
        if spec.squeeze:
            block = block.squeeze(spec.axis + int(batched))
        block = block.swapaxes(-2, -1) if spec.transpose else block
        return deinterleaved(block, spec.deinterleave) if spec.deinterleave else block

    def _read(self, tensor: str, index: tuple[slice, ...] | None = None, *, borrow: bool = False) -> np.ndarray:
        """One tensor (or a slice of it) from disk, as float32 in memory of its own
        (``borrow``: a stored tensor shared by several canonical ones may come back as the
        kept read-only array itself, for a caller that copies what it takes).

        Bytes are copied with ``pread`` into a buffer we own, not read through a memory map:
        pages of a mapped file count as this process's resident memory for as long as the
        kernel keeps them, so one sweep over a mapped 2 GB checkpoint left 2 GB "resident"
        (measured: +2.2 GB peak RSS on a 1B model after one forward pass). Page-cache pages
        of a plain read do not. A slice along the first axis reads only its rows.
        """
        file = self.files.get(tensor)
        if file is None:
            raise MissingTensorError(self.path, f"missing tensor {tensor!r}")
        try:
            handle, info, data_start = self._locate(file, tensor)
            self._check_unchanged(file)
            dtype = STORED_AS.get(info.dtype)
            if dtype is None:
                raise CorruptFileError(file, f"tensor {tensor!r} has dtype {info.dtype}, not a float type")
            shape = list(info.shape)
            whole_rows = index is None or not shape or index[0] == slice(None)
            if whole_rows and tensor in self._shared:
                return self._cut_shared(tensor, file, handle, info, data_start, dtype, index, borrow)
            row_bytes = info.nbytes // shape[0] if shape and shape[0] else info.nbytes
            first, rows = 0, (shape[0] if shape else 1)
            if index is not None and shape and index[0] != slice(None):
                first, stop, _ = index[0].indices(shape[0])
                rows = max(0, stop - first)
                shape[0] = rows
            rest = None if index is None or all(i == slice(None) for i in index[1:]) else index[1:]
            t = self._read_widened(file, handle, tensor, data_start + info.begin + first * row_bytes,
                                   rows * row_bytes, dtype, shape)
            if rest is not None:
                t = np.ascontiguousarray(t[(slice(None), *rest)])  # a slice: drop the rest
            return t
        except CorruptFileError:
            raise
        except OSError as e:
            raise CorruptFileError(file, f"cannot read tensor {tensor!r}: {str(e)[:160]}") from None
        except (MemoryError, RuntimeError) as e:
            oom = out_of_memory(e, file, f"reading tensor {tensor!r}")
            if oom is None:
                raise
            raise oom from None

    def _read_widened(self, file: str, handle: Any, tensor: str, offset: int, n: int, dtype: Any,
                      shape: Sequence[int]) -> np.ndarray:
        """``n`` stored bytes at ``offset``, widened to float32 of ``shape`` in new memory. Bytes
        ``widen`` copies out of are read into a reused staging buffer, free again once widened."""
        staged = widens_by_copy(dtype)
        buffer = self.staging.take(n) if staged else np.empty(n, np.uint8)
        pread_into(handle, buffer, offset, file, tensor)
        self._check_unchanged(file)  # a rewrite during the read: these bytes may be mixed
        self._consumed(file, handle, tensor, offset, n)
        t = widen(buffer, dtype).reshape(shape)
        if staged:
            self.staging.give(buffer)
        return t

    def _cut_shared(self, tensor: str, file: str, handle: Any, info: TensorInfo, data_start: int,
                    dtype: Any, index: tuple[slice, ...] | None, borrow: bool = False) -> np.ndarray:
        """``_read`` of a shared stored tensor (see ``_shared``): the part asked for, copied
        out of the widened whole, which is read once and kept in the LRU."""
        key = ("@stored", tensor)
        whole = self._cache.get(key)
        if whole is None:
            fresh = self._read_widened(file, handle, tensor, data_start + info.begin, info.nbytes,
                                       dtype, info.shape)
            if tensor_bytes(fresh) > self._cache.max_entry:  # too big to keep: no copy of it
                return fresh if index is None else np.ascontiguousarray(fresh[index])
            whole = read_only(fresh)
            self._cache.put(key, whole)
        part = whole if index is None else whole[index]
        if borrow:
            return part  # read-only: the caller copies the part it keeps
        return np.array(part, dtype=np.float32, order="C", copy=True)  # the caller's own

    def _check_unchanged(self, file: str) -> None:
        """Refuse to read from a file rewritten since the model was opened: a training loop
        saving each epoch in place keeps the size, so size alone does not tell (docs/internals.md)."""
        try:
            now = file_identity(os.stat(file))
        except OSError as e:
            raise CheckpointChangedError(
                file, f"the file is gone or unreadable since the model was opened ({e.strerror}); reopen the model"
            ) from None
        if now != self._identity[file]:
            raise _changed(file, self._identity[file], now)

    def _locate(self, file: str, tensor: str) -> tuple[Any, TensorInfo, int]:
        """The open file, the tensor's header entry and where the data buffer starts."""
        with self._lock:
            handle = self._handles.get(file)
            if handle is None:
                header = self._headers.get(file)
                if header is None or header.identity is None:
                    header = self._headers[file] = read_header(file)
                handle = open(file, "rb")  # noqa: SIM115 (closed in close())
                opened = file_identity(os.fstat(handle.fileno()))
                if header.identity is not None and opened != header.identity:
                    handle.close()  # rewritten between inspection and this first read
                    raise _changed(file, header.identity, opened)
                if self.read_plan.streaming:  # a larger kernel read-ahead for a streamed file
                    advise(handle.fileno(), 0, opened[2], SEQUENTIAL)
                self._identity[file] = opened
                self._handles[file] = handle
            header = self._headers[file]
        info = header.tensors.get(tensor)
        if info is None:
            raise CorruptFileError(file, f"no tensor {tensor!r} in this file")
        return handle, info, header.data_start

    def _cached(self, key: tuple[str, int | None], build: Callable[[], np.ndarray]) -> np.ndarray:
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        value = read_only(build())
        self._cache.put(key, value)
        return value
