"""`headscope forward`: what the forward pass of the engine gives."""

from __future__ import annotations

import torch

from headscope.engine.forward import transformer as forward
from headscope.engine.model.loading import load_model
from tests.e2e.test_cli import run_json


def test_forward_matches_the_engine(capsys, gpt2_dir) -> None:
    path, _ = gpt2_dir
    report = run_json(capsys, "forward", str(path), "--tokens", "3,14,15,92")
    ref = forward.run(load_model(path).weights, [3, 14, 15, 92])
    assert torch.allclose(torch.tensor(report["logits"]), ref.logits[0], atol=1e-5)
    assert torch.tensor(report["patterns"]).shape == ref.patterns[0].shape
