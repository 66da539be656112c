"""``bench.patching_gqa`` on the tiny grouped-query shape, in this process (its driver only
runs the same ``one`` in subprocesses): the timed calls, their values, the table; and the
"before" side, the per-query-head projections the bench keeps, is really what the patch ran
and gives the engine's values."""

from __future__ import annotations

import pytest

from bench.checkpoints import SHAPES, write_checkpoint
from bench.patching_gqa import USERS, one, table


@pytest.fixture
def engine_projections():
    """Restore the engine's ``projections`` wherever ``install_reference`` replaced it."""
    import importlib
    import sys

    from headscope.engine.forward import transformer

    for name in USERS:
        importlib.import_module(name)
    original = transformer.projections
    held = [m for name, m in sys.modules.items()
            if name.startswith("headscope.") and getattr(m, "projections", None) is original]
    yield
    for m in held:
        m.projections = original


def test_bench_patching_gqa_smoke(tmp_path, engine_projections) -> None:
    path = write_checkpoint(SHAPES["tiny-llama"], tmp_path)  # 4 query heads, 2 key/value heads
    after = one(str(path), 8, [1], ["out", "k"])
    before = one(str(path), 8, [1], ["out", "k"], reference=True)
    assert len(after["k"]["values"]) == 4 and after["code"].endswith("engine")
    assert before["reference_calls"] > 0 and "reference_calls" not in after
    text = table({"before": [before], "after": [after]}, "tiny-llama", ["out", "k"])
    rows = {line.split("|")[1].strip(): line.split("|") for line in text.splitlines() if line.startswith("| ")}
    # the same float32 product per head on both sides, batched over 4 or 2 heads: equal up to
    # a few ulps of the metric (a logit difference of order 1)
    assert float(rows["k"][7]) <= 1e-5 and float(rows["out"][7]) <= 1e-5  # max abs diff
