"""The plumbing every long computation shares (engine/core/progress.py): progress reported as a
fraction clamped to 0..1, cancellation asked between steps, and a memo of finished parts that
a sweep reads back instead of computing (here the spectral sweep on the bundled model)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from headscope.engine.circuits import spectral
from headscope.engine.core.errors import CancelledError
from headscope.engine.core.progress import check_cancelled, report
from headscope.engine.model.loading import load_model
from tests.conftest import sample_model


def test_report_clamps_the_fraction_and_nobody_listening_is_fine() -> None:
    seen: list[float] = []
    for fraction in (-0.5, 0.0, 0.25, 1.0, 1.5):
        report(seen.append, fraction)
    assert seen == [0.0, 0.0, 0.25, 1.0, 1.0]
    report(None, 0.5)


def test_check_cancelled_raises_only_when_asked_to_stop() -> None:
    check_cancelled(None)
    check_cancelled(lambda: False)
    with pytest.raises(CancelledError, match="sweep cancelled"):
        check_cancelled(lambda: True)


class DictMemo:
    """A Memo that keeps its parts in a dict and counts what it was asked."""

    def __init__(self, parts: dict[int, np.ndarray] | None = None) -> None:
        self.parts = dict(parts or {})
        self.put_layers: list[int] = []

    def get(self, index: int, shape: tuple[int, ...] | None = None) -> np.ndarray | None:
        return self.parts.get(index)

    def put(self, index: int, value: Any) -> None:
        self.parts[index] = np.array(value)
        self.put_layers.append(index)


def test_a_sweep_reads_finished_parts_from_its_memo_and_puts_the_others() -> None:
    w = load_model(sample_model("attn-only-2l")).weights
    fresh = {name: DictMemo() for name in ("copying_score", "qk_positivity")}
    full = spectral.spectral_scores(w, memos=fresh)
    assert all(sorted(m.put_layers) == [0, 1] for m in fresh.values())
    # layer 0 stored with a marker value: read back as stored, only layer 1 is computed
    marker = np.full(w.cfg.n_heads, 0.125, np.float32)
    half = {name: DictMemo({0: marker}) for name in fresh}
    fractions: list[float] = []
    resumed = spectral.spectral_scores(w, fractions.append, memos=half)
    assert all(m.put_layers == [1] for m in half.values())
    for name in half:
        np.testing.assert_array_equal(resumed[name][0], marker)
        np.testing.assert_array_equal(resumed[name][1], full[name][1])
    assert sorted(fractions) == [0.5, 1.0]


def test_a_cancelled_sweep_stops_before_computing() -> None:
    w = load_model(sample_model("attn-only-2l")).weights
    memo = {name: DictMemo() for name in ("copying_score", "qk_positivity")}
    with pytest.raises(CancelledError):
        spectral.spectral_scores(w, cancelled=lambda: True, memos=memo)
    assert all(m.put_layers == [] for m in memo.values())
