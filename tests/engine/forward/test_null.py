"""The null of random heads (engine/forward/null.py; docs/math.md, "Reading a head"): seeded, scale free, z the standardised score, random heads distributed like whole ones."""

from __future__ import annotations

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
