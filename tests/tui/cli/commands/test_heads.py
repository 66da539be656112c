"""`headscope heads`: every head's scores equal the engine's score functions; sorting; the ablation column."""

from __future__ import annotations

import pytest
import torch

from headscope.engine.forward import behaviour
from headscope.engine.forward import transformer as forward
from headscope.engine.model.loading import load_model
from tests import weight_algebra as algebra
from tests.e2e.test_cli import run_cli, run_json


def test_heads_equal_the_score_functions(capsys, gpt2_dir) -> None:
    path, _ = gpt2_dir
    rows = run_json(capsys, "heads", str(path))
    w = load_model(path).weights
    copying = algebra.all_copying_scores(w)
    behaviours = behaviour.behaviour_scores(w, seed=0)
    assert len(rows) == w.cfg.n_layers * w.cfg.n_heads
    for r in rows:
        layer, head = r["layer"], r["head"]
        assert r["copying_score"] == pytest.approx(float(copying[layer, head]), abs=1e-6)
        assert r["induction_score"] == pytest.approx(float(behaviours["induction"][layer, head]), abs=1e-6)
        assert -1 <= r["copying_score"] <= 1


def test_heads_sort_and_unknown_key(capsys, gpt2_dir) -> None:
    path, _ = gpt2_dir
    rows = run_json(capsys, "heads", str(path), "--sort", "prev_token_score")
    values = [r["prev_token_score"] for r in rows]
    assert values == sorted(values, reverse=True)
    code, _, err = run_cli(capsys, "heads", str(path), "--sort", "nonsense")
    assert code == 2 and "unknown sort key" in err and err.count("\n") == 1


def test_heads_ablation_column_equals_single_head_forward_passes(capsys, gpt2_dir) -> None:
    path, _ = gpt2_dir
    plain_rows = run_json(capsys, "heads", str(path))
    assert "ablation_effect" not in plain_rows[0], "a forward pass per head is opt-in"
    rows = run_json(capsys, "heads", str(path), "--sort", "ablation_effect")  # implies --ablation
    values = [r["ablation_effect"] for r in rows]
    assert values == sorted(values, reverse=True)
    # Each value is the loss of a full forward pass with that one head zeroed, minus the
    # clean loss, on the second copy of the seed-0 repeated tokens.
    w = load_model(path).weights
    tokens = behaviour.repeated_tokens(w.cfg.d_vocab, w.cfg.n_ctx, seed=0)
    half = tokens.shape[1] // 2

    def loss(ablate: list[tuple[int, int]]) -> float:
        logits = forward.run(w, tokens, ablate=ablate).logits[:, half:-1]
        return float(torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), tokens[:, half + 1 :].reshape(-1)))

    clean = loss([])
    for r in rows[:2] + rows[-1:]:
        assert r["ablation_effect"] == pytest.approx(loss([(r["layer"], r["head"])]) - clean, abs=1e-4)
    code, out, _ = run_cli(capsys, "heads", str(path), "--ablation")
    assert code == 0 and "ablation_effect" in out.splitlines()[0]
