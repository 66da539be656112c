"""Reading a head from its weights (docs/math.md, "Reading a head"): singular directions as
tokens and their overlap, the virtual heads along a composition path (V-composition's virtual
full OV, the K-composition path), and the spectral scores of the random heads that calibrate
the copying score and QK positivity.

Nothing here forms a ``d_vocab × d_vocab`` matrix: SVDs and spectra come from the
``d_head``-sized factors (``FactoredMatrix``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from headscope.engine.circuits.factored import FactoredMatrix
from headscope.engine.circuits.head_circuits import head_weight
from headscope.engine.circuits.spectral import spectral_score
from headscope.engine.core.numeric import is_finite
from headscope.engine.core.threads import one_lapack_thread
from headscope.engine.core.validation import NULL_SAMPLES

__all__ = ["Directions", "diagonal_rate", "k_path", "null_spectral_scores", "overlap",
           "signed_directions", "top_by_magnitude", "torch_normals", "virtual_ov"]


# -- singular directions ---------------------------------------------------------------------


@dataclass(frozen=True)
class Directions:
    """The top ``k`` singular triplets of a circuit: ``u [ldim, k]``, ``s [k]``, ``v [rdim, k]``."""

    u: np.ndarray
    s: np.ndarray
    v: np.ndarray


def signed_directions(fm: FactoredMatrix, k: int) -> Directions:
    """Top ``k`` singular triplets of ``fm`` (``FactoredMatrix.svd``, from the factors), with
    the sign fixed so each ``u`` column's largest-magnitude entry is positive (``u s vᵀ`` is
    unchanged when ``u`` and ``v`` flip together)."""
    u, s, vh = fm.svd()
    k = max(0, min(int(k), s.shape[-1]))
    u, s, v = u[:, :k], s[:k], vh[:k].T
    peak = np.take_along_axis(u, np.abs(u).argmax(0)[None, :], 0)  # [1, k]
    sign = np.where(peak < 0, -1.0, 1.0).astype(u.dtype)
    return Directions(u * sign, s, v * sign)


def top_by_magnitude(vector: np.ndarray, top: int) -> tuple[list[int], list[float]]:
    """Ids and signed values of the ``top`` entries of largest ``|value|``, largest first
    (ties: the lower id first)."""
    vector = np.asarray(vector)
    top = max(0, min(int(top), vector.shape[0]))
    idx = np.argsort(-np.abs(vector), kind="stable")[:top]
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


def virtual_ov(w: Any, a: tuple[int, int], b: tuple[int, int]) -> FactoredMatrix:
    """The V-composition virtual full OV circuit ``W_E OV_A OV_B W_U`` [source token, output
    token], kept factored through ``d_head``: ``(W_E W_V^A) (W_O^A W_V^B) (W_O^B W_U)``."""
    (la, ha), (lb, hb) = a, b
    with np.errstate(all="ignore"):
        middle = head_weight(w, la, ha, "W_O") @ head_weight(w, lb, hb, "W_V")  # [d_head, d_head]
        left = w.get("embed.W_E") @ head_weight(w, la, ha, "W_V")  # [d_vocab, d_head]
        right = head_weight(w, lb, hb, "W_O") @ w.get("unembed.W_U")  # [d_head, d_vocab]
        return FactoredMatrix(left @ middle, right)


def k_path(w: Any, a: tuple[int, int], b: tuple[int, int]) -> FactoredMatrix:
    """The K-composition path ``W_E QK_B (W_E OV_A)ᵀ`` [query token, key-side token]: how much
    a query token attends to a position whose *earlier head A* moved token ``t`` there.

    ``= (W_E W_Q^B) (W_E W_V^A W_O^A W_K^B)ᵀ``; for an induction mechanism (A a previous-token
    head) it is the query token against the token *before* the key, and its diagonal stands out.
    """
    (la, ha), (lb, hb) = a, b
    w_e = w.get("embed.W_E")
    with np.errstate(all="ignore"):
        query = w_e @ head_weight(w, lb, hb, "W_Q")  # [d_vocab, d_head]
        key = (w_e @ head_weight(w, la, ha, "W_V")) @ (head_weight(w, la, ha, "W_O")
                                                        @ head_weight(w, lb, hb, "W_K"))
        return FactoredMatrix(query, key.T)


def diagonal_rate(block: np.ndarray) -> float:
    """Fraction of the rows of a square block whose largest entry is on the diagonal
    (the K-path's diagonal rate; docs/math.md, "Virtual heads")."""
    if block.shape[0] == 0:
        return float("nan")
    return float(np.mean(block.argmax(1) == np.arange(block.shape[0])))


# -- the null of the spectral scores -------------------------------------------------------------


NORMALS_CHUNK = 1 << 22  # normals per chunk of ``torch_normals`` (a multiple of 16)


def torch_normals(bits: Any, size: int) -> np.ndarray:
    """``size`` standard normals (float32), the numbers ``torch.randn`` (CPU, ``size >= 16``)
    draws from the same MT19937 stream (``bits``: ``np.random.RandomState(seed)._bit_generator``
    for ``torch.Generator().manual_seed(seed)``): 24-bit uniforms, then Box-Muller on blocks
    of 16 (the last block redrawn when ``size`` is not a multiple of 16). torch's vectorised
    log/cos/sin may round differently from numpy's: some values differ by one float32 ulp.
    This keeps the null calibrating the copying score and QK positivity what it was."""
    def uniforms(n: int) -> np.ndarray:
        raw = bits.random_raw(n)
        raw &= (1 << 24) - 1
        out = raw.astype(np.float32)
        out *= np.float32(2.0**-24)
        return out

    def box_muller(d: np.ndarray, out: np.ndarray) -> None:  # [16·B] -> out [16·B]
        # each block's 8 radii and 8 angles gathered contiguous first: numpy's float32
        # log/sqrt/cos/sin on [B, 8] strided halves took 2.5x as long, same values
        halves = d.reshape(-1, 2, 8)
        radius = np.subtract(np.float32(1), halves[:, 0])
        theta = np.multiply(np.float32(2.0 * np.pi), halves[:, 1])
        np.log(radius, out=radius)
        radius *= np.float32(-2)
        np.sqrt(radius, out=radius)
        blocks = out.reshape(-1, 2, 8)
        np.multiply(radius, np.cos(theta), out=blocks[:, 0])
        np.multiply(radius, np.sin(theta, out=theta), out=blocks[:, 1])

    # drawn and transformed in chunks of whole blocks (the same stream, the same numbers): all
    # at once the temporaries were ~22 bytes per normal, 1.5 GB for a 70B-wide null's 67 M
    out = np.empty(size, np.float32)
    whole = size // 16 * 16
    for start in range(0, whole, NORMALS_CHUNK):
        data = uniforms(min(whole, start + NORMALS_CHUNK) - start)
        box_muller(data, out[start : start + data.size])
    bits.random_raw(size - whole)  # the ragged end's draws, as before (redrawn below)
    if size % 16:
        tail = np.empty(16, np.float32)
        box_muller(uniforms(16), tail)
        out[size - 16:] = tail
    return out


def null_spectral_scores(middle: np.ndarray, d_head: int, seed: int,
                         samples: int = NULL_SAMPLES) -> np.ndarray:
    """``[samples]`` float32: ``Σ Re λ / Σ |λ|`` of random heads' token circuits.

    A random head is ``X``, ``Y [d_model, d_head]`` i.i.d. standard Gaussian (seeded); its
    token circuit ``(W_E X)(Yᵀ W_U)`` (OV, ``middle = W_U W_E``) or ``(W_E X)(W_E Y)ᵀ`` (QK,
    ``middle = W_Eᵀ W_E``) has the non-zero eigenvalues of ``Yᵀ middle X``. The score is
    scale free in each factor, so matching a head's norms changes nothing.
    """
    d_model = middle.shape[0]
    bits = np.random.RandomState(seed)._bit_generator
    x = torch_normals(bits, samples * d_model * d_head).reshape(samples, d_model, d_head)
    y = torch_normals(bits, samples * d_model * d_head).reshape(samples, d_model, d_head)
    small = _middle_products(x, y, middle.astype(np.float32, copy=False))
    if not is_finite(small):  # NaN/inf embeddings: LAPACK never sees a NaN matrix
        return np.full((samples,), np.nan, np.float32)
    with one_lapack_thread():
        eig = np.linalg.eigvals(small.astype(np.float64))
    return spectral_score(eig).astype(np.float32)


def _middle_products(x: np.ndarray, y: np.ndarray, middle: np.ndarray, chunk: int = 32) -> np.ndarray:
    """``yᵀ middle x`` ``[S, d_head, d_head]`` (float32) for ``x``, ``y`` ``[S, d_model, d_head]``.

    Float32 products, as the real heads' scores are formed (at 7B the float64 ones were
    2 × 275 GFLOP). ``yᵀ middle`` of ``chunk`` heads at once is one ``[chunk·d_head, d_model]
    @ [d_model, d_model]`` product: numpy's stacked ``matmul`` of one ``[d_head, d_model]``
    slice at a time took 1.5-2x the CPU time at 7B (the same sums in another order: the
    results move within float32 rounding, ~1e-7 of the largest entry); 32 heads keep the
    copies to 64 MB at 7B."""
    samples, d_model, d_head = x.shape
    out = np.empty((samples, d_head, d_head), np.float32)
    with np.errstate(all="ignore"):
        for start in range(0, samples, chunk):
            part = slice(start, start + chunk)
            left = y[part].swapaxes(-2, -1).reshape(-1, d_model) @ middle  # [c·d_head, d_model]
            out[part] = left.reshape(-1, d_head, d_model) @ x[part]
    return out
