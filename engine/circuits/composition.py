"""Q-, K- and V-composition scores between heads (docs/math.md, "Scores"):
``‖W_A W_B‖_F / (‖W_A‖_F ‖W_B‖_F)`` for the OV circuit ``W_A`` of an earlier head and the
circuit ``W_B`` a later head reads through (QK for Q-, QKᵀ for K-, OV for V-composition).

``composition_score`` is the definition on two ``FactoredMatrix`` circuits (as TransformerLens'
``composition_scores``). The sweep (``iter_composition_tiles``, ``composition_scores``) is its
fast path, tested pair by pair against it: it never loops over head pairs in Python — each
circuit is reduced to a small square-root factor of its Gram matrices, and one matrix product
per target layer gives all pairs' norms. It works in tiles of source layers that fit
``TILE_BYTES`` (docs/internals.md, "Sweeps in pieces").
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from headscope.engine.circuits.factored import FactoredMatrix
from headscope.engine.core.numeric import finite_matrices, tame
from headscope.engine.core.progress import Cancelled, Memo, Progress, check_cancelled, report
from headscope.engine.core.threads import core_pool, one_lapack_thread
from headscope.engine.model.nonfinite import layer_nonfinite

__all__ = ["TILE_BYTES", "CompositionScores", "CompositionTile", "composition_baseline",
           "composition_pairs", "composition_score", "composition_scores", "composition_tile",
           "iter_composition_tiles"]

TILE_BYTES = 768 << 20  # source factors stacked at once by a composition sweep


@dataclass(frozen=True)
class CompositionTile:
    """One layer pair's scores ``[H, H]``: source layer's heads × target layer's heads."""

    kind: str
    source: int
    target: int
    scores: np.ndarray


@dataclass(frozen=True)
class CompositionScores:
    """``scores[l1, h1, l2, h2]``: how much head (l1, h1) writes into what (l2, h2) reads.

    Zero where ``l1 >= l2``; NaN where either head has non-finite weights (or a zero circuit).
    ``baseline`` is the expected score of random Gaussian factors of the same shapes.
    """

    kind: str
    scores: np.ndarray  # [L, H, L, H] float32
    baseline: float
    seed: int


def _frobenius(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):  # a zeroed or overflowing head: NaN scores, by design
        return np.sqrt(np.square(x).sum((-2, -1)))


def composition_score(left: FactoredMatrix, right: FactoredMatrix) -> np.ndarray:
    """The composition score by its definition, ``‖W_A W_B‖_F / (‖W_A‖_F ‖W_B‖_F)``.

    As TransformerLens' ``composition_scores``: ``left.collapse_l()`` (``S Vh``) and
    ``right.collapse_r()`` (``U S``) drop orthogonal factors that change none of the three
    norms. Leading dims broadcast.
    """
    a, b = left.collapse_l(), right.collapse_r()
    return _frobenius(a @ b) / (_frobenius(a) * _frobenius(b))


def _r_factor(x: np.ndarray) -> np.ndarray:
    """``R [H, k, k]`` with ``RᵀR = xᵀx`` for ``x [H, n, k]``: a float64 Cholesky factor
    (``diag(√λ) Vᵀ`` of ``eigh`` where it fails: rank-deficient Grams). Replacing ``x`` by
    ``R`` changes no Frobenius norm of ``x Y`` (``‖xY‖² = tr(Yᵀ xᵀx Y)``)."""
    with one_lapack_thread():  # small batched products too: threads only contend here
        x64 = x.astype(np.float64)
        gram = x64.swapaxes(-2, -1) @ x64
        gram = np.where(finite_matrices(gram)[:, None, None], gram, 0)
        root = np.empty_like(gram)
        for i, g in enumerate(gram):
            try:
                root[i] = np.linalg.cholesky(g).T
            except np.linalg.LinAlgError:
                vals, vecs = np.linalg.eigh(g)
                root[i] = np.sqrt(np.clip(vals, 0, None))[:, None] * vecs.T
    return root.astype(x.dtype)


def _zero_bad(x: np.ndarray, bad: np.ndarray) -> np.ndarray:
    if not bad.any():
        return x
    x = x.copy()
    x[bad] = 0
    return x


class _Factors:
    """Each layer's reduced factors: the source ``X = R(W_V) W_O [H, k, d]`` (``‖X Y‖ = ‖OV
    Y‖``) and the target ``Y = A R(Bᵀ)ᵀ [H, d, k]`` of ``W_B = A B`` (``‖X Y‖ = ‖X W_B‖``),
    tamed, with non-finite heads zeroed (and their scores NaN)."""

    def __init__(self, w: Any, kind: str) -> None:
        self.w, self.kind = w, kind
        self._bad: dict[int, np.ndarray] = {}

    def bad(self, layer: int) -> np.ndarray:
        if layer not in self._bad:
            self._bad[layer] = layer_nonfinite(self.w, layer)
        return self._bad[layer]

    def _attn(self, layer: int, name: str) -> np.ndarray:
        return self.w.get(f"blocks.{layer}.attn.{name}")

    def source(self, layer: int, out: np.ndarray | None = None) -> np.ndarray:
        """``X [H, k, d]``, into ``out`` if given (a sweep's block of source layers)."""
        bad = self.bad(layer)
        w_v = _zero_bad(tame(self._attn(layer, "W_V")), bad)
        w_o = _zero_bad(tame(self._attn(layer, "W_O")), bad)
        with one_lapack_thread():  # H small products
            return np.matmul(_r_factor(w_v), w_o, out=out)

    def target(self, layer: int) -> np.ndarray:
        a_name, b_name = {"q": ("W_Q", "W_K"), "k": ("W_K", "W_Q"), "v": ("W_V", "W_O")}[self.kind]
        a, b_t = self._attn(layer, a_name), self._attn(layer, b_name)
        if self.kind == "v":
            b_t = b_t.swapaxes(-2, -1)
        bad = self.bad(layer)
        a, b_t = _zero_bad(tame(a), bad), _zero_bad(tame(b_t), bad)
        with one_lapack_thread():
            return a @ _r_factor(b_t).swapaxes(-2, -1)  # [H, d, k]

    def tile(self, source: int, target: int, scores: np.ndarray) -> CompositionTile:
        mask = self.bad(source)[:, None] | self.bad(target)[None, :]
        return CompositionTile(self.kind, source, target, np.where(mask, np.float32(np.nan), scores))


@dataclass(frozen=True)
class _Target:
    """A target layer's factors as the products read them: every head's ``Y`` side by side,
    ``[d, H2 k2]``, and their norms ``[H2]`` (prepared on a worker)."""

    flat: np.ndarray
    norm: np.ndarray
    heads: int
    k: int


def _prepare_target(f: _Factors, layer: int) -> _Target:
    y = f.target(layer)
    n_tgt, d, k2 = y.shape
    return _Target(np.ascontiguousarray(y.transpose(1, 0, 2)).reshape(d, n_tgt * k2), _frobenius(y),
                   n_tgt, k2)


def _pair_squares(x: np.ndarray, target: _Target) -> np.ndarray:
    """``[H, k, d]`` -> ``[H, H2]``: ``‖x_i y_j‖²`` for every head pair of one source layer
    and ``target``: one product, on one BLAS thread.

    One product per source layer, never one for a block of them: BLAS may sum a product's
    entries in another order when the number of rows changes (seen on AMD EPYC's OpenBLAS
    kernels, 1 ulp), and a pair's score must not depend on how many source layers shared its
    block (``tile_bytes``), its cluster part or a resumed sweep (tests compare them to the
    bit). One BLAS thread, the source layers' products side by side on the cores: threaded
    BLAS on these ``H k × d`` products spent most of a sweep with its threads waiting on each
    other on a busy 2-core box (3× slower than one thread on GPT-2-small); one thread gives
    the same numbers."""
    n_heads, k, d = x.shape
    with one_lapack_thread(), np.errstate(all="ignore"):
        prod = x.reshape(-1, d) @ target.flat
        np.square(prod, out=prod)
        return prod.reshape(n_heads, k, target.heads, target.k).sum((1, 3))


def _pair_scores(squares: np.ndarray, x_norm: np.ndarray, target: _Target) -> np.ndarray:
    """``‖x_i y_j‖ / (‖x_i‖ ‖y_j‖)`` ``[H, H2]`` from ``_pair_squares`` and the norms."""
    with np.errstate(all="ignore"):
        return (np.sqrt(squares) / (x_norm[:, None] * target.norm[None, :])).astype(np.float32)


def _source_block(f: _Factors, sources: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The source factors ``X [n, H, k, d]`` of ``sources`` and their norms ``[n, H]``.

    Each layer's factors are read and reduced on their own core (reads, page faults and
    d_head-sized LAPACK calls, each single-threaded), written into the block in place with
    their norms: stacking them afterwards, and squaring the whole block for its norms, were
    two block-sized fresh arrays on one thread while the other core waited (85 ms of
    GPT-2-small's 0.6 s sweep on a box where fresh pages are dear)."""
    cfg = f.w.cfg
    xs = np.empty((len(sources), cfg.n_heads, cfg.d_head, cfg.d_model), np.float32)
    x_norms = np.empty((len(sources), cfg.n_heads), np.float32)

    def reduce_source(i: int) -> None:
        x_norms[i] = _frobenius(f.source(sources[i], out=xs[i]))

    list(core_pool().map(reduce_source, range(len(sources))))
    return xs, x_norms


def composition_pairs(n_layers: int) -> list[tuple[int, int]]:
    """Every ``(source, target)`` layer pair of a composition sweep, ``source < target``."""
    return [(s, t) for t in range(n_layers) for s in range(t)]


def composition_tile(w: Any, kind: str, source: int, target: int) -> CompositionTile:
    """One layer pair's scores (what ``iter_composition_tiles`` yields for it)."""
    if not 0 <= source < target < w.cfg.n_layers:
        raise ValueError(f"a composition tile needs 0 <= source < target < {w.cfg.n_layers}, "
                         f"not {source}, {target}")
    f = _Factors(w, kind)
    x, y = f.source(source), _prepare_target(f, target)
    return f.tile(source, target, _pair_scores(_pair_squares(x, y), _frobenius(x), y))


_Running = tuple[int, list[int], _Target, list[Future[np.ndarray]]]  # target, rows, Y, products


def _block_scores(f: _Factors, xs: np.ndarray, x_norms: np.ndarray, targets: list[tuple[int, list[int]]],
                  cancelled: Cancelled) -> Iterator[tuple[int, list[tuple[int, np.ndarray]]]]:
    """Each target layer's scores against the block's source rows it takes, ``(target,
    [(row, [H, H2]), ...])``, in order, as a pipeline with no wait between targets: a
    target's products are queued behind the last one's (the core pool takes them in order),
    then the last one's scores are taken, then the next target is prepared. Waiting for each
    target's products before queueing the next left a core idle at every target with an odd
    number of source rows, and while the main thread laid out each target's factors (GPT-2-
    small's in-process sweep: 508-542 ms before, 475-533 ms after). Two targets' factors are
    held at most, as before; a cancel is seen after each target's scores are out (the caller
    keeps them)."""
    pool = core_pool()
    running: deque[_Running] = deque()
    prepared: Future[_Target] | None = pool.submit(_prepare_target, f, targets[0][0])
    try:
        for n, (target, rows) in enumerate(targets):
            assert prepared is not None
            y = prepared.result()
            running.append((target, rows, y, [pool.submit(_pair_squares, xs[i], y) for i in rows]))
            if len(running) > 1:
                yield _taken(running.popleft(), x_norms)
                check_cancelled(cancelled)
            prepared = pool.submit(_prepare_target, f, targets[n + 1][0]) if n + 1 < len(targets) else None
        while running:
            yield _taken(running.popleft(), x_norms)
    finally:
        for future in [*(fut for *_, futures in running for fut in futures), *([prepared] if prepared else [])]:
            future.cancel()


def _taken(running: _Running, x_norms: np.ndarray) -> tuple[int, list[tuple[int, np.ndarray]]]:
    target, rows, y, squares = running
    return target, [(i, _pair_scores(square.result(), x_norms[i], y)) for i, square in zip(rows, squares, strict=True)]


def iter_composition_tiles(w: Any, kind: str, progress: Progress = None,
                           cancelled: Cancelled = None, *, skip: frozenset[tuple[int, int]] = frozenset(),
                           tile_bytes: int = TILE_BYTES) -> Iterator[CompositionTile]:
    """Every pair ``source < target`` not in ``skip``, as each finishes: blocks of source
    layers that fit ``tile_bytes``, each multiplied with each later target layer in one
    product; ``progress`` counts pairs (equal work each)."""
    n_layers, cfg = w.cfg.n_layers, w.cfg
    wanted = set(composition_pairs(n_layers)) - skip
    total = max(1, len(wanted))
    done = 0
    f = _Factors(w, kind)
    hk = cfg.n_heads * cfg.d_head
    layer_bytes = 4 * hk * cfg.d_model  # one layer's X [H, k, d] or Y [H, d, k]
    # The budget holds the block's sources, their product and the next target's Y (prepared
    # while this target's products run).
    block = max(1, (tile_bytes - layer_bytes) // (4 * hk * (cfg.d_model + hk)))
    for first in range(0, n_layers - 1, block):
        sources = [s for s in range(first, min(first + block, n_layers - 1))
                   if any((s, t) in wanted for t in range(s + 1, n_layers))]
        if not sources:
            continue
        check_cancelled(cancelled)
        xs, x_norms = _source_block(f, sources)
        targets = [(t, rows) for t in range(sources[0] + 1, n_layers)
                   if (rows := [i for i, s in enumerate(sources) if s < t and (s, t) in wanted])]
        for target, scored in _block_scores(f, xs, x_norms, targets, cancelled):
            for i, scores in scored:
                yield f.tile(sources[i], target, scores)
                done += 1
            report(progress, done / total)
    report(progress, 1.0)


def _wishart_root(rng: np.random.Generator, n: int, k: int, samples: int) -> np.ndarray:
    """``L [samples, k, min(n, k)]`` with ``L Lᵀ`` distributed as ``XᵀX`` for an ``n × k``
    matrix ``X`` of i.i.d. standard normals (the Wishart ``W_k(n, I)``). For ``n ≥ k``,
    Bartlett's decomposition: ``L`` lower-triangular, ``L_ii = √χ²(n − i)`` (``i = 0 … k−1``),
    ``L_ij ~ N(0, 1)`` below the diagonal: ``k(k+1)/2`` draws, not ``n k``. For ``n < k``,
    ``Xᵀ`` itself (no more draws than that)."""
    if n < k:
        return np.swapaxes(rng.standard_normal((samples, n, k)), -2, -1)
    root = np.tril(rng.standard_normal((samples, k, k)), -1)
    i = np.arange(k)
    root[:, i, i] = np.sqrt(rng.chisquare(n - i, size=(samples, k)))
    return root


@functools.lru_cache(maxsize=32)
def composition_baseline(d_model: int, d_head: int, seed: int = 0, samples: int = 32) -> float:
    """Expected composition score of i.i.d. standard Gaussian factors of the model's shapes,
    ``‖V O Q Kᵀ‖ / (‖V O‖ ‖Q Kᵀ‖)`` for ``V, Q, K`` of ``d_model × d_head`` and ``O`` of
    ``d_head × d_model``: the mean over ``samples`` draws from numpy's ``default_rng(seed)``.

    Every norm is a trace of ``d_head``-sized matrices, and those are drawn directly, in
    distribution equal to the products of the dense factors (tested against them):
    ``VᵀV`` and ``KᵀK`` are Wishart (``_wishart_root``); ``O = L W`` with ``L Lᵀ = O Oᵀ``
    Wishart and ``W``'s orthonormal rows independent of ``L``, so ``O Q = L A`` and
    ``QᵀQ = AᵀA + BᵀB`` with ``A = W Q`` Gaussian and ``BᵀB`` Wishart with ``d_model −
    d_head`` degrees of freedom (``Q``'s part outside ``W``'s rows). This
    draws ``O(d_head²)`` numbers per sample instead of ``4 d_model d_head`` (0.13 s → 3 ms at
    GPT-2-small's shape, 1.4 s → 0.06 s at 7B's)."""
    rng = np.random.default_rng(seed)
    n, k = d_model, d_head
    root_v, root_k, root_o = (_wishart_root(rng, n, k, samples) for _ in range(3))
    m = root_o.shape[-1]  # O = L W: W's min(n, k) orthonormal rows
    root_b = _wishart_root(rng, n - m, k, samples)
    a = rng.standard_normal((samples, m, k))

    def t(x: np.ndarray) -> np.ndarray:
        return np.swapaxes(x, -2, -1)

    # ‖V O Q Kᵀ‖² = tr(VᵀV (OQ) KᵀK (OQ)ᵀ); ‖V O‖² = tr(VᵀV O Oᵀ); ‖Q Kᵀ‖² = tr(QᵀQ KᵀK)
    with one_lapack_thread():
        gv, gk, go = (r @ t(r) for r in (root_v, root_k, root_o))
        oq = root_o @ a
        gq = t(a) @ a + root_b @ t(root_b)
        num = ((gv @ oq @ gk) * oq).sum((-2, -1))
        ov = (gv * go).sum((-2, -1))  # Gram matrices are symmetric
        qk = (gq * gk).sum((-2, -1))
    return float(np.mean(np.sqrt(num) / (np.sqrt(ov) * np.sqrt(qk))))


def composition_scores(w: Any, kind: str, seed: int = 0, progress: Progress = None,
                       cancelled: Cancelled = None, *,
                       on_tile: Callable[[CompositionTile], None] | None = None,
                       baseline_samples: int = 32, memo: Memo | None = None,
                       tile_bytes: int = TILE_BYTES) -> CompositionScores:
    """Every ``kind``-composition score ``[L, H, L, H]`` and the baseline.

    ``memo``: one part per target layer ``t``, ``scores[:t, :, t, :]``; stored targets are
    skipped (``on_tile`` still gets their tiles, first), each computed target is put once its
    last pair ``(t - 1, t)`` is done. ``tile_bytes`` bounds the source factors held at once;
    it changes the blocking, not the numbers. ``kind`` is validated where the request enters
    (``api``, ``service``: docs/internals.md, "The path of a request"), not here."""
    cfg = w.cfg
    scores = np.zeros((cfg.n_layers, cfg.n_heads, cfg.n_layers, cfg.n_heads), np.float32)
    skip: set[tuple[int, int]] = set()
    for target in range(1, cfg.n_layers):
        known = None if memo is None else memo.get(target, (target, cfg.n_heads, cfg.n_heads))
        if known is None:
            continue
        scores[:target, :, target, :] = known
        skip.update((source, target) for source in range(target))
        if on_tile is not None:
            for source in range(target):
                on_tile(CompositionTile(kind, source, target, scores[source, :, target, :].copy()))
    for tile in iter_composition_tiles(w, kind, progress, cancelled, skip=frozenset(skip),
                                       tile_bytes=tile_bytes):
        scores[tile.source, :, tile.target, :] = tile.scores
        if memo is not None and tile.source == tile.target - 1:
            memo.put(tile.target, scores[:tile.target, :, tile.target, :].copy())
        if on_tile is not None:
            on_tile(tile)
    baseline = composition_baseline(cfg.d_model, cfg.d_head, seed, baseline_samples)
    return CompositionScores(kind, scores, baseline, seed)
