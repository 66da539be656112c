"""engine.forward beyond parity: head ablation, per-head outputs, the final-norm scale used for
direct logit attribution, masks, input validation and non-finite weights."""

from __future__ import annotations

import pytest
import torch

from headscope.engine.core.errors import ConfigError, IndexOutOfRangeError, PromptError
from headscope.engine.forward.torch_weights import torch_weights
from headscope.engine.forward.transformer import log_probs, run
from headscope.engine.model.processing import ProcessedWeights
from headscope.engine.model.weights import DictWeights
from tests.engine.model.test_processing import CTX, KINDS, V, make_cfg, random_tensors

TOKENS = torch.randint(0, V, (2, CTX), generator=torch.Generator().manual_seed(7))


def weights(kind: str, **cfg_changes: object) -> DictWeights:
    cfg = make_cfg(kind).replace(**cfg_changes)
    return DictWeights(cfg, random_tensors(make_cfg(kind)))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layer_head", [(0, 1), (1, 0)])
def test_zero_ablation_equals_removing_the_heads_output_weights(kind: str, layer_head: tuple[int, int]) -> None:
    """Zeroing a head's output is the same model as one with that head's W_O set to zero."""
    layer, head = layer_head
    w = weights(kind)
    tensors = {k: v.clone() for k, v in w._t.items()}
    tensors[f"blocks.{layer}.attn.W_O"][head] = 0.0
    manual = run(DictWeights(w.cfg, tensors), TOKENS)
    ablated = run(w, TOKENS, ablate=[(layer, head)])
    torch.testing.assert_close(ablated.logits, manual.logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(ablated.patterns, manual.patterns, rtol=0, atol=1e-6)
    assert not torch.allclose(ablated.logits, run(w, TOKENS).logits, atol=1e-3)


def _linear_model() -> DictWeights:
    """Attention-only, one layer, no normalisation: logits are linear in each head's output."""
    return weights("ln_attn_only", n_layers=1, normalization=None)


def _manual_head_output(w: DictWeights, pattern: torch.Tensor, head: int) -> torch.Tensor:
    """z W_O for one head from the formula: x = W_E[t] + W_pos, v = x W_V + b_V, z = A v."""
    def get(name: str) -> torch.Tensor:
        return torch.as_tensor(w.get(name))

    def get_head(name: str) -> torch.Tensor:
        return torch.as_tensor(w.get_head(name, head))

    x = get("embed.W_E")[TOKENS] + get("pos_embed.W_pos")[: TOKENS.shape[1]]
    v = x @ get_head("blocks.0.attn.W_V") + get_head("blocks.0.attn.b_V")
    return (pattern @ v) @ get_head("blocks.0.attn.W_O")  # [batch, pos, d_model]


@pytest.mark.parametrize("ablation", ["zero", "mean"])
def test_ablation_changes_logits_by_exactly_that_heads_contribution(ablation: str) -> None:
    w, head = _linear_model(), 2
    clean = run(w, TOKENS, return_head_outputs=True)
    result = _manual_head_output(w, clean.patterns[:, 0, head], head)
    torch.testing.assert_close(clean.head_outputs[:, 0, head], result, rtol=0, atol=1e-5)

    replacement = torch.zeros_like(result) if ablation == "zero" else result.mean(dim=1, keepdim=True)
    expected = clean.logits - (result - replacement) @ torch.as_tensor(w.get("unembed.W_U"))
    ablated = run(w, TOKENS, ablate=[(0, head)], ablation=ablation)
    torch.testing.assert_close(ablated.logits, expected, rtol=0, atol=1e-4)


def test_mean_ablation_averages_within_each_sequence() -> None:
    w = weights("ln")
    batch = run(w, TOKENS, ablate=[(0, 1)], ablation="mean")
    for i in range(TOKENS.shape[0]):
        alone = run(w, TOKENS[i], ablate=[(0, 1)], ablation="mean")
        torch.testing.assert_close(alone.logits[0], batch.logits[i], rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["ln_attn_only", "rms_gqa"])
def test_residual_decomposes_into_head_outputs_through_the_final_scale(kind: str) -> None:
    """Processed attention-only model: logits - b_U = (embeddings + Σ heads + Σ b_O) W_U / scale.

    This is the identity direct logit attribution relies on: the final norm's gain is folded
    into W_U and, for LayerNorm, W_U is centred, so the mean subtraction drops out."""
    w = ProcessedWeights(weights(kind, d_mlp=None))
    cfg = w.cfg
    res = run(w, TOKENS, return_head_outputs=True)
    assert res.head_outputs.shape == (TOKENS.shape[0], cfg.n_layers, cfg.n_heads, CTX, cfg.d_model)
    w = torch_weights(w)
    resid = w.get("embed.W_E")[TOKENS] + res.head_outputs.sum(dim=(1, 2))
    if cfg.positional == "learned":
        resid = resid + w.get("pos_embed.W_pos")[:CTX]
    resid = resid + sum(w.get(f"blocks.{i}.attn.b_O") for i in range(cfg.n_layers))
    expected = resid / res.final_scale @ w.get("unembed.W_U") + w.get("unembed.b_U")
    torch.testing.assert_close(res.logits, expected, rtol=0, atol=1e-4)


def test_final_scale_is_the_final_norms_divisor() -> None:
    w = weights("rms_gqa")
    res = run(w, TOKENS, return_head_outputs=True)
    assert res.final_scale.shape == (*TOKENS.shape, 1)
    assert run(w, TOKENS).final_scale is None and run(w, TOKENS).head_outputs is None
    assert run(weights("bert"), TOKENS, return_head_outputs=True).final_scale is None  # post-LN


@pytest.mark.parametrize("kind", KINDS)
def test_patterns_are_distributions_with_the_right_mask(kind: str) -> None:
    w = weights(kind)
    p = run(w, TOKENS).patterns
    assert p.shape == (TOKENS.shape[0], w.cfg.n_layers, w.cfg.n_heads, CTX, CTX)
    torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:-1]))
    above = p.triu(1)
    if w.cfg.causal:
        assert (above == 0).all()
    else:
        assert above.sum() > 1.0  # an encoder attends to later positions


def test_log_probs_normalise() -> None:
    lp = log_probs(run(weights("ln"), TOKENS))
    torch.testing.assert_close(lp.exp().sum(-1), torch.ones(TOKENS.shape))


@pytest.mark.parametrize(
    ("tokens", "error"),
    [([], PromptError), ([[]], PromptError), ([1, V], IndexOutOfRangeError),
     ([-1, 2], IndexOutOfRangeError), (list(range(CTX + 1)), IndexOutOfRangeError)],
)
def test_bad_tokens_raise_typed_errors(tokens: list, error: type) -> None:
    with pytest.raises(error):
        run(weights("ln"), tokens)


def test_bad_ablation_requests() -> None:
    w = weights("ln")
    with pytest.raises(IndexOutOfRangeError):
        run(w, [1, 2], ablate=[(0, w.cfg.n_heads)])
    with pytest.raises(IndexOutOfRangeError):
        run(w, [1, 2], ablate=[(w.cfg.n_layers, 0)])
    with pytest.raises(ValueError):
        run(w, [1, 2], ablate=[(0, 0)], ablation="resample")


def test_unknown_activation_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="solu"):
        run(weights("ln", act_fn="solu_ln"), [1, 2])


@pytest.mark.parametrize("kind", KINDS)
def test_non_finite_weights_do_not_crash(kind: str) -> None:
    w = weights(kind)
    w._t["blocks.0.attn.W_O"][0, 0, 0] = float("nan")
    w._t["embed.W_E"][3, 0] = float("inf")
    res = run(w, [3, 1, 2], return_head_outputs=True)
    assert not torch.isfinite(res.logits).all()
    run(ProcessedWeights(w), [3, 1, 2], ablate=[(0, 0)], ablation="mean")
