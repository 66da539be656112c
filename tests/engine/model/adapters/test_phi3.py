"""The Phi-3 adapter (engine/model/adapters/phi3.py): long rope below the original context, and the early spellings of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headscope.engine.forward.transformer import log_probs, run
from headscope.engine.model.loading import load_model
from tests.engine.forward.test_transformer import SEQS, _assert_close, hf_reference
from tests.engine.model.test_adapters import build_phi3_longrope


def test_longrope_short_factors_below_the_original_context(tmp_path: Path) -> None:
    """Sequences within the original context rotate with the short factors (the same
    checkpoint gives other patterns with the long ones)."""
    path, model = build_phi3_longrope(tmp_path)
    short = SEQS[:, :8]
    ref_lp, ref_pat = hf_reference("phi3", model, short)
    res = run(load_model(path).weights, short)
    _assert_close(res.patterns, ref_pat, "phi3 longrope patterns (8 positions)")
    _assert_close(log_probs(res), ref_lp, "phi3 longrope log-probs (8 positions)")
    long_pat = run(load_model(path).weights, SEQS).patterns[:, :, :, :8, :8]
    assert (long_pat - ref_pat).abs().max() > 1e-3


@pytest.mark.parametrize("legacy", ["su", "yarn"])
def test_phi3_early_long_context_spellings_mean_longrope(tmp_path: Path, legacy: str) -> None:
    """Phi-3 configs written before the rename (``rope_scaling.type`` "su" or "yarn", the
    original context beside it) are LongRoPE, as transformers' Phi3Config reads them."""
    path, model = build_phi3_longrope(tmp_path)
    config = json.loads((path / "config.json").read_text())
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = {"type": legacy, "long_factor": rope["long_factor"], "short_factor": rope["short_factor"]}
    (path / "config.json").write_text(json.dumps(config))
    ref_lp, ref_pat = hf_reference("phi3", model, SEQS)
    res = run(load_model(path).weights, SEQS)
    _assert_close(res.patterns, ref_pat, f"phi3 {legacy} patterns")
    _assert_close(log_probs(res), ref_lp, f"phi3 {legacy} log-probs")
