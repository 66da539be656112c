"""Per-head QK and OV circuits as :class:`~engine.factored.FactoredMatrix` (docs/math.md, "Circuits").

Row-vector convention, as TransformerLens: ``QK = W_Q W_Kᵀ`` has query-side rows and key-side
columns; ``OV = W_V W_O`` maps a source residual vector (row) to the head's output. The
circuits are weights only: attention scores are shown without the ``1/√d_head`` scale, and
the query/key/value biases are not part of them (they add a per-query/per-key constant that
the bilinear QK form does not contain; ``fold_value_biases`` moves ``b_V`` into ``b_O``).

Nothing here materialises a ``d_model × d_model`` or ``d_vocab × d_vocab`` matrix: ask a
circuit for ``.block(rows, cols)``, or use the ``*_block`` helpers, which never compute more
than the requested embedding rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from headscope.engine.circuits.factored import FactoredMatrix, broadcast_shapes
from headscope.engine.core.config import ModelConfig
from headscope.engine.core.errors import InvalidRequestError
from headscope.engine.model.weights import WeightSource

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "full_ov",
    "full_ov_block",
    "head_weight",
    "ov",
    "positional_qk",
    "qk",
    "rope",
    "rotary_matrix",
    "rotary_profile",
    "rotary_qk",
    "token_qk",
    "token_qk_block",
]


def _path(w: WeightSource) -> str | None:
    return getattr(w, "path", None)


def head_weight(w: WeightSource, layer: int, head: int, name: str) -> Tensor:
    """``blocks.{layer}.attn.{name}`` for one head (float32), after a range check."""
    w.cfg.check_head(layer, head, _path(w))
    return w.get_head(f"blocks.{layer}.attn.{name}", head)


def qk(w: WeightSource, layer: int, head: int) -> FactoredMatrix:
    """``W_Q W_Kᵀ`` ``[d_model (query), d_model (key)]``."""
    return FactoredMatrix(head_weight(w, layer, head, "W_Q"), head_weight(w, layer, head, "W_K").T)


def ov(w: WeightSource, layer: int, head: int) -> FactoredMatrix:
    """``W_V W_O`` ``[d_model (source), d_model (output)]``."""
    return FactoredMatrix(head_weight(w, layer, head, "W_V"), head_weight(w, layer, head, "W_O"))


def token_qk(w: WeightSource, layer: int, head: int) -> FactoredMatrix:
    """``W_E QK W_Eᵀ`` ``[query token, key token]``."""
    w_e = w.get("embed.W_E")
    return FactoredMatrix(w_e @ head_weight(w, layer, head, "W_Q"),
                          (w_e @ head_weight(w, layer, head, "W_K")).T)


def full_ov(w: WeightSource, layer: int, head: int) -> FactoredMatrix:
    """``W_E OV W_U`` ``[source token, output token]`` (``W_U`` is ``W_Eᵀ`` when tied)."""
    return FactoredMatrix(w.get("embed.W_E") @ head_weight(w, layer, head, "W_V"),
                          head_weight(w, layer, head, "W_O") @ w.get("unembed.W_U"))


def positional_qk(w: WeightSource, layer: int, head: int) -> FactoredMatrix:
    """``W_pos QK W_posᵀ`` ``[query position, key position]``, learned positions only."""
    if w.cfg.positional != "learned":
        raise InvalidRequestError(
            _path(w),
            f"positional QK needs learned position embeddings; this model's are "
            f"{w.cfg.positional!r} (rotary models: use rotary_qk at an offset)",
        )
    w_pos = w.get("pos_embed.W_pos")
    return FactoredMatrix(w_pos @ head_weight(w, layer, head, "W_Q"),
                          (w_pos @ head_weight(w, layer, head, "W_K")).T)


def token_qk_block(w: WeightSource, layer: int, head: int, rows: Sequence[int],
                   cols: Sequence[int], offset: int | None = None) -> Tensor:
    """``token_qk(...).block(rows, cols)`` reading only those embedding rows.

    With ``offset`` (rotary models) the block of ``W_E W_Q R(Δ) W_Kᵀ W_Eᵀ`` instead.
    """
    w_e = w.get("embed.W_E")
    w_q = head_weight(w, layer, head, "W_Q")
    if offset is not None:
        w_q = w_q @ rotary_matrix(_layer_cfg(w, layer), offset, _path(w))
    q = w_e[torch.as_tensor(rows, dtype=torch.long)] @ w_q
    k = w_e[torch.as_tensor(cols, dtype=torch.long)] @ head_weight(w, layer, head, "W_K")
    return q @ k.T


def full_ov_block(w: WeightSource, layer: int, head: int, rows: Sequence[int],
                  cols: Sequence[int]) -> Tensor:
    """``full_ov(...).block(rows, cols)`` reading only those rows of ``W_E``/columns of ``W_U``."""
    src = w.get("embed.W_E")[torch.as_tensor(rows, dtype=torch.long)]
    out = w.get("unembed.W_U")[:, torch.as_tensor(cols, dtype=torch.long)]
    return (src @ head_weight(w, layer, head, "W_V")) @ (head_weight(w, layer, head, "W_O") @ out)


def circuit_block(w: WeightSource, layer: int, head: int, kind: str, basis: str,
                  rows: Sequence[int], cols: Sequence[int], offset: int = 0) -> Tensor:
    """The ``rows × cols`` block of a head's circuit that the explorer and the CLI show.

    token basis: QK is ``W_E QK W_Eᵀ`` (rotary models: at offset Δ), OV the full OV circuit
    ``W_E OV W_U``; position basis (QK, learned positions): ``W_pos QK W_posᵀ``. Only the
    requested rows and columns are ever multiplied out.
    """
    if basis == "position":
        return positional_qk(w, layer, head).block(list(rows), list(cols))
    if kind == "ov":
        return full_ov_block(w, layer, head, rows, cols)
    rotary = w.cfg.positional == "rotary"
    return token_qk_block(w, layer, head, rows, cols, offset if rotary else None)


# -- rotary position embeddings --------------------------------------------------------------


def _require_rotary(cfg: ModelConfig, path: str | None) -> int:
    if cfg.positional != "rotary":
        raise InvalidRequestError(
            path, f"rotary circuits need rotary positions; this model's are {cfg.positional!r}"
        )
    return cfg.rotary_dim or cfg.d_head


def rope(x: Tensor, positions: Tensor, cfg: ModelConfig) -> Tensor:
    """Rotate row vectors ``x [..., d_head]`` to ``positions`` (broadcast against ``x[..., 0]``).

    Hugging Face / GPT-NeoX ``rotate_half`` convention on the first ``r = cfg.rotary_dim``
    dims: dims ``i`` and ``i + r/2`` form a pair rotated by ``position · base^(-2i/r)`` (with
    the checkpoint's RoPE scaling applied, as in the forward pass); the remaining dims pass
    through (partial rotary).
    """
    # one definition of the frequencies (incl. RoPE scaling) and of the rotation
    from headscope.engine.forward.transformer import apply_rotary, rotary_inv_freq, rotary_scale

    x = x.expand(broadcast_shapes(x.shape, (*positions.shape, x.shape[-1])))
    # LongRoPE: the factors of a sequence reaching the largest position asked for
    seq_len = int(positions.max().item()) + 1 if positions.numel() else None
    inv_freq = rotary_inv_freq(cfg, seq_len=seq_len).to(torch.float64)
    # angles [..., r/2]
    return apply_rotary(x, positions.to(torch.float64)[..., None] * inv_freq, rotary_scale(cfg))


def _layer_cfg(w: WeightSource, layer: int) -> ModelConfig:
    """The config with ``layer``'s RoPE (Gemma 3's local layers have their own base)."""
    from headscope.engine.forward.transformer import layer_config

    return layer_config(w.cfg, layer)


def rotary_matrix(cfg: ModelConfig, offset: int, path: str | None = None) -> Tensor:
    """``R(Δ) [d_head, d_head]`` with ``rope(x, p) = x @ R(p)``.

    Rotations compose, ``R(i) R(j)ᵀ = R(i - j)``, so the score of a query at position ``i``
    and a key at ``j`` is ``q R(i) (k R(j))ᵀ = q R(i - j) kᵀ``: it depends on ``Δ = i - j`` only.
    """
    _require_rotary(cfg, path)
    eye = torch.eye(cfg.d_head, dtype=torch.float32)
    return rope(eye, torch.full((cfg.d_head,), float(offset)), cfg)


def rotary_qk(w: WeightSource, layer: int, head: int, offset: int) -> FactoredMatrix:
    """``W_Q R(Δ) W_Kᵀ`` ``[d_model (query), d_model (key)]`` for a key ``Δ = offset``
    positions before the query (weights only: no biases, no ``1/√d_head``)."""
    rot = rotary_matrix(_layer_cfg(w, layer), offset, _path(w))
    return FactoredMatrix(head_weight(w, layer, head, "W_Q") @ rot,
                          head_weight(w, layer, head, "W_K").T)


def rotary_profile(w: WeightSource, layer: int, head: int, offsets: Sequence[int], *,
                   n_tokens: int = 256, seed: int = 0) -> Tensor:
    """Same-token QK score against offset: ``[len(offsets)]``.

    The statistic: draw ``n_tokens`` distinct token ids with a generator seeded by ``seed``,
    take their embedding rows ``e`` rescaled to norm ``√d_model`` (the scale a pre-norm hands
    to attention), and average, over the sample, the unscaled attention score of ``e`` as the
    query and the same ``e`` as a key ``Δ`` positions earlier:
    ``profile[Δ] = mean_e  e W_Q R(Δ) W_Kᵀ eᵀ``. It shows how the head's preference for
    matching content decays or oscillates with distance; weights only (no biases).
    """
    cfg = _layer_cfg(w, layer)
    path = _path(w)
    _require_rotary(cfg, path)
    w_q, w_k = head_weight(w, layer, head, "W_Q"), head_weight(w, layer, head, "W_K")
    w_e = w.get("embed.W_E")
    g = torch.Generator().manual_seed(seed)
    ids = torch.randperm(cfg.d_vocab, generator=g)[: min(n_tokens, cfg.d_vocab)]
    e = w_e[ids]
    e = e * (cfg.d_model**0.5 / e.norm(dim=-1, keepdim=True).clamp_min(1e-12))
    q, k = e @ w_q, e @ w_k  # [n, d_head]
    deltas = torch.as_tensor(list(offsets), dtype=torch.float32)
    q_rot = rope(q[None, :, :], deltas[:, None], cfg)  # [n_offsets, n, d_head]
    return (q_rot * k).sum(-1).mean(-1)
