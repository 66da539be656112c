"""Round trips between headscope and TransformerLens-style state dicts keep the model's outputs."""

from __future__ import annotations

import pytest
import torch

from headscope.engine.core.errors import InvalidRequestError
from headscope.engine.forward import transformer as forward
from headscope.engine.model.loading import load_model
from headscope.engine.model.tl_compat import from_transformer_lens, save_native, to_transformer_lens

TOKENS = [1, 5, 9, 2, 33, 7, 5, 9]


def log_probs(weights) -> torch.Tensor:
    return forward.log_probs(forward.run(weights, TOKENS))


@pytest.mark.parametrize("fixture", ["gpt2_dir", "neox_dir", "llama_dir"])
@pytest.mark.parametrize("raw", [False, True])
def test_round_trip_through_a_tl_state_dict(request, fixture, raw) -> None:
    path, _ = request.getfixturevalue(fixture)
    model = load_model(path, raw=raw)
    tl_cfg, state = to_transformer_lens(model.weights)
    if model.cfg.kv_heads != model.cfg.n_heads:  # GQA stays un-expanded, as TransformerLens stores it
        assert state["blocks.0.attn._W_K"].shape[0] == model.cfg.kv_heads
        assert tl_cfg["n_key_value_heads"] == model.cfg.kv_heads
    assert tl_cfg["normalization_type"] == model.cfg.normalization
    back = from_transformer_lens(tl_cfg, state)
    # the same float32 weights through the same forward: only a re-layout (rtol 1e-5 of log-probs ~5)
    assert torch.allclose(log_probs(back), log_probs(model.weights), atol=1e-5)


def test_save_native_opens_in_headscope_with_the_same_outputs(gpt2_dir, tmp_path) -> None:
    path, _ = gpt2_dir
    model = load_model(path)
    out = save_native(model.weights, tmp_path / "native")
    reopened = load_model(out, raw=True)  # already processed: nothing left to fold
    assert reopened.structure()["family"] == "native"
    # the same float32 weights, saved and read back: only a re-layout (rtol 1e-5 of log-probs ~5)
    assert torch.allclose(log_probs(reopened.weights), log_probs(model.weights), atol=1e-5)


def test_encoders_are_refused(bert_mlm_dir) -> None:
    path, _ = bert_mlm_dir
    with pytest.raises(InvalidRequestError, match="encoder"):
        to_transformer_lens(load_model(path).weights)


def test_rope_scaling_and_sliding_windows_are_refused_not_dropped(tmp_path) -> None:
    """Neither HookedTransformerConfig nor the native layout carries them: a converted model
    would compute other patterns."""
    from tests.family_fixtures import build_llama3_rope, build_mistral

    for builder, words in ((build_llama3_rope, "llama3 RoPE scaling"), (build_mistral, "sliding window")):
        path, _ = builder(tmp_path / builder.__name__)
        with pytest.raises(InvalidRequestError, match=words):
            to_transformer_lens(load_model(path).weights)
