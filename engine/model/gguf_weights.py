"""llama.cpp GGUF files as checkpoints: reading the tensors (docs/internals.md, "GGUF").

``GGUFWeights`` reads the HF-named tensors ``engine.model.gguf_config`` maps lazily: the rows
asked for are read with ``pread`` and dequantised by headscope's kernels
(``engine.formats.dequant``: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, bit for bit llama.cpp's
``gguf.quants.dequantize``, about three times faster), other types by ``gguf.quants`` itself;
the conversion's changes are undone: the Q/K row permutation of Llama-architecture files
(``convert_hf_to_gguf.py``'s ``LlamaModel.permute``, done there for llama.cpp's interleaved
rotary kernel; undone on the bytes, before dequantising) and Gemma's ``+ 1`` on norm gains. So
circuits and patterns equal those of the original checkpoint, up to the quantisation error of
the stored type.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from headscope.engine.core.config import ModelConfig
from headscope.engine.core.errors import CorruptFileError, MissingTensorError
from headscope.engine.formats.gguf import GGUFHeader, GGUFTensorInfo
from headscope.engine.formats.widening import StagingBuffers
from headscope.engine.model.adapters.base import spec_parts
from headscope.engine.model.gguf_config import GGUFArch
from headscope.engine.model.readplan import (
    DONTNEED,
    SEQUENTIAL,
    WILLNEED,
    PlannedReads,
    ReadPlan,
    advise,
)
from headscope.engine.model.weights import CheckpointWeights

if TYPE_CHECKING:
    import numpy as np

    from headscope.engine.model.adapters.base import Spec


def check_types(header: GGUFHeader, used: Mapping[str, str]) -> None:
    """Every tensor the model reads has a type headscope can dequantise (its own kernels,
    ``engine.formats.dequant``, or else ``gguf.quants``) and the bytes its type and shape need."""
    from headscope.engine.formats.dequant import TYPES

    own = set(TYPES) | {"F64"}
    for g in used.values():
        t = header.tensors[g]
        if t.type_name not in own and t.type_name not in gguf_package_types():
            raise CorruptFileError(
                header.path, f"tensor {g!r} has type {t.type_name}, which cannot be dequantised"
            )
        problem = size_problem(t)
        if problem:
            raise CorruptFileError(header.path, problem)


def gguf_package_types() -> set[str]:
    """The block types ``gguf.quants`` implements (llama.cpp's table): imported only for a
    type outside headscope's own kernels, so opening a file of those never imports it."""
    from gguf.quants import _type_traits

    return {t.name for t in _type_traits}


def size_problem(t: GGUFTensorInfo) -> str | None:
    """Why a tensor's bytes do not fit its type and shape (None if they do, or if the type is
    not one of headscope's own kernels: gguf.quants checks those)."""
    from headscope.engine.formats.dequant import TYPES

    layout = TYPES.get(t.type_name)
    if layout is None:
        return None
    block, size = layout
    rows = t.numel // t.shape[-1] if t.shape[-1] else 0
    what = f"tensor {t.name!r} ({t.type_name}, shape {list(t.shape)})"
    if t.shape[-1] % block:
        return f"{what} has rows of {t.shape[-1]} values, not a whole number of {t.type_name} blocks of {block}"
    expected = t.numel // block * size
    if t.nbytes != expected or (rows and t.nbytes % rows):
        return f"{what} holds {t.nbytes:,} bytes; its type and shape need {expected:,}"
    return None


# --- reading tensors ------------------------------------------------------------------------


class GGUFSource(PlannedReads):
    """Reads HF-named tensors out of a GGUF file: rows by ``pread``, dequantised, conversion
    undone.

    Dequantising costs more than copying bytes (~2 ns per element for Q4_K), and per-head
    reads of a tensor cut along its columns (``W_O``) need the whole tensor: whole tensors
    are kept, dequantised, in a small LRU bounded by ``cache_bytes`` (tensors over a quarter of
    it, e.g. embeddings, are not kept). Callers always get a copy of their own.
    """

    def __init__(
        self,
        header: GGUFHeader,
        hf_names: Mapping[str, str],
        arch: GGUFArch,
        cfg: ModelConfig,
        cache_bytes: int = 256 << 20,
    ) -> None:
        self.header = header
        self.hf_names = dict(hf_names)
        self.arch = arch
        self.cfg = cfg
        self.cache_bytes = cache_bytes
        self.dequantised = 0  # tensor/row-range dequantisations (tests count them)
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cached_bytes = 0
        self._handle: Any = None
        self._lock = threading.Lock()
        # the stored bytes of each read, before dequantising: reused from read to read (a fresh
        # buffer above glibc's mmap threshold is faulted in and zeroed on every read, ~10 ms per
        # 48 MB Q8_0 MLP matrix; see ``StagingBuffers``)
        self.staging = StagingBuffers()
        # Called with (file, tensor, offset, bytes) for every read from disk (tests).
        self.on_read: Callable[[str, str, int, int], None] | None = None

    def plan_sizes(self) -> tuple[int, int]:
        """The read plan's sizes: a quantised 70B (40 GB) does not fit in the page cache; its
        attention tensors are the hot ones."""
        tensors = self.header.tensors
        hot = sum(info.nbytes for name, info in tensors.items() if ".attn_" in name)
        return sum(info.nbytes for info in tensors.values()), hot

    def position(self, hf: str) -> int | None:
        """The file offset of ``hf``'s first byte (None if the file has no such tensor)."""
        g = self.hf_names.get(hf)
        return None if g is None else self.header.tensors[g].offset

    def advise_will_need(self, hfs: list[str]) -> None:
        """When the file is streamed, ask the kernel to start reading these tensors, on a
        thread (``CheckpointWeights.advise_will_need``)."""
        if not self.read_plan.streaming:
            return
        ranges = sorted((info.offset, info.nbytes) for info in
                        (self.header.tensors[self.hf_names[h]] for h in hfs if h in self.hf_names))
        handle = self._open()

        def run() -> None:
            for offset, n in ranges:
                advise(handle.fileno(), offset, n, WILLNEED)

        threading.Thread(target=run, name="headscope-will-need", daemon=True).start()

    def _open(self) -> Any:
        with self._lock:
            if self._handle is None:
                self._handle = open(self.header.path, "rb")  # noqa: SIM115 (closed in close())
                streaming = self._plan.streaming if self._plan is not None else None
            else:
                return self._handle
        if streaming is None:
            streaming = self.read_plan.streaming
        if streaming:  # a larger kernel read-ahead for a streamed file
            advise(self._handle.fileno(), 0, self.header.file_size, SEQUENTIAL)
        return self._handle

    def permuted_heads(self, hf: str) -> int | None:
        """How many heads the conversion permuted the rows of ``hf`` in, if it did."""
        if not self.arch.permuted_qk:
            return None
        if ".self_attn.q_proj." in hf:
            return self.cfg.n_heads
        if ".self_attn.k_proj." in hf:
            return self.cfg.kv_heads
        return None

    def read(self, hf: str, rows: slice | None = None, cols: tuple[slice, ...] | None = None) -> np.ndarray:
        """The tensor ``hf`` as float32 in HF layout (rows ``rows`` of its first axis only; and
        ``cols``, an index of the other axes, e.g. one head's columns of ``o_proj``), in
        memory of its own.

        Only a cut along ``cols`` keeps the whole dequantised tensor (for the next head's cut):
        a whole-tensor read (a sweep, the forward pass) is kept by the caller if at all, and a
        copy for the cache would cost a second pass over it."""
        import numpy as np

        g = self.hf_names.get(hf)
        if g is None:
            raise MissingTensorError(self.header.path, f"missing tensor {hf!r}")
        info = self.header.tensors[g]
        n = info.shape[0]
        first, stop = (0, n) if rows is None else rows.indices(n)[:2]
        stop = max(stop, first)
        heads = self.permuted_heads(hf)
        group = n // heads if heads else 1
        rest = tuple(cols or ())
        with self._lock:
            whole = self._cache.get(g)
            if whole is not None:
                self._cache.move_to_end(g)
        if whole is not None:
            return np.array(whole[(slice(first, stop), *rest)], order="C")  # a copy
        if len(info.shape) == 1:  # a vector is read whole (its bytes are not split in rows)
            lo, hi = 0, n
        else:
            lo, hi = first // group * group, -(-stop // group) * group  # whole heads if permuted
        data = self._dequantised(info, g, lo, hi, heads=(hi - lo) // group if heads else None)
        if self.arch.norm_offset and hf.endswith("norm.weight"):
            data = data - self.arch.norm_offset
        part = (slice(first - lo, stop - lo), *rest)
        if rest and (lo, hi) == (0, n) and self._keep(g, data):
            return np.array(data[part], order="C")  # a copy: the cache keeps ``data``
        if (first - lo, stop - lo) == (0, len(data)) and not rest:
            return data  # not kept: already the caller's
        return np.ascontiguousarray(data[part])

    def _keep(self, g: str, data: np.ndarray) -> bool:
        """Keep a whole dequantised tensor (unless it is over a quarter of the budget)."""
        if data.nbytes > self.cache_bytes // 4:
            return False
        with self._lock:
            if g not in self._cache:
                self._cache[g] = data
                self._cached_bytes += data.nbytes
            while self._cached_bytes > self.cache_bytes and self._cache:
                _, old = self._cache.popitem(last=False)
                self._cached_bytes -= old.nbytes
        return True

    def _dequantised(
        self, info: GGUFTensorInfo, g: str, lo: int, hi: int, heads: int | None = None
    ) -> np.ndarray:
        """Rows ``lo:hi`` of tensor ``g`` as a new float32 array: stored order, or with the
        conversion's Q/K permutation undone over ``heads`` whole heads."""
        vector = len(info.shape) == 1
        n = 1 if vector else info.shape[0]
        if vector:
            lo, hi = 0, 1
        kind = f"tensor {g!r} ({info.type_name}, shape {list(info.shape)})"
        problem = size_problem(info)
        if problem:
            raise CorruptFileError(self.header.path, problem)
        row_bytes = info.nbytes // n
        staged = self._pread(info.offset + lo * row_bytes, (hi - lo) * row_bytes, g)
        try:
            return self._values(staged, info, g, lo, hi, heads, row_bytes, vector, kind)
        finally:
            self.staging.give(staged)  # every path below leaves new memory, none a view of it

    def _values(self, raw: np.ndarray, info: GGUFTensorInfo, g: str, lo: int, hi: int, heads: int | None,
                row_bytes: int, vector: bool, kind: str) -> np.ndarray:
        """``_dequantised`` of the stored bytes ``raw`` of rows ``lo:hi``."""
        import numpy as np

        from headscope.engine.formats import dequant

        with self._lock:
            self.dequantised += 1
        shape = info.shape if vector else (hi - lo, *info.shape[1:])
        if heads:
            # Rows are dequantised independently, so the permutation is undone on the bytes
            # (a quarter to a half byte per value for Q4/Q8) instead of on the float32 rows.
            raw = _unpermute(raw.reshape(hi - lo, row_bytes), heads).reshape(-1)
        if info.type_name == "F64":
            return raw.view(np.float64).astype(np.float32).reshape(shape)
        if dequant.can_dequantise(info.type_name):
            out = np.empty(shape, np.float32)
            try:
                return dequant.dequantize(raw, info.type_name, out)
            except dequant.DequantError as e:
                raise CorruptFileError(self.header.path, f"cannot dequantise {kind}: {e}") from None
        return self._dequantised_by_gguf(raw, info, kind, row_bytes, shape)

    def _dequantised_by_gguf(
        self, raw: np.ndarray, info: GGUFTensorInfo, kind: str, row_bytes: int, shape: tuple[int, ...]
    ) -> np.ndarray:
        """Types headscope has no kernel for (Q5_0, Q2_K, the IQ types, ...): llama.cpp's own
        numpy code, about three times slower."""
        import numpy as np
        from gguf.constants import GGMLQuantizationType
        from gguf.quants import dequantize

        try:
            values = dequantize(raw.reshape(-1, row_bytes), GGMLQuantizationType(info.ggml_type))
        except (ValueError, NotImplementedError) as e:
            raise CorruptFileError(self.header.path, f"cannot dequantise {kind}: {str(e)[:160]}") from None
        return np.array(values, dtype=np.float32).reshape(shape)

    def _pread(self, offset: int, n: int, g: str) -> np.ndarray:

        path = self.header.path
        handle = self._open()
        try:
            size = os.fstat(handle.fileno()).st_size
            if size != self.header.file_size:
                raise CorruptFileError(
                    path,
                    f"the file changed on disk since it was opened (now {size:,} bytes, "
                    f"was {self.header.file_size:,}); reopen the model",
                )
            buf = self.staging.take(n)  # the caller gives it back (``_dequantised``)
            view, done = memoryview(buf), 0
            while done < n:
                got = os.preadv(handle.fileno(), [view[done:]], offset + done)
                if got <= 0:
                    raise CorruptFileError(path, f"cannot read tensor {g!r}: the file ends early")
                done += got
        except OSError as e:
            raise CorruptFileError(path, f"cannot read tensor {g!r}: {str(e)[:160]}") from None
        hook = self.on_read
        if hook is not None:
            hook(path, g, offset, n)
        if self.read_plan.drops(".attn_" in g):  # read once into our memory: see read_plan
            advise(handle.fileno(), offset, n, DONTNEED)
        return buf

    def close(self) -> None:
        with self._lock:
            if self._handle is not None:
                self._handle.close()
                self._handle = None
            self._cache.clear()
            self._cached_bytes = 0


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Invert ``convert_hf_to_gguf.py``'s ``LlamaModel.permute``.

    The conversion reorders each head's rows from HF's rotate-half layout (pairs ``(i, i + d/2)``)
    to llama.cpp's interleaved one (pairs ``(2i, 2i + 1)``):
    ``w.reshape(n, 2, d/2, ...).swapaxes(1, 2)``; this is the inverse.
    """
    rest = w.shape[1:]
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, half, 2, *rest).swapaxes(1, 2).reshape(w.shape)


class GGUFWeights(CheckpointWeights):
    """``CheckpointWeights`` whose checkpoint tensors come from a ``GGUFSource``."""

    def __init__(self, cfg: ModelConfig, specs: Mapping[str, Spec], source: GGUFSource, path: str | None = None) -> None:
        super().__init__(cfg, specs, {}, path=path)
        self.source = source

    # The file's reads, and so its plan, are the source's: the budget is set there too.
    @property
    def page_cache_budget(self) -> int | None:
        return self.source.page_cache_budget

    @page_cache_budget.setter
    def page_cache_budget(self, value: int | None) -> None:
        self.source.page_cache_budget = value

    @property
    def read_plan(self) -> ReadPlan:
        return self.source.read_plan

    def file_position(self, name: str) -> tuple[str, int] | None:
        spec = self.specs.get(name)
        parts = [] if spec is None else spec_parts(spec)
        offset = self.source.position(parts[0].tensor) if parts else None
        return None if offset is None else (self.source.header.path, offset)

    def advise_will_need(self, prefix: str) -> None:
        self.source.advise_will_need(sorted({part.tensor for name, spec in self.specs.items()
                                             if name.startswith(prefix) for part in spec_parts(spec)}))

    def _read(self, tensor: str, index: tuple[slice, ...] | None = None, *, borrow: bool = False) -> np.ndarray:
        # always a fresh array of its own (``borrow`` allows less, so nothing to do for it)
        rows = cols = None
        if index is not None:
            rows = None if index[0] == slice(None) else index[0]
            cols = None if all(i == slice(None) for i in index[1:]) else index[1:]
        t = self.source.read(tensor, rows, cols)
        with self._lock:
            self.reads += 1
        return t

    def close(self) -> None:
        super().close()
        self.source.close()

