"""Per-head QK and OV circuits as :class:`~engine.circuits.factored.FactoredMatrix`, in numpy
(docs/math.md, "Circuits").

Row-vector convention, as TransformerLens: ``QK = W_Q W_Kᵀ`` has query-side rows and key-side
columns; ``OV = W_V W_O`` maps a source residual vector (row) to the head's output. The
circuits are weights only: attention scores are shown without the ``1/√d_head`` scale, and
the query/key/value biases are not part of them (they add a per-query/per-key constant that
the bilinear QK form does not contain; ``fold_value_biases`` moves ``b_V`` into ``b_O``).

``w`` is the model's weights (``model.weights``, the ``engine.model.weights.CircuitWeights``
surface): ``w.get`` read-only float32 arrays, ``w.cfg``, ``w.embed_rows``, ``w.unembed_cols``.
Nothing here materialises a ``d_model × d_model`` or ``d_vocab × d_vocab`` matrix: ask a
circuit for ``.block(rows, cols)``, or use ``circuit_block``, which reads only the requested
embedding rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from headscope.engine.circuits.factored import FactoredMatrix
from headscope.engine.core.errors import InvalidRequestError
from headscope.engine.model.rotary import layer_config, require_rotary, rope, rotary_matrix

__all__ = [
    "circuit_block",
    "full_ov",
    "full_ov_row",
    "head_weight",
    "ov",
    "positional_qk",
    "qk",
    "rotary_profile",
    "rotary_qk",
    "token_qk",
    "token_sample",
]


def _path(w: Any) -> str | None:
    return getattr(w, "path", None)


def head_weight(w: Any, layer: int, head: int, name: str) -> np.ndarray:
    """``blocks.{layer}.attn.{name}`` of one head (float32), after a range check:
    ``W_Q``/``W_K``/``W_V`` ``[d_model, d_head]``, ``W_O`` ``[d_head, d_model]``. Only that
    head's slice is read and processed (``get_head``): a view of one head of a 7B layer reads
    1 MB, not the layer's 32 MB."""
    w.cfg.check_head(layer, head, _path(w))
    return w.get_head(f"blocks.{layer}.attn.{name}", head)


def qk(w: Any, layer: int, head: int) -> FactoredMatrix:
    """``W_Q W_Kᵀ`` ``[d_model (query), d_model (key)]``."""
    return FactoredMatrix(head_weight(w, layer, head, "W_Q"), head_weight(w, layer, head, "W_K").T)


def ov(w: Any, layer: int, head: int) -> FactoredMatrix:
    """``W_V W_O`` ``[d_model (source), d_model (output)]``."""
    return FactoredMatrix(head_weight(w, layer, head, "W_V"), head_weight(w, layer, head, "W_O"))


def token_qk(w: Any, layer: int, head: int) -> FactoredMatrix:
    """``W_E QK W_Eᵀ = (W_E W_Q)(W_E W_K)ᵀ`` ``[query token, key token]``."""
    w_q, w_k = head_weight(w, layer, head, "W_Q"), head_weight(w, layer, head, "W_K")
    w_e = w.get("embed.W_E")
    with np.errstate(all="ignore"):
        return FactoredMatrix(w_e @ w_q, (w_e @ w_k).T)


def full_ov(w: Any, layer: int, head: int) -> FactoredMatrix:
    """``W_E OV W_U = (W_E W_V)(W_O W_U)`` ``[source token, output token]`` (``W_U`` is
    ``W_Eᵀ`` when tied)."""
    w_v, w_o = head_weight(w, layer, head, "W_V"), head_weight(w, layer, head, "W_O")
    with np.errstate(all="ignore"):
        return FactoredMatrix(w.get("embed.W_E") @ w_v, w_o @ w.get("unembed.W_U"))


def _require_learned(w: Any) -> None:
    if w.cfg.positional != "learned":
        raise InvalidRequestError(
            _path(w), f"positional QK needs learned position embeddings; this model's are "
            f"{w.cfg.positional!r} (rotary models: use rotary_qk at an offset)")


def positional_qk(w: Any, layer: int, head: int) -> FactoredMatrix:
    """``W_pos QK W_posᵀ`` ``[query position, key position]``, learned positions only."""
    _require_learned(w)
    w_q, w_k = head_weight(w, layer, head, "W_Q"), head_weight(w, layer, head, "W_K")
    w_pos = w.get("pos_embed.W_pos")
    with np.errstate(all="ignore"):
        return FactoredMatrix(w_pos @ w_q, (w_pos @ w_k).T)


def circuit_block(w: Any, layer: int, head: int, kind: str, basis: str,
                  rows: Sequence[int] | np.ndarray, cols: Sequence[int] | np.ndarray,
                  offset: int = 0) -> np.ndarray:
    """The ``rows × cols`` block of a head's circuit that the explorer and the CLI show.

    token basis: QK is ``W_E QK W_Eᵀ`` (rotary models: ``W_E W_Q R(Δ) W_Kᵀ W_Eᵀ`` at offset
    Δ), OV the full OV circuit ``W_E OV W_U``; position basis (QK, learned positions):
    ``W_pos QK W_posᵀ``. Only the requested rows and columns are multiplied out, and only
    those rows of ``W_E`` (columns of ``W_U``) are read (``w.embed_rows``, ``w.unembed_cols``).
    """
    cfg = w.cfg
    cfg.check_head(layer, head, _path(w))
    rows, cols = np.asarray(rows, dtype=np.intp), np.asarray(cols, dtype=np.intp)

    def attn(name: str) -> np.ndarray:
        return w.get_head(f"blocks.{layer}.attn.{name}", head)

    with np.errstate(all="ignore"):
        if basis == "position":
            _require_learned(w)
            w_pos = w.get("pos_embed.W_pos")
            return (w_pos[rows] @ attn("W_Q")) @ (w_pos[cols] @ attn("W_K")).T
        if kind == "ov":
            return (w.embed_rows(rows) @ attn("W_V")) @ (attn("W_O") @ w.unembed_cols(cols))
        w_q = attn("W_Q")
        if cfg.positional == "rotary":
            w_q = w_q @ rotary_matrix(layer_config(cfg, layer), offset, _path(w))
        return (w.embed_rows(rows) @ w_q) @ (w.embed_rows(cols) @ attn("W_K")).T


def full_ov_row(w: Any, layer: int, head: int, source: int) -> np.ndarray:
    """Row ``source`` of the full OV circuit ``W_E OV W_U`` over the whole vocabulary
    ``[d_vocab]``: what the head writes to the logits when it attends to ``source``. Reads the
    whole (cached) unembedding: every column is needed."""
    w_v = head_weight(w, layer, head, "W_V")
    w_o = head_weight(w, layer, head, "W_O")
    with np.errstate(all="ignore"):
        return ((w.embed_rows(np.asarray([source], dtype=np.intp)) @ w_v) @ (w_o @ w.get("unembed.W_U")))[0]


# -- rotary position embeddings: engine/model/rotary.py (one RoPE for the circuits and the
# forward pass)


def rotary_qk(w: Any, layer: int, head: int, offset: int) -> FactoredMatrix:
    """``W_Q R(Δ) W_Kᵀ`` ``[d_model (query), d_model (key)]`` for a key ``Δ = offset``
    positions before the query (weights only: no biases, no ``1/√d_head``)."""
    rot = rotary_matrix(layer_config(w.cfg, layer), offset, _path(w))
    return FactoredMatrix(head_weight(w, layer, head, "W_Q") @ rot, head_weight(w, layer, head, "W_K").T)


def token_sample(d_vocab: int, count: int, seed: int) -> np.ndarray:
    """``count`` distinct token ids drawn with ``seed``: the first ``count`` entries of
    ``torch.randperm(d_vocab, generator=torch.Generator().manual_seed(seed))``, the sample the
    rotary profile and the K-path's diagonal rate have always used (docs/math.md).

    torch's CPU ``randperm`` is a forward Fisher-Yates shuffle drawing ``random() % (n - i)``
    from an MT19937 seeded like numpy's legacy ``RandomState(seed)``; entry ``i`` is final
    after step ``i``, so ``count`` steps suffice."""
    bits = np.random.RandomState(seed)._bit_generator
    k = max(0, min(int(count), int(d_vocab)))
    raw = bits.random_raw(k)
    moved: dict[int, int] = {}
    out = np.empty(k, dtype=np.int64)
    for i in range(k):
        z = int(raw[i]) % (d_vocab - i) + i
        vi, vz = moved.get(i, i), moved.get(z, z)
        moved[i], moved[z] = vz, vi
        out[i] = vz
    return out


def rotary_profile(w: Any, layer: int, head: int, offsets: Sequence[int], *,
                   n_tokens: int = 256, seed: int = 0) -> np.ndarray:
    """Same-token QK score against offset: ``[len(offsets)]`` float32.

    The statistic: ``n_tokens`` distinct token ids drawn with ``seed`` (``token_sample``),
    their embedding rows ``e`` rescaled to norm ``√d_model`` (the scale a pre-norm hands to
    attention), and the mean over the sample of the unscaled attention score of ``e`` as the
    query and the same ``e`` as a key ``Δ`` positions earlier:
    ``profile[Δ] = mean_e  e W_Q R(Δ) W_Kᵀ eᵀ``. It shows how the head's preference for
    matching content decays or oscillates with distance; weights only (no biases).
    """
    cfg = layer_config(w.cfg, layer)
    require_rotary(cfg, _path(w))
    w_q, w_k = head_weight(w, layer, head, "W_Q"), head_weight(w, layer, head, "W_K")
    ids = token_sample(cfg.d_vocab, n_tokens, seed)
    e = w.embed_rows(ids)
    with np.errstate(all="ignore"):
        norms = np.sqrt(np.square(e).sum(-1, keepdims=True))
        e = e * (np.float32(cfg.d_model**0.5) / np.maximum(norms, np.float32(1e-12)))
        q, k = e @ w_q, e @ w_k  # [n, d_head]
        deltas = np.asarray(list(offsets), dtype=np.float32)
        q_rot = rope(q[None, :, :], deltas[:, None], cfg)  # [n_offsets, n, d_head]
        return (q_rot * k).sum(-1).mean(-1).astype(np.float32)
