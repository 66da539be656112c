"""`headscope diff` on models with NaN and huge heads and different shapes, in a subprocess."""

from __future__ import annotations

from pathlib import Path

import pytest

from headscope.engine.model.loading import load_model
from tests.engine import test_overflow
from tests.engine.test_overflow import run_diff

diff_models_on_disk = test_overflow.diff_models_on_disk  # test_overflow's pytest fixture


@pytest.mark.parametrize("flags", [(), ("--match-heads",)])
def test_diff_with_a_nan_head_flags_it_in_a_subprocess(diff_models_on_disk: dict[str, Path], flags) -> None:
    out = run_diff(diff_models_on_disk["base"], diff_models_on_disk["nan"], *flags)
    rows = {(r["layer"], r["head"]): r for r in out["heads"]}
    broken = [r for r in rows.values() if r["matched_head"] == 2 and r["layer"] == 1]
    assert len(broken) == 1 and broken[0]["nonfinite"] is True
    assert broken[0]["ov_similarity"] is None and broken[0]["read_subspace_cos"] is None
    assert broken[0]["qk_similarity"] is not None  # W_Q/W_K are intact
    others = [r for r in rows.values() if r is not broken[0]]
    assert not any(r["nonfinite"] for r in others)
    assert all(r["ov_similarity"] is not None and r["read_subspace_cos"] is not None for r in others)
    if not flags:  # identity matching: every other head is exactly the same head
        assert all(r["ov_similarity"] == pytest.approx(1, abs=1e-4) for r in others)


def test_diff_with_a_huge_head_in_a_subprocess(diff_models_on_disk: dict[str, Path]) -> None:
    out = run_diff(diff_models_on_disk["base"], diff_models_on_disk["huge"])
    row = next(r for r in out["heads"] if (r["layer"], r["head"]) == (1, 2))
    # The same head scaled: similarity 1 (scale-free), subspaces identical; flagged (it overflows).
    assert row["ov_similarity"] == pytest.approx(1, abs=1e-4)
    assert row["read_subspace_cos"] == pytest.approx(1, abs=1e-4)
    assert row["nonfinite"] is True


def test_diff_with_a_different_d_model_and_d_head(diff_models_on_disk: dict[str, Path]) -> None:
    from headscope.engine.circuits.similarity import circuit_similarity

    out = run_diff(diff_models_on_disk["base"], diff_models_on_disk["distilled"])
    ov, _ = circuit_similarity(load_model(diff_models_on_disk["base"]).weights,
                               load_model(diff_models_on_disk["distilled"]).weights)
    for r in out["heads"]:
        assert r["ov_similarity"] == pytest.approx(float(ov[r["layer"], r["head"], r["head"]]), abs=1e-5)
        assert "read_subspace_cos" not in r  # residual streams of different widths: no angles
        assert r["nonfinite"] is False
