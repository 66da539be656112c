"""Rotary embeddings (engine/model/rotary.py) against Hugging Face's (torch)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headscope.engine.circuits import head_circuits as circuits
from headscope.engine.forward.torch_weights import torch_weights
from headscope.engine.model import rotary
from tests.engine.circuits.test_head_circuits import (
    close,
    dense_torch,
    hf_rotary_score,
    random_weights,
    t,
)


@pytest.mark.parametrize("rotary_dim", [None, 4])
def test_rotary_qk_is_the_score_of_rotated_queries_and_keys(rotary_dim):
    w = random_weights(positional="rotary", d_head=6, rotary_dim=rotary_dim, n_ctx=64)
    g = torch.Generator().manual_seed(1)
    x_q, x_k = torch.randn(12, generator=g), torch.randn(12, generator=g)
    q, k = x_q @ dense_torch(w, 1, "W_Q")[2], x_k @ dense_torch(w, 1, "W_K")[2]
    for i, delta in [(5, 0), (5, 1), (9, 3), (40, 17), (3, -2)]:
        expected = hf_rotary_score(q, k, i, i - delta, w.cfg)
        got = x_q @ t(circuits.rotary_qk(w, 1, 2, delta).AB) @ x_k
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    # Offset 0 is the plain QK circuit.
    close(circuits.rotary_qk(w, 1, 2, 0).AB, circuits.qk(w, 1, 2).AB)


def test_rotary_matrices_compose_like_rotations():
    w = random_weights(positional="rotary", d_head=6, rotary_dim=4)
    r = lambda d: rotary.rotary_matrix(w.cfg, d)  # noqa: E731
    close(r(7) @ r(3).T, r(4))
    close(r(5) @ r(5).T, np.eye(6, dtype=np.float32))


def test_rotary_profile_is_the_documented_statistic():
    w = random_weights(positional="rotary", d_head=6, rotary_dim=4, d_vocab=40)
    offsets = [0, 1, 2, 7]
    profile = circuits.rotary_profile(w, 0, 1, offsets, n_tokens=10, seed=3)
    ids = torch.randperm(40, generator=torch.Generator().manual_seed(3))[:10]
    w_q, w_k = dense_torch(w, 0, "W_Q")[1], dense_torch(w, 0, "W_K")[1]
    for n, delta in enumerate(offsets):
        total = 0.0
        for t in ids.tolist():  # noqa: F402 (a token id; t() is not called here)
            e = torch_weights(w).get("embed.W_E")[t]
            e = e * 12**0.5 / e.norm()
            total += float(hf_rotary_score(e @ w_q, e @ w_k, 20 + delta, 20, w.cfg))
        assert float(profile[n]) == pytest.approx(total / 10, rel=1e-4, abs=1e-4)
    # Reproducible for a seed.
    np.testing.assert_array_equal(circuits.rotary_profile(w, 0, 1, offsets, n_tokens=10, seed=3), profile)
