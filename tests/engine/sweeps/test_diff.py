"""Circuit similarity from the factors (engine.circuits.similarity, numpy) against dense
circuits, head matching, and model diffs."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from headscope.engine.circuits import similarity
from headscope.engine.core.config import ModelConfig
from headscope.engine.core.errors import InvalidRequestError
from headscope.engine.model.weights import DictWeights
from headscope.engine.sweeps.diff import best_matching

L, H, D, DH, V, N_CTX = 2, 3, 16, 4, 40, 8


def circuit_similarity(wa: DictWeights, wb: DictWeights) -> SimpleNamespace:
    """``similarity.circuit_similarity`` on the numpy surface of ``wa``, ``wb``, as tensors."""
    ov, qk = similarity.circuit_similarity(wa, wb)
    return SimpleNamespace(ov=torch.from_numpy(ov), qk=torch.from_numpy(qk))


def principal_cosines(x: np.ndarray | torch.Tensor, y: np.ndarray | torch.Tensor) -> float:
    """The mean principal cosine of the column spaces of one pair (arrays or tensors)."""
    return float(similarity.principal_cosines(np.asarray(x)[None], np.asarray(y)[None])[0])


def random_weights(seed: int, d_model: int = D, d_head: int = DH, path: str | None = None) -> DictWeights:
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    cfg = ModelConfig(
        family="native", architecture="test", n_layers=L, n_heads=H, d_model=d_model,
        d_head=d_head, d_vocab=V, n_ctx=N_CTX, normalization=None,
    )
    t = {"embed.W_E": r(V, d_model), "unembed.W_U": r(d_model, V), "pos_embed.W_pos": r(N_CTX, d_model)}
    for layer in range(L):
        for name in ("W_Q", "W_K", "W_V"):
            t[f"blocks.{layer}.attn.{name}"] = r(H, d_model, d_head)
        t[f"blocks.{layer}.attn.W_O"] = r(H, d_head, d_model)
    return DictWeights(cfg, t, path=path)


def edited(w: DictWeights, name: str, layer: int, head: int, change) -> DictWeights:
    """A copy of ``w`` with ``change`` applied to one head's ``blocks.{layer}.attn.{name}``."""
    t = dict(w._t)
    x = t[f"blocks.{layer}.attn.{name}"].clone()
    x[head] = change(x[head])
    t[f"blocks.{layer}.attn.{name}"] = x
    return DictWeights(w.cfg, t)


def dense_full_ov(w: DictWeights, layer: int, head: int) -> np.ndarray:
    wv = w.get(f"blocks.{layer}.attn.W_V")[head]
    wo = w.get(f"blocks.{layer}.attn.W_O")[head]
    return w.get("embed.W_E") @ wv @ wo @ w.get("unembed.W_U")


def dense_token_qk(w: DictWeights, layer: int, head: int) -> np.ndarray:
    wq = w.get(f"blocks.{layer}.attn.W_Q")[head]
    wk = w.get(f"blocks.{layer}.attn.W_K")[head]
    e = w.get("embed.W_E")
    return e @ wq @ wk.T @ e.T


def cosine(x: np.ndarray, y: np.ndarray) -> float:
    return float((x * y).sum() / (np.linalg.norm(x) * np.linalg.norm(y)))


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


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6])
def test_hungarian_matching_is_optimal(n: int) -> None:
    g = torch.Generator().manual_seed(n)
    for _ in range(5):
        s = torch.randn(n, n, generator=g).tolist()
        match = best_matching(s)
        assert sorted(match) == list(range(n))
        best = max(sum(s[i][p[i]] for i in range(n)) for p in itertools.permutations(range(n)))
        assert sum(s[i][match[i]] for i in range(n)) == pytest.approx(best)


def test_principal_cosines() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(10, 3, generator=g)
    mix = torch.randn(3, 3, generator=g) + 3 * torch.eye(3)
    assert principal_cosines(x, x @ mix) == pytest.approx(1.0, abs=1e-5)  # each cosine is at most 1
    e = torch.eye(10)
    assert principal_cosines(e[:, :2], e[:, 2:4]) == pytest.approx(0.0, abs=1e-6)
    half = torch.cat([e[:, :1], (e[:, 1:2] + e[:, 2:3]) / 2**0.5], dim=1)  # cosines 1 and 1/√2
    assert principal_cosines(e[:, :2], half) == pytest.approx((1 + 2**-0.5) / 2, abs=1e-6)
