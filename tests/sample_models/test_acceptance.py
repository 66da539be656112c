"""Acceptance of the bundled sample models (sample_models/README.md): their circuits are real.

Scores come from the engine (``engine.circuits`` and ``engine.forward.behaviour`` on
``engine.model.loading.load_model``), i.e. what ``headscope heads`` shows; the training code's
own diagnostics (``sample_models.model``, written independently) are used as a cross-check of
the engine on trained weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from headscope.engine.forward.behaviour import (
    ablation_effects,
    behaviour_scores,
    repeated_tokens,
)
from headscope.engine.forward.torch_weights import torch_weights
from headscope.engine.forward.transformer import run
from headscope.engine.model.loading import load_model
from headscope.sample_models import corpus
from headscope.sample_models.model import ModelShape, TinyTransformer, copying_scores
from tests.conftest import INDUCTION_HEAD, PREV_TOKEN_HEAD, sample_model
from tests.weight_algebra import all_copying_scores, composition_scores

# Clear margins for zero-ablation (nats of mean loss on the second copy of the engine's
# repeated random tokens, where the intact model's loss is ≈ 0.04); the measured values are
# in sample_models/README.md. The previous-token head is a bottleneck (every induction head
# reads it); the induction head carries most, not all, of the copying: its two weaker
# siblings back it up in part.
ABLATION_MARGIN = 1.0
INDUCTION_ABLATION_MARGIN = 0.5


@pytest.fixture(scope="module")
def two_layer():
    model = load_model(sample_model("attn-only-2l"))
    w = model.weights
    return model, behaviour_scores(w, seed=0), all_copying_scores(w), composition_scores(w, "k")


def test_attn_only_2l_prev_token_head_k_composes_into_a_copying_induction_head(two_layer) -> None:
    model, behaviour, copying, comp = two_layer
    assert model.cfg.n_layers == 2
    # The strongest K-composition edge, baseline subtracted, over layer-0 → layer-1 pairs.
    edges = comp.scores[0, :, 1, :] - comp.baseline  # [H0, H1]
    src, dst = divmod(int(edges.argmax()), model.cfg.n_heads)
    assert float(edges[src, dst]) > 0, "the top edge beats random factors"
    assert float(behaviour["prev_token"][0, src]) >= 0.6, behaviour["prev_token"][0]
    assert float(behaviour["induction"][1, dst]) >= 0.5, behaviour["induction"][1]
    assert float(copying[1, dst]) >= 0.7, copying[1]
    # And they are the model's best previous-token and induction heads: the ones the README
    # and the other tests name.
    assert src == int(behaviour["prev_token"][0].argmax())
    assert dst == int(behaviour["induction"][1].argmax())
    assert ((0, src), (1, dst)) == (PREV_TOKEN_HEAD, INDUCTION_HEAD)


def _repeated_loss(model, ablate: list[tuple[int, int]]) -> float:
    """Next-token loss on the second copy of the engine's seeded repeated random sequences
    (positions T..2T-2 predicting T+1..2T-1: what the first copy determines), as
    ``engine.forward.behaviour.ablation_effects`` defines it."""
    tokens = repeated_tokens(model.cfg.d_vocab, model.cfg.n_ctx, seed=0)
    half = tokens.shape[1] // 2
    logits = run(model.weights, tokens, ablate=ablate).logits[:, half:-1]
    return float(torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), tokens[:, half + 1 :].reshape(-1)))


def test_attn_only_2l_zero_ablating_the_circuit_hurts_on_repeated_tokens(two_layer) -> None:
    model, behaviour, _, comp = two_layer
    edges = comp.scores[0, :, 1, :] - comp.baseline
    src, dst = divmod(int(edges.argmax()), model.cfg.n_heads)
    effects = ablation_effects(model.weights, seed=0)
    base = _repeated_loss(model, [])
    assert base < 0.2, "the intact model copies the repeated half"
    # The induction head (top K-composition target, best induction score) is the layer-1
    # head whose loss the model misses most, by a clear margin.
    assert float(effects[1, dst]) >= INDUCTION_ABLATION_MARGIN, effects[1]
    assert dst == int(effects[1].argmax())
    # The previous-token head is a bottleneck: every induction head reads its output.
    assert float(effects[0, src]) >= ABLATION_MARGIN, effects[0]
    # Zeroing every induction head together costs the whole in-context copying.
    induction_heads = [h for h in range(model.cfg.n_heads) if behaviour["induction"][1, h] >= 0.5]
    assert dst in induction_heads
    assert _repeated_loss(model, [(1, h) for h in induction_heads]) - base >= ABLATION_MARGIN
    # ...which the engine's per-head effect agrees with for the single head.
    assert _repeated_loss(model, [(1, dst)]) - base == pytest.approx(float(effects[1, dst]), abs=1e-4)


def test_attn_only_1l_copies_but_has_no_induction_head() -> None:
    model = load_model(sample_model("attn-only-1l"))
    assert model.cfg.n_layers == 1
    behaviour = behaviour_scores(model.weights, seed=0)
    assert float(behaviour["induction"].max()) < 0.3, behaviour["induction"]
    assert float(all_copying_scores(model.weights).max()) >= 0.7


@pytest.mark.parametrize("name", ["attn-only-1l", "attn-only-2l"])
def test_engine_copying_scores_match_the_training_code(name: str) -> None:
    # On the raw weights the engine's batched eigenvalue sweep and the training code's
    # plain torch.linalg.eigvals loop compute the same statistic.
    path = sample_model(name)
    cfg = json.loads((path / "headscope.json").read_text())
    shape = ModelShape(**{k: cfg[k] for k in ("n_layers", "n_heads", "d_model", "d_head",
                                              "d_vocab", "n_ctx")},
                       layer_norm=cfg["normalization"] == "LN")
    trained = TinyTransformer(shape)
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        trained.load_state_dict({k: f.get_tensor(k) for k in f.keys()})  # noqa: SIM118
    raw = load_model(path, raw=True)
    torch.testing.assert_close(all_copying_scores(raw.weights), copying_scores(trained),
                               rtol=0, atol=1e-4)


def test_native_sample_models_ship_their_vocabulary() -> None:
    for name in ("attn-only-1l", "attn-only-2l"):
        model = load_model(sample_model(name))
        text = "When Mary and John went to the store , John gave a drink to Mary ."
        assert model.tokenizer.encode(text) == corpus.encode(text)
        # Attention-only with LayerNorm, like TransformerLens' attn-only models.
        assert model.raw_cfg.normalization == "LN" and model.raw_cfg.d_mlp is None
        assert model.cfg.normalization == "LNPre", "processed: LayerNorm folded"


def test_gpt2_mini_loads_through_the_hf_adapter_and_agrees_with_transformers() -> None:
    transformers = pytest.importorskip("transformers")
    path = sample_model("gpt2-mini")
    model = load_model(path)
    assert model.raw_cfg.family == "gpt2" and model.raw_cfg.normalization == "LN"
    assert model.raw_cfg.d_mlp is not None and model.raw_cfg.tied_unembed
    text = corpus.Corpus(7).text(4)
    ids = model.tokenizer.encode(text)[: model.cfg.n_ctx]
    assert ids == corpus.encode(text)[: model.cfg.n_ctx]
    hf = transformers.GPT2LMHeadModel.from_pretrained(path).eval()
    with torch.no_grad():
        expected = hf(torch.tensor([ids])).logits
    for raw in (True, False):
        logits = run(model.with_raw(raw).weights, ids).logits
        # Processing centres the unembedding: logits move by a per-position constant.
        torch.testing.assert_close(logits - logits.mean(-1, keepdim=True),
                                   expected - expected.mean(-1, keepdim=True),
                                   rtol=1e-4, atol=1e-4)


def test_gpt2_mini_circuits_are_computed_with_layer_norm_folded() -> None:
    path = sample_model("gpt2-mini")
    model = load_model(path)
    assert model.cfg.normalization == "LNPre" and not model.raw
    w = model.weights
    # The fold checked in torch on zero-copy tensors of the same arrays.
    tw, raw = torch_weights(w), torch_weights(model.with_raw(True).weights)
    # fold_ln + center_writing_weights: W_V of every head reads ln1's gain, centred over
    # d_model (TransformerLens' fold_layer_norm), so the OV circuit includes the LayerNorm.
    for layer in range(model.cfg.n_layers):
        gain = raw.get(f"blocks.{layer}.ln1.w")
        folded = gain[None, :, None] * raw.get(f"blocks.{layer}.attn.W_V")
        folded = folded - folded.mean(1, keepdim=True)
        torch.testing.assert_close(tw.get(f"blocks.{layer}.attn.W_V"), folded,
                                   rtol=1e-5, atol=1e-6)
    scores = behaviour_scores(w, seed=0)
    assert all(torch.isfinite(s).all() for s in scores.values())
    assert torch.isfinite(all_copying_scores(w)).all()
    # Trained circuits, seen through the folded weights: a previous-token head in layer 0
    # that the in-context copying of the repeated half depends on.
    prev = int(scores["prev_token"][0].argmax())
    assert float(scores["prev_token"][0, prev]) >= 0.6
    assert float(ablation_effects(w, seed=0)[0, prev]) >= ABLATION_MARGIN


def test_sample_models_are_small() -> None:
    # The training series (attn-only-2l-training/) has its own budget, < 10 MB, checked in
    # tests/engine/sweeps/test_timeline.py; the models themselves stay under 8 MiB.
    root = Path(sample_model("attn-only-2l")).parent
    series = root / "attn-only-2l-training"
    total = sum(p.stat().st_size for p in root.rglob("*")
                if p.is_file() and series not in p.parents)
    assert total < 8 << 20, f"sample models take {total / 2**20:.1f} MiB"


def test_attn_only_2l_trained_past_its_phase_change() -> None:
    # The shipped training log: a plateau, then within a few hundred steps the previous-token
    # and induction heads form and the loss on the repeated half collapses; training went on
    # for at least as long again after that.
    log = json.loads((sample_model("attn-only-2l") / "training_log.json").read_text())
    induction = [e["induction_max_last"] for e in log]
    formed = next(i for i, v in enumerate(induction) if v >= 0.5)
    assert formed > 0 and max(induction[:formed]) < 0.2, "a plateau before the change"
    assert log[formed - 1]["repeated_loss"] - log[formed + 1]["repeated_loss"] > 2.0
    assert log[-1]["step"] >= 2 * log[formed]["step"]
    assert min(induction[formed + 1 :]) >= 0.5 and log[-1]["prev_token_max_l0"] >= 0.6
