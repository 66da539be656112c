"""Where a model bends the bilinear picture of the circuits (engine/model/caveats.py): each
non-linearity between the residual stream and the scores or logits is named, from the config
alone; a plain decoder has none."""

from __future__ import annotations

from pathlib import Path

import pytest

from headscope.engine.core.config import ModelConfig
from headscope.engine.model.caveats import model_caveats, ov_caveats, qk_caveats
from headscope.engine.model.loading import read_structure
from tests import family_fixtures
from tests.conftest import sample_model


def config(**extra: object) -> ModelConfig:
    return ModelConfig(family="native", architecture="test", n_layers=1, n_heads=2, d_model=8,
                       d_head=4, d_vocab=10, n_ctx=16, extra=dict(extra))


def test_a_plain_decoder_has_no_caveat() -> None:
    assert model_caveats(config()) == []
    assert read_structure(sample_model("attn-only-2l"))["approximations"] == []


@pytest.mark.parametrize(("kind", "fragment"), [
    ("layer", "q/k LayerNorm (per head)"),
    ("head", "q/k RMSNorm (per head)"),
    ("proj", "q/k RMSNorm (over the whole projection)"),
])
def test_a_qk_norm_makes_the_scores_not_bilinear(kind: str, fragment: str) -> None:
    (note,) = qk_caveats(config(qk_norm=kind))
    assert fragment in note and "not bilinear" in note
    assert ov_caveats(config(qk_norm=kind)) == []


def test_soft_caps_are_named_with_their_cap() -> None:
    cfg = config(attn_softcap=50.0, final_softcap=30.0, post_attn_norm=True)
    assert qk_caveats(cfg) == ["scores soft-capped to ±50 (tanh) after QK"]
    assert ov_caveats(cfg) == [
        "OV omits the RMSNorm applied to the attention output (all heads together)",
        "logits soft-capped to ±30 (tanh)"]
    assert model_caveats(cfg) == qk_caveats(cfg) + ov_caveats(cfg)


@pytest.mark.parametrize(("build", "fragments"), [
    ("build_gemma2", ["scores soft-capped", "logits soft-capped"]),
    ("build_gemma3", ["q/k RMSNorm (per head)"]),
    ("build_olmo2", ["q/k RMSNorm (over the whole projection)"]),
])
def test_the_families_that_bend_it_say_so_in_their_structure(build: str, fragments: list[str],
                                                              tmp_path: Path) -> None:
    path, _ = getattr(family_fixtures, build)(tmp_path / build)
    notes = read_structure(path)["approximations"]
    for fragment in fragments:
        assert any(fragment in n for n in notes), notes
