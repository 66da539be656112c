"""Compare the circuits of two checkpoints of the same architecture.

The question after pruning, distillation or more training: which heads kept their circuits?
Per head we compare the *circuits*, not the weights, so the answer does not depend on the
head's internal basis (``W_V M``, ``M⁻¹ W_O`` is the same head):

- ``ov_similarity``: normalised Frobenius inner product of the full OV circuits
  ``W_E OV W_U`` of A and B, ``⟨C_A, C_B⟩_F / (‖C_A‖_F ‖C_B‖_F)`` in [-1, 1];
- ``qk_similarity``: the same for the token QK circuits ``W_E QK W_Eᵀ``.

Both are taken in the *token* basis, which two models with the same tokenizer share even when
their residual streams are rotated or of different width. Everything is computed from the
factors: with ``G_E = W_E,Aᵀ W_E,B`` and ``G_U = W_U,A W_U,Bᵀ`` (``d_model × d_model``, once per
model pair), ``⟨A₁B₁, A₂B₂⟩_F = Σ (A₁ᵀA₂) ∘ (B₁B₂ᵀ)`` needs only ``d_head``-sized blocks; no
``vocab × vocab`` matrix is ever built.

The two models may differ in ``d_model`` and ``d_head`` (an original and a distilled copy):
only the layout (layers × heads) and the vocabulary must agree. When both models share
``d_model`` we also report principal angles between the heads' read subspaces (column spaces
of ``W_V``) and write subspaces (row spaces of ``W_O``) in the residual stream: the cosines of
the angles, 1 meaning the same subspace.

A head with NaN/inf weights gets NaN similarities (and NaN cosines; nothing non-finite reaches
an SVD) and ``nonfinite: true`` in its row; heads with finite weights near 1e19 are rescaled
per head by a power of two first (the similarities are scale-free), so they do not overflow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from headscope.engine.core.errors import InvalidRequestError
from headscope.engine.core.validation import (
    EDGE_THRESHOLD,
    SCORE_NAMES,
    WEIGHT_SCORE_NAMES,
)

if TYPE_CHECKING:
    import torch

    from headscope.engine.circuits.fast import NumpyWeights
    from headscope.engine.model.loading import Model
    from headscope.engine.model.weights import WeightSource
    from headscope.engine.sweeps.cluster import Cluster
    from headscope.engine.sweeps.compute import Progress
    from headscope.engine.sweeps.store import ResultStore

# The scores a diff compares (every head score but the duplicate-token one).
SCORE_KEYS = tuple(k for k in SCORE_NAMES if k != "duplicate_token_score")

@dataclass(frozen=True)
class CircuitSimilarity:
    """Per layer, ``[n_heads_A, n_heads_B]`` similarities of every head pair."""

    ov: torch.Tensor  # [L, H, H]
    qk: torch.Tensor  # [L, H, H]


def _stack(w: WeightSource, layer: int, name: str) -> torch.Tensor:
    """One layer's stacked head weights, each head rescaled by a power of two if its entries
    are huge (``factored.tame``; every similarity here is scale-free per head and factor)."""
    from headscope.engine.circuits.factored import tame

    return tame(w.get(f"blocks.{layer}.attn.{name}"))


def _pair_inner(a_cross: torch.Tensor, b_cross: torch.Tensor, n_heads: int) -> torch.Tensor:
    """``⟨A₁B₁, A₂B₂⟩`` for all head pairs from ``A₁ᵀA₂`` and ``B₁B₂ᵀ`` of stacked heads.

    ``a_cross``/``b_cross`` are ``[H·d_head_x, H·d_head_y]`` (the two models' ``d_head`` may
    differ); the (h1, h2) block of their elementwise product sums to the inner product of
    head h1's and head h2's circuits.
    """
    rows, cols = a_cross.shape
    prod = (a_cross * b_cross).reshape(n_heads, rows // n_heads, n_heads, cols // n_heads)
    return prod.sum(dim=(1, 3))


def _flat_heads(w_stack: torch.Tensor) -> torch.Tensor:
    """``[H, d_model, d_head]`` → ``[d_model, H·d_head]`` (heads side by side)."""
    n_heads, d_model, d_head = w_stack.shape
    return w_stack.permute(1, 0, 2).reshape(d_model, n_heads * d_head)


def _head_factors(w: WeightSource, layer: int, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's heads side by side, ``[d_model, H·d_head]`` each: ``(W_V, W_Oᵀ)`` for OV
    (``C_h = W_E W_V,h W_O,h W_U``), ``(W_Q, W_K)`` for QK (``C_h = W_E W_Q,h W_K,hᵀ W_Eᵀ``)."""
    if kind == "ov":
        return _flat_heads(_stack(w, layer, "W_V")), _flat_heads(
            _stack(w, layer, "W_O").transpose(1, 2)
        )
    return _flat_heads(_stack(w, layer, "W_Q")), _flat_heads(_stack(w, layer, "W_K"))


def _cross_inner(
    x: tuple[torch.Tensor, torch.Tensor],
    y: tuple[torch.Tensor, torch.Tensor],
    g_left: torch.Tensor,
    g_right: torch.Tensor,
    n_heads: int,
) -> torch.Tensor:
    """``⟨C_x[h1], C_y[h2]⟩_F`` for all head pairs of one layer, ``[H, H]``.

    With ``C = E L Rᵀ M``: ``⟨C_x, C_y⟩ = Σ (L_xᵀ G_left L_y) ∘ (R_xᵀ G_right R_y)`` where
    ``G_left = E_xᵀ E_y`` and ``G_right = M_x M_yᵀ`` (``d_model``-sized Gram matrices).
    """
    a_cross = x[0].T @ (g_left @ y[0])
    b_cross = x[1].T @ (g_right @ y[1])
    return _pair_inner(a_cross, b_cross, n_heads)


def _self_norms(
    x: tuple[torch.Tensor, torch.Tensor], g_left: torch.Tensor, g_right: torch.Tensor, n_heads: int
) -> torch.Tensor:
    """``‖C_x[h]‖_F`` for each head ``[H]``: only the diagonal blocks of :func:`_cross_inner`."""

    def diagonal_blocks(f: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        d_model = f.shape[0]
        f_heads = f.reshape(d_model, n_heads, -1).permute(1, 2, 0)  # [H, d_head, d_model]
        gf_heads = (g @ f).reshape(d_model, n_heads, -1).permute(1, 0, 2)  # [H, d_model, d_head]
        return f_heads @ gf_heads  # [H, d_head, d_head]

    sq = (diagonal_blocks(x[0], g_left) * diagonal_blocks(x[1], g_right)).sum(dim=(1, 2))
    return sq.clamp_min(0).sqrt()


def _check_comparable(wa: Any, wb: Any) -> None:
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


def circuit_similarity(wa: WeightSource, wb: WeightSource) -> CircuitSimilarity:
    """Token-basis OV and QK similarity of every head of A with every head of B, per layer."""
    import torch

    ca = wa.cfg
    _check_comparable(wa, wb)
    n_heads = ca.n_heads
    with torch.inference_mode():
        e_a, e_b = wa.get("embed.W_E"), wb.get("embed.W_E")
        u_a, u_b = wa.get("unembed.W_U"), wb.get("unembed.W_U")
        # The only vocab-sized work: six d_model × d_model Gram matrices, once per pair.
        g_e = {"ab": e_a.T @ e_b, "aa": e_a.T @ e_a, "bb": e_b.T @ e_b}
        g_u = {"ab": u_a @ u_b.T, "aa": u_a @ u_a.T, "bb": u_b @ u_b.T}
        sims: dict[str, list[torch.Tensor]] = {"ov": [], "qk": []}
        for layer in range(ca.n_layers):
            for kind, out in sims.items():
                g_right = g_u if kind == "ov" else g_e
                fa, fb = _head_factors(wa, layer, kind), _head_factors(wb, layer, kind)
                cross = _cross_inner(fa, fb, g_e["ab"], g_right["ab"], n_heads)
                norm_a = _self_norms(fa, g_e["aa"], g_right["aa"], n_heads)
                norm_b = _self_norms(fb, g_e["bb"], g_right["bb"], n_heads)
                out.append(_normalised(cross, norm_a[:, None] * norm_b[None, :]))
        return CircuitSimilarity(ov=torch.stack(sims["ov"]), qk=torch.stack(sims["qk"]))


def _normalised(cross: torch.Tensor, denom: torch.Tensor) -> torch.Tensor:
    """``cross / denom``; 0 for a zero circuit (``denom == 0``), NaN where either head is
    non-finite (NaN weights give NaN norms: the ratio is undefined, not 0)."""
    import torch

    ratio = torch.where(denom > 0, cross / denom, torch.zeros_like(cross))
    return torch.where(torch.isfinite(denom) & torch.isfinite(cross), ratio, math.nan)


def principal_cosines(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cosines of the principal angles between the column spaces of ``x`` and ``y``.

    In float64 (the matrices are ``d_model × d_head``); NaN cosines if either holds a NaN
    or an infinity, checked before the QR and the SVD, which must never see one.
    """
    import torch

    from headscope.engine.circuits.factored import is_finite

    k = min(x.shape[-1], y.shape[-1], x.shape[-2])
    if not (is_finite(x) and is_finite(y)):
        return torch.full((k,), math.nan)
    qx, _ = torch.linalg.qr(x.double())
    qy, _ = torch.linalg.qr(y.double())
    return torch.linalg.svdvals(qx.T @ qy).clamp(max=1.0).float()



# -- the same similarities in numpy (engine/fast.py's weights: no torch) --------------------


def _flat_heads_np(w_stack: np.ndarray) -> np.ndarray:
    """``_flat_heads`` in numpy: ``[H, d_model, d_head]`` → ``[d_model, H·d_head]``."""
    n_heads, d_model, d_head = w_stack.shape
    return w_stack.transpose(1, 0, 2).reshape(d_model, n_heads * d_head)


def _head_factors_np(w: NumpyWeights, layer: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """``_head_factors`` in numpy (each head tamed as ``factored.tame`` does)."""
    from headscope.engine.circuits.fast import _tamed

    def stack(name: str) -> np.ndarray:
        return _tamed(w.get(f"blocks.{layer}.attn.{name}"))

    if kind == "ov":
        return _flat_heads_np(stack("W_V")), _flat_heads_np(stack("W_O").swapaxes(1, 2))
    return _flat_heads_np(stack("W_Q")), _flat_heads_np(stack("W_K"))


def _pair_inner_np(a_cross: np.ndarray, b_cross: np.ndarray, n_heads: int) -> np.ndarray:
    rows, cols = a_cross.shape
    return (a_cross * b_cross).reshape(n_heads, rows // n_heads, n_heads, cols // n_heads).sum((1, 3))


def _self_norms_np(x: tuple[np.ndarray, np.ndarray], g_left: np.ndarray, g_right: np.ndarray,
                   n_heads: int) -> np.ndarray:
    def diagonal_blocks(f: np.ndarray, g: np.ndarray) -> np.ndarray:
        d_model = f.shape[0]
        f_heads = f.reshape(d_model, n_heads, -1).transpose(1, 2, 0)  # [H, d_head, d_model]
        gf_heads = (g @ f).reshape(d_model, n_heads, -1).transpose(1, 0, 2)  # [H, d_model, d_head]
        return f_heads @ gf_heads

    sq = (diagonal_blocks(x[0], g_left) * diagonal_blocks(x[1], g_right)).sum((1, 2))
    return np.sqrt(np.maximum(sq, 0))


def similarity_arrays(wa: NumpyWeights, wb: NumpyWeights) -> tuple[np.ndarray, np.ndarray]:
    """``circuit_similarity`` on ``engine.fast`` weights, in numpy: ``(ov, qk)``, ``[L, H, H]``
    each (the same Gram matrices and products; tests/test_diff.py holds them equal)."""
    _check_comparable(wa, wb)
    n_heads = wa.cfg.n_heads
    with np.errstate(all="ignore"):
        # read for the Gram matrices only: not kept (the explorer's compare mode runs this)
        e_a, e_b = wa.get("embed.W_E", keep=False), wb.get("embed.W_E", keep=False)
        u_a, u_b = wa.get("unembed.W_U", keep=False), wb.get("unembed.W_U", keep=False)
        same = wa is wb
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
                fa, fb = _head_factors_np(wa, layer, kind), _head_factors_np(wb, layer, kind)
                cross = _pair_inner_np(fa[0].T @ (g_e["ab"] @ fb[0]), fa[1].T @ (g_right["ab"] @ fb[1]),
                                       n_heads)
                norm_a = _self_norms_np(fa, g_e["aa"], g_right["aa"], n_heads)
                norm_b = norm_a if same else _self_norms_np(fb, g_e["bb"], g_right["bb"], n_heads)
                denom = norm_a[:, None] * norm_b[None, :]
                ratio = np.where(denom > 0, cross / np.where(denom > 0, denom, 1), 0)
                out.append(np.where(np.isfinite(denom) & np.isfinite(cross), ratio, np.nan)
                           .astype(np.float32))
    return np.stack(sims["ov"]), np.stack(sims["qk"])


def principal_cosines_np(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``principal_cosines`` of stacked pairs, ``x [H, n, ka]``, ``y [H, n, kb]``: the mean
    cosine of each pair ``[H]`` (float64 QR and SVD; NaN for a pair with a non-finite entry,
    which never reaches LAPACK)."""
    from headscope.engine.circuits.fast import _finite, one_lapack_thread

    finite = _finite(x) & _finite(y)
    x64 = np.where(finite[:, None, None], x, 0).astype(np.float64)
    y64 = np.where(finite[:, None, None], y, 0).astype(np.float64)
    with one_lapack_thread():
        qx, qy = np.linalg.qr(x64)[0], np.linalg.qr(y64)[0]
        s = np.linalg.svd(qx.swapaxes(-2, -1) @ qy, compute_uv=False)
    mean = np.minimum(s, 1.0).astype(np.float32).mean(-1)
    return np.where(finite, mean, np.nan)


def best_matching(similarity: list[list[float]]) -> list[int]:
    """Hungarian assignment maximising total similarity: ``match[i]`` is B's head for A's ``i``.

    O(n³) Kuhn–Munkres with potentials (n = heads per layer, at most a few dozen).
    """
    n = len(similarity)
    cost = [[-v for v in row] for row in similarity]
    inf = math.inf
    u, v = [0.0] * (n + 1), [0.0] * (n + 1)
    p, way = [0] * (n + 1), [0] * (n + 1)  # p[j]: row matched to column j (1-based)
    for i in range(1, n + 1):
        p[0], j0 = i, 0
        minv, used = [inf] * (n + 1), [False] * (n + 1)
        while True:
            used[j0] = True
            i0, delta, j1 = p[j0], inf, 0
            for j in range(1, n + 1):
                if not used[j]:
                    cur = cost[i0 - 1][j - 1] - u[i0] - v[j]
                    if cur < minv[j]:
                        minv[j], way[j] = cur, j0
                    if minv[j] < delta:
                        delta, j1 = minv[j], j
            for j in range(n + 1):
                if used[j]:
                    u[p[j]] += delta
                    v[j] -= delta
                else:
                    minv[j] -= delta
            j0 = j1
            if p[j0] == 0:
                break
        while j0:  # augment along the alternating path
            j1 = way[j0]
            p[j0] = p[j1]
            j0 = j1
    match = [0] * n
    for j in range(1, n + 1):
        match[p[j] - 1] = j - 1
    return match


@dataclass(frozen=True)
class ModelDiff:
    heads: list[dict[str, Any]]  # one row per head of A (with its matched head of B)
    matching: list[list[int]] | None  # per layer, B's head for each of A's heads (None: identity)
    composition: dict[str, dict[str, Any]]  # kind -> gained / lost / changed edges
    biggest_changes: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "heads": self.heads,
            "matching": self.matching,
            "composition": self.composition,
            "biggest_changes": self.biggest_changes,
        }


def diff_models(
    a: Model, b: Model, *, match_heads: bool = False, threshold: float = EDGE_THRESHOLD,
    seed: int = 0, store: ResultStore | None = None, progress: Progress = None,
    cluster: Cluster | None = None, behaviour: bool = True,
) -> ModelDiff:
    """Per-head score deltas and circuit similarities, and the composition-graph diff.

    With ``match_heads`` each layer's heads of B are first matched to A's by a Hungarian
    assignment on OV + QK similarity (for checkpoints from independent runs, where head
    numbering is arbitrary); otherwise head ``h`` of A is compared with head ``h`` of B.
    Composition edges count when their score exceeds the baseline by ``threshold``.
    ``store``: the on-disk results store both models' sweeps read and write
    (``engine.store``); ``progress(fraction)`` follows the whole diff. ``cluster``: both
    models' weight sweeps (copying, QK positivity, composition tiles) run there
    (``engine.cluster``); the similarities and the behavioural pass stay here.

    Everything but the behavioural scores is weight algebra, done in numpy where
    ``engine.fast`` applies (safetensors checkpoints; not with a ``cluster``, whose workers
    run the torch sweeps): ``behaviour=False`` compares only the weight scores
    (``WEIGHT_SCORE_NAMES``) and never imports torch; with the behavioural scores (the
    default) torch is imported for their forward pass only, on a background thread while
    the similarities are computed.
    """
    from headscope.engine.circuits.fast import numpy_weights
    from headscope.engine.forward.runtime import import_torch_in_background
    from headscope.engine.sweeps.compute import progress_span

    if progress is not None:
        progress(0.0)
    arrays_a, arrays_b = numpy_weights(a), numpy_weights(b)
    torch_free = arrays_a is not None and arrays_b is not None
    if behaviour and torch_free:
        import_torch_in_background()
    if torch_free:
        sim_ov, sim_qk = similarity_arrays(arrays_a, arrays_b)  # type: ignore[arg-type]
    else:
        from headscope.engine.forward.torch_weights import torch_weights

        sim = circuit_similarity(torch_weights(a.weights), torch_weights(b.weights))
        sim_ov, sim_qk = sim.ov.numpy(), sim.qk.numpy()
    n_layers, n_heads = a.cfg.n_layers, a.cfg.n_heads
    if match_heads:
        # NaN (non-finite heads) ranks below every real similarity sum (in [-2, 2])
        total = np.nan_to_num(sim_ov + sim_qk, nan=-4.0)
        matching = [best_matching(total[i].tolist()) for i in range(n_layers)]
    else:
        matching = [list(range(n_heads)) for _ in range(n_layers)]
    if progress is not None:
        progress(0.05)
    keys = SCORE_KEYS if behaviour else WEIGHT_SCORE_NAMES

    def table(model: Model, part: Progress) -> dict[str, np.ndarray]:
        """``keys`` and ``nonfinite``, ``[L, H]`` each: the sweeps (and stored parts) of
        ``heads --no-behaviour`` / ``heads``; z-scores are not compared (no calibration)."""
        from headscope.engine.sweeps.compute import score_table, weight_scores

        entry = None if store is None else store.for_model(model)
        if not behaviour:
            return weight_scores(model, part, store=entry)
        found = score_table(model, seed, part, store=entry, cluster=cluster)
        return {name: getattr(found, name) for name in (*keys, "nonfinite")}

    table_a = table(a, progress_span(progress, 0.05, 0.3))
    table_b = table(b, progress_span(progress, 0.3, 0.55))
    cosines = _subspace_cosines(a, b, matching, arrays_a, arrays_b) if a.cfg.d_model == b.cfg.d_model else None
    heads = []
    for layer in range(n_layers):
        for head in range(n_heads):
            hb = matching[layer][head]
            row: dict[str, Any] = {
                "layer": layer,
                "head": head,
                "matched_head": hb,
                "ov_similarity": float(sim_ov[layer, head, hb]),
                "qk_similarity": float(sim_qk[layer, head, hb]),
            }
            for key in keys:
                va, vb = float(table_a[key][layer, head]), float(table_b[key][layer, hb])
                row[f"{key}_a"] = va
                row[f"{key}_b"] = vb
                row[f"{key}_delta"] = vb - va
            if cosines is not None:
                row["read_subspace_cos"] = float(cosines[0][layer, head])
                row["write_subspace_cos"] = float(cosines[1][layer, head])
            # NaN/inf or overflowing weights in either head: its numbers are flagged
            row["nonfinite"] = bool(table_a["nonfinite"][layer, head] or table_b["nonfinite"][layer, hb]) or not (
                math.isfinite(row["ov_similarity"]) and math.isfinite(row["qk_similarity"])
            )
            row["change"] = _change_size(row, keys)  # how much the head changed: ranks and colours
            heads.append(row)
    composition = {
        kind: _composition_diff(a, b, kind, matching, threshold, seed, store,
                                progress_span(progress, 0.55 + 0.15 * i, 0.7 + 0.15 * i), cluster)
        for i, kind in enumerate("qkv")
    }
    # Changes equal to 1e-6 are float noise: keep those in layer/head order (stable output);
    # an undefined (NaN) change sorts last.
    biggest = sorted(heads, key=lambda r: (math.isnan(r["change"]), -round(r["change"], 6)
                                           if math.isfinite(r["change"]) else 0.0,
                                           r["layer"], r["head"]))[:10]
    if progress is not None:
        progress(1.0)
    return ModelDiff(
        heads=heads,
        matching=matching if match_heads else None,
        composition=composition,
        biggest_changes=[
            {"layer": r["layer"], "head": r["head"], "change": r["change"], **_summary(r, keys)}
            for r in biggest
        ],
    )


def _subspace_cosines(a: Model, b: Model, matching: list[list[int]], arrays_a: NumpyWeights | None,
                      arrays_b: NumpyWeights | None) -> tuple[np.ndarray, np.ndarray]:
    """``[L, H]`` mean principal cosines of each head's read (``W_V``) and write (``W_Oᵀ``)
    subspaces with its matched head of B (models of the same ``d_model``)."""
    n_layers, n_heads = a.cfg.n_layers, a.cfg.n_heads
    read, write = np.zeros((n_layers, n_heads)), np.zeros((n_layers, n_heads))
    for layer in range(n_layers):
        pre, hb = f"blocks.{layer}.attn", matching[layer]
        if arrays_a is not None and arrays_b is not None:
            read[layer] = principal_cosines_np(arrays_a.get(f"{pre}.W_V"), arrays_b.get(f"{pre}.W_V")[hb])
            write[layer] = principal_cosines_np(arrays_a.get(f"{pre}.W_O").swapaxes(-2, -1),
                                                arrays_b.get(f"{pre}.W_O")[hb].swapaxes(-2, -1))
            continue
        from headscope.engine.forward.torch_weights import torch_weights

        wa, wb = torch_weights(a.weights), torch_weights(b.weights)
        for head in range(n_heads):
            read[layer, head] = float(principal_cosines(
                wa.get_head(f"{pre}.W_V", head), wb.get_head(f"{pre}.W_V", hb[head])).mean())
            write[layer, head] = float(principal_cosines(
                wa.get_head(f"{pre}.W_O", head).T, wb.get_head(f"{pre}.W_O", hb[head]).T).mean())
    return read, write


def _change_size(row: dict[str, Any], keys: tuple[str, ...] = SCORE_KEYS) -> float:
    """How much a head changed: lost circuit similarity, or the largest score delta; only
    the finite ones count (NaN if none is)."""
    sims = [row[k] for k in ("ov_similarity", "qk_similarity") if math.isfinite(row[k])]
    deltas = [abs(row[f"{k}_delta"]) for k in keys if math.isfinite(row[f"{k}_delta"])]
    parts = ([1.0 - min(sims)] if sims else []) + deltas
    return max(parts) if parts else math.nan


def _summary(row: dict[str, Any], keys: tuple[str, ...] = SCORE_KEYS) -> dict[str, Any]:
    return {
        "ov_similarity": row["ov_similarity"],
        "qk_similarity": row["qk_similarity"],
        **{f"{k}_delta": row[f"{k}_delta"] for k in keys},
    }


def _composition_diff(
    a: Model, b: Model, kind: str, matching: list[list[int]], threshold: float, seed: int,
    store: ResultStore | None = None, progress: Progress = None, cluster: Cluster | None = None,
) -> dict[str, Any]:
    from headscope.engine.sweeps.compute import composition, progress_span

    def scores_of(model: Model, part: Progress) -> Any:
        # The `composition` command's own sweep (same stored tiles, same numbers).
        entry = None if store is None else store.for_model(model)
        return composition(model, kind, seed=seed, progress=part, store=entry, cluster=cluster)

    ra, rb = scores_of(a, progress_span(progress, 0.0, 0.5)), scores_of(b, progress_span(progress, 0.5, 1.0))
    # A pruned (all-zero) or non-finite head has an undefined (NaN) ratio; for the graph
    # diff it composes with nothing: score 0, so its edges show up as lost or gained.
    above_a = np.nan_to_num(ra.scores, nan=0.0) - ra.baseline
    above_b = np.nan_to_num(rb.scores, nan=0.0) - rb.baseline
    return {
        "baseline_a": float(ra.baseline),
        "baseline_b": float(rb.baseline),
        "threshold": threshold,
        **edge_changes(above_a, above_b, matching, threshold),
    }


def edge_changes(
    above_a: Any, above_b: Any, matching: list[list[int]], threshold: float
) -> dict[str, list[dict[str, Any]]]:
    """The composition-graph diff: ``gained``, ``lost`` and ``changed`` edges, biggest
    ``|b − a|`` first, from the scores above baseline ``[L, H, L, H]`` of A and of B (any
    array indexable by four ints); B's heads are taken through ``matching``."""
    n_layers, n_heads = len(matching), len(matching[0]) if matching else 0
    gained, lost, changed = [], [], []
    for l1 in range(n_layers):
        for h1 in range(n_heads):
            for l2 in range(l1 + 1, n_layers):
                for h2 in range(n_heads):
                    va = float(above_a[l1, h1, l2, h2])
                    vb = float(above_b[l1, matching[l1][h1], l2, matching[l2][h2]])
                    edge = {
                        "source": [l1, h1],
                        "target": [l2, h2],
                        "a": va,
                        "b": vb,
                        "delta": vb - va,
                    }
                    if va > threshold >= vb:
                        lost.append(edge)
                    elif vb > threshold >= va:
                        gained.append(edge)
                    elif abs(vb - va) > threshold:
                        changed.append(edge)
    for edges in (gained, lost, changed):
        edges.sort(key=lambda e: -abs(e["delta"]))
    return {"gained": gained, "lost": lost, "changed": changed}
