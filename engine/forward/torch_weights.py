"""The weights as torch tensors: the one place the forward layer turns the model layer's numpy
arrays into tensors (docs/internals.md, "Weights").

``torch_weights(w)`` wraps any ``WeightSource`` (numpy float32 arrays, read-only, possibly
cached and shared); its ``get``/``get_head`` return ``torch.from_numpy`` views of them: no
copy, so a forward pass holds no second copy of a big tensor. The forward pass never writes
into a weight (every operation on one makes a new tensor), and must not: the memory is the
cache's.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from headscope.engine.core.config import ModelConfig
from headscope.engine.model.weights import WeightSource

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["HeldLayerWeights", "TorchWeights", "as_tensor", "torch_weights"]

# torch warns, once per process, that a read-only array gives a tensor it cannot protect. The
# arrays are read-only so that numpy code cannot edit a cached weight, and the forward pass
# writes none: the first such conversion is made with that warning silenced (after it torch
# never warns again), without a process-wide filter.
_WARNED = False
_WARN_LOCK = threading.Lock()


def as_tensor(a: Any) -> Tensor:
    """A numpy array as a tensor sharing its memory (anything else: ``torch.as_tensor``)."""
    global _WARNED
    import numpy as np
    import torch

    if not isinstance(a, np.ndarray):
        return torch.as_tensor(a)
    if _WARNED or a.flags.writeable:
        return torch.from_numpy(a)
    with _WARN_LOCK, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)
        t = torch.from_numpy(a)
        _WARNED = True
    return t


class TorchWeights:
    """A ``WeightSource`` view whose arrays are torch tensors (zero-copy)."""

    def __init__(self, source: WeightSource) -> None:
        self.source = source
        self.cfg: ModelConfig = source.cfg
        self.path: str | None = getattr(source, "path", None)

    def has(self, name: str) -> bool:
        return self.source.has(name)

    def get(self, name: str) -> Tensor:
        return as_tensor(self.source.get(name))

    def get_head(self, name: str, head: int) -> Tensor:
        return as_tensor(self.source.get_head(name, head))

    @property
    def reads_columns(self) -> bool:
        """Whether the source reads a block of a matrix's columns without the whole
        (``get_columns``: checkpoints and processed checkpoints)."""
        return callable(getattr(self.source, "get_columns", None))

    def columns(self, name: str, start: int, stop: int) -> Tensor:
        """``get(name)[:, start:stop]``, through the source's ``get_columns`` where it has one."""
        read = getattr(self.source, "get_columns", None)
        if read is None:
            return self.get(name)[:, start:stop]
        return as_tensor(read(name, start, stop))

    def embed_rows(self, ids: Tensor) -> Tensor:
        """``get("embed.W_E")[ids]`` (``ids`` of any shape): only those rows are read and
        processed where the source can (``CircuitWeights.embed_rows``), not the whole
        vocabulary-sized matrix (154 MB for GPT-2) that a pass of a few tokens needs rows of."""
        rows = getattr(self.source, "embed_rows", None)
        if rows is None:
            return self.get("embed.W_E")[ids]
        return as_tensor(rows(ids.reshape(-1).numpy())).reshape(*ids.shape, -1)

    def unembed_columns(self, cols: Sequence[int], *, centred: bool = True) -> tuple[Tensor, Tensor]:
        """``(W_U[:, cols], b_U[cols])``, processing only those columns where the source can
        (``unembed_cols``, ``unembed_bias_cols``): a logit difference reads two of 50k.
        ``centred=False``: the caller reads only differences between the columns' logits, so
        processing's centring over the vocabulary may be left out (``CircuitWeights``)."""
        import numpy as np

        ids = np.asarray(list(cols), dtype=np.intp)
        w_cols = getattr(self.source, "unembed_cols", None)
        b_cols = getattr(self.source, "unembed_bias_cols", None)
        w_u = as_tensor(w_cols(ids, centred=centred)) if w_cols is not None else self.get("unembed.W_U")[:, list(cols)]
        b_u = as_tensor(b_cols(ids, centred=centred)) if b_cols is not None else self.get("unembed.b_U")[list(cols)]
        return w_u, b_u


class HeldLayerWeights(TorchWeights):
    """``torch_weights(w)`` that holds the tensors of one layer (``hold``) while the patched
    copies go through it in sub-batches: each sub-batch asks for the same weights, and a model
    whose layers do not fit the weight cache (a 7B layer is 0.8 GB of float32, the cache's layer
    budget 0.5 GB) would otherwise read and process them from the checkpoint once per
    sub-batch. Tensors of other layers pass through."""

    def __init__(self, w: WeightSource) -> None:
        super().__init__(w.source if isinstance(w, TorchWeights) else w)
        self._layer: str | None = None  # the held layer's name prefix
        self._held: dict[str, Tensor] = {}

    def hold(self, layer: int | None) -> None:
        """Keep the tensors of ``layer`` as they are read, dropping the previous layer's
        (``None``: hold nothing)."""
        self._layer = None if layer is None else f"blocks.{layer}."
        self._held.clear()

    def get(self, name: str) -> Tensor:
        if self._layer is None or not name.startswith(self._layer):
            return super().get(name)
        if name not in self._held:
            self._held[name] = super().get(name)
        return self._held[name]


def torch_weights(w: WeightSource | TorchWeights) -> TorchWeights:
    """``w`` read as torch tensors (``w`` itself if it already is such a view)."""
    return w if isinstance(w, TorchWeights) else TorchWeights(w)
