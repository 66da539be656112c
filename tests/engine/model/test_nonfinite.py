"""Heads whose attention weights are not finite (engine/model/nonfinite.py) are flagged; finite ones never."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from headscope.engine.api.model import open_model
from headscope.engine.circuits.spectral import nonfinite_heads
from headscope.engine.core.requests import ScoreTableRequest
from headscope.engine.service.engine import Engine
from tests.engine.test_hostile_io import copy_of


def test_nonfinite_flags_heads_whose_attention_is_not_finite(
    tmp_path: Path, gpt2_dir: tuple[Path, Any]
) -> None:
    """Finite weights (positions at 3e38, near float32's max) whose residual overflows:
    every pattern is NaN, so every head is flagged though no attention weight is NaN."""
    d = copy_of(gpt2_dir[0], tmp_path / "m")
    tensors = load_file(str(d / "model.safetensors"))
    tensors["transformer.wpe.weight"] = torch.full_like(tensors["transformer.wpe.weight"], 3e38)
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    m = open_model(d, raw=True)
    assert nonfinite_heads(m.weights) == []  # the stored attention weights are finite
    rows = m.heads()
    assert all(r["nonfinite"] for r in rows)
    assert all(r["copying_score"] == r["copying_score"] for r in rows)  # weight scores finite

    async def go() -> None:
        engine = Engine(None, model=m, prefetch=False)
        try:
            table = await engine.get(ScoreTableRequest())
            assert table.nonfinite.all()
        finally:
            await engine.aclose()

    asyncio.run(go())


def test_finite_models_are_not_flagged(gpt2_dir: tuple[Path, Any]) -> None:
    assert not any(r["nonfinite"] for r in open_model(gpt2_dir[0]).heads())
