"""Time left from progress fractions (engine/core/eta.py)."""

from __future__ import annotations

import pytest

from headscope.engine.core.eta import Eta


def test_eta_from_progress_fractions():
    now = [100.0]
    eta = Eta(clock=lambda: now[0])
    assert eta.seconds_left() is None
    eta.update(0.2)  # resumed: a fifth was done before
    now[0] = 110.0
    eta.update(0.4)
    assert eta.seconds_left() == pytest.approx(30.0)  # 10 s per 0.2, 0.6 left
