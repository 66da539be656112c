"""A dense MLP applied in column blocks of its weights, so no whole MLP matrix is ever in
memory in float32 (docs/internals.md, "Weights").

At Llama-2-70B shape one layer's ``W_gate``, ``W_in`` and ``W_out`` are 0.94 GB each in
float32, 2.8 GB together: the forward pass would hold all three at once. Here

    hidden[:, j:k] = act(x W_gate[:, j:k]) * (x W_in[:, j:k])      (gated; + b_in after)
    hidden[:, j:k] = act(x W_in[:, j:k] + b_in[j:k])              (not gated)
    out[:, i:m]    = hidden W_out[:, i:m] + b_out[i:m]

each block read alone through ``TorchWeights.columns`` (a checkpoint reads only the stored rows
of a Hugging Face ``[out, in]`` weight). Every output element is the same dot product as in
the unblocked ``x @ W``, so the results agree to float32 rounding (BLAS may sum in another
order).

Gradients (attribution patching's backward pass) go through ``_BlockedMLP``, which keeps only
its input and reads the blocks again in the backward pass: autograd would otherwise keep
every block it multiplied by, the whole matrices again.

    dhidden        = dout W_outᵀ = Σ_i dout[:, i:m] W_out[:, i:m]ᵀ
    dx             = Σ_j ∂hidden[:, j:k]/∂x · dhidden[:, j:k]     (each block by autograd)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from headscope.engine.forward.torch_weights import TorchWeights

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["MLP_BLOCK_BYTES", "blocked_mlp", "column_blocks", "uses_blocks"]

# Float32 bytes of one block of one MLP matrix. A matrix larger than this is applied in
# blocks: at 7B (180 MB) nothing changes, 13B's (283 MB) go in two blocks, at 70B (0.94 GB) the
# MLP's peak falls from 2.8 GB to about two blocks. HEADSCOPE_MLP_BLOCK_BYTES sets it (tests
# force tiny blocks to compare with the unblocked pass).
MLP_BLOCK_BYTES = int(os.environ.get("HEADSCOPE_MLP_BLOCK_BYTES", str(256 << 20)))

Activation = Callable[["Tensor"], "Tensor"]


def uses_blocks(w: TorchWeights, block_bytes: int | None = None) -> bool:
    """Whether ``mlp`` applies this model's MLP in blocks: a matrix is larger than a block
    and the source reads columns alone (``get_columns``)."""
    cfg = w.cfg
    budget = MLP_BLOCK_BYTES if block_bytes is None else block_bytes
    return bool(cfg.d_mlp) and 4 * cfg.d_model * cfg.d_mlp > budget and w.reads_columns


def column_blocks(rows: int, cols: int, block_bytes: int) -> list[tuple[int, int]]:
    """``[start, stop)`` column ranges of a float32 ``[rows, cols]`` matrix, each at most
    ``block_bytes`` (at least one column)."""
    step = max(1, block_bytes // (4 * rows))
    return [(j, min(cols, j + step)) for j in range(0, cols, step)]


def blocked_mlp(w: TorchWeights, layer: int, x: Tensor, act: Activation, gated: bool,
                block_bytes: int | None = None) -> Tensor:
    """``transformer.mlp`` of ``x [.., d_model]`` with its weights read in column blocks of at
    most ``block_bytes`` (default ``MLP_BLOCK_BYTES``); differentiable in ``x``."""
    budget = MLP_BLOCK_BYTES if block_bytes is None else block_bytes
    return _BlockedMLP.apply(x, _Blocks(w, layer, act, gated, budget))


class _Blocks:
    """One layer's MLP, block by block."""

    def __init__(self, w: TorchWeights, layer: int, act: Activation, gated: bool, block_bytes: int) -> None:
        self.w, self.act, self.gated = w, act, gated
        self.pre = f"blocks.{layer}.mlp"
        d_model, d_mlp = w.cfg.d_model, w.cfg.d_mlp
        self.hidden_blocks = column_blocks(d_model, d_mlp, block_bytes)  # of W_in, W_gate
        self.out_blocks = column_blocks(d_mlp, d_model, block_bytes)  # of W_out

    def hidden(self, x: Tensor, j: int, k: int) -> Tensor:
        """``hidden[.., j:k]`` before the gated form's bias."""
        w, pre = self.w, self.pre
        if self.gated:
            return self.act(x @ w.columns(f"{pre}.W_gate", j, k)) * (x @ w.columns(f"{pre}.W_in", j, k))
        return self.act((x @ w.columns(f"{pre}.W_in", j, k)) + w.get(f"{pre}.b_in")[j:k])

    def forward(self, x: Tensor) -> Tensor:
        import torch

        w, pre = self.w, self.pre
        hidden = torch.empty(*x.shape[:-1], w.cfg.d_mlp, dtype=x.dtype)
        for j, k in self.hidden_blocks:
            hidden[..., j:k] = self.hidden(x, j, k)
        if self.gated:  # TransformerLens' GatedMLP: b_in after the gate
            hidden.add_(w.get(f"{pre}.b_in"))
        out = torch.empty(*x.shape[:-1], w.cfg.d_model, dtype=x.dtype)
        for i, m in self.out_blocks:
            out[..., i:m] = hidden @ w.columns(f"{pre}.W_out", i, m)
        return out.add_(w.get(f"{pre}.b_out"))

    def backward(self, x: Tensor, grad_out: Tensor) -> Tensor:
        import torch

        w, pre = self.w, self.pre
        d_hidden = torch.zeros(*x.shape[:-1], w.cfg.d_mlp, dtype=grad_out.dtype)
        for i, m in self.out_blocks:
            d_hidden += grad_out[..., i:m] @ w.columns(f"{pre}.W_out", i, m).T
        grad_x = torch.zeros_like(x)
        for j, k in self.hidden_blocks:
            with torch.enable_grad():
                xj = x.detach().requires_grad_(True)
                (g,) = torch.autograd.grad(self.hidden(xj, j, k), xj, d_hidden[..., j:k])
            grad_x += g
        return grad_x


def _autograd_function() -> Any:
    import torch

    class BlockedMLP(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Tensor, blocks: _Blocks) -> Tensor:
            ctx.blocks = blocks
            ctx.save_for_backward(x)
            with torch.no_grad():
                return blocks.forward(x)

        @staticmethod
        def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, None]:
            (x,) = ctx.saved_tensors
            return ctx.blocks.backward(x, grad_out), None

    return BlockedMLP


class _Lazy:
    """``_BlockedMLP.apply``: the autograd Function is defined on first use (torch is imported
    lazily everywhere in the engine)."""

    fn: Any = None

    def apply(self, x: Tensor, blocks: _Blocks) -> Tensor:
        if self.fn is None:
            self.fn = _autograd_function()
        return self.fn.apply(x, blocks)


_BlockedMLP = _Lazy()
