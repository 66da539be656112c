"""Weight sources: where canonical float32 tensors come from (docs/internals.md).

``WeightSource`` is the one interface the forward pass, the circuits and the scores read
weights through. ``DictWeights`` holds tensors in memory (tests, training, conversions);
``CheckpointWeights`` (below) reads a checkpoint lazily.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .config import ModelConfig
from .errors import MissingTensorError

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
