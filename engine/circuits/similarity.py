"""Circuit similarity of two checkpoints' heads (docs/math.md, "Comparing two checkpoints").

Per head pair, the normalised Frobenius inner product ``⟨C_A, C_B⟩_F / (‖C_A‖_F ‖C_B‖_F)`` of
the full OV circuits ``W_E OV W_U`` and of the token QK circuits ``W_E QK W_Eᵀ``, in the token
basis, which two models with one tokenizer share even when their residual streams differ.
With ``G_E = W_E,Aᵀ W_E,B`` and ``G_U = W_U,A W_U,Bᵀ`` computed once,
``⟨A₁B₁, A₂B₂⟩_F = Σ (A₁ᵀA₂) ∘ (B₁B₂ᵀ)`` needs only ``d_head``-sized blocks; no
``vocab × vocab`` matrix is built. The similarity is invariant to a head's internal basis
(``W_V M``, ``M⁻¹ W_O`` is the same head) and to a positive scale of each factor, so huge
heads are tamed first; a head with NaN/inf weights gets NaN and never reaches LAPACK.

``principal_cosines``: the mean cosine of the principal angles between two heads' read
(``W_V``) or write (``W_Oᵀ``) subspaces, when the models share ``d_model``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from headscope.engine.core.errors import InvalidRequestError
from headscope.engine.core.numeric import finite_matrices, tame
from headscope.engine.core.threads import one_lapack_thread

__all__ = ["check_comparable", "circuit_similarity", "principal_cosines"]


def check_comparable(wa: Any, wb: Any) -> None:
    """Same head layout and vocabulary, or an ``InvalidRequestError`` naming both."""
    ca, cb = wa.cfg, wb.cfg
    path_a, path_b = getattr(wa, "path", None), getattr(wb, "path", None)
    if (ca.n_layers, ca.n_heads) != (cb.n_layers, cb.n_heads):
        raise InvalidRequestError(
            path_a,
            f"cannot compare with {path_b}: different head layouts: {ca.n_layers}×{ca.n_heads} "
            f"vs {cb.n_layers}×{cb.n_heads} (layers × heads); only models with the same layout "
            "can be compared head by head",
        )
    if ca.d_vocab != cb.d_vocab:
        raise InvalidRequestError(
            path_a,
            f"cannot compare with {path_b}: different vocabularies ({ca.d_vocab} vs "
            f"{cb.d_vocab} tokens): the token basis needs identical tokenizers",
        )


def _flat_heads(w_stack: np.ndarray) -> np.ndarray:
    """``[H, d_model, d_head]`` → ``[d_model, H·d_head]`` (heads side by side)."""
    n_heads, d_model, d_head = w_stack.shape
    return w_stack.transpose(1, 0, 2).reshape(d_model, n_heads * d_head)


def _head_factors(w: Any, layer: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """The layer's heads side by side, ``[d_model, H·d_head]`` each, each head tamed:
    ``(W_V, W_Oᵀ)`` for OV (``C_h = W_E W_V,h W_O,h W_U``), ``(W_Q, W_K)`` for QK
    (``C_h = W_E W_Q,h W_K,hᵀ W_Eᵀ``)."""

    def stack(name: str) -> np.ndarray:
        return tame(w.get(f"blocks.{layer}.attn.{name}"))

    if kind == "ov":
        return _flat_heads(stack("W_V")), _flat_heads(stack("W_O").swapaxes(1, 2))
    return _flat_heads(stack("W_Q")), _flat_heads(stack("W_K"))


def _pair_inner(a_cross: np.ndarray, b_cross: np.ndarray, n_heads: int) -> np.ndarray:
    """``⟨A₁B₁, A₂B₂⟩`` for all head pairs from ``A₁ᵀA₂`` and ``B₁B₂ᵀ`` of stacked heads
    ``[H·d_head_x, H·d_head_y]``: the (h1, h2) block of their elementwise product sums to the
    inner product of head h1's and head h2's circuits."""
    rows, cols = a_cross.shape
    return (a_cross * b_cross).reshape(n_heads, rows // n_heads, n_heads, cols // n_heads).sum((1, 3))


def _self_norms(x: tuple[np.ndarray, np.ndarray], g_left: np.ndarray, g_right: np.ndarray,
                n_heads: int) -> np.ndarray:
    """``‖C_x[h]‖_F`` for each head ``[H]``: only the diagonal blocks of the cross products."""

    def diagonal_blocks(f: np.ndarray, g: np.ndarray) -> np.ndarray:
        d_model = f.shape[0]
        f_heads = f.reshape(d_model, n_heads, -1).transpose(1, 2, 0)  # [H, d_head, d_model]
        gf_heads = (g @ f).reshape(d_model, n_heads, -1).transpose(1, 0, 2)  # [H, d_model, d_head]
        return f_heads @ gf_heads

    sq = (diagonal_blocks(x[0], g_left) * diagonal_blocks(x[1], g_right)).sum((1, 2))
    return np.sqrt(np.maximum(sq, 0))


def circuit_similarity(wa: Any, wb: Any) -> tuple[np.ndarray, np.ndarray]:
    """Token-basis ``(ov, qk)`` similarity of every head of A with every head of B, per layer:
    ``[L, H_A, H_B]`` float32 each; 0 for a zero circuit, NaN where a head is non-finite."""
    check_comparable(wa, wb)
    n_heads = wa.cfg.n_heads
    with np.errstate(all="ignore"):
        # read for the Gram matrices only: not kept (the explorer's compare mode runs this)
        e_a, e_b = _once(wa, "embed.W_E"), _once(wb, "embed.W_E")
        u_a, u_b = _once(wa, "unembed.W_U"), _once(wb, "unembed.W_U")
        same = wa is wb
        # The only vocab-sized work: six d_model × d_model Gram matrices, once per pair.
        g_e = {"ab": e_a.T @ e_b}
        g_e["aa"] = g_e["ab"] if same else e_a.T @ e_a
        g_e["bb"] = g_e["ab"] if same else e_b.T @ e_b
        g_u = {"ab": u_a @ u_b.T}
        g_u["aa"] = g_u["ab"] if same else u_a @ u_a.T
        g_u["bb"] = g_u["ab"] if same else u_b @ u_b.T
        del e_a, e_b, u_a, u_b  # only the Gram matrices from here on
        sims: dict[str, list[np.ndarray]] = {"ov": [], "qk": []}
        for layer in range(wa.cfg.n_layers):
            for kind, out in sims.items():
                g_right = g_u if kind == "ov" else g_e
                fa, fb = _head_factors(wa, layer, kind), _head_factors(wb, layer, kind)
                cross = _pair_inner(fa[0].T @ (g_e["ab"] @ fb[0]), fa[1].T @ (g_right["ab"] @ fb[1]),
                                    n_heads)
                norm_a = _self_norms(fa, g_e["aa"], g_right["aa"], n_heads)
                norm_b = norm_a if same else _self_norms(fb, g_e["bb"], g_right["bb"], n_heads)
                denom = norm_a[:, None] * norm_b[None, :]
                ratio = np.where(denom > 0, cross / np.where(denom > 0, denom, 1), 0)
                out.append(np.where(np.isfinite(denom) & np.isfinite(cross), ratio, np.nan)
                           .astype(np.float32))
    return np.stack(sims["ov"]), np.stack(sims["qk"])


def _once(w: Any, name: str) -> np.ndarray:
    """``w.get(name)``, not kept in ``w``'s cache where the reader allows it."""
    try:
        return w.get(name, keep=False)
    except TypeError:
        return w.get(name)


def principal_cosines(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The mean cosine of the principal angles between the column spaces of each stacked pair,
    ``x [H, n, ka]``, ``y [H, n, kb]`` -> ``[H]`` (float64 QR and SVD; NaN for a pair with a
    non-finite entry, which never reaches LAPACK)."""
    finite = finite_matrices(x) & finite_matrices(y)
    x64 = np.where(finite[:, None, None], x, 0).astype(np.float64)
    y64 = np.where(finite[:, None, None], y, 0).astype(np.float64)
    with one_lapack_thread():
        qx, qy = np.linalg.qr(x64)[0], np.linalg.qr(y64)[0]
        s = np.linalg.svd(qx.swapaxes(-2, -1) @ qy, compute_uv=False)
    mean = np.minimum(s, 1.0).astype(np.float32).mean(-1)
    return np.where(finite, mean, np.nan)
