"""Weight sources: where canonical float32 tensors come from (docs/internals.md).

``WeightSource`` is the one interface the forward pass, the circuits and the scores read
weights through. ``DictWeights`` holds tensors in memory (tests, training, conversions);
``CheckpointWeights`` (below) reads a checkpoint lazily.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .adapters import Heads, Spec, Whole, Zeros
from .config import ModelConfig
from .errors import CorruptFileError, IndexOutOfRangeError, MissingTensorError

if TYPE_CHECKING:
    import torch

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


def _kv_name(name: str) -> str:
    """``blocks.0.attn.W_K`` -> ``blocks.0.attn._W_K`` (the un-expanded GQA tensor)."""
    prefix, _, last = name.rpartition(".")
    return f"{prefix}._{last}" if last in ("W_K", "W_V", "b_K", "b_V") else name


class CheckpointWeights:
    """A ``WeightSource`` reading a safetensors checkpoint lazily (docs/internals.md).

    ``specs`` (from an adapter) say where each canonical tensor lives; ``files`` map each
    checkpoint tensor name to the (already validated, inside-the-model-directory) file
    holding it. Files are opened with ``safe_open`` (mmap) on first use; ``get_head`` reads
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
    ) -> None:
        self.cfg = cfg
        self.specs = dict(specs)
        self.files = dict(files)
        self.path = path
        self.cache_bytes = cache_bytes
        self.reads = 0  # tensor/slice reads from disk (tests count them)
        self._handles: dict[str, Any] = {}
        self._sizes: dict[str, int] = {}  # file sizes when opened (see _read)
        self._cache: OrderedDict[tuple[str, int | None], torch.Tensor] = OrderedDict()
        self._cached_bytes = 0
        self._lock = threading.RLock()

    def has(self, name: str) -> bool:
        return name in self.specs

    def get(self, name: str) -> torch.Tensor:
        return self._cached((name, None), lambda: self._build(name))

    def get_head(self, name: str, head: int) -> torch.Tensor:
        if not 0 <= head < self.cfg.n_heads:
            raise IndexOutOfRangeError(self.path, f"head {head} out of range 0..{self.cfg.n_heads - 1}")
        return self._cached((name, head), lambda: self._build_head(name, head))

    def close(self) -> None:
        with self._lock:
            self._handles.clear()
            self._cache.clear()
            self._cached_bytes = 0

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
        if isinstance(spec, Whole):
            t = self._read(spec.tensor, None)
            return (t.T if spec.transpose else t).contiguous()
        t = self._read(spec.tensor, None)
        stored = self.cfg.kv_heads if spec.kv else self.cfg.n_heads
        heads = torch.stack([self._cut(spec, t.narrow(spec.axis, spec.offset + i * spec.stride, spec.size))
                             for i in range(stored)])
        if spec.kv and stored != self.cfg.n_heads:
            heads = torch.repeat_interleave(heads, self.cfg.n_heads // stored, dim=0)
        return heads.contiguous()

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
    def _cut(spec: Heads, block: torch.Tensor) -> torch.Tensor:
        if spec.squeeze:
            block = block.squeeze(spec.axis)
        return block.transpose(-2, -1) if spec.transpose else block

    def _read(self, tensor: str, index: tuple[slice, ...] | None) -> torch.Tensor:
        """One tensor (or a slice of it) from disk, as float32."""
        file = self.files.get(tensor)
        if file is None:
            raise MissingTensorError(self.path, f"missing tensor {tensor!r}")
        try:
            with self._lock:
                handle = self._handles.get(file)
                if handle is None:
                    from safetensors import safe_open

                    self._sizes[file] = os.stat(file).st_size
                    handle = self._handles[file] = safe_open(file, framework="pt")
                self.reads += 1
            # safe_open maps the file: reading pages of a file truncated since it was opened
            # kills the process with SIGBUS. A stat per read (~µs) turns the common case (a
            # download or copy rewriting the file under us) into a clear error instead.
            if os.stat(file).st_size != self._sizes[file]:
                raise CorruptFileError(
                    file,
                    f"the file changed on disk since it was opened (now {os.stat(file).st_size:,} "
                    f"bytes, was {self._sizes[file]:,}); reopen the model",
                )
            # Reads happen outside the lock: safe_open handles are safe to share between
            # threads, and one large read (an embedding) must not hold up head slices.
            t = handle.get_tensor(tensor) if index is None else handle.get_slice(tensor)[index]
        except CorruptFileError:
            raise
        except (OSError, RuntimeError, ValueError) as e:  # SafetensorError is a plain Exception subclass
            raise CorruptFileError(file, f"cannot read tensor {tensor!r}: {str(e)[:160]}") from None
        except Exception as e:
            if type(e).__name__ == "SafetensorError":
                raise CorruptFileError(file, f"cannot read tensor {tensor!r}: {str(e)[:160]}") from None
            raise
        return t.float()

    def _cached(self, key: tuple[str, int | None], build: Callable[[], torch.Tensor]) -> torch.Tensor:
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        value = build()
        size = value.numel() * value.element_size()
        if size <= self.cache_bytes // 4:  # big tensors (embeddings) would evict everything
            with self._lock:
                if key not in self._cache:
                    self._cache[key] = value
                    self._cached_bytes += size
                while self._cached_bytes > self.cache_bytes and self._cache:
                    _, old = self._cache.popitem(last=False)
                    self._cached_bytes -= old.numel() * old.element_size()
        return value
