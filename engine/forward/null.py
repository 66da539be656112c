"""The random-head null that calibrates the behavioural and sink scores (docs/math.md,
"Calibrated scores"): random heads read the clean model's stream, layer by layer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from headscope.engine.core.progress import Cancelled, check_cancelled
from headscope.engine.core.threads import one_lapack_thread
from headscope.engine.core.validation import NULL_SAMPLES
from headscope.engine.forward.sinks import delimiter_sink_mass, passes, sink_mass
from headscope.engine.model.weights import WeightSource, stored_kv

# -- the null ----------------------------------------------------------------------------------


def random_projections(rows: Tensor, d_head: int, norms: Sequence[float], samples: int,
                       gen: torch.Generator, rng: np.random.Generator) -> list[Tensor]:
    """``rows @ W`` ``[samples, N, d_head]`` (float32) of ``samples`` random heads reading
    ``rows [N, d]``, one set per norm of ``norms``: each ``W [d, d_head]`` i.i.d. standard
    Gaussian, rescaled to that Frobenius norm; seeded by ``gen`` (the normals) and ``rng``
    (a χ² per head).

    Drawn in the span of the rows when ``N < d`` (docs/math.md, "Calibrated scores"): with
    the Gram matrix ``G = rows rowsᵀ`` and its symmetric square root ``S = G^½``, ``rows @ W``
    has the law of ``S Z`` for ``Z [N, d_head]`` i.i.d. standard Gaussian (both are Gaussian
    with covariance ``G ⊗ I``), and ``‖Z‖²`` plus a χ² with ``(d − N)·d_head`` degrees of
    freedom has the law of ``‖W‖²`` jointly with it (``rows = U Σ Vᵀ``: ``Z = U Vᵀ W``; with
    rank ``r < N``, ``N − r`` of ``Z``'s dimensions stand in for as many outside the span). So
    ``N·d_head`` normals and one χ² per head give exactly the distribution of drawing all of
    ``W``: a 7B layer's 64 heads drew 2 × 33.5 M normals and formed two
    ``[N, 4096] @ [4096, 8192]`` products per batch; now ~2 × 2.7 M normals and an
    ``[N, N]`` product.

    ``G^½`` is the one square root that is a continuous function of the rows: a triangular
    factor (a QR of ``rowsᵀ``) picks, for rows that are dependent up to rounding (a repeated
    token's layer-0 stream, the same row up to 1e-7), a basis from the rounding itself, so the
    draw, and every z, moved with 1e-7 changes of the weights.
    """
    finite = torch.isfinite(rows).all(-1)
    if not bool(finite.all()):  # a NaN row would spoil the span of all: it projects to NaN alone
        found = random_projections(rows[finite], d_head, norms, samples, gen, rng)
        out = [torch.full((samples, rows.shape[0], d_head), math.nan) for _ in norms]
        for whole, part in zip(out, found, strict=True):
            whole[:, finite] = part
        return out
    n, d = rows.shape
    rows = rows.double()
    span = n < d
    root = gram_root(rows) if span else None
    out = []
    for norm in norms:
        inside = torch.randn(samples, n if span else d, d_head, generator=gen).double()
        if root is not None:
            outside = torch.from_numpy(rng.chisquare((d - n) * d_head, samples))
            projected = root @ inside
        else:  # no smaller span: W itself
            outside = torch.zeros(samples, dtype=torch.float64)
            projected = rows @ inside
        frobenius = (inside.square().sum((1, 2)) + outside).sqrt()
        out.append((projected * (norm / frobenius)[:, None, None]).float())
    return out


def gram_root(rows: Tensor) -> Tensor:
    """``(rows rowsᵀ)^½`` ``[N, N]`` (float64), the symmetric positive semi-definite root:
    eigenvalues that rounding made slightly negative count as 0.

    The eigendecomposition runs in numpy's LAPACK on one thread: torch's threaded ``eigh``
    of a 7B layer's ``[330, 330]`` Gram matrix took 1-4 CPU seconds on a busy 2-core box
    (its threads spin waiting on each other), one thread 0.02 s. The root is the same up to
    rounding: where rows are dependent (a repeated token's layer-0 stream), the near-zero
    eigenvalues are rounding, and their square roots move the root by ~``√ε₆₄ ≈ 1e-8`` of its
    largest entry in any LAPACK, torch's own on one thread against two included, which moves
    the float32 projections by at most about one unit in the last place."""
    rows = rows.double()
    gram = (rows @ rows.T).numpy()
    with one_lapack_thread():
        values, vectors = np.linalg.eigh(gram)
    values, vectors = torch.from_numpy(values), torch.from_numpy(vectors)
    return (vectors * values.clamp(min=0).sqrt()) @ vectors.T


def head_generators(seed: int) -> tuple[torch.Generator, np.random.Generator]:
    """The seeded generators of one layer's random heads (``random_projections``)."""
    return torch.Generator().manual_seed(seed), np.random.default_rng(seed)


def projected_patterns(q: Tensor, k: Tensor, scale: float, rotate: Callable[[Tensor], Tensor] | None,
                       causal: bool = True) -> Tensor:
    """Attention patterns ``[b, n, q, k]`` of heads whose queries and keys are ``q``, ``k``
    ``[b, n, p, d_head]`` (no biases); ``rotate`` applies RoPE to ``[b, n, p, d_head]``;
    ``causal`` masks the keys after each query (encoders: none)."""
    if rotate is not None:
        q, k = rotate(q), rotate(k)
    p = q.shape[-2]
    scores = q @ k.transpose(-1, -2) / scale
    if causal:
        scores = scores.masked_fill(torch.ones(p, p, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1)


def random_head_patterns(xs: Sequence[Tensor], d_head: int, norm_q: float, norm_k: float, scale: float,
                         rotate: Callable[[Tensor], Tensor] | None, seed: int,
                         samples: int = NULL_SAMPLES, causal: bool = True) -> list[Tensor]:
    """Attention patterns ``[b, samples, p, p]`` of the same random heads reading each stream
    of ``xs`` (``[b, p, d]`` each).

    Each random head has i.i.d. Gaussian ``W_Q``, ``W_K [d_model, d_head]`` (seeded) rescaled
    to Frobenius norms ``norm_q`` and ``norm_k`` (the softmax temperature depends on them), no
    biases; they are drawn in the span of every stream's rows at once (``random_projections``).
    """
    d = xs[0].shape[-1]
    rows = torch.cat([x.reshape(-1, d) for x in xs])
    q, k = random_projections(rows, d_head, (norm_q, norm_k), samples, *head_generators(seed))
    out, start = [], 0
    for x in xs:
        b, p, _ = x.shape

        def part(t: Tensor, b: int = b, p: int = p, start: int = start) -> Tensor:  # [b, S, p, e]
            return t[:, start : start + b * p].reshape(samples, b, p, d_head).transpose(0, 1)

        out.append(projected_patterns(part(q), part(k), scale, rotate, causal))
        start += b * p
    return out


# -- model-wide passes: sinks and the behavioural null -----------------------------------------

def _mean_finite_norm(weights: Tensor) -> float:
    """Mean Frobenius norm of the heads ``[H, d_model, d_head]`` whose norm is finite (a NaN
    head does not poison its layer's null); NaN if none is.

    Each head's squared norm is summed in float32 over its last dimension (``d_head`` terms,
    relative error at most ``d_head·2⁻²⁴``, 8e-6 at 128, ~1e-7 in practice), and those
    ``[H, d_model]`` partial sums in float64: ``vector_norm(dtype=float64)`` over the whole
    head converted every weight on the way and took 10x as long (at 7B, 64 of them per run).
    The norm only sets the scale of the random heads' float32 projections. A row whose
    float32 squares could overflow (an inf norm) or lose bits below float32's normal range
    (a norm under 2⁻⁴⁰; zero rows too) is summed in float64, as all were.

    A head read from an ``[out, in]`` weight is a view whose last dimension is strided (its
    ``d_model`` axis is the contiguous one): a float32 sum along a strided axis ran at 2 GB/s
    (26 ms for a 7B layer's ``W_Q``, 15× the contiguous sum). There, runs of ``d_head``
    consecutive elements of the contiguous axis are summed instead: the same number of terms
    per float32 sum, so the same bound."""
    parts = _runs(weights)  # [H, ..., d_head]: each head's elements, d_head to a float32 sum
    rows = torch.linalg.vector_norm(parts, dim=-1)
    squares = rows.double().square()
    risky = ~((rows > 2.0**-40) & torch.isfinite(rows))
    if bool(risky.any()):
        squares[risky] = parts[risky].double().square().sum(-1)
    norms = squares.flatten(1).sum(-1).sqrt()
    finite = norms[torch.isfinite(norms)]
    return float(finite.mean()) if finite.numel() else math.nan


def _runs(weights: Tensor) -> Tensor:
    """``weights [H, a, e]`` as ``[H, ..., e]`` runs of ``e`` elements each, every element in
    one run: the last axis itself where it is contiguous (or nothing better is), else ``e``-long
    runs along the contiguous axis ``a`` (a view, no copy)."""
    h, a, e = weights.shape
    if weights.stride(-1) == 1 or weights.stride(-2) != 1 or a % e:
        return weights
    return weights.transpose(-1, -2).reshape(h, e, a // e, e)


def layer_head_norms(w: WeightSource, layer: int) -> tuple[float, float]:
    """The mean Frobenius norms of layer ``layer``'s ``W_Q`` and ``W_K`` heads, the scale of
    its random heads. ``W_K`` repeats each stored head for its group's query heads
    (grouped-query attention, ``ModelConfig.kv_head_of``): the mean over the stored heads is
    the same mean, read from ``1/group`` of the weights (``stored_kv``: a 70B layer's 33 MB, not 268 MB)."""
    from headscope.engine.forward.torch_weights import torch_weights

    w = torch_weights(w)
    attn = f"blocks.{layer}.attn"
    return _mean_finite_norm(w.get(f"{attn}.W_Q")), _mean_finite_norm(stored_kv(w, f"{attn}.W_K"))


def behaviour_null(w: WeightSource, repeated: Tensor, natural: Sequence[Tensor], seed: int,
                   samples: int = NULL_SAMPLES,
                   delimiters: Sequence[Tensor] | None = None,
                   cancelled: Cancelled = None) -> dict[str, Tensor]:
    """``{name: [L, samples]}``: the behavioural scores of ``samples`` random heads per layer.

    Layer ``l``'s random heads (``random_head_patterns``: Gaussian ``W_Q``/``W_K`` rescaled
    to the mean Frobenius norms of the layer's real heads, seeded by ``seed + l``, drawn in
    the span of all the batches' rows) read the same normalised stream as the real heads,
    from the clean model. ``prev_token``,
    ``duplicate_token`` and ``induction`` are scored on ``repeated`` as ``behaviour_scores``
    scores them; ``attention_sink`` and ``delimiter_sink`` on ``repeated`` and ``natural``
    (``delimiters``: a mask per natural batch) as ``sink_scores``. ``cancelled()`` is
    checked between layers (``CancelledError``).
    """
    sums = NullSums(w, repeated, natural, seed, samples, delimiters, cancelled)
    passes(w, [repeated, *natural], sums)
    return sums.result()


class NullSums:
    """``behaviour_null``'s reduction, an ``on_block(batch_index, layer, x, pattern)`` for
    ``passes`` over ``[repeated, *natural]`` (the clean model's stream: ``x``; the real
    heads' ``pattern`` is not used); ``result()`` once every batch has run."""

    def __init__(self, w: WeightSource, repeated: Tensor, natural: Sequence[Tensor], seed: int,
                 samples: int = NULL_SAMPLES, delimiters: Sequence[Tensor] | None = None,
                 cancelled: Cancelled = None) -> None:
        from headscope.engine.forward.behaviour import detection_patterns
        from headscope.engine.forward.torch_weights import torch_weights

        cfg = w.cfg
        w = torch_weights(w)  # the layer's W_Q/W_K norms are read as tensors
        self.w, self.cfg, self.seed, self.samples, self.cancelled = w, cfg, seed, samples, cancelled
        self.detections = detection_patterns(repeated)
        self.n_batches = 1 + len(natural)
        self.masks: list[Tensor | None] = [None, *(delimiters or [None] * len(natural))]
        self.out = {name: torch.zeros(cfg.n_layers, samples)
                    for name in (*self.detections, "attention_sink", "delimiter_sink")}
        self.counted = torch.zeros(cfg.n_layers)
        # What the random heads of the current layer read, one entry per batch so far
        # (``passes`` runs every batch through a layer before the next): they are drawn
        # once per layer, in the span of all the batches' rows (``random_head_patterns``).
        self.inputs: list[Tensor] = []

    def _rotate_for(self, layer: int) -> Callable[[Tensor], Tensor] | None:
        from headscope.engine.forward.transformer import (
            layer_config,
            rotary,
            rotary_scale,
            torch_rotary_inv_freq,
        )

        if self.cfg.positional != "rotary":
            return None
        layer_cfg, path = layer_config(self.cfg, layer), getattr(self.w, "path", None)
        return lambda t: rotary(t, torch_rotary_inv_freq(layer_cfg, path, t.shape[-2]), rotary_scale(layer_cfg))

    def __call__(self, i: int, layer: int, x: Tensor, _pattern: Tensor) -> None:
        from headscope.engine.forward.transformer import attention_input

        check_cancelled(self.cancelled)
        self.inputs.append(attention_input(self.w, layer, x).float())
        if i + 1 < self.n_batches:
            return
        inputs, self.inputs = self.inputs, []
        norm_q, norm_k = layer_head_norms(self.w, layer)
        patterns = random_head_patterns(inputs, self.cfg.d_head, norm_q, norm_k, float(self.cfg.scale),
                                        self._rotate_for(layer), self.seed + layer, self.samples,
                                        causal=self.cfg.causal)
        for j, pattern in enumerate(patterns):
            self._reduce(j, layer, pattern)

    def _reduce(self, i: int, layer: int, pattern: Tensor) -> None:
        from headscope.engine.forward.behaviour import detect

        out = self.out
        out["attention_sink"][layer] += sink_mass(pattern) / self.n_batches
        mask = self.masks[i]
        if mask is not None:
            found = delimiter_sink_mass(pattern, mask, causal=self.cfg.causal)
            if not bool(found.isnan().all()):
                out["delimiter_sink"][layer] += found
                self.counted[layer] += 1
        if i == 0:
            for name, det in self.detections.items():
                out[name][layer] = detect(pattern, det)

    def result(self) -> dict[str, Tensor]:
        self.out["delimiter_sink"] /= self.counted[:, None]
        return self.out


