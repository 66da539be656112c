"""Reading a head (docs/math.md, "Reading a head"): singular directions as tokens, virtual
heads along composition paths, attention sinks (on the first token and on delimiters), and
the null that calibrates the scores.

Pure torch functions on a ``WeightSource`` and ``FactoredMatrix``; nothing here forms a
``d_vocab × d_vocab`` matrix (SVDs and spectra come from the ``d_head``-sized factors).
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from headscope.engine.circuits.factored import FactoredMatrix, is_finite
from headscope.engine.core.errors import CancelledError
from headscope.engine.core.validation import NULL_SAMPLES
from headscope.engine.model.weights import WeightSource

__all__ = [
    "NULL_SAMPLES",
    "SINK_SKIP",
    "Directions",
    "delimiter_sink_mass",
    "head_generators",
    "is_delimiter",
    "k_path",
    "null_spectral_scores",
    "overlap",
    "projected_patterns",
    "random_head_patterns",
    "random_projections",
    "signed_directions",
    "sink_mass",
    "top_by_magnitude",
    "virtual_ov",
]

SINK_SKIP = 4  # query positions 0..SINK_SKIP-1 are left out of the sink score


# -- singular directions ---------------------------------------------------------------------


@dataclass(frozen=True)
class Directions:
    """The top ``k`` singular triplets of a circuit: ``u [ldim, k]``, ``s [k]``, ``v [rdim, k]``."""

    u: Tensor
    s: Tensor
    v: Tensor


def signed_directions(fm: FactoredMatrix, k: int) -> Directions:
    """Top ``k`` singular triplets of ``fm`` (``FactoredMatrix.svd``, from the factors), with
    the sign fixed so each ``u`` column's largest-magnitude entry is positive (``u s vᵀ`` is
    unchanged when ``u`` and ``v`` flip together)."""
    u, s, vh = fm.svd()
    k = max(0, min(int(k), s.shape[-1]))
    u, s, v = u[:, :k], s[:k], vh[:k].T
    peak = u.gather(0, u.abs().argmax(0, keepdim=True))  # [1, k]
    sign = torch.where(peak < 0, -1.0, 1.0).to(u.dtype)
    return Directions(u * sign, s, v * sign)


def top_by_magnitude(vector: Tensor, top: int) -> tuple[list[int], list[float]]:
    """Ids and signed values of the ``top`` entries of largest ``|value|``, largest first."""
    top = max(0, min(int(top), vector.shape[0]))
    idx = vector.abs().topk(top).indices
    return [int(i) for i in idx], [float(vector[i]) for i in idx]


def overlap(in_ids: Sequence[int], in_values: Sequence[float],
            out_ids: Sequence[int], out_values: Sequence[float]) -> float:
    """Signed overlap of a direction's top in- and out-tokens, in [-1, 1].

    (tokens in both lists with the same sign − those with opposite signs) / len(in list):
    1 when the direction reads and writes the same tokens the same way (copying), −1 when
    it writes them negated, 0 when the lists share nothing. NaN for empty lists.
    """
    if not in_ids:
        return math.nan
    out = dict(zip(out_ids, out_values, strict=True))
    total = sum(math.copysign(1.0, v * out[t]) for t, v in zip(in_ids, in_values, strict=True)
                if t in out and v * out[t] != 0)
    return total / len(in_ids)


# -- virtual heads -----------------------------------------------------------------------------


def _head(w: WeightSource, layer: int, head: int, name: str) -> Tensor:
    return w.get_head(f"blocks.{layer}.attn.{name}", head)


def virtual_ov(w: WeightSource, a: tuple[int, int], b: tuple[int, int]) -> FactoredMatrix:
    """The V-composition virtual full OV circuit ``W_E OV_A OV_B W_U`` [source token, output
    token], kept factored through ``d_head``: ``(W_E W_V^A) (W_O^A W_V^B) (W_O^B W_U)``."""
    (la, ha), (lb, hb) = a, b
    middle = _head(w, la, ha, "W_O") @ _head(w, lb, hb, "W_V")  # [d_head, d_head]
    left = w.get("embed.W_E") @ _head(w, la, ha, "W_V")  # [d_vocab, d_head]
    right = _head(w, lb, hb, "W_O") @ w.get("unembed.W_U")  # [d_head, d_vocab]
    return FactoredMatrix(left @ middle, right)


def k_path(w: WeightSource, a: tuple[int, int], b: tuple[int, int]) -> FactoredMatrix:
    """The K-composition path ``W_E QK_B (W_E OV_A)ᵀ`` [query token, key-side token]: how much
    a query token attends to a position whose *earlier head A* moved token ``t`` there.

    ``= (W_E W_Q^B) (W_E W_V^A W_O^A W_K^B)ᵀ``; for an induction mechanism (A a previous-token
    head) it is the query token against the token *before* the key, and its diagonal stands out.
    """
    (la, ha), (lb, hb) = a, b
    w_e = w.get("embed.W_E")
    query = w_e @ _head(w, lb, hb, "W_Q")  # [d_vocab, d_head]
    key = (w_e @ _head(w, la, ha, "W_V")) @ (_head(w, la, ha, "W_O") @ _head(w, lb, hb, "W_K"))
    return FactoredMatrix(query, key.T)


# -- attention sinks ---------------------------------------------------------------------------


def sink_mass(pattern: Tensor, skip: int = SINK_SKIP) -> Tensor:
    """``pattern [b, h, q, k]`` -> ``[h]``: mean attention to key 0 over queries ``q >= skip``
    (all queries if the sequence is not longer than ``skip``) and over the batch."""
    q = pattern.shape[-2]
    start = skip if q > skip else 0
    return pattern[:, :, start:, 0].float().mean((0, 2))


# Special tokens that end or separate text, by their usual spellings (prompts are encoded
# without special tokens, so these count only where a prompt spells them out).
SPECIAL_DELIMITERS = frozenset({
    "<s>", "</s>", "<bos>", "<eos>", "<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>",
    "<|eot_id|>", "<|im_start|>", "<|im_end|>", "[CLS]", "[SEP]",
})


def is_delimiter(text: str) -> bool:
    """Whether a token's text is a delimiter: whitespace only (a newline, a space), or
    punctuation only (Unicode category P*: ``.`` ``,`` ``?`` ``"`` ``)``, once whitespace is
    removed: `` ,`` and ``.\n`` count), or one of ``SPECIAL_DELIMITERS`` (BOS/EOS/SEP)."""
    if text in SPECIAL_DELIMITERS:
        return True
    core = "".join(text.split())
    return all(unicodedata.category(c).startswith("P") for c in core)


def delimiter_sink_mass(pattern: Tensor, delimiter: Tensor, skip: int = SINK_SKIP,
                        causal: bool = True) -> Tensor:
    """``pattern [b, h, q, k]``, ``delimiter [b, k]`` (bool) -> ``[h]``: the attention mass on
    the delimiter positions ``1 ≤ k < q`` (neither the first token, which ``sink_mass``
    counts, nor the query itself; an encoder's ``k > q`` too), averaged over the queries
    ``q >= skip`` that have at least one such position and over the batch; NaN for every head
    if no query has one."""
    n = pattern.shape[-1]
    others = torch.ones(n, n, dtype=torch.bool)
    others = others.tril(-1) if causal else others & ~torch.eye(n, dtype=torch.bool)
    others[:, 0] = False  # the first token is sink_mass's
    keys = delimiter.bool()[:, None, :] & others[None]  # [b, q, k]
    rows = keys.any(-1)  # [b, q]
    if n > skip:
        rows[:, :skip] = False
    if not bool(rows.any()):
        return torch.full((pattern.shape[1],), math.nan)
    mass = (pattern.float() * keys[:, None].float()).sum(-1)  # [b, h, q]
    return (mass * rows[:, None].float()).sum((0, 2)) / rows.sum()


# -- the null ----------------------------------------------------------------------------------


def null_spectral_scores(middle: Tensor, d_head: int, seed: int,
                         samples: int = NULL_SAMPLES) -> Tensor:
    """``[samples]``: ``Σ Re λ / Σ |λ|`` of random heads' token circuits.

    A random head is ``X``, ``Y [d_model, d_head]`` i.i.d. standard Gaussian (seeded); its
    token circuit ``(W_E X)(Yᵀ W_U)`` (OV, ``middle = W_U W_E``) or ``(W_E X)(W_E Y)ᵀ`` (QK,
    ``middle = W_Eᵀ W_E``) has the non-zero eigenvalues of ``Yᵀ middle X``. The score is
    scale free in each factor, so matching a head's norms changes nothing.
    """
    d_model = middle.shape[0]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, d_model, d_head, generator=g)
    y = torch.randn(samples, d_model, d_head, generator=g)
    # float32 products, as the real heads' scores are formed (engine.fast); at 7B the float64
    # ones were 2 × 275 GFLOP
    small = y.transpose(-2, -1) @ middle.float() @ x  # [S, d_head, d_head]
    if not is_finite(small):  # NaN/inf embeddings: eigvals on a NaN matrix kills the process
        return torch.full((samples,), math.nan)
    eig = torch.linalg.eigvals(small.double())
    return (eig.real.sum(-1) / eig.abs().sum(-1)).float()


def random_projections(rows: Tensor, d_head: int, norms: Sequence[float], samples: int,
                       gen: torch.Generator, rng: np.random.Generator) -> list[Tensor]:
    """``rows @ W`` ``[samples, N, d_head]`` (float32) of ``samples`` random heads reading
    ``rows [N, d]``, one set per norm of ``norms``: each ``W [d, d_head]`` i.i.d. standard
    Gaussian, rescaled to that Frobenius norm; seeded by ``gen`` (the normals) and ``rng``
    (a χ² per head).

    Drawn in the span of the rows when ``N < d`` (docs/math.md, "Calibrated scores"): with
    ``rowsᵀ = Q R`` (``Q [d, N]``, orthonormal columns), ``rows @ W = Rᵀ (Qᵀ W)``, where
    ``Qᵀ W`` is itself i.i.d. standard Gaussian ``[N, d_head]``, independent of the part of
    ``W`` outside the span, whose squared norm (all the rescaling needs of it) is χ² with
    ``(d − N)·d_head`` degrees of freedom. So ``N·d_head`` normals and one χ² per head give
    exactly the distribution of drawing all of ``W``: a 7B layer's 64 heads drew 2 × 33.5 M
    normals and formed two ``[N, 4096] @ [4096, 8192]`` products per batch; now ~2 × 2.7 M
    normals and an ``[N, N]`` product.
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
    r = torch.linalg.qr(rows.T, mode="r")[1] if span else None  # rows = rᵀ Qᵀ
    out = []
    for norm in norms:
        inside = torch.randn(samples, n if span else d, d_head, generator=gen).double()
        if r is not None:
            outside = torch.from_numpy(rng.chisquare((d - n) * d_head, samples))
            projected = r.T @ inside
        else:  # no smaller span: W itself
            outside = torch.zeros(samples, dtype=torch.float64)
            projected = rows @ inside
        frobenius = (inside.square().sum((1, 2)) + outside).sqrt()
        out.append((projected * (norm / frobenius)[:, None, None]).float())
    return out


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

# Natural text for the sink score (encoded with the model's tokenizer where it has one).
NATURAL_PROMPTS = (
    "When Mary and John went to the store , John gave a drink to Mary .",
    "The cat sat on the mat and looked at the dog , and the dog looked back at the cat .",
    "On Monday the old man walked to the river with his small red boat .",
    "In the morning we read the news , then we went out to buy bread and milk .",
)


def passes(w: WeightSource, batches: Sequence[Tensor],
           on_block: Callable[[int, int, Tensor, Tensor], None],
           after_layer: Callable[[int], None] | None = None) -> None:
    """Run the ``[b, p]`` token batches through the model side by side, layer by layer
    (``forward.blocks_together``: each layer's weights are read once for all of them);
    ``on_block(batch_index, layer, x_in, pattern)`` sees every layer's input stream and
    pattern of every batch, ``after_layer(layer)`` runs once each layer is done."""
    from headscope.engine.forward.transformer import blocks_together, embed

    with torch.inference_mode():
        blocks_together(w, [embed(w, tokens) for tokens in batches], on_block=on_block,
                        after_layer=after_layer)


def sink_scores(w: WeightSource, batches: Sequence[Tensor],
                delimiters: Sequence[Tensor | None], skip: int = SINK_SKIP
                ) -> tuple[Tensor, Tensor]:
    """``([L, H], [L, H])`` in one pass over the batches: ``sink_mass`` averaged over every
    batch, and ``delimiter_sink_mass`` averaged over the batches with a ``delimiters [b, p]``
    mask (``None``: a batch without one) that have a query to score (NaN if none has)."""
    sums = SinkSums(w.cfg, len(batches), delimiters, skip)
    passes(w, batches, sums)
    return sums.result()


class SinkSums:
    """``sink_scores``' reduction, an ``on_block(batch_index, layer, x, pattern)`` for
    ``passes``; ``result()`` once every batch has run."""

    def __init__(self, cfg: Any, n_batches: int, delimiters: Sequence[Tensor | None],
                 skip: int = SINK_SKIP) -> None:
        self.cfg, self.n_batches, self.delimiters, self.skip = cfg, n_batches, delimiters, skip
        self.first = torch.zeros(cfg.n_layers, cfg.n_heads)
        self.delim = torch.zeros(cfg.n_layers, cfg.n_heads)
        self.counted = torch.zeros(cfg.n_layers)

    def __call__(self, i: int, layer: int, _x: Tensor, pattern: Tensor) -> None:
        self.first[layer] += sink_mass(pattern, self.skip) / self.n_batches
        if self.delimiters[i] is not None:
            found = delimiter_sink_mass(pattern, self.delimiters[i], self.skip, self.cfg.causal)
            if not bool(found.isnan().all()):
                self.delim[layer] += found
                self.counted[layer] += 1

    def result(self) -> tuple[Tensor, Tensor]:
        return self.first, self.delim / self.counted[:, None]  # 0/0: NaN where no batch had a delimiter


def _mean_finite_norm(weights: Tensor) -> float:
    """Mean Frobenius norm of the heads ``[H, d_model, d_head]`` whose norm is finite (a NaN
    head does not poison its layer's null); NaN if none is."""
    norms = torch.linalg.vector_norm(weights, dim=(-2, -1), dtype=torch.float64)  # no float64 copy
    finite = norms[torch.isfinite(norms)]
    return float(finite.mean()) if finite.numel() else math.nan


def behaviour_null(w: WeightSource, repeated: Tensor, natural: Sequence[Tensor], seed: int,
                   samples: int = NULL_SAMPLES,
                   delimiters: Sequence[Tensor] | None = None,
                   cancelled: Callable[[], bool] | None = None) -> dict[str, Tensor]:
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
                 cancelled: Callable[[], bool] | None = None) -> None:
        from headscope.engine.circuits.scores import detection_patterns
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
            rotary_inv_freq,
            rotary_scale,
        )

        if self.cfg.positional != "rotary":
            return None
        layer_cfg, path = layer_config(self.cfg, layer), getattr(self.w, "path", None)
        return lambda t: rotary(t, rotary_inv_freq(layer_cfg, path, t.shape[-2]), rotary_scale(layer_cfg))

    def __call__(self, i: int, layer: int, x: Tensor, _pattern: Tensor) -> None:
        from headscope.engine.forward.transformer import attention_input

        if self.cancelled is not None and self.cancelled():
            raise CancelledError()
        self.inputs.append(attention_input(self.w, layer, x).float())
        if i + 1 < self.n_batches:
            return
        inputs, self.inputs = self.inputs, []
        norm_q, norm_k = (_mean_finite_norm(self.w.get(f"blocks.{layer}.attn.{n}")) for n in ("W_Q", "W_K"))
        patterns = random_head_patterns(inputs, self.cfg.d_head, norm_q, norm_k, float(self.cfg.scale),
                                        self._rotate_for(layer), self.seed + layer, self.samples,
                                        causal=self.cfg.causal)
        for j, pattern in enumerate(patterns):
            self._reduce(j, layer, pattern)

    def _reduce(self, i: int, layer: int, pattern: Tensor) -> None:
        from headscope.engine.circuits.scores import _detect

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
                out[name][layer] = _detect(pattern, det)

    def result(self) -> dict[str, Tensor]:
        self.out["delimiter_sink"] /= self.counted[:, None]
        return self.out


