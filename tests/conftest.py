"""Shared pytest fixtures: the tiny random checkpoints of every family (tests/hf_fixtures.py)
and the bundled sample models."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hf_fixtures import (  # noqa: F401  (re-exported pytest fixtures)
    bert_base_dir,
    bert_mlm_dir,
    gpt2_dir,
    llama_dir,
    neox_dir,
    qwen2_dir,
)


@pytest.fixture(autouse=True)
def _results_store_in_tmp(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own on-disk results store (engine.sweeps.store), never ~/.cache."""
    root = tmp_path_factory.mktemp("headscope-cache")
    monkeypatch.setenv("HEADSCOPE_CACHE_DIR", str(root))
    return root


SAMPLE_MODELS = Path(__file__).resolve().parent.parent / "sample_models"


# The bundled attn-only-2l's circuit, as sample_models/README.md documents it (layer, head).
# test_sample_models.py checks that the engine finds exactly these; other tests use them.
PREV_TOKEN_HEAD, INDUCTION_HEAD = (0, 1), (1, 2)


def sample_model(name: str) -> Path:
    path = SAMPLE_MODELS / name
    if not (path / "model.safetensors").exists():
        pytest.fail(f"bundled sample model {name} is missing at {path}")
    return path
