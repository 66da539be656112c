"""The Phi adapter (engine/model/adapters/phi.py): a QK layernorm is flagged."""

from __future__ import annotations

from pathlib import Path

from tests.engine.model.test_adapters import build_phi_qk_layernorm


def test_phi_qk_layernorm_is_flagged(tmp_path: Path) -> None:
    from headscope.engine.model.loading import read_structure

    path, _ = build_phi_qk_layernorm(tmp_path)
    assert any("q/k LayerNorm" in n for n in read_structure(path)["approximations"])
