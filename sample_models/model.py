"""The small torch transformer the sample models are trained with.

Parameters are stored under TransformerLens' canonical names and shapes (``embed.W_E``,
``blocks.{l}.attn.W_Q`` [n_heads, d_model, d_head], ...), so ``state_dict()`` *is* the
headscope native layout and the export to GPT-2's Conv1D layout is a pure reshape.

Two flavours:
- attention-only (``d_mlp=None``, ``layer_norm=False``): no MLP, no LayerNorm, so the QK/OV
  circuits read off the weights are exactly what the model computes;
- GPT-2 style (``d_mlp`` set, ``layer_norm=True``): pre-LayerNorm blocks, gelu_new MLP, tied
  unembedding without bias (what ``GPT2LMHeadModel`` computes).

This module also holds the training-time diagnostics (previous-token and induction
attention, copying and K-composition scores). They are written independently of
``engine.circuits``/``engine.forward.behaviour`` on purpose, so that the two can be checked against each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class ModelShape:
    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    d_vocab: int
    n_ctx: int
    d_mlp: int | None = None  # None: attention-only
    layer_norm: bool = False
    tied_unembed: bool = False  # W_U = W_Eᵀ and no b_U (GPT-2)
    ln_eps: float = 1e-5


class _Params(nn.Module):
    """A bag of named parameters, so that ``state_dict`` keys read ``embed.W_E`` etc."""

    def __init__(self, **shapes: tuple[int, ...]) -> None:
        super().__init__()
        for name, shape in shapes.items():
            self.register_parameter(name, nn.Parameter(torch.zeros(shape)))


class Attention(nn.Module):
    def __init__(self, s: ModelShape) -> None:
        super().__init__()
        H, D, dh = s.n_heads, s.d_model, s.d_head
        self.W_Q = nn.Parameter(torch.zeros(H, D, dh))
        self.W_K = nn.Parameter(torch.zeros(H, D, dh))
        self.W_V = nn.Parameter(torch.zeros(H, D, dh))
        self.W_O = nn.Parameter(torch.zeros(H, dh, D))
        self.b_Q = nn.Parameter(torch.zeros(H, dh))
        self.b_K = nn.Parameter(torch.zeros(H, dh))
        self.b_V = nn.Parameter(torch.zeros(H, dh))
        self.b_O = nn.Parameter(torch.zeros(D))
        self.scale = math.sqrt(dh)

    def forward(self, x: Tensor, ablate_heads: list[int] | None = None) -> tuple[Tensor, Tensor]:
        # x: [b, p, D] -> q, k, v: [b, H, p, dh]
        q = torch.einsum("bpd,hde->bhpe", x, self.W_Q) + self.b_Q[:, None]
        k = torch.einsum("bpd,hde->bhpe", x, self.W_K) + self.b_K[:, None]
        v = torch.einsum("bpd,hde->bhpe", x, self.W_V) + self.b_V[:, None]
        scores = q @ k.transpose(-1, -2) / self.scale  # [b, H, q, k]
        p = x.shape[1]
        causal = torch.ones(p, p, dtype=torch.bool, device=x.device).tril()
        pattern = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        z = pattern @ v  # [b, H, p, dh]
        if ablate_heads:
            z = z.clone()
            z[:, ablate_heads] = 0.0  # zero-ablation: the head writes nothing (bias b_O stays)
        out = torch.einsum("bhpe,hed->bpd", z, self.W_O) + self.b_O
        return out, pattern


class LayerNorm(nn.Module):
    def __init__(self, d_model: int, eps: float) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(d_model))
        self.b = nn.Parameter(torch.zeros(d_model))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, x.shape[-1:], self.w, self.b, self.eps)


class MLP(nn.Module):
    def __init__(self, d_model: int, d_mlp: int) -> None:
        super().__init__()
        self.W_in = nn.Parameter(torch.zeros(d_model, d_mlp))
        self.b_in = nn.Parameter(torch.zeros(d_mlp))
        self.W_out = nn.Parameter(torch.zeros(d_mlp, d_model))
        self.b_out = nn.Parameter(torch.zeros(d_model))

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(x @ self.W_in + self.b_in, approximate="tanh") @ self.W_out + self.b_out


class Block(nn.Module):
    def __init__(self, s: ModelShape) -> None:
        super().__init__()
        self.ln1 = LayerNorm(s.d_model, s.ln_eps) if s.layer_norm else None
        self.attn = Attention(s)
        self.ln2 = LayerNorm(s.d_model, s.ln_eps) if s.layer_norm and s.d_mlp else None
        self.mlp = MLP(s.d_model, s.d_mlp) if s.d_mlp else None

    def forward(self, x: Tensor, ablate_heads: list[int] | None) -> tuple[Tensor, Tensor]:
        a, pattern = self.attn(self.ln1(x) if self.ln1 else x, ablate_heads)
        x = x + a
        if self.mlp is not None:
            x = x + self.mlp(self.ln2(x) if self.ln2 else x)
        return x, pattern


class TinyTransformer(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        s = self.shape = shape
        self.embed = _Params(W_E=(s.d_vocab, s.d_model))
        self.pos_embed = _Params(W_pos=(s.n_ctx, s.d_model))
        self.blocks = nn.ModuleList(Block(s) for _ in range(s.n_layers))
        self.ln_final = LayerNorm(s.d_model, s.ln_eps) if s.layer_norm else None
        self.unembed = None if s.tied_unembed else _Params(W_U=(s.d_model, s.d_vocab), b_U=(s.d_vocab,))

    def init_weights(self, generator: torch.Generator, std: float = 0.02) -> None:
        """GPT-2-like init: N(0, std), output projections scaled down by depth."""
        s = self.shape
        out_std = std / math.sqrt(2 * s.n_layers)
        for name, p in self.named_parameters():
            last = name.rsplit(".", 1)[-1]
            if last in ("w",):
                nn.init.ones_(p)
            elif last.startswith("b"):
                nn.init.zeros_(p)
            else:
                scale = out_std if last in ("W_O", "W_out") else std
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=generator) * scale)

    def W_U(self) -> Tensor:
        return self.embed.W_E.T if self.unembed is None else self.unembed.W_U

    def forward(
        self, tokens: Tensor, ablate: dict[int, list[int]] | None = None
    ) -> tuple[Tensor, list[Tensor]]:
        """Logits ``[b, p, d_vocab]`` and per-layer attention patterns ``[b, H, q, k]``."""
        p = tokens.shape[-1]
        x = self.embed.W_E[tokens] + self.pos_embed.W_pos[:p]
        patterns = []
        for layer, block in enumerate(self.blocks):
            x, pattern = block(x, (ablate or {}).get(layer))
            patterns.append(pattern)
        if self.ln_final is not None:
            x = self.ln_final(x)
        logits = x @ self.W_U()
        if self.unembed is not None:
            logits = logits + self.unembed.b_U
        return logits, patterns

    def canonical_tensors(self) -> dict[str, Tensor]:
        """Every parameter under its canonical name, detached, contiguous float32."""
        return {k: v.detach().float().contiguous().clone() for k, v in self.state_dict().items()}


# ---- diagnostics (independent of engine.forward.behaviour) -------------------------------------------


def loss_fn(logits: Tensor, tokens: Tensor) -> Tensor:
    """Mean next-token cross-entropy."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def repeated_random_tokens(
    d_vocab: int, half: int, batch: int, seed: int, exclude: tuple[int, ...] = ()
) -> Tensor:
    """``[batch, 2*half]``: uniformly random tokens, the first half repeated once."""
    g = torch.Generator().manual_seed(seed)
    allowed = torch.tensor([i for i in range(d_vocab) if i not in exclude])
    first = allowed[torch.randint(len(allowed), (batch, half), generator=g)]
    return torch.cat([first, first], dim=1)


@torch.no_grad()
def attention_scores(model: TinyTransformer, seed: int = 0, batch: int = 8) -> dict[str, Tensor]:
    """Previous-token and induction attention ``[n_layers, n_heads]`` on repeated random tokens.

    previous-token: mean attention from position i to i-1 (i ≥ 1);
    induction: mean attention from i in the second copy to i - T + 1 (T: half length).
    """
    s = model.shape
    half = s.n_ctx // 2
    tokens = repeated_random_tokens(s.d_vocab, half, batch, seed)
    _, patterns = model(tokens)
    pat = torch.stack(patterns, dim=1)  # [b, L, H, q, k]
    q = torch.arange(1, 2 * half)
    prev = pat[..., q, q - 1].mean(dim=(0, -1))
    q2 = torch.arange(half, 2 * half)
    induction = pat[..., q2, q2 - half + 1].mean(dim=(0, -1))
    # Previous-token on the first (non-repeated) half only, so induction does not count.
    q1 = torch.arange(1, half)
    prev_first = pat[..., q1, q1 - 1].mean(dim=(0, -1))
    return {"prev_token": prev_first, "prev_token_all": prev, "induction": induction}


@torch.no_grad()
def copying_scores(model: TinyTransformer) -> Tensor:
    """Σ Re λ / Σ |λ| over eigenvalues of the full OV circuit W_E W_V W_O W_U, per head.

    The non-zero eigenvalues of (W_E W_V)(W_O W_U) are those of (W_O W_U)(W_E W_V),
    a d_head × d_head matrix.
    """
    W_E, W_U = model.embed.W_E.double(), model.W_U().double()
    out = torch.zeros(model.shape.n_layers, model.shape.n_heads)
    for layer, block in enumerate(model.blocks):
        small = block.attn.W_O.double() @ W_U @ W_E @ block.attn.W_V.double()  # [H, dh, dh]
        lam = torch.linalg.eigvals(small)
        out[layer] = (lam.real.sum(-1) / lam.abs().sum(-1)).float()
    return out


@torch.no_grad()
def k_composition(model: TinyTransformer, src_layer: int = 0, dst_layer: int = 1) -> Tensor:
    """‖OV₁ QK₂ᵀ‖_F / (‖OV₁‖_F ‖QK₂ᵀ‖_F) for every (source head, destination head)."""
    a, b = model.blocks[src_layer].attn, model.blocks[dst_layer].attn
    ov = a.W_V.double() @ a.W_O.double()  # [H, D, D]
    qk_t = b.W_K.double() @ b.W_Q.double().transpose(-1, -2)  # QKᵀ = W_K W_Qᵀ: [H, D, D]
    prod = torch.einsum("hij,gjk->hgik", ov, qk_t)
    norm = torch.linalg.matrix_norm
    return (norm(prod) / (norm(ov)[:, None] * norm(qk_t)[None, :])).float()


@torch.no_grad()
def ablation_losses(model: TinyTransformer, seed: int = 0, batch: int = 16) -> Tensor:
    """Loss increase on the second half of repeated random tokens when a head is zeroed."""
    s = model.shape
    half = s.n_ctx // 2
    tokens = repeated_random_tokens(s.d_vocab, half, batch, seed)

    def second_half_loss(ablate: dict[int, list[int]] | None) -> float:
        logits, _ = model(tokens, ablate)
        return float(loss_fn(logits[:, half - 1 :], tokens[:, half - 1 :]))

    base = second_half_loss(None)
    out = torch.zeros(s.n_layers, s.n_heads)
    for layer in range(s.n_layers):
        for head in range(s.n_heads):
            out[layer, head] = second_half_loss({layer: [head]}) - base
    return out
