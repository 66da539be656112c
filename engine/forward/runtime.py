"""torch's process-wide settings and the tensors the layers above hand to the forward pass.

torch is imported in ``engine.forward`` only (docs/internals.md, "Layers"): the service sets
torch's thread count and the sweeps start torch's import early through these functions,
and build the token batches of a forward pass with them, without importing torch
themselves. Each imports torch when called, never when this module is imported.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["gradient_mode", "import_torch_in_background", "inference_mode", "mask_batch",
           "set_threads", "token_batch"]


def set_threads(n: int) -> int:
    """Set torch's intra-op thread count to ``n``; the count it had before."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    return previous


def inference_mode() -> contextlib.AbstractContextManager[Any]:
    """``torch.inference_mode()``: no autograd bookkeeping for what runs inside."""
    import torch

    return torch.inference_mode()


def gradient_mode() -> contextlib.AbstractContextManager[Any]:
    """``torch.inference_mode(False)``: autograd back on inside a job that runs under
    ``inference_mode`` (the engine's workers): attribution patching takes a backward pass,
    and tensors made in inference mode cannot enter one."""
    import torch

    return torch.inference_mode(False)


def import_torch_in_background() -> None:
    """Start ``import torch`` on a daemon thread (a forward pass needs it; the weight algebra
    before it does not): its 1-3 s overlap that algebra instead of preceding it. The main
    thread's own ``import torch`` later waits for this one (Python's import lock)."""
    if "torch" in sys.modules:
        return

    def load() -> None:
        # a failure here is raised again, with its traceback, by the main thread's import
        with contextlib.suppress(Exception):
            import torch  # noqa: F401

    threading.Thread(target=load, name="headscope-import-torch", daemon=True).start()


def token_batch(rows: Sequence[Sequence[int]]) -> Tensor:
    """``[batch, pos]`` int64 token ids, the input of a forward pass."""
    import torch

    return torch.tensor([list(row) for row in rows], dtype=torch.int64)


def mask_batch(rows: Sequence[Sequence[bool]]) -> Tensor:
    """``[batch, pos]`` bool: a per-token mask beside a ``token_batch``."""
    import torch

    return torch.tensor([list(row) for row in rows], dtype=torch.bool)
