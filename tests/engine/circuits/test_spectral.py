"""Scores (docs/math.md, "Scores"): the weight-only sweeps (``spectral``, ``composition``,
numpy) and the behavioural ones against per-head dense definitions, constructed heads with
known answers, seeds, cancellation and non-finite weights."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from headscope.engine.circuits import composition as comp_mod
from headscope.engine.circuits import head_circuits as circuits
from headscope.engine.circuits import spectral
from headscope.engine.circuits.factored import FactoredMatrix
from headscope.engine.core.config import ModelConfig
from headscope.engine.core.errors import CancelledError, InvalidRequestError
from headscope.engine.forward import behaviour
from headscope.engine.forward.torch_weights import torch_weights
from headscope.engine.forward.transformer import run
from headscope.engine.model.weights import DictWeights
from tests.engine.circuits.test_head_circuits import random_weights


def all_copying_scores(w: DictWeights, progress=None, cancelled=None) -> torch.Tensor:
    """``spectral.spectral_scores``' copying scores ``[L, H]``, as a tensor."""
    return torch.from_numpy(spectral.spectral_scores(w, progress, cancelled)["copying_score"])


def all_qk_positivity(w: DictWeights, progress=None, cancelled=None) -> torch.Tensor:
    return torch.from_numpy(spectral.spectral_scores(w, progress, cancelled)["qk_positivity"])


def composition_scores(w: DictWeights, kind: str, seed: int = 0, progress=None, cancelled=None) -> SimpleNamespace:
    """``composition.composition_scores``, its scores as a tensor."""
    found = comp_mod.composition_scores(w, kind, seed, progress, cancelled)
    return SimpleNamespace(kind=found.kind, scores=torch.from_numpy(found.scores), baseline=found.baseline)


# -- reference implementations (dense, one head or pair at a time) ---------------------------


def dense_spectral_score(m: torch.Tensor) -> float:
    ev = torch.linalg.eigvals(m.double())
    return float(ev.real.sum() / ev.abs().sum())


def attn(w: DictWeights, layer: int, name: str) -> torch.Tensor:
    """A weight as a tensor (the forward layer's zero-copy view): the references do their
    maths in torch, apart from the numpy algebra under test."""
    return torch_weights(w).get(f"blocks.{layer}.attn.{name}")


def dense_composition(w: DictWeights, kind: str) -> torch.Tensor:
    cfg = w.cfg
    out = torch.zeros(cfg.n_layers, cfg.n_heads, cfg.n_layers, cfg.n_heads)
    for l1 in range(cfg.n_layers):
        for h1 in range(cfg.n_heads):
            ov1 = (attn(w, l1, "W_V")[h1] @ attn(w, l1, "W_O")[h1]).double()
            for l2 in range(l1 + 1, cfg.n_layers):
                for h2 in range(cfg.n_heads):
                    q, k = attn(w, l2, "W_Q")[h2].double(), attn(w, l2, "W_K")[h2].double()
                    v, o = attn(w, l2, "W_V")[h2].double(), attn(w, l2, "W_O")[h2].double()
                    right = {"q": q @ k.T, "k": k @ q.T, "v": v @ o}[kind]
                    out[l1, h1, l2, h2] = float(
                        torch.linalg.norm(ov1 @ right) / (torch.linalg.norm(ov1) * torch.linalg.norm(right))
                    )
    return out


# TransformerLens' head-detector patterns, transcribed from transformer_lens/head_detector.py.
def tl_previous_token_pattern(tokens: torch.Tensor) -> torch.Tensor:
    n = tokens.shape[-1]
    return torch.tril(torch.ones(n, n), diagonal=-1) - torch.tril(torch.ones(n, n), diagonal=-2)


def tl_duplicate_token_pattern(tokens: torch.Tensor) -> torch.Tensor:
    token_pattern = tokens.repeat(tokens.shape[-1], 1).numpy()
    eq_mask = np.equal(token_pattern, token_pattern.T).astype(int)
    np.fill_diagonal(eq_mask, 0)
    return torch.tril(torch.as_tensor(eq_mask).float())


def tl_induction_pattern(tokens: torch.Tensor) -> torch.Tensor:
    duplicate = tl_duplicate_token_pattern(tokens)
    shifted = torch.roll(duplicate, shifts=1, dims=1)
    zeros = torch.zeros(duplicate.shape[0], 1)
    return torch.tril(torch.cat((zeros, shifted[:, 1:]), dim=1))


def tl_mul_score(pattern: torch.Tensor, detection: torch.Tensor) -> float:
    return float((pattern * detection).sum() / pattern.sum())


# -- constructed models --------------------------------------------------------------------------


def copying_model(sign: float) -> DictWeights:
    """One head whose full OV circuit is ``sign · 3 · W_E W_Eᵀ`` (W_V W_O = ±3·I on the span of W_E)."""
    d_model, d_head, vocab = 8, 4, 6
    cfg = ModelConfig(family="native", architecture="test", n_layers=1, n_heads=2, d_model=d_model,
                      d_head=d_head, d_vocab=vocab, n_ctx=8, normalization=None)
    g = torch.Generator().manual_seed(0)
    w_e = torch.zeros(vocab, d_model)
    w_e[:, :d_head] = torch.randn(vocab, d_head, generator=g)
    eye = torch.eye(d_model)[:, :d_head]
    w_v = torch.stack((eye, torch.randn(d_model, d_head, generator=g)))
    w_o = torch.stack((sign * 3 * eye.T, torch.randn(d_head, d_model, generator=g)))
    t = {"embed.W_E": w_e, "unembed.W_U": w_e.T.clone(), "blocks.0.attn.W_V": w_v,
         "blocks.0.attn.W_O": w_o, "blocks.0.attn.W_Q": torch.randn(2, d_model, d_head, generator=g),
         "blocks.0.attn.W_K": torch.randn(2, d_model, d_head, generator=g)}
    return DictWeights(cfg, t)


N_CTX, VOCAB = 16, 8
POS, TOK, PREV = slice(0, N_CTX), slice(N_CTX, N_CTX + VOCAB), slice(N_CTX + VOCAB, N_CTX + 2 * VOCAB)


def induction_model() -> DictWeights:
    """Two layers, two heads each. Residual dims: positions | current token | previous token.

    (0, 0) is a previous-token head (its QK reads W_pos and prefers key i-1) that copies the
    token into the "previous token" dims; (1, 0) is an induction head: its query reads the
    current token, its key the previous-token dims, so it attends to the token after an
    earlier occurrence and copies it to the logits. (0, 1) and (1, 1) are small random heads.
    """
    d_model, d_head, beta = N_CTX + 2 * VOCAB, 16, 60.0
    cfg = ModelConfig(family="native", architecture="test", n_layers=2, n_heads=2, d_model=d_model,
                      d_head=d_head, d_vocab=VOCAB, n_ctx=N_CTX, normalization=None)
    g = torch.Generator().manual_seed(0)
    eye = torch.eye(d_model)
    t: dict[str, torch.Tensor] = {
        "embed.W_E": eye[TOK].clone(),  # token t -> e_{TOK t}
        "pos_embed.W_pos": eye[POS].clone(),  # position i -> e_i
        "unembed.W_U": eye[:, TOK].clone(),
        "unembed.b_U": torch.zeros(VOCAB),
    }
    for layer in range(2):
        w = {n: 0.1 * torch.randn(2, *s, generator=g) for n, s in
             [("W_Q", (d_model, d_head)), ("W_K", (d_model, d_head)), ("W_V", (d_model, d_head)),
              ("W_O", (d_head, d_model))]}
        w["W_Q"][0], w["W_K"][0], w["W_V"][0], w["W_O"][0] = 0, 0, 0, 0
        t |= {f"blocks.{layer}.attn.{n}": v for n, v in w.items()}
        t |= {f"blocks.{layer}.attn.{b}": torch.zeros(2, d_head) for b in ("b_Q", "b_K", "b_V")}
        t[f"blocks.{layer}.attn.b_O"] = torch.zeros(d_model)
    prev = {n: t[f"blocks.0.attn.{n}"][0] for n in ("W_Q", "W_K", "W_V", "W_O")}
    for i in range(1, N_CTX):
        prev["W_Q"][i, i - 1] = beta  # query at i looks for key position i-1
    for j in range(N_CTX):
        prev["W_K"][j, j] = 1.0
    for v in range(VOCAB):
        prev["W_V"][N_CTX + v, v] = 1.0  # read the token ...
        prev["W_O"][v, N_CTX + VOCAB + v] = 1.0  # ... write it to the previous-token dims
    ind = {n: t[f"blocks.1.attn.{n}"][0] for n in ("W_Q", "W_K", "W_V", "W_O")}
    for v in range(VOCAB):
        ind["W_Q"][N_CTX + v, v] = beta  # query: the current token
        ind["W_K"][N_CTX + VOCAB + v, v] = 1.0  # key: the token before the key position
        ind["W_V"][N_CTX + v, v] = 1.0
        ind["W_O"][v, N_CTX + v] = 10.0  # predict the attended token
    return DictWeights(cfg, t)


# -- spectral scores -------------------------------------------------------------------------------


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_identity_copying_head_scores_plus_one_and_its_negation_minus_one(sign):
    w = copying_model(sign)
    # an exact ±identity: float32 eigenvalues of a well-conditioned matrix, a few u each
    assert spectral.copying_score(circuits.full_ov(w, 0, 0)) == pytest.approx(sign, abs=1e-5)
    assert float(all_copying_scores(w)[0, 0]) == pytest.approx(sign, abs=1e-5)


@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_batched_spectral_scores_equal_the_dense_per_head_definition(n_kv_heads):
    w = random_weights(n_kv_heads=n_kv_heads, d_vocab=9)
    w_e, w_u = torch_weights(w).get("embed.W_E"), torch_weights(w).get("unembed.W_U")
    copying, positivity = all_copying_scores(w), all_qk_positivity(w)
    assert copying.shape == positivity.shape == (2, 4)
    for layer in range(2):
        for head in range(4):
            v, o = attn(w, layer, "W_V")[head], attn(w, layer, "W_O")[head]
            q, k = attn(w, layer, "W_Q")[head], attn(w, layer, "W_K")[head]
            want_c = dense_spectral_score(w_e @ v @ o @ w_u)
            want_p = dense_spectral_score(w_e @ q @ k.T @ w_e.T)
            # float32 factored eigenvalues against float64 dense ones: a ratio in [-1, 1] of sums
            # of |eigenvalues| (d_head of them); 1e-4 is ~1e3 u, the eigenvalues' condition
            assert float(copying[layer, head]) == pytest.approx(want_c, abs=1e-4)
            assert float(positivity[layer, head]) == pytest.approx(want_p, abs=1e-4)
            assert spectral.copying_score(circuits.full_ov(w, layer, head)) == pytest.approx(want_c, abs=1e-4)
            assert spectral.qk_positivity(circuits.token_qk(w, layer, head)) == pytest.approx(want_p, abs=1e-4)


# -- composition -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["q", "k", "v"])
@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_batched_composition_equals_the_dense_per_pair_definition(kind, n_kv_heads):
    w = random_weights(n_layers=3, n_kv_heads=n_kv_heads)
    result = composition_scores(w, kind, seed=5)
    assert result.kind == kind and result.scores.shape == (3, 4, 3, 4)
    torch.testing.assert_close(result.scores, dense_composition(w, kind), rtol=1e-4, atol=1e-5)
    later_or_same = torch.arange(3)[:, None] >= torch.arange(3)[None, :]
    assert (result.scores.permute(0, 2, 1, 3)[later_or_same] == 0).all()


def test_composition_score_is_its_definition_on_dense_matrices():
    """``‖W_A W_B‖_F / (‖W_A‖_F ‖W_B‖_F)``, from the factors, for rectangular factors and a
    batch; scale-free, and 1 when ``W_B`` only reads what ``W_A`` writes."""
    g = torch.Generator().manual_seed(3)
    a = FactoredMatrix(torch.randn(5, 9, 3, generator=g, dtype=torch.float64).numpy(),
                       torch.randn(5, 3, 7, generator=g, dtype=torch.float64).numpy())
    b = FactoredMatrix(torch.randn(5, 7, 2, generator=g, dtype=torch.float64).numpy(),
                       torch.randn(5, 2, 11, generator=g, dtype=torch.float64).numpy())
    ab, bb = torch.from_numpy(a.AB), torch.from_numpy(b.AB)
    dense = torch.linalg.matrix_norm(ab @ bb) / (torch.linalg.matrix_norm(ab) * torch.linalg.matrix_norm(bb))
    torch.testing.assert_close(torch.from_numpy(comp_mod.composition_score(a, b)), dense)
    torch.testing.assert_close(torch.from_numpy(comp_mod.composition_score(a * 3.0, b)), dense)
    u = torch.linalg.qr(torch.randn(6, 1, generator=g, dtype=torch.float64))[0].numpy()  # rank one, W_B = W_Aᵀ
    rank_one = FactoredMatrix(u, u.T)
    assert float(comp_mod.composition_score(rank_one, rank_one)) == pytest.approx(1.0)


@pytest.mark.parametrize("kind", ["q", "k", "v"])
@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_batched_composition_equals_composition_score_on_the_heads_circuits(kind, n_kv_heads):
    """The fast path (reduced factors, one matmul per target layer) against the definition
    on each pair's FactoredMatrix circuits: OV₁ and QK₂ / QK₂ᵀ / OV₂."""
    w = random_weights(n_layers=3, n_kv_heads=n_kv_heads)
    fast = composition_scores(w, kind, seed=5).scores
    for l1 in range(3):
        for h1 in range(4):
            for l2 in range(l1 + 1, 3):
                for h2 in range(4):
                    target = {"q": circuits.qk(w, l2, h2), "k": circuits.qk(w, l2, h2).T,
                              "v": circuits.ov(w, l2, h2)}[kind]
                    want = comp_mod.composition_score(circuits.ov(w, l1, h1), target)
                    assert float(fast[l1, h1, l2, h2]) == pytest.approx(float(want), rel=1e-4, abs=1e-6)


def test_composition_baseline_is_seeded():
    a = comp_mod.composition_baseline(16, 4, seed=1)
    assert comp_mod.composition_baseline(16, 4, seed=1) == a
    assert comp_mod.composition_baseline(16, 4, seed=2) != a
    w = random_weights()
    assert composition_scores(w, "k", seed=1).baseline == comp_mod.composition_baseline(12, 5, seed=1)


@pytest.mark.parametrize("d_model, d_head", [(16, 4), (6, 6), (3, 5), (40, 8)])
def test_composition_baseline_matches_a_dense_monte_carlo_estimate(d_model, d_head):
    """The baseline draws d_head-sized Wishart and Gaussian matrices in place of the dense
    factors' products; the mean of the dense products' score, drawn independently, agrees
    within 4 standard errors of the difference of two means (d_model < d_head included)."""
    n = 2000
    rng = np.random.default_rng(0)

    def gaussian(rows, cols):
        return rng.standard_normal((n, rows, cols))

    ov1 = gaussian(d_model, d_head) @ gaussian(d_head, d_model)
    qk2 = gaussian(d_model, d_head) @ np.swapaxes(gaussian(d_model, d_head), -2, -1)
    ratios = np.linalg.norm(ov1 @ qk2, axis=(-2, -1)) / (
        np.linalg.norm(ov1, axis=(-2, -1)) * np.linalg.norm(qk2, axis=(-2, -1)))
    standard_error = ratios.std() * np.sqrt(2 / n)
    got = comp_mod.composition_baseline(d_model, d_head, seed=1, samples=n)
    assert got == pytest.approx(ratios.mean(), abs=4 * standard_error)


def test_previous_token_head_feeding_an_induction_head_is_the_top_k_composition_edge():
    w = induction_model()
    k_comp = composition_scores(w, "k")
    top = torch.nan_to_num(k_comp.scores, nan=-1.0).flatten().argmax()
    assert np.unravel_index(int(top), k_comp.scores.shape) == (0, 0, 1, 0)
    assert float(k_comp.scores[0, 0, 1, 0]) == pytest.approx(1 / math.sqrt(VOCAB), rel=1e-4)
    assert float(k_comp.scores[0, 0, 1, 0]) > k_comp.baseline
    # The previous-token head writes where the induction head's *key* reads, not its query.
    assert float(composition_scores(w, "q").scores[0, 0, 1, 0]) == pytest.approx(0, abs=1e-6)


# -- behaviour ---------------------------------------------------------------------------------------


def test_constructed_heads_get_their_behaviour_scores():
    w = induction_model()
    b = behaviour.behaviour_scores(w, seed=0)
    assert float(b["prev_token"][0, 0]) > 0.99
    # Only the second copy's first query is split: key 0 also "follows" token 0, because
    # the previous-token head at position 0 can only attend to itself.
    assert float(b["induction"][1, 0]) > 0.9
    assert float(b["induction"][0, 0]) < 0.2
    assert float(b["prev_token"][1, 0]) < 0.5
    assert float(b["duplicate_token"][0, 0]) < 0.2


def test_repeated_tokens_are_seeded_and_duplicate_only_across_copies():
    toks = behaviour.repeated_tokens(50, 40, seed=3, seq_len=10, batch=2)
    assert toks.shape == (2, 20)
    torch.testing.assert_close(toks, behaviour.repeated_tokens(50, 40, seed=3, seq_len=10, batch=2))
    assert not torch.equal(toks, behaviour.repeated_tokens(50, 40, seed=4, seq_len=10, batch=2))
    assert torch.equal(toks[:, :10], toks[:, 10:])
    assert all(len(set(row[:10].tolist())) == 10 for row in toks)
    with pytest.raises(InvalidRequestError):
        behaviour.repeated_tokens(50, 15, seq_len=8)


def soft_attention_weights(d_vocab: int, seed: int) -> DictWeights:
    """``random_weights`` with W_Q and W_K scaled by 0.1: layer 1's attention logits are O(10)
    instead of O(1e4), where every pattern is one-hot and a score is a ratio of rounding
    residues (ill-conditioned: CPUs disagree in the 5th digit)."""
    w = random_weights(d_vocab=d_vocab, seed=seed)
    t = {k: torch.as_tensor(v) * 0.1 if k.endswith(("W_Q", "W_K")) else v for k, v in w._t.items()}
    return DictWeights(w.cfg, t, path=w.path)


def float64_patterns(w: DictWeights, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A float64 forward of ``random_weights``' attention-only, unnormalised model:
    the patterns ``[b, L, H, p, p]`` and each head's logit condition ``[L, H]``: the largest
    ``sum_k (|x||W_Q|)_k (|x||W_K|)_k / sqrt(d_head)`` of any entry, which bounds a logit's
    float32 error by ``u * (d_head + 2 d_model)`` times it (the dot products' lengths)."""
    t = {k: torch.as_tensor(v).double() for k, v in w._t.items()}
    cfg = w.cfg
    pos = tokens.shape[1]
    causal = torch.ones(pos, pos, dtype=torch.bool).tril()
    x = t["embed.W_E"][tokens] + t["pos_embed.W_pos"][:pos]
    patterns, conds = [], []
    for layer in range(cfg.n_layers):
        a = {n: t[f"blocks.{layer}.attn.{n}"] for n in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")}
        q, k, v = (torch.einsum("bpd,hde->bhpe", x, a["W_" + n]) + a["b_" + n][:, None] for n in "QKV")
        logits = q @ k.transpose(-1, -2) / math.sqrt(cfg.d_head)
        aq, ak = (torch.einsum("bpd,hde->bhpe", x.abs(), a["W_" + n].abs()) for n in "QK")
        conds.append((aq @ ak.transpose(-1, -2)).masked_fill(~causal, 0).amax(dim=(0, 2, 3)) / math.sqrt(cfg.d_head))
        pattern = logits.masked_fill(~causal, -math.inf).softmax(-1)
        patterns.append(pattern)
        x = x + torch.einsum("bhpe,hed->bpd", pattern @ v, a["W_O"]) + a["b_O"]
    return torch.stack(patterns, dim=1), torch.stack(conds)


def score_tolerance(cfg: ModelConfig, cond: float, ref: float) -> float:
    """The float32 error bound of a detection score against a float64 reference: a logit's
    error is at most ``u (d_head + 2 d_model) cond``; a softmax entry's relative error at most
    twice that, and a ratio of sums of such positive entries twice again. Relative, because
    with the exclusions the masked mass in the denominator can be small."""
    u = float(np.finfo(np.float32).eps) / 2
    return 4 * u * (cfg.d_head + 2 * cfg.d_model) * cond * abs(ref) + 4 * u


@pytest.mark.parametrize("seq_len,vocab", [(6, 23), (8, 5)])  # 5 < 8: repeats inside a copy
def test_behaviour_scores_match_transformerlens_detect_head_mul(seq_len, vocab):
    w = soft_attention_weights(vocab, seed=4)
    tokens = behaviour.repeated_tokens(vocab, 16, seed=7, seq_len=seq_len, batch=3)
    got = behaviour.behaviour_scores(w, seed=7, seq_len=seq_len, batch=3)
    patterns, cond = float64_patterns(w, tokens)
    refs = {"prev_token": tl_previous_token_pattern, "duplicate_token": tl_duplicate_token_pattern,
            "induction": tl_induction_pattern}
    for name, make in refs.items():
        for layer in range(2):
            for head in range(4):
                per_seq = []
                for b in range(3):
                    det = make(tokens[b])
                    tl = tl_mul_score(patterns[b, layer, head], det)
                    # TransformerLens divides by every row's mass (each row sums to 1); we
                    # divide by the rows where the pattern has an entry.
                    per_seq.append(tl * det.shape[0] / int((det.sum(-1) > 0).sum()))
                ref = float(np.mean(per_seq))
                tol = score_tolerance(w.cfg, float(cond[layer, head]), ref)
                assert float(got[name][layer, head]) == pytest.approx(ref, abs=tol)


def tl_masked_score(pattern: torch.Tensor, detection: torch.Tensor, exclude_bos: bool,
                    exclude_current_token: bool) -> float:
    """TransformerLens' compute_head_attention_similarity_score ("mul") with its exclusions,
    with headscope's denominator: the masked mass of the rows where the pattern has an entry."""
    pattern = pattern.clone()
    if exclude_bos:
        pattern[:, 0] = 0
    if exclude_current_token:
        pattern.fill_diagonal_(0)
    rows = detection.sum(-1) > 0
    return float((pattern * detection).sum() / pattern[rows].sum())


@pytest.mark.parametrize("exclude_bos,exclude_current_token", [(True, False), (False, True), (True, True)])
def test_behaviour_scores_exclude_bos_and_current_token_as_transformerlens(exclude_bos, exclude_current_token):
    w = soft_attention_weights(23, seed=5)
    tokens = behaviour.repeated_tokens(23, 16, seed=2, seq_len=6, batch=2)
    got = behaviour.behaviour_scores(w, seed=2, seq_len=6, batch=2, exclude_bos=exclude_bos,
                                  exclude_current_token=exclude_current_token)
    plain = behaviour.behaviour_scores(w, seed=2, seq_len=6, batch=2)
    patterns, cond = float64_patterns(w, tokens)
    refs = {"prev_token": tl_previous_token_pattern, "duplicate_token": tl_duplicate_token_pattern,
            "induction": tl_induction_pattern}
    for name, make in refs.items():
        changed = False
        for layer in range(2):
            for head in range(4):
                ref = float(np.mean([tl_masked_score(patterns[b, layer, head], make(tokens[b]), exclude_bos,
                                                     exclude_current_token) for b in range(2)]))
                tol = score_tolerance(w.cfg, float(cond[layer, head]), ref)
                assert float(got[name][layer, head]) == pytest.approx(ref, abs=tol)
                changed |= abs(float(got[name][layer, head] - plain[name][layer, head])) > 10 * tol
        assert changed  # the options change the scores by more than the tolerance


# -- ablation ------------------------------------------------------------------------------------------


def loss_without(w: DictWeights, tokens: torch.Tensor, layer: int | None, head: int | None) -> float:
    """Reference: zero-ablation is the same model with that head's W_O set to zero."""
    t = dict(w._t)
    if layer is not None:
        w_o = torch.as_tensor(t[f"blocks.{layer}.attn.W_O"]).clone()
        w_o[head] = 0
        t[f"blocks.{layer}.attn.W_O"] = w_o
    logits = run(DictWeights(w.cfg, t), tokens).logits
    half = tokens.shape[1] // 2  # the second copy's predictions of tokens half+1 ..
    return float(torch.nn.functional.cross_entropy(logits[:, half:-1].flatten(0, 1),
                                                   tokens[:, half + 1 :].flatten()))


def test_ablation_effects_are_loss_increases_and_the_induction_head_matters_most():
    w = induction_model()
    effects = behaviour.ablation_effects(w, seed=2)
    tokens = behaviour.repeated_tokens(VOCAB, N_CTX, seed=2)
    base = loss_without(w, tokens, None, None)
    for layer in range(2):
        for head in range(2):
            want = loss_without(w, tokens, layer, head) - base
            # a difference of two float32 losses of O(log VOCAB) from forwards in other batch shapes
            assert float(effects[layer, head]) == pytest.approx(want, abs=1e-4)
    assert float(effects[1, 0]) > 0.5  # the induction head predicts the whole second copy
    assert np.unravel_index(int(effects.flatten().argmax()), effects.shape) in {(1, 0), (0, 0)}
    # the same losses (~2) in another batch shape: a few float32 u of the loss, not of the effect
    assert behaviour.ablation_effect(w, 1, 0, seed=2) == pytest.approx(float(effects[1, 0]), abs=1e-5)


# -- sweeps: progress, cancellation, non-finite weights ------------------------------------------


def test_sweeps_report_progress_up_to_one():
    w = random_weights(n_layers=3)
    for sweep in (all_copying_scores, all_qk_positivity,
                  lambda w, progress: composition_scores(w, "v", progress=progress)):
        seen: list[float] = []
        sweep(w, progress=seen.append)
        assert seen == sorted(seen) and seen[-1] == 1.0


@pytest.mark.parametrize("sweep", [
    lambda w, c: all_copying_scores(w, cancelled=c),
    lambda w, c: all_qk_positivity(w, cancelled=c),
    lambda w, c: composition_scores(w, "q", cancelled=c),
    lambda w, c: behaviour.behaviour_scores(w, cancelled=c),
    lambda w, c: behaviour.ablation_effects(w, cancelled=c),
])
def test_a_cancelled_sweep_raises_cancelled_error(sweep):
    w = random_weights(n_layers=3)
    calls = []

    def cancelled() -> bool:  # turns true after the first layer's check
        calls.append(1)
        return len(calls) > 1

    with pytest.raises(CancelledError):
        sweep(w, cancelled)


def with_nan(w: DictWeights, name: str, layer: int, head: int) -> DictWeights:
    t = dict(w._t)
    x = torch.as_tensor(t[f"blocks.{layer}.attn.{name}"]).clone()
    x[head].view(-1)[3] = float("nan")
    t[f"blocks.{layer}.attn.{name}"] = x
    return DictWeights(w.cfg, t)


@pytest.mark.parametrize("name", ["W_Q", "W_K", "W_V", "W_O"])
def test_nan_weights_give_nan_scores_for_that_head_and_no_crash(name):
    clean = random_weights(n_layers=3)
    w = with_nan(clean, name, 1, 2)
    assert spectral.nonfinite_heads(w) == [(1, 2)]
    assert spectral.nonfinite_heads(clean) == []
    bad = torch.zeros(3, 4, dtype=torch.bool)
    bad[1, 2] = True
    for sweep in (all_copying_scores, all_qk_positivity):
        s, ref = sweep(w), sweep(clean)
        assert torch.isnan(s[bad]).all()
        torch.testing.assert_close(s[~bad], ref[~bad])
    comp, ref = composition_scores(w, "k").scores, composition_scores(clean, "k").scores
    assert torch.isnan(comp[1, 2, 2]).all() and torch.isnan(comp[0, :, 1, 2]).all()
    assert comp[1, 2, 0].eq(0).all()  # no edge to an earlier layer: stays zero
    finite = ~torch.isnan(comp)
    torch.testing.assert_close(comp[finite], ref[finite])
    behaviours = behaviour.behaviour_scores(w, seq_len=6)
    assert torch.isnan(behaviours["induction"][1, 2])
    assert torch.isfinite(behaviours["induction"][0]).all()  # layer 0 is upstream of the NaN
    # The single-circuit scores see only their own factors: NaN when the NaN is in them.
    circuit = circuits.token_qk if name in ("W_Q", "W_K") else circuits.full_ov
    assert math.isnan(spectral.copying_score(circuit(w, 1, 2)))


def test_a_zero_head_has_undefined_scores_not_a_crash():
    clean = random_weights(n_layers=2)
    t = dict(clean._t)
    w_o = torch.as_tensor(t["blocks.0.attn.W_O"]).clone()
    w_o[1] = 0  # a pruned head: OV = 0, so every ratio is 0/0
    t["blocks.0.attn.W_O"] = w_o
    w = DictWeights(clean.cfg, t)
    assert spectral.nonfinite_heads(w) == []
    assert torch.isnan(all_copying_scores(w)[0, 1])
    comp = composition_scores(w, "v").scores
    assert torch.isnan(comp[0, 1, 1]).all() and torch.isfinite(comp[0, 0, 1]).all()


def test_r_factor_never_decomposes_a_non_finite_gram():
    x = torch.randn(3, 10, 4, generator=torch.Generator().manual_seed(0)).numpy()
    x[1, 2, 3] = float("inf")
    root = comp_mod._r_factor(x)
    np.testing.assert_array_equal(root[1], np.zeros((4, 4), np.float32))
    np.testing.assert_allclose(root[0].T @ root[0], x[0].T @ x[0], atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("raw", [False, True])
def test_untied_middles_in_vocabulary_blocks_equal_the_whole_products(tmp_path, monkeypatch, raw):
    """Llama's untied W_E/W_U, processed (final-norm gain folded, W_U centred over the
    vocabulary) and raw: the middles summed over blocks of 7 tokens (ragged last block) are the
    whole products to float32 rounding of a sum over the vocabulary."""
    from bench.checkpoints import SHAPES, write_checkpoint
    from headscope.engine.model.loading import load_model

    w = load_model(write_checkpoint(SHAPES["tiny-llama"], tmp_path), raw=raw).weights
    assert w.tied_embedding() is None
    whole = spectral.spectral_middles(w)
    monkeypatch.setattr(spectral, "VOCAB_WHOLE_BYTES", 0)
    monkeypatch.setattr(spectral, "VOCAB_BLOCK_BYTES", 4 * 64 * 7)
    blocked = spectral.spectral_middles(w)
    eps = float(np.finfo(np.float32).eps)
    for name in spectral.SPECTRAL_SCORES:
        scale = float(np.abs(whole[name]).max())
        np.testing.assert_allclose(blocked[name], whole[name], rtol=0, atol=500 * eps * scale)


def test_sweep_without_read_ahead_gives_the_same_scores_and_reads_each_layer_once(tmp_path, monkeypatch):
    """A layer larger than ``READ_AHEAD_BYTES`` (70B widths) is not read during the previous
    one's eigenvalues: the scores are bit-identical and every attention tensor is still read
    from the file once, in file order."""
    from bench.checkpoints import SHAPES, write_checkpoint
    from headscope.engine.model.loading import load_model

    path = write_checkpoint(SHAPES["tiny-llama"], tmp_path)
    ahead = spectral.spectral_scores(load_model(path).weights)
    monkeypatch.setattr(spectral, "READ_AHEAD_BYTES", 0)
    model = load_model(path)
    reads: list[str] = []
    model.raw_weights.on_read = lambda file, tensor, offset, n: reads.append(tensor)
    alone = spectral.spectral_scores(model.weights)
    for name, value in ahead.items():
        np.testing.assert_array_equal(alone[name], value)
    attn = [t for t in reads if ".self_attn." in t]
    assert len(attn) == len(set(attn)) == 4 * model.cfg.n_layers
