"""The fast behavioural sweeps equal their straightforward definitions.

``ablation_effects`` resumes from cached residual streams and ablates a layer's heads as one
batch; ``behaviour_scores`` reduces each layer's pattern as soon as it is produced. Both are
checked here against the plain loops they replace (one full ``run`` per head; all patterns
stacked), on DictWeights models and on the tiny checkpoints of every family (GPT-2 with MLPs
and LayerNorm, GPT-NeoX parallel + rotary, Llama RMS + gated + GQA, BERT post-LN, raw and
processed).
"""

from __future__ import annotations

import weakref

import pytest
import torch

from headscope.engine.core.errors import CancelledError
from headscope.engine.forward import behaviour
from headscope.engine.forward import transformer as forward
from headscope.engine.forward.transformer import run
from headscope.engine.model.loading import load_model
from headscope.engine.model.weights import DictWeights, WeightSource
from tests.engine.circuits.test_head_circuits import random_weights

# -- reference implementations: the definitions, written the straightforward way -------------


def reference_loss(logits: torch.Tensor, tokens: torch.Tensor) -> float:
    half = tokens.shape[1] // 2  # positions T .. 2T-2 predicting tokens T+1 .. 2T-1
    return float(torch.nn.functional.cross_entropy(logits[:, half:-1].flatten(0, 1),
                                                   tokens[:, half + 1 :].flatten()))


def reference_ablation_effects(w: WeightSource, tokens: torch.Tensor, ablation: str) -> torch.Tensor:
    """One full forward pass per head (what ablation_effects did before)."""
    cfg = w.cfg
    base = reference_loss(run(w, tokens).logits, tokens)
    out = torch.empty(cfg.n_layers, cfg.n_heads)
    for layer in range(cfg.n_layers):
        for head in range(cfg.n_heads):
            logits = run(w, tokens, ablate=[(layer, head)], ablation=ablation).logits
            out[layer, head] = reference_loss(logits, tokens) - base
    return out


def reference_behaviour(w: WeightSource, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """All patterns stacked, then the TransformerLens "mul" measure per sequence (our rows)."""
    patterns = run(w, tokens).patterns  # [b, L, H, q, k]
    out = {}
    for name, det in behaviour.detection_patterns(tokens).items():
        rows = det.sum(-1) > 0  # [b, q]
        on = (patterns * det[:, None, None]).sum((-2, -1))
        total = (patterns * rows[:, None, None, :, None]).sum((-2, -1))
        out[name] = (on / total).mean(0)
    return out


# -- models ------------------------------------------------------------------------------------


def well_scaled(w: DictWeights) -> DictWeights:
    """``random_weights`` with N(0, 1/d) matrices: losses of a few nats, not tens of thousands
    (where float32 resolution alone is 1e-3), and patterns that are neither uniform nor one-hot."""
    d = w.cfg.d_model
    t = {name: x / d**0.5 if ".attn.W_" in name or ".attn._W_" in name or name == "unembed.W_U" else x
         for name, x in w._t.items()}
    return DictWeights(w.cfg, t, path=w.path)


def dict_models() -> dict[str, WeightSource]:
    return {
        "attn-only learned": well_scaled(random_weights(n_layers=3, n_ctx=24, seed=1)),
        "attn-only rotary gqa": well_scaled(random_weights(
            n_layers=2, n_heads=4, n_kv_heads=2, positional="rotary", rotary_dim=4, d_head=6, n_ctx=24,
            seed=2)),
    }


@pytest.fixture(scope="module")
def family_models(gpt2_dir, neox_dir, llama_dir, bert_mlm_dir) -> dict[str, WeightSource]:
    dirs = {"gpt2": gpt2_dir[0], "neox": neox_dir[0], "llama": llama_dir[0], "bert_mlm": bert_mlm_dir[0]}
    models = {name: load_model(path).weights for name, path in dirs.items()}
    models["gpt2 raw"] = load_model(gpt2_dir[0], raw=True).weights
    return models


SEQ, BATCH = 6, 2  # 2 sequences of 6 random tokens written twice: small and fast


# -- ablation ------------------------------------------------------------------------------------


@pytest.mark.parametrize("ablation", ["zero", "mean"])
@pytest.mark.parametrize("name", list(dict_models()))
def test_ablation_effects_equal_one_pass_per_head_on_dict_models(name, ablation):
    w = dict_models()[name]
    tokens = behaviour.repeated_tokens(w.cfg.d_vocab, w.cfg.n_ctx, 3, SEQ, BATCH)
    got = behaviour.ablation_effects(w, seed=3, seq_len=SEQ, batch=BATCH, ablation=ablation)
    want = reference_ablation_effects(w, tokens, ablation)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert got.abs().max() > 1e-3  # the heads matter: the comparison is not 0 == 0


@pytest.mark.parametrize("ablation", ["zero", "mean"])
@pytest.mark.parametrize("name", ["gpt2", "neox", "llama", "bert_mlm", "gpt2 raw"])
def test_ablation_effects_equal_one_pass_per_head_on_every_family(family_models, name, ablation):
    w = family_models[name]
    tokens = behaviour.repeated_tokens(w.cfg.d_vocab, w.cfg.n_ctx, 5, SEQ, BATCH)
    got = behaviour.ablation_effects(w, seed=5, seq_len=SEQ, batch=BATCH, ablation=ablation)
    want = reference_ablation_effects(w, tokens, ablation)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert got.abs().max() > 1e-3


def test_ablation_effect_of_one_head_equals_the_sweep_entry(family_models):
    w = family_models["gpt2"]
    sweep = behaviour.ablation_effects(w, seed=1, seq_len=SEQ, batch=BATCH, ablation="mean")
    for layer, head in [(0, 0), (0, 3), (1, 2)]:
        one = behaviour.ablation_effect(w, layer, head, seed=1, seq_len=SEQ, batch=BATCH, ablation="mean")
        assert one == pytest.approx(float(sweep[layer, head]), abs=1e-6)


def test_heads_ablated_in_small_chunks_give_the_same_effects(monkeypatch):
    w = dict_models()["attn-only learned"]
    together = behaviour.ablation_effects(w, seed=0, seq_len=SEQ, batch=BATCH)
    monkeypatch.setattr(behaviour, "_ABLATION_BATCH_BYTES", 1)  # one head per batch
    assert behaviour._heads_per_pass(w, torch.zeros(BATCH, 2 * SEQ)) == 1
    torch.testing.assert_close(behaviour.ablation_effects(w, seed=0, seq_len=SEQ, batch=BATCH), together,
                               atol=1e-6, rtol=0)


def test_run_ablations_gives_the_final_stream_of_each_single_head_ablation(family_models):
    for w in (dict_models()["attn-only rotary gqa"], family_models["neox"], family_models["bert_mlm"]):
        tokens = behaviour.repeated_tokens(w.cfg.d_vocab, w.cfg.n_ctx, 0, SEQ, BATCH)
        layer = w.cfg.n_layers - 2
        with torch.inference_mode():
            entering = forward.blocks(w, forward.embed(w, tokens), 0, layer)
            final = forward.run_ablations(w, entering, layer, [2, 0], "mean")
            logits = forward.unembed(w, final)  # [2, b, p, vocab]
        for i, head in enumerate([2, 0]):
            want = run(w, tokens, ablate=[(layer, head)], ablation="mean").logits
            torch.testing.assert_close(logits[i], want, atol=1e-4, rtol=1e-4)


def test_ablation_sweep_reports_progress_and_stops_between_layers():
    w = random_weights(n_layers=4, n_ctx=24)
    seen: list[float] = []
    behaviour.ablation_effects(w, seq_len=SEQ, batch=BATCH, progress=seen.append)
    assert len(seen) == 4 and seen == sorted(seen) and seen[-1] == 1.0
    checks: list[int] = []
    reports: list[float] = []

    def cancelled() -> bool:  # true at the check before the third layer
        checks.append(1)
        return len(checks) > 3

    with pytest.raises(CancelledError):
        behaviour.ablation_effects(w, seq_len=SEQ, batch=BATCH, progress=reports.append, cancelled=cancelled)
    assert len(reports) == 2  # two layers done, then stopped


def test_ablation_rejects_unknown_kinds_and_heads():
    w = random_weights()
    with pytest.raises(ValueError):
        behaviour.ablation_effects(w, ablation="resample")
    with pytest.raises(ValueError):
        behaviour.ablation_effect(w, 0, 0, ablation="resample")
    with pytest.raises(Exception, match="head"):
        behaviour.ablation_effect(w, 0, 99)


# -- behaviour ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gpt2", "neox", "llama", "bert_mlm"])
def test_behaviour_scores_equal_the_stacked_pattern_definition(family_models, name):
    w = family_models[name]
    tokens = behaviour.repeated_tokens(w.cfg.d_vocab, w.cfg.n_ctx, 4, 8, 3)
    got = behaviour.behaviour_scores(w, seed=4, seq_len=8, batch=3)
    for key, want in reference_behaviour(w, tokens).items():
        torch.testing.assert_close(got[key], want, atol=1e-6, rtol=1e-6)


def test_behaviour_scores_default_sequence_and_per_layer_progress():
    w = random_weights(n_layers=3, n_ctx=100)
    seen: list[float] = []
    got = behaviour.behaviour_scores(w, seed=0, progress=seen.append)
    assert seen == [1 / 3, 2 / 3, 1.0]
    default = behaviour.repeated_tokens(w.cfg.d_vocab, w.cfg.n_ctx, 0)
    assert default.shape == (4, 64)  # batch 4, T = min(32, n_ctx // 2) written twice
    for key, want in reference_behaviour(w, default).items():
        torch.testing.assert_close(got[key], want, atol=1e-6, rtol=1e-6)


def test_behaviour_scores_keep_one_layers_pattern_at_a_time(monkeypatch):
    """The sweep never stacks patterns: each is reduced and dropped inside the layer loop."""
    w = random_weights(n_layers=3, n_ctx=24)
    alive: list[int] = []
    real_attend = forward.attend
    live: weakref.WeakSet = weakref.WeakSet()

    def attend(*args, **kwargs):
        out = real_attend(*args, **kwargs)
        alive.append(len(live))  # patterns of earlier layers still referenced
        live.add(out[0])
        return out

    monkeypatch.setattr(forward, "attend", attend)
    behaviour.behaviour_scores(w, seq_len=SEQ, batch=BATCH)
    assert alive == [0, 0, 0]  # each layer's pattern is reduced and dropped before the next is made


def test_blocks_callback_sees_each_layer_input_and_pattern(family_models):
    w = family_models["llama"]
    tokens = behaviour.repeated_tokens(w.cfg.d_vocab, w.cfg.n_ctx, 0, SEQ, BATCH)
    seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    with torch.inference_mode():
        x0 = forward.embed(w, tokens)
        final = forward.blocks(w, x0, on_block=lambda layer, x, p: seen.update({layer: (x, p)}))
        resumed = forward.blocks(w, seen[1][0], 1)
    ref = run(w, tokens)
    assert sorted(seen) == list(range(w.cfg.n_layers))
    torch.testing.assert_close(seen[0][0], x0)
    for layer, (_, pattern) in seen.items():
        torch.testing.assert_close(pattern, ref.patterns[:, layer])
    torch.testing.assert_close(forward.unembed(w, final), ref.logits)
    torch.testing.assert_close(resumed, final)


def assert_side_by_side_is_alone(w: WeightSource) -> None:
    """``forward.blocks_together`` on streams of different lengths (their MLPs run as one):
    the streams and patterns of running each alone with ``blocks``, every layer once."""
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(w.cfg.d_vocab, (b, p), generator=g) for b, p in ((2, 7), (1, 5), (3, 9))]
    seen: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    done: list[int] = []
    with torch.inference_mode():
        streams = [forward.embed(w, t) for t in batches]
        together = forward.blocks_together(w, streams, on_block=lambda i, layer, x, p: seen.update({(i, layer): (x, p)}),
                                           after_layer=done.append)
        for i, x0 in enumerate(streams):
            alone: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
            final = forward.blocks(w, x0, on_block=lambda layer, x, p, alone=alone: alone.update({layer: (x, p)}))
            # float rounding of the stream's own scale (Gemma's embeddings are scaled by √d)
            scale = float(final.abs().max())
            torch.testing.assert_close(together[i], final, rtol=1e-5, atol=1e-5 * scale)
            for layer, (x, pattern) in alone.items():
                torch.testing.assert_close(seen[i, layer][0], x, rtol=1e-5, atol=1e-5 * scale)
                torch.testing.assert_close(seen[i, layer][1], pattern, rtol=1e-5, atol=1e-5)
    assert done == list(range(w.cfg.n_layers)) and len(seen) == 3 * w.cfg.n_layers


@pytest.mark.parametrize("name", ["gpt2", "neox", "llama", "bert_mlm"])
def test_blocks_together_run_each_stream_as_blocks_does(family_models, name):
    assert_side_by_side_is_alone(family_models[name])


# -- the benchmark script ------------------------------------------------------------------------


def test_bench_behaviour_scenarios_agree_on_a_tiny_checkpoint(tmp_path):
    from bench import behaviour
    from bench.checkpoints import SHAPES, write_checkpoint

    path = write_checkpoint(SHAPES["tiny-gpt2"], tmp_path)
    results = {name: behaviour.one(name, path, budget=60.0, seq_len=5, batch=2)
               for name in ("ablation", "ablation-ref")}
    assert results["ablation-ref"]["heads_done"] == 8 and not results["ablation-ref"]["extrapolated"]
    assert behaviour.max_diff(results["ablation"]["values"], results["ablation-ref"]["values"]) < 1e-5
    text = behaviour.table(results)
    assert "| ablation_effects (all heads) | compute, cold (s) |" in text
    assert "| behaviour_scores | compute, cold (s) | not run | not run | – |" in text
