"""Edge attribution results (engine/core/edge_results.py): the area under the faithfulness curve."""

from __future__ import annotations

import pytest

from headscope.engine.core.edge_results import curve_area
from tests.hf_fixtures import (  # noqa: F401  (session-scoped pytest fixtures)
    gpt2_dir,
    llama_dir,
    neox_dir,
    qwen2_dir,
)


def test_curve_area_is_mibs_trapezoid() -> None:
    """MIB's CPR: the trapezoid rule between consecutive points, from the first to the last."""
    assert curve_area((0.5, 1.0), (1.0, 1.0)) == pytest.approx(0.5)
    assert curve_area((0.0, 0.5, 1.0), (0.0, 1.0, 0.5)) == pytest.approx(0.25 + 0.375)
    assert curve_area((1.0,), (0.7,)) == 0.0
