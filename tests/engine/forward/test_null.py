"""The null of random heads (engine/forward/null.py; docs/math.md, "Reading a head"): seeded, scale free, z the standardised score, random heads distributed like whole ones."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from headscope.engine.api.model import open_model
from headscope.engine.circuits import directions
from headscope.engine.core.validation import SCORE_NAMES
from headscope.engine.forward import behaviour, null
from headscope.engine.sweeps import scores as score_sweeps
from tests.engine.circuits import test_directions
from tests.engine.circuits.test_directions import _quantiles

model = test_directions.model  # test_directions's pytest fixture


def test_the_null_is_seeded_and_z_is_the_standardised_score(model: Any) -> None:
    null = score_sweeps.score_null(model, seed=0, samples=16)
    again = score_sweeps.score_null(model, seed=0, samples=16)
    other = score_sweeps.score_null(model, seed=1, samples=16)
    np.testing.assert_array_equal(null.mean, again.mean)
    assert not np.array_equal(null.mean, other.mean)
    table = score_sweeps.score_table(model)
    i = null.names.index("induction_score")
    expected = (table.induction_score[1, 2] - null.mean[i, 1]) / null.std[i, 1]
    assert null.z("induction_score", table.induction_score)[1, 2] == pytest.approx(expected, rel=1e-5)
    # the weight-based nulls do not depend on the layer (the same embeddings, any norm)
    j = null.names.index("copying_score")
    assert null.mean[j, 0] == null.mean[j, 1]


def test_the_table_and_its_null_come_from_one_forward_pass(model: Any, monkeypatch) -> None:
    """`heads` scores the real heads' behaviour, the sinks and the random heads' behaviour (the
    z's) in one pass with every batch side by side: each layer's MLP runs once for all the
    batches and its weights are read once (a 7B model reads 13 GB of weights per pass; the
    passes used to be one per batch, and three of them), with the same numbers as the
    separate requests and, up to float rounding, as the behavioural scores on their own."""
    from headscope.engine.forward import transformer as forward

    table, null = score_sweeps.score_table(model), score_sweeps.score_null(model)
    _, natural = score_sweeps.sink_batches(model)
    finished: list[int] = []
    real = forward.finish_block

    def counting(w: Any, layer: int, x: Any, a: Any) -> Any:
        finished.append(layer)
        return real(w, layer, x, a)

    monkeypatch.setattr(forward, "finish_block", counting)
    shared, shared_null = score_sweeps.calibrated_score_table(model)
    assert natural and finished == list(range(model.cfg.n_layers))
    assert shared_null is not None
    for name in (*SCORE_NAMES, "nonfinite"):
        np.testing.assert_array_equal(getattr(shared, name), getattr(table, name), err_msg=name)
    np.testing.assert_array_equal(shared_null.mean, null.mean)
    np.testing.assert_array_equal(shared_null.std, null.std)
    alone = behaviour.behaviour_scores(model.weights)
    for name, score in alone.items():
        np.testing.assert_allclose(getattr(shared, f"{name}_score"), score.numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=name)


def test_null_spectral_scores_are_scale_free() -> None:
    middle = torch.randn(16, 16, generator=torch.Generator().manual_seed(3)).numpy()
    a = directions.null_spectral_scores(middle, 4, seed=0, samples=8)
    b = directions.null_spectral_scores(middle * 1e3, 4, seed=0, samples=8)
    np.testing.assert_allclose(a, b, rtol=1.3e-6, atol=1e-5)


def test_null_spectral_scores_draw_torchs_seeded_normals() -> None:
    """The random heads are ``torch.randn``'s, seeded as before (numbers kept across the move to
    numpy): every draw within one float32 ulp, the scores as the torch computation gives them."""
    g = torch.Generator().manual_seed(5)
    bits = np.random.RandomState(5)._bit_generator
    for size in (16 * 7, 1000, 37):
        want = torch.randn(size, generator=g).numpy()
        got = directions.torch_normals(bits, size)
        np.testing.assert_allclose(got, want, rtol=3e-7, atol=3e-7)
    middle = torch.randn(16, 16, generator=torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 16, 4, generator=g), torch.randn(8, 16, 4, generator=g)
    eig = torch.linalg.eigvals((y.transpose(-2, -1) @ middle @ x).double())
    want = (eig.real.sum(-1) / eig.abs().sum(-1)).float().numpy()
    np.testing.assert_allclose(directions.null_spectral_scores(middle.numpy(), 4, seed=0, samples=8), want,
                               atol=1e-6)


def test_non_finite_embeddings_give_a_nan_null_not_a_crash() -> None:
    middle = np.eye(8, dtype=np.float32)
    middle[2, 3] = float("nan")
    assert np.isnan(directions.null_spectral_scores(middle, 4, seed=0, samples=4)).all()


def test_random_heads_are_causal_only_in_causal_models() -> None:
    x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(0))
    (causal,) = null.random_head_patterns([x], 4, 3.0, 3.0, 2.0, None, seed=0, samples=5)
    (encoder,) = null.random_head_patterns([x], 4, 3.0, 3.0, 2.0, None, seed=0, samples=5, causal=False)
    assert causal.shape == (2, 5, 6, 6)
    torch.testing.assert_close(causal.sum(-1), torch.ones(2, 5, 6))
    above = torch.ones(6, 6, dtype=torch.bool).triu(1)  # keys after the query
    assert float(causal[..., above].abs().max()) == 0.0 and float(encoder[..., above].min()) > 0.0


def test_a_non_finite_row_projects_to_nan_alone() -> None:
    """A token whose stream is NaN/inf gets NaN random-head projections; the span of the
    other rows, and so their projections, stay finite."""
    rows = torch.randn(6, 16, generator=torch.Generator().manual_seed(2))
    rows[2, 3], rows[4, 0] = float("nan"), float("inf")
    q, k = null.random_projections(rows, 4, (1.0, 2.0), 3, *null.head_generators(0))
    for t in (q, k):
        assert t.shape == (3, 6, 4)
        assert t[:, [2, 4]].isnan().all() and torch.isfinite(t[:, [0, 1, 3, 5]]).all()


def test_random_heads_move_with_the_rows_not_with_their_rounding() -> None:
    """A repeated token's layer-0 stream is the same row up to rounding: the draw must be a
    continuous function of the rows, so a 1e-7 change in them (another summation order) moves
    the projections by about as much, not by a redrawn basis (a QR of the rows did: ~0.5)."""
    g = torch.Generator().manual_seed(3)
    tokens = torch.randn(20, 64, generator=g, dtype=torch.float64)
    rows = tokens[torch.randint(0, 20, (50,), generator=g)]  # 50 rows, rank 20
    rows = rows + 1e-7 * torch.randn(rows.shape, generator=g, dtype=torch.float64)
    moved = rows + 1e-7 * torch.randn(rows.shape, generator=g, dtype=torch.float64)
    a, _ = null.random_projections(rows.float(), 8, (1.0, 1.0), 4, *null.head_generators(0))
    b, _ = null.random_projections(moved.float(), 8, (1.0, 1.0), 4, *null.head_generators(0))
    assert float(a.abs().max()) > 0.1
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


@pytest.mark.parametrize("n_rows", [4, 12])  # fewer rows than d (drawn in their span), more
def test_random_heads_drawn_in_the_rows_span_have_the_distribution_of_whole_ones(n_rows: int) -> None:
    """``rows @ W`` for Gaussian ``W [d, e]`` rescaled to a norm: drawn as ``Rᵀ (Qᵀ W)`` and a
    χ² for the rest of W, against drawing W itself (docs/math.md, "Calibrated scores")."""
    d, e, norm, samples = 10, 3, 2.5, 40_000
    g = torch.Generator().manual_seed(5)
    rows = torch.randn(n_rows, d, generator=g, dtype=torch.float64)
    rows[1] = rows[0]  # the same token twice (a repeated sequence's first layer)
    got, other = null.random_projections(rows.float(), e, (norm, 2 * norm), samples, *null.head_generators(7))
    got = got.double()
    assert not torch.allclose(other.double(), 2 * got)  # two sets of heads, not one rescaled
    whole = torch.randn(samples, d, e, generator=g, dtype=torch.float64)
    whole = whole * (norm / whole.norm(dim=(1, 2)))[:, None, None]
    want = rows @ whole
    assert got.shape == (samples, n_rows, e)
    torch.testing.assert_close(got[:, 1], got[:, 0], rtol=1e-5, atol=1e-5)
    # second moments: E[P Pᵀ] = norm²/d · e/e · rows rowsᵀ for W uniform on the sphere
    second = torch.einsum("sne,sme->nm", got, got) / samples
    torch.testing.assert_close(second, norm**2 / d * rows @ rows.T, rtol=0.03, atol=0.03 * norm**2)
    # and the shape of the distribution: ‖P‖², one entry, one score-like product
    for stat in (lambda p: p.square().sum((1, 2)), lambda p: p[:, 2, 0], lambda p: (p[:, 2] * p[:, 3]).sum(-1)):
        torch.testing.assert_close(_quantiles(stat(got)), _quantiles(stat(want)), rtol=0.05, atol=0.03)


def test_an_encoder_gets_a_null(bert_base_dir) -> None:
    path, _ = bert_base_dir
    null = score_sweeps.score_null(open_model(path), samples=8)
    assert null.names == SCORE_NAMES
    # (no punctuation in the fixture's vocabulary: no delimiter-sink null, NaN rather than 0)
    assert np.isfinite(np.delete(null.mean, SCORE_NAMES.index("delimiter_sink_score"), 0)).all()


# -- the cheaper null against its float64 formulas (issue 40) -------------------------------------

U32 = 2.0**-24  # float32's unit roundoff
U64 = 2.0**-53


def _old_gram_root(rows: torch.Tensor) -> torch.Tensor:
    rows = rows.double()
    values, vectors = torch.linalg.eigh(rows @ rows.T)
    return (vectors * values.clamp(min=0).sqrt()) @ vectors.T


def _old_mean_finite_norm(weights: torch.Tensor) -> float:
    norms = torch.linalg.vector_norm(weights, dim=(-2, -1), dtype=torch.float64)
    finite = norms[torch.isfinite(norms)]
    return float(finite.mean()) if finite.numel() else float("nan")


def test_the_gram_root_is_torchs_up_to_the_rounding_of_the_gram_matrix() -> None:
    """numpy's one-thread ``eigh`` against torch's: any backward-stable ``eigh`` gives the
    root of ``G + ΔG`` with ``‖ΔG‖ ≲ N·ε·‖G‖``, and ``‖A^½ − B^½‖ ≤ ‖A − B‖^½`` for positive
    semi-definite A, B, so two of them agree to ``√(N·ε·‖G‖)`` where rows are dependent (a
    repeated token: the root is only Hölder-continuous there) and much closer elsewhere."""
    g = torch.Generator().manual_seed(4)
    tokens = torch.randn(12, 40, generator=g, dtype=torch.float64)
    for rows in (torch.randn(30, 40, generator=g, dtype=torch.float64),  # full rank
                 tokens[torch.randint(0, 12, (30,), generator=g)]):  # rank 12: repeated rows
        gram = rows @ rows.T
        bound = math.sqrt(2 * rows.shape[0] * U64 * float(torch.linalg.matrix_norm(gram, 2)))
        new, old = null.gram_root(rows.float()), _old_gram_root(rows.float())
        assert float((new - old).abs().max()) <= bound
        exact = rows.float().double()
        assert float((new @ new - exact @ exact.T).abs().max()) <= 4 * bound**2  # a root of G


@pytest.mark.parametrize("layout", ["contiguous", "per-head view of an [out, in] read"])
def test_mean_norms_summed_in_float32_rows_are_the_float64_norms(layout: str) -> None:
    """Per head, float32 sums of ``d_head`` squares (relative error below ``(d_head + 2)·u``:
    recursive summation of positive terms, the squares' and the root's rounding) and a
    float64 sum of those: the float64 norm to that bound, also for heads whose float32
    squares would overflow or underflow (summed in float64), zero heads and a NaN head. A
    per-head view (``d_head`` strided, ``d_model`` contiguous, as ``W_Q`` is read) sums
    ``d_head``-long runs of its contiguous axis instead: the same bound."""
    g = torch.Generator().manual_seed(6)
    if layout == "contiguous":
        weights = torch.randn(6, 40, 16, generator=g)
    else:
        weights = torch.randn(6 * 16, 48, generator=g).reshape(6, 16, 48).transpose(1, 2)  # [6, 48, 16]
        assert weights.stride(-2) == 1 and null._runs(weights).shape == (6, 16, 3, 16)
    weights[1] *= 1e25  # squares beyond float32
    weights[2] *= 1e-30  # squares below float32's normal range
    weights[3] = 0
    weights[4, 3, 2] = float("nan")  # left out of the mean
    bound = (16 + 2) * U32
    got, want = null._mean_finite_norm(weights), _old_mean_finite_norm(weights)
    assert got == pytest.approx(want, rel=bound)
    for head in (0, 1, 2, 5):  # one head at a time: no large one hides a small one's error
        one = weights[head : head + 1]
        assert null._mean_finite_norm(one) == pytest.approx(_old_mean_finite_norm(one), rel=bound, abs=0)
    assert math.isnan(null._mean_finite_norm(weights[4:5]))


def test_the_behaviour_null_is_its_float64_formula(model: Any, monkeypatch) -> None:
    """The whole behavioural null on attn-only-2l, its norms and Gram roots as they are and
    as the float64 formulas they replace. The norms move by at most ``(d_head + 2)·u``
    relative (the test above), the roots by far less than float32's rounding; both scale the
    random heads' queries and keys, so their logits ``ℓ`` move by at most ``2(d_head + 3)·u·|ℓ|``
    and each probability by at most twice the largest logit move: every score (a mean of
    probability mass, at most 1) by ``4(d_head + 3)·u·max|ℓ|``, with ``max|ℓ| < 10`` here
    (9.2, layer 1 on all the batches)."""
    from headscope.engine.sweeps.scores import delimiter_masks, sink_batches

    repeated, natural = sink_batches(model, 0)
    masks = delimiter_masks(model, natural)
    # the span path too: 20 rows of the repeated batch, fewer than d_model
    short = repeated[:1, :20]
    new = null.behaviour_null(model.weights, short, natural[:1], 0, 8, masks[:1])
    new_all = null.behaviour_null(model.weights, repeated, natural, 0, 8, masks)
    monkeypatch.setattr(null, "gram_root", _old_gram_root)
    monkeypatch.setattr(null, "_mean_finite_norm", _old_mean_finite_norm)
    old = null.behaviour_null(model.weights, short, natural[:1], 0, 8, masks[:1])
    old_all = null.behaviour_null(model.weights, repeated, natural, 0, 8, masks)
    tolerance = 4 * (model.cfg.d_head + 3) * U32 * 10
    for got, want in ((new, old), (new_all, old_all)):
        assert got.keys() == want.keys()
        for name in got:
            torch.testing.assert_close(got[name], want[name], rtol=0, atol=tolerance, equal_nan=True, msg=name)


def _old_torch_normals(bits: Any, size: int) -> np.ndarray:
    def uniforms(n: int) -> np.ndarray:
        raw = bits.random_raw(n)
        return (raw & ((1 << 24) - 1)).astype(np.float32) * np.float32(2.0**-24)

    def box_muller(d: np.ndarray) -> np.ndarray:
        u1, u2 = np.float32(1) - d[..., :8], d[..., 8:]
        radius = np.sqrt(np.float32(-2) * np.log(u1))
        theta = np.float32(2.0 * np.pi) * u2
        return np.concatenate([radius * np.cos(theta), radius * np.sin(theta)], -1)

    data = uniforms(size)
    out = data.copy()
    whole = size // 16 * 16
    out[:whole] = box_muller(data[:whole].reshape(-1, 16)).reshape(-1)
    if size % 16:
        out[size - 16:] = box_muller(uniforms(16))
    return out


def test_the_normals_are_the_same_numbers_as_before() -> None:
    """Box-Muller on contiguous halves: the same float32 operations on the same values."""
    for size in (16, 37, 16 * 7, 1000, 4099):
        got = directions.torch_normals(np.random.RandomState(9)._bit_generator, size)
        want = _old_torch_normals(np.random.RandomState(9)._bit_generator, size)
        np.testing.assert_array_equal(got, want)


def test_null_spectral_scores_are_the_float64_formula_up_to_float32_products() -> None:
    """The chunked float32 ``yᵀ M x`` against the same draws in float64. Each entry's error
    is at most ``2·d_model·u·(|y|ᵀ|M||x|)`` (two chained float32 products, recursive
    summation); the eigenvalues of ``A + ΔA`` lie within ``κ(V)·‖ΔA‖₂`` of ``A``'s
    (Bauer-Fike, ``V`` the eigenvectors), so ``Σ Re λ / Σ |λ|`` moves by at most
    ``2·d_head·κ(V)·‖ΔA‖₂ / Σ |λ|``, computed here per head."""
    d, e, samples = 24, 4, 9  # a chunk of 32 is more than all: one partial chunk, and two
    middle = torch.randn(d, d, generator=torch.Generator().manual_seed(3)).numpy()
    bits = np.random.RandomState(0)._bit_generator
    x = directions.torch_normals(bits, samples * d * e).reshape(samples, d, e).astype(np.float64)
    y = directions.torch_normals(bits, samples * d * e).reshape(samples, d, e).astype(np.float64)
    small = y.swapaxes(-2, -1) @ middle.astype(np.float64) @ x
    eig, vectors = np.linalg.eig(small)
    want = eig.real.sum(-1) / np.abs(eig).sum(-1)
    worst = np.abs(y).swapaxes(-2, -1) @ np.abs(middle.astype(np.float64)) @ np.abs(x)
    error = 2 * d * U32 * np.linalg.norm(worst, axis=(-2, -1))  # ≥ ‖ΔA‖₂
    bound = 2 * e * np.linalg.cond(vectors) * error / np.abs(eig).sum(-1)
    got = directions.null_spectral_scores(middle, e, seed=0, samples=samples)
    assert (np.abs(got - want) <= bound + 2 * U32).all()
    # chunks of 4 (two whole, one partial) are the same products as one chunk
    chunked = directions._middle_products(x.astype(np.float32), y.astype(np.float32), middle, chunk=4)
    whole = directions._middle_products(x.astype(np.float32), y.astype(np.float32), middle)
    np.testing.assert_allclose(chunked, whole, rtol=0, atol=2 * float(error.max()))


def test_a_layers_head_norms_read_each_stored_key_head_once(llama_dir) -> None:
    """Grouped-query attention: the processed ``W_K`` repeats each stored head for its group,
    so the mean norm over the stored heads (what the null reads, ``stored_kv``) is the mean
    over every query head's copy. The stored heads are a view of the checkpoint's ``[out,
    in]`` layout and the repeated copy is contiguous, so ``_mean_finite_norm`` groups their
    float32 partial sums differently: each within its documented ``d_head·2⁻²⁴``."""
    from headscope.engine.forward.torch_weights import torch_weights
    from headscope.engine.model.loading import load_model

    w = load_model(llama_dir[0]).weights
    assert w.cfg.kv_heads < w.cfg.n_heads  # the fixture is grouped
    t = torch_weights(w)
    for layer in range(w.cfg.n_layers):
        norm_q, norm_k = null.layer_head_norms(w, layer)
        assert norm_q == null._mean_finite_norm(t.get(f"blocks.{layer}.attn.W_Q"))
        every_copy = null._mean_finite_norm(t.get(f"blocks.{layer}.attn.W_K"))
        assert norm_k == pytest.approx(every_copy, rel=w.cfg.d_head * 2.0**-24, abs=0)
        stored = t.get(f"blocks.{layer}.attn._W_K")
        assert stored.shape[0] == w.cfg.kv_heads
        assert torch.equal(stored, t.get(f"blocks.{layer}.attn.W_K")[::w.cfg.n_heads // w.cfg.kv_heads])
