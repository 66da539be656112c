"""Circuit similarity between two models' heads (engine/circuits/similarity.py; docs/math.md, "Comparing two checkpoints"): equal to the dense circuits' cosines, invariant to each head's basis, refused across layouts, NaN only for a NaN head; principal cosines."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from headscope.engine.core.errors import InvalidRequestError
from headscope.engine.model.weights import DictWeights
from tests.engine.sweeps.test_diff import (
    DH,
    D,
    H,
    L,
    circuit_similarity,
    cosine,
    dense_full_ov,
    dense_token_qk,
    edited,
    principal_cosines,
    random_weights,
)


def test_similarity_matches_dense_circuits_for_every_head_pair() -> None:
    wa, wb = random_weights(0), random_weights(1, d_model=12)  # widths may differ
    sim = circuit_similarity(wa, wb)
    assert sim.ov.shape == (L, H, H) and sim.qk.shape == (L, H, H)
    for layer, h1, h2 in itertools.product(range(L), range(H), range(H)):
        expected_ov = cosine(dense_full_ov(wa, layer, h1), dense_full_ov(wb, layer, h2))
        expected_qk = cosine(dense_token_qk(wa, layer, h1), dense_token_qk(wb, layer, h2))
        assert sim.ov[layer, h1, h2].item() == pytest.approx(expected_ov, abs=1e-4)
        assert sim.qk[layer, h1, h2].item() == pytest.approx(expected_qk, abs=1e-4)


def test_similarity_is_one_with_itself_and_invariant_to_head_basis() -> None:
    wa = random_weights(2)
    sim = circuit_similarity(wa, wa)
    assert torch.allclose(sim.ov.diagonal(dim1=1, dim2=2), torch.ones(L, H), atol=1e-5)
    assert torch.allclose(sim.qk.diagonal(dim1=1, dim2=2), torch.ones(L, H), atol=1e-5)
    # W_V M, M⁻¹ W_O and W_Q N, W_K N⁻ᵀ are the same head: similarity stays 1.
    g = torch.Generator().manual_seed(3)
    m = torch.randn(DH, DH, generator=g) + 3 * torch.eye(DH)
    t = dict(wa._t)
    t["blocks.1.attn.W_V"] = t["blocks.1.attn.W_V"] @ m
    t["blocks.1.attn.W_O"] = torch.linalg.inv(m) @ t["blocks.1.attn.W_O"]
    t["blocks.1.attn.W_Q"] = t["blocks.1.attn.W_Q"] @ m
    t["blocks.1.attn.W_K"] = t["blocks.1.attn.W_K"] @ torch.linalg.inv(m).T
    sim2 = circuit_similarity(wa, DictWeights(wa.cfg, t))
    assert torch.allclose(sim2.ov[1].diagonal(), torch.ones(H), atol=1e-4)
    assert torch.allclose(sim2.qk[1].diagonal(), torch.ones(H), atol=1e-4)


def test_negated_ov_has_similarity_minus_one() -> None:
    wa = random_weights(4)
    t = dict(wa._t)
    t["blocks.0.attn.W_O"] = -t["blocks.0.attn.W_O"]
    sim = circuit_similarity(wa, DictWeights(wa.cfg, t))
    assert torch.allclose(sim.ov[0].diagonal(), -torch.ones(H), atol=1e-5)


def test_different_layouts_are_refused_with_a_reason() -> None:
    wa = random_weights(0, path="original")
    cfg = wa.cfg.replace(n_heads=2)
    with pytest.raises(InvalidRequestError, match="different head layouts") as info:
        circuit_similarity(wa, DictWeights(cfg, wa._t, path="pruned"))
    message = str(info.value)
    assert "original" in message and "pruned" in message and "\n" not in message


@pytest.mark.parametrize("d_model_b,d_head_b", [(D, 8), (24, 8), (12, 2)])
def test_different_d_head_and_width_are_compared(d_model_b: int, d_head_b: int) -> None:
    """A distilled copy with the same layers × heads: the token-basis similarity is defined."""
    wa, wb = random_weights(0), random_weights(1, d_model=d_model_b, d_head=d_head_b)
    sim = circuit_similarity(wa, wb)
    for layer, h1, h2 in itertools.product(range(L), range(H), range(H)):
        expected_ov = cosine(dense_full_ov(wa, layer, h1), dense_full_ov(wb, layer, h2))
        expected_qk = cosine(dense_token_qk(wa, layer, h1), dense_token_qk(wb, layer, h2))
        assert sim.ov[layer, h1, h2].item() == pytest.approx(expected_ov, abs=1e-4)
        assert sim.qk[layer, h1, h2].item() == pytest.approx(expected_qk, abs=1e-4)
    assert torch.allclose(circuit_similarity(wb, wb).ov.diagonal(dim1=1, dim2=2), torch.ones(L, H), atol=1e-4)


def test_a_nan_head_has_nan_similarity_and_the_others_are_unchanged() -> None:
    wa = random_weights(0)
    wb = edited(wa, "W_V", 1, 2, lambda x: x.index_put_((torch.tensor(0), torch.tensor(0)), torch.tensor(float("nan"))))
    clean, sim = circuit_similarity(wa, wa), circuit_similarity(wa, wb)
    assert torch.isnan(sim.ov[1, :, 2]).all()  # every pair with B's head (1, 2): undefined
    finite = torch.ones(L, H, H, dtype=torch.bool)
    finite[1, :, 2] = False
    torch.testing.assert_close(sim.ov[finite], clean.ov[finite])
    torch.testing.assert_close(sim.qk, clean.qk)  # the NaN is in W_V: QK is untouched
    assert np.isnan(principal_cosines(wa.get("blocks.1.attn.W_V")[2], wb.get("blocks.1.attn.W_V")[2]))


def test_huge_heads_have_the_similarity_of_the_unscaled_head() -> None:
    """Similarity is scale-free per head: W_V, W_O × 1e19 (finite in float32, products are
    not) gives the same numbers as the head itself, not NaN."""
    wa = random_weights(0)
    wb = edited(edited(wa, "W_V", 0, 1, lambda x: x * 1e19), "W_O", 0, 1, lambda x: x * 1e19)
    wb = edited(edited(wb, "W_Q", 1, 0, lambda x: x * 1e19), "W_K", 1, 0, lambda x: x * 3e18)
    torch.testing.assert_close(circuit_similarity(wa, wb).ov, circuit_similarity(wa, wa).ov, atol=1e-5, rtol=0)
    torch.testing.assert_close(circuit_similarity(wa, wb).qk, circuit_similarity(wa, wa).qk, atol=1e-5, rtol=0)


def test_principal_cosines() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(10, 3, generator=g)
    mix = torch.randn(3, 3, generator=g) + 3 * torch.eye(3)
    assert principal_cosines(x, x @ mix) == pytest.approx(1.0, abs=1e-5)  # each cosine is at most 1
    e = torch.eye(10)
    assert principal_cosines(e[:, :2], e[:, 2:4]) == pytest.approx(0.0, abs=1e-6)
    half = torch.cat([e[:, :1], (e[:, 1:2] + e[:, 2:3]) / 2**0.5], dim=1)  # cosines 1 and 1/√2
    assert principal_cosines(e[:, :2], half) == pytest.approx((1 + 2**-0.5) / 2, abs=1e-6)
