"""The weight sweeps (docs/math.md, "Scores"; numpy) against their straightforward definitions on random
checkpoints (GQA, bf16, LayerNorm and RMSNorm), and the pieces a sweep is made of: one layer
of spectral scores, one layer pair of composition scores, streamed as they finish."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.checkpoints import SHAPES, write_checkpoint
from headscope.engine.circuits import composition as comp
from headscope.engine.circuits import spectral
from headscope.engine.circuits.spectral import kept_spectral_middles
from headscope.engine.model.loading import load_model
from headscope.engine.model.weights import DictWeights
from headscope.engine.sweeps import scores as score_sweeps
from tests.engine.circuits.test_head_circuits import random_weights


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-gpt2", "tiny-llama-mha"])
def model(request, tmp_path_factory):
    """A processed random checkpoint: GQA bf16 RMSNorm, tied fp32 LayerNorm, 3-layer bf16."""
    return load_model(write_checkpoint(SHAPES[request.param], tmp_path_factory.mktemp("ck")))


def _f64(w, name: str) -> np.ndarray:
    """A weight (a read-only float32 array) as a float64 copy for the dense definitions."""
    return np.asarray(w.get(name), dtype=np.float64)


def _attn(w, layer: int, name: str) -> np.ndarray:
    return _f64(w, f"blocks.{layer}.attn.{name}")


def _spectral(m: np.ndarray) -> float:
    """``Σ Re λ / Σ |λ|`` of the dense matrix ``m``."""
    ev = np.linalg.eigvals(m)
    return float(ev.real.sum() / np.abs(ev).sum())


def definition_scores(w) -> tuple[np.ndarray, np.ndarray]:
    """Copying (full OV ``W_E W_V W_O W_U``) and QK positivity (token QK ``W_E W_Q W_Kᵀ W_Eᵀ``)
    from the eigenvalues of the dense ``d_vocab × d_vocab`` circuits, head by head."""
    cfg = w.cfg
    w_e, w_u = _f64(w, "embed.W_E"), _f64(w, "unembed.W_U")
    copying = np.empty((cfg.n_layers, cfg.n_heads))
    positivity = np.empty((cfg.n_layers, cfg.n_heads))
    for layer in range(cfg.n_layers):
        q, k, v, o = (_attn(w, layer, n) for n in ("W_Q", "W_K", "W_V", "W_O"))
        for h in range(cfg.n_heads):
            copying[layer, h] = _spectral(w_e @ v[h] @ o[h] @ w_u)
            positivity[layer, h] = _spectral(w_e @ q[h] @ k[h].T @ w_e.T)
    return copying, positivity


def dense_composition(w, kind: str) -> np.ndarray:
    """``‖W_A W_B‖_F / (‖W_A‖_F ‖W_B‖_F)`` with dense ``d_model × d_model`` circuits."""
    cfg = w.cfg
    out = np.zeros((cfg.n_layers, cfg.n_heads, cfg.n_layers, cfg.n_heads))
    m = {layer: {n: _attn(w, layer, n) for n in ("W_Q", "W_K", "W_V", "W_O")} for layer in range(cfg.n_layers)}
    for l1 in range(cfg.n_layers):
        for h1 in range(cfg.n_heads):
            ov = m[l1]["W_V"][h1] @ m[l1]["W_O"][h1]
            for l2 in range(l1 + 1, cfg.n_layers):
                for h2 in range(cfg.n_heads):
                    a = m[l2]
                    right = {"q": a["W_Q"][h2] @ a["W_K"][h2].T, "k": a["W_K"][h2] @ a["W_Q"][h2].T,
                             "v": a["W_V"][h2] @ a["W_O"][h2]}[kind]
                    out[l1, h1, l2, h2] = np.linalg.norm(ov @ right) / (np.linalg.norm(ov) * np.linalg.norm(right))
    return out


def test_spectral_sweep_equals_the_eigenvalue_definition(model):
    copying, positivity = definition_scores(model.weights)
    fused = spectral.spectral_scores(model.weights)
    np.testing.assert_allclose(fused["copying_score"], copying, atol=1e-4)
    np.testing.assert_allclose(fused["qk_positivity"], positivity, atol=1e-4)
    assert not fused["nonfinite"].any() and not fused["overflow"].any()
    # the CLI's table is the same numbers, bit for bit (one code path)
    table = score_sweeps.score_table(model)
    np.testing.assert_array_equal(table.copying_score, fused["copying_score"])
    np.testing.assert_array_equal(table.qk_positivity, fused["qk_positivity"])


def test_one_layer_piece_equals_the_sweep_row(model):
    w = model.weights
    whole = spectral.spectral_scores(w)
    piece = spectral.layer_spectral_scores(w, 1, kept_spectral_middles(w))
    for name in ("copying_score", "qk_positivity", "nonfinite"):
        np.testing.assert_array_equal(piece[name], whole[name][1])


@pytest.mark.parametrize("kind", ["q", "k", "v"])
def test_tiled_composition_equals_the_definition_and_the_untiled_sweep(model, kind):
    w = model.weights
    untiled = comp.composition_scores(w, kind, tile_bytes=1 << 40).scores
    tiled = comp.composition_scores(w, kind, tile_bytes=1).scores  # one source layer a block
    np.testing.assert_allclose(tiled, untiled, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tiled, dense_composition(model.weights, kind), atol=1e-4)


def test_streamed_tiles_arrive_pair_by_pair_and_equal_the_final_matrix(model):
    w = model.weights
    tiles: list[comp.CompositionTile] = []
    fractions: list[float] = []
    final = comp.composition_scores(w, "k", on_tile=tiles.append, progress=fractions.append, tile_bytes=1)
    pairs = [(t.source, t.target) for t in tiles]
    assert sorted(pairs) == sorted(comp.composition_pairs(w.cfg.n_layers))
    assert len(set(pairs)) == len(pairs)
    for tile in tiles:
        np.testing.assert_array_equal(tile.scores, final.scores[tile.source, :, tile.target, :])
        alone = comp.composition_tile(w, "k", tile.source, tile.target)
        np.testing.assert_allclose(alone.scores, tile.scores, rtol=1e-5, atol=1e-6)
    assert fractions == sorted(fractions) and fractions[-1] == 1.0


def test_skipped_pairs_are_not_recomputed(model):
    w = model.weights
    n = w.cfg.n_layers
    done = frozenset(comp.composition_pairs(n)[:1])
    rest = [(t.source, t.target) for t in comp.iter_composition_tiles(w, "q", skip=done)]
    assert sorted(rest) == sorted(set(comp.composition_pairs(n)) - done)


def test_nonfinite_heads_are_nan_in_every_piece():
    w = random_weights(n_layers=3, n_heads=2)
    tensors = {k: np.array(w.get(k)) for k in w._t}  # writable float32 copies
    tensors["blocks.1.attn.W_Q"][1, 0, 0] = math.nan
    bad = DictWeights(w.cfg, tensors)
    fused = spectral.spectral_scores(bad)
    assert np.argwhere(fused["nonfinite"]).tolist() == [[1, 1]]
    assert math.isnan(fused["copying_score"][1, 1]) and math.isnan(fused["qk_positivity"][1, 1])
    assert not np.isnan(fused["copying_score"][1, 0])
    assert [tuple(x) for x in np.argwhere(fused["nonfinite"] | fused["overflow"]).tolist()] == \
        spectral.nonfinite_heads(bad)
    tile = comp.composition_tile(bad, "v", 0, 1)
    assert np.isnan(tile.scores[:, 1]).all() and not np.isnan(tile.scores[:, 0]).any()
    assert np.isnan(comp.composition_tile(bad, "v", 1, 2).scores[1]).all()
