"""Weight sources: where canonical float32 tensors come from (docs/internals.md).

``WeightSource`` is the one interface the forward pass, the circuits and the scores read
weights through. ``DictWeights`` holds tensors in memory (tests, training, conversions);
``CheckpointWeights`` (below) reads a checkpoint lazily.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from headscope.engine.core.cache import ByteLRU
from headscope.engine.core.config import ModelConfig
from headscope.engine.core.errors import (
    CheckpointChangedError,
    CorruptFileError,
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
from headscope.engine.model.adapters.base import Heads, Product, Rows, Spec, Whole, Zeros

if TYPE_CHECKING:
    import torch

# safetensors dtype -> torch dtype name, for the float types weights come in.
_FLOAT_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                 "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn"}


class _TorchDtypes(dict):
    """``_FLOAT_DTYPES`` as torch dtypes, built on first use (torch is imported lazily)."""

    def get(self, key: str, default: Any = None) -> Any:
        if not self:
            import torch

            self.update({k: getattr(torch, v) for k, v in _FLOAT_DTYPES.items()})
        return super().get(key, default)


_TORCH_DTYPES = _TorchDtypes()

# Attention tensors that are stored per head along dim 0 in canonical form.
HEAD_TENSORS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V")


@runtime_checkable
class WeightSource(Protocol):
    cfg: ModelConfig

    def has(self, name: str) -> bool: ...

    def get(self, name: str) -> torch.Tensor: ...

    def get_head(self, name: str, head: int) -> torch.Tensor: ...


class DictWeights:
    """Canonical tensors held in a dict. GQA ``_W_K``/``_W_V``/``_b_K``/``_b_V`` are expanded."""

    def __init__(self, cfg: ModelConfig, tensors: Mapping[str, torch.Tensor], path: str | None = None):
        self.cfg = cfg
        self.path = path
        self._t = dict(tensors)

    def has(self, name: str) -> bool:
        return name in self._t or _kv_name(name) in self._t

    def get(self, name: str) -> torch.Tensor:
        import torch

        if name in self._t:
            return self._t[name].float()
        kv = _kv_name(name)
        if kv in self._t:
            group = self.cfg.n_heads // self.cfg.kv_heads
            return torch.repeat_interleave(self._t[kv].float(), group, dim=0)
        raise MissingTensorError(self.path, f"missing tensor {name!r}")

    def get_head(self, name: str, head: int) -> torch.Tensor:
        if name in self._t:
            return self._t[name][head].float()
        kv = _kv_name(name)
        if kv in self._t:
            return self._t[kv][self.cfg.kv_head_of(head)].float()
        raise MissingTensorError(self.path, f"missing tensor {name!r}")



def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a tensor's elements hold (what the tensor caches charge for it)."""
    return int(t.numel() * t.element_size())

def _pread_into(handle: Any, buffer: torch.Tensor, offset: int, file: str, tensor: str) -> None:
    """Fill the uint8 ``buffer`` from ``offset`` of the open file (positional reads: no shared
    file position, so threads can read the same file at once)."""
    view = memoryview(buffer.numpy())
    done = 0
    while done < len(view):  # one read returns at most ~2 GB on Linux
        got = os.preadv(handle.fileno(), [view[done:]], offset + done)
        if got <= 0:
            raise CorruptFileError(file, f"cannot read tensor {tensor!r}: the file ends after "
                                         f"{done:,} of its {len(view):,} bytes")
        done += got


def _affine(t: torch.Tensor, spec: Whole) -> torch.Tensor:
    """``t * spec.scale + spec.add`` in place (``t`` is a fresh float32 tensor)."""
    if spec.scale != 1.0:
        t.mul_(spec.scale)
    if spec.add != 0.0:
        t.add_(spec.add)
    return t


def _deinterleaved(block: torch.Tensor, r: int) -> torch.Tensor:
    """The last axis (a head's dims) with its first ``r`` reordered from interleaved rotary pairs
    ``(2i, 2i+1)`` to rotate-half pairs ``(i, i + r/2)``: evens, then odds, then the rest."""
    import torch

    order = torch.cat([torch.arange(0, r, 2), torch.arange(1, r, 2), torch.arange(r, block.shape[-1])])
    return block[..., order]


def _head_view(t: torch.Tensor, spec: Heads, stored: int) -> torch.Tensor:
    """``stack([t.narrow(spec.axis, spec.offset + i * spec.stride, spec.size) for i in
    range(stored)])`` as a strided view of ``t`` (no copy)."""
    t = t.contiguous()
    strides = list(t.stride())
    shape = list(t.shape)
    shape[spec.axis] = spec.size
    return t.as_strided((stored, *shape), (spec.stride * strides[spec.axis], *strides),
                        t.storage_offset() + spec.offset * strides[spec.axis])


def _changed(file: str, was: tuple[int, ...], now: tuple[int, ...]) -> CheckpointChangedError:
    changed = [name for name, a, b in zip(("device", "inode", "size", "modification time"),
                                          was, now, strict=True) if a != b]
    return CheckpointChangedError(
        file,
        f"the file changed on disk since the model was opened ({', '.join(changed)} differ: "
        "rewritten or replaced); reopen the model to see the new weights",
    )


def _kv_name(name: str) -> str:
    """``blocks.0.attn.W_K`` -> ``blocks.0.attn._W_K`` (the un-expanded GQA tensor)."""
    prefix, _, last = name.rpartition(".")
    return f"{prefix}._{last}" if last in ("W_K", "W_V", "b_K", "b_V") else name


class CheckpointWeights:
    """A ``WeightSource`` reading a safetensors checkpoint lazily (docs/internals.md).

    ``specs`` (from an adapter) say where each canonical tensor lives; ``files`` map each
    checkpoint tensor name to the (already validated, inside-the-model-directory) file
    holding it. Files are opened on first use and read with ``pread`` (see ``_read``); ``get_head`` reads
    only the rows/columns of one head; bf16/fp16 are upcast to float32 per tensor or per
    slice, never for the whole model. Converted tensors live in a small LRU cache bounded
    by bytes. Safe to call from several threads.
    """

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

    def has(self, name: str) -> bool:
        return name in self.specs

    def get(self, name: str) -> torch.Tensor:
        return self._cached((name, None), lambda: self._build(name))

    def get_fresh(self, name: str) -> torch.Tensor:
        """``get(name)`` as a tensor no one else holds (not cached): the caller may edit it
        in place, e.g. to process a vocabulary-sized tensor without a second copy."""
        hit = self._cache.get((name, None))
        return hit.clone() if hit is not None else self._build(name)

    def get_head(self, name: str, head: int) -> torch.Tensor:
        if not 0 <= head < self.cfg.n_heads:
            raise IndexOutOfRangeError(self.path, f"head {head} out of range 0..{self.cfg.n_heads - 1}")
        return self._cached((name, head), lambda: self._build_head(name, head))

    def close(self) -> None:
        with self._lock:
            for handle in self._handles.values():
                handle.close()
            self._handles.clear()
            self._cache.clear()

    # --- building canonical tensors ---------------------------------------------------

    def _spec(self, name: str) -> Spec:
        spec = self.specs.get(name)
        if spec is None:
            raise MissingTensorError(self.path, f"no tensor {name!r} in this {self.cfg.architecture} model")
        return spec

    def _build(self, name: str) -> torch.Tensor:
        import torch

        spec = self._spec(name)
        if isinstance(spec, Zeros):
            return torch.zeros(spec.shape)
        # Rearranged in the stored dtype and upcast in the same pass (upcasting is exact, so
        # the order does not matter): no float32 copy of the tensor in its stored layout.
        if isinstance(spec, Product):
            return self._build_whole(spec.left) @ self._build_whole(spec.right)
        if isinstance(spec, Rows):
            return self._build_rows(spec)
        if isinstance(spec, Whole):
            return self._build_whole(spec)
        stored = self.cfg.kv_heads if spec.kv else self.cfg.n_heads
        # Upcast the stored tensor in one sequential pass, then cut every head out of it as one
        # strided view and copy that once: stacking per-head transposed slices of a bf16
        # tensor was the slowest step of a 7B sweep (27 s of `torch.stack`).
        heads = self._cut(spec, _head_view(self._read(spec.tensor, None), spec, stored), batched=True)
        if spec.kv and stored != self.cfg.n_heads:
            heads = torch.repeat_interleave(heads, self.cfg.n_heads // stored, dim=0)
        return heads.contiguous()

    def _build_whole(self, spec: Whole) -> torch.Tensor:
        import torch

        if not spec.transpose:
            return _affine(self._read(spec.tensor, None).contiguous(), spec)
        t = self._read(spec.tensor, None, upcast=False).T
        return _affine(torch.empty(t.shape).copy_(t), spec)

    def _build_rows(self, spec: Rows) -> torch.Tensor:
        """Part of a fused tensor: only its rows are read."""
        index = (slice(spec.offset, spec.offset + spec.size), *([slice(None)] * (len(spec.shape) - 1)))
        t = self._read(spec.tensor, index)
        return (t.T if spec.transpose else t).contiguous()

    def _build_head(self, name: str, head: int) -> torch.Tensor:
        import torch

        spec = self._spec(name)
        if isinstance(spec, Zeros) and len(spec.shape) >= 2 and spec.shape[0] == self.cfg.n_heads:
            return torch.zeros(spec.shape[1:])
        if not isinstance(spec, Heads):
            raise MissingTensorError(self.path, f"{name!r} is not a per-head tensor")
        stored = self.cfg.kv_head_of(head) if spec.kv else head
        start = spec.offset + stored * spec.stride
        index = [slice(None)] * len(spec.shape)
        index[spec.axis] = slice(start, start + spec.size)
        return self._cut(spec, self._read(spec.tensor, tuple(index))).contiguous()

    @staticmethod
    def _cut(spec: Heads, block: torch.Tensor, batched: bool = False) -> torch.Tensor:
        """One head's ``block`` (or all heads, ``batched``: a leading head dim) in canonical layout."""
        if spec.squeeze:
            block = block.squeeze(spec.axis + int(batched))
        block = block.transpose(-2, -1) if spec.transpose else block
        return _deinterleaved(block, spec.deinterleave) if spec.deinterleave else block

    def _read(self, tensor: str, index: tuple[slice, ...] | None, upcast: bool = True) -> torch.Tensor:
        """One tensor (or a slice of it) from disk, as float32 in memory of its own (in its
        stored dtype if not ``upcast``; whole tensors only).

        Bytes are copied with ``pread`` into a buffer we own, not read through a memory map:
        pages of a mapped file count as this process's resident memory for as long as the
        kernel keeps them, so one sweep over a mapped 2 GB checkpoint left 2 GB "resident"
        (measured: +2.2 GB peak RSS on a 1B model after one forward pass). Page-cache pages
        of a plain read do not. A slice along the first axis reads only its rows.
        """
        import torch

        file = self.files.get(tensor)
        if file is None:
            raise MissingTensorError(self.path, f"missing tensor {tensor!r}")
        try:
            handle, info, data_start = self._locate(file, tensor)
            self._check_unchanged(file)
            dtype = _TORCH_DTYPES.get(info.dtype)
            if dtype is None:
                raise CorruptFileError(file, f"tensor {tensor!r} has dtype {info.dtype}, not a float type")
            shape = list(info.shape)
            row_bytes = info.nbytes // shape[0] if shape and shape[0] else info.nbytes
            first, rows = 0, (shape[0] if shape else 1)
            if index is not None and shape and index[0] != slice(None):
                first, stop, _ = index[0].indices(shape[0])
                rows = max(0, stop - first)
                shape[0] = rows
                index = (slice(None), *index[1:])
            n_bytes = rows * row_bytes
            buffer = torch.empty(n_bytes, dtype=torch.uint8)
            _pread_into(handle, buffer, data_start + info.begin + first * row_bytes, file, tensor)
            self._check_unchanged(file)  # a rewrite during the read: these bytes may be mixed
            with self._lock:
                self.reads += 1
            t = buffer.view(dtype).reshape(shape)
            if not upcast and index is None:
                return t
            if index is not None:
                t = t[index]
            out = t.float()
            if out.data_ptr() == buffer.data_ptr() and out.numel() * 4 != n_bytes:
                out = out.clone(memory_format=torch.contiguous_format)  # a float32 slice: drop the rest
            return out
        except CorruptFileError:
            raise
        except OSError as e:
            raise CorruptFileError(file, f"cannot read tensor {tensor!r}: {str(e)[:160]}") from None
        except (MemoryError, RuntimeError) as e:
            oom = out_of_memory(e, file, f"reading tensor {tensor!r}")
            if oom is None:
                raise
            raise oom from None

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
                self._identity[file] = opened
                self._handles[file] = handle
            header = self._headers[file]
        info = header.tensors.get(tensor)
        if info is None:
            raise CorruptFileError(file, f"no tensor {tensor!r} in this file")
        return handle, info, header.data_start

    def _cached(self, key: tuple[str, int | None], build: Callable[[], torch.Tensor]) -> torch.Tensor:
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        value = build()
        self._cache.put(key, value)
        return value
