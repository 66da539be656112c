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


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6])
def test_hungarian_matching_is_optimal(n: int) -> None:
    g = torch.Generator().manual_seed(n)
    for _ in range(5):
        s = torch.randn(n, n, generator=g).tolist()
        match = best_matching(s)
        assert sorted(match) == list(range(n))
        best = max(sum(s[i][p[i]] for i in range(n)) for p in itertools.permutations(range(n)))
        assert sum(s[i][match[i]] for i in range(n)) == pytest.approx(best)
