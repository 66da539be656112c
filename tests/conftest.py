"""Shared pytest fixtures: the tiny random checkpoints of every family (tests/hf_fixtures.py)
and the bundled sample models."""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.hf_fixtures import (  # noqa: F401  (re-exported pytest fixtures)
    bert_base_dir,
    bert_mlm_dir,
    gpt2_dir,
    llama_dir,
    neox_dir,
    qwen2_dir,
)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Collect once, then freeze what is left. pytest collects garbage five times as it
    unconfigures (to find unraisable exceptions), which over a session's heap (torch,
    transformers, Textual: 1.2-1.6 million objects) took about 1 s each; pytest-xdist's worker
    gateway gives a finishing worker 5 s before it sends it SIGINT, which ended every full
    run with a KeyboardInterrupt warning and a 10 s wait. After the freeze those five passes
    see only what is made after it."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _results_store_in_tmp(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own on-disk results store (engine.sweeps.store), never ~/.cache."""
    root = tmp_path_factory.mktemp("headscope-cache")
    monkeypatch.setenv("HEADSCOPE_CACHE_DIR", str(root))
    return root


@pytest.fixture(autouse=True)
def _record_notifications(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every notification an app ever showed, in ``notified(app)``: Textual drops a toast from
    ``app._notifications`` when it times out (5 s), so a test that looked there after a slow
    open on a busy machine found nothing. Patched only where the tests imported Textual (a
    test of the engine must not import it)."""
    if "textual.app" not in sys.modules:
        return
    from textual.app import App

    shown = App._on_notify

    def on_notify(self: Any, event: Any) -> None:
        self.__dict__.setdefault("_notified_history", []).append(event.notification)
        shown(self, event)

    monkeypatch.setattr(App, "_on_notify", on_notify)


def notified(app: Any) -> list[Any]:
    """The notifications ``app`` has shown, oldest first, expired ones too (``.message``,
    ``.severity``, ``.markup``)."""
    return list(app.__dict__.get("_notified_history", []))


SAMPLE_MODELS = Path(__file__).resolve().parent.parent / "sample_models"


# The bundled attn-only-2l's circuit, as sample_models/README.md documents it (layer, head).
# test_sample_models.py checks that the engine finds exactly these; other tests use them.
PREV_TOKEN_HEAD, INDUCTION_HEAD = (0, 1), (1, 2)


def sample_model(name: str) -> Path:
    path = SAMPLE_MODELS / name
    if not (path / "model.safetensors").exists():
        pytest.fail(f"bundled sample model {name} is missing at {path}")
    return path
