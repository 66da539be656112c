"""Weight-based scores and processed weights against TransformerLens itself (issue #16).

For every family both read, the same tiny random checkpoint (tests/hf_fixtures.py,
tests/family_fixtures.py, tests/hf_fixtures_phi.py) is opened by headscope (processed, the
default) and by TransformerLens 4 (``TransformerBridge.boot_transformers`` on the directory,
offline, then ``enable_compatibility_mode()``: ``fold_ln``, ``center_writing_weights``,
``center_unembed``, ``fold_value_biases``, as HookedTransformer's ``from_pretrained`` did).
Per-head ``W_Q W_K W_V W_O`` and their biases, ``W_E``, ``W_pos``, ``W_U``, ``b_U``, the copying
scores, QK positivities and Q/K/V composition scores must agree to 1e-4.

Where TransformerLens keeps a tensor in another, equivalent form, the comparison maps it
(docs/math.md, "Comparing with TransformerLens"); every score is unchanged by these maps:

- grouped-query K/V: TransformerLens stacks the ``n_kv_heads`` stored heads; headscope expands
  them to one per query head (``h // (n_heads // n_kv_heads)``).
- Gemma 1/2/3: TransformerLens 4 multiplies the embeddings by √d_model at run time and keeps
  ``W_E`` unscaled; headscope's ``W_E`` is the scaled matrix (HookedTransformer's convention).
  Spectral and composition scores are scale-free.
- GPT-J: headscope reorders each head's first ``rotary_dim`` query/key dims from interleaved
  pairs ``(2i, 2i+1)`` to rotate-half pairs ``(i, i + r/2)`` (docs/math.md, "Rotary layouts");
  ``q·k`` and every QK score are unchanged by the common permutation.
- OLMo2: TransformerLens leaves the final RMSNorm's gain in the norm; headscope folds it into
  ``W_U`` (exact: the norm's output is read by ``W_U`` alone), as it does for every other
  RMSNorm family. TransformerLens' full OV circuit then lacks the gain, so its copying scores
  differ; with the gain put back they agree.

No test here skips: TransformerLens is in the ``test`` extra (pyproject.toml).
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from headscope.engine.circuits import composition, spectral
from headscope.engine.forward.torch_weights import torch_weights
from headscope.engine.model.loading import load_model
from tests import family_fixtures
from tests.hf_fixtures_phi import (  # noqa: F401  (session-scoped pytest fixtures)
    gptj_dir,
    opt_dir,
    opt_post_ln_dir,
    phi3_dir,
    phi_dir,
)

# The session-scoped checkpoints other test files use too (built once per worker): the
# families of tests/hf_fixtures.py and tests/hf_fixtures_phi.py by fixture name, those of
# tests/family_fixtures.py through its parametrised ``new_family`` fixture.
DIR_FIXTURES = ["gpt2", "neox", "llama", "qwen2", "phi3", "phi", "gptj", "opt", "opt_post_ln"]
new_family = family_fixtures.new_family
# float32 on both sides, sums in another order: through the fixtures' 2 layers of sums of <= 64
# terms each value is off by ~u·64·2 ≈ 1e-5 of its terms' magnitude; 1e-4 of the reference's
# magnitude (at least 1) leaves 10x for terms larger than their sum (_close scales it).
ATOL = 1e-4


def boot_transformer_lens(path: Path) -> Any:
    """TransformerLens' processed model of the checkpoint at ``path``, offline."""
    from tokenizers import Tokenizer, models
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import PreTrainedTokenizerFast

    # The fixtures ship no tokenizer; TransformerLens wants one (a fresh one each time:
    # booting edits the tokenizer's init kwargs). Weights do not depend on it.
    word = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>"))
    tok = PreTrainedTokenizerFast(tokenizer_object=word, unk_token="<unk>")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = TransformerBridge.boot_transformers(str(path), tokenizer=tok, device="cpu")
        model.enable_compatibility_mode(disable_warnings=True)
    return model


def _spectral(fm: Any) -> torch.Tensor:
    """TransformerLens' statistic ``Σ Re λ / Σ |λ|`` on its own ``FactoredMatrix``."""
    eig = fm.eigenvalues
    return eig.real.sum(-1) / eig.abs().sum(-1)


def _close(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> None:
    theirs = theirs.detach().float()
    assert ours.shape == theirs.shape, f"{what}: shape {tuple(ours.shape)} vs TransformerLens {tuple(theirs.shape)}"
    err = (ours - theirs).abs().max().item()
    scale = max(1.0, theirs.abs().max().item()) if theirs.numel() else 1.0  # relative beyond magnitude 1
    assert err <= ATOL * scale, f"{what}: max |headscope - TransformerLens| = {err:.2e} (scale {scale:.3g})"


@pytest.mark.parametrize("name", DIR_FIXTURES)
def test_families_match_transformer_lens(name: str, request: pytest.FixtureRequest) -> None:
    path, hf_model = request.getfixturevalue(f"{name}_dir")
    check_against_transformer_lens(name, path, hf_model)


def test_new_families_match_transformer_lens(new_family: tuple[str, Path, Any]) -> None:
    check_against_transformer_lens(*new_family)


def check_against_transformer_lens(name: str, path: Path, hf_model: Any) -> None:
    """Processed weights and weight-based scores of the checkpoint at ``path``, headscope's
    against TransformerLens'."""
    model = load_model(path)
    w = torch_weights(model.weights)  # the same arrays as zero-copy tensors, to meet TransformerLens'
    cfg = w.cfg
    tl = boot_transformer_lens(path)
    group = cfg.n_heads // cfg.kv_heads

    def stacked(what: str) -> torch.Tensor:
        return torch.stack([w.get(f"blocks.{layer}.attn.{what}") for layer in range(cfg.n_layers)])

    perm = torch.arange(cfg.d_head)
    if cfg.family == "gptj":  # interleaved -> rotate-half order of the rotary dims
        r = cfg.rotary_dim
        perm[:r] = torch.cat((torch.arange(0, r, 2), torch.arange(1, r, 2)))

    with torch.no_grad():
        for what in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
            try:
                theirs = getattr(tl, what)
            except AttributeError:  # TransformerLens: a bias-free projection has no stacked bias
                assert not stacked(what).any(), f"{name}: {what} is not zero but TransformerLens has none"
                continue
            if what[-1] in "KV" and group > 1:
                theirs = theirs.repeat_interleave(group, dim=1)
            if what[-1] in "QK":
                theirs = theirs[..., perm]
            _close(stacked(what), theirs, f"{name} {what}")

        scale = math.sqrt(cfg.d_model) if cfg.family.startswith("gemma") else 1.0
        _close(w.get("embed.W_E"), tl.W_E * scale, f"{name} W_E")
        if cfg.positional == "learned":
            _close(w.get("pos_embed.W_pos"), tl.W_pos, f"{name} W_pos")
        w_u = tl.W_U
        if cfg.family == "olmo2":  # put back the final norm's gain TransformerLens leaves unfolded
            w_u = hf_model.model.norm.weight.detach()[:, None] * w_u
        _close(w.get("unembed.W_U"), w_u, f"{name} W_U")
        _close(w.get("unembed.b_U"), tl.b_U, f"{name} b_U")

        # The scores, each side computed its own way on its own weights (headscope's in numpy).
        ours = spectral.spectral_scores(model.weights)
        _close(torch.from_numpy(ours["copying_score"]), _spectral(tl.W_E @ tl.OV @ w_u), f"{name} copying scores")
        _close(torch.from_numpy(ours["qk_positivity"]), _spectral(tl.W_E @ tl.QK @ tl.W_E.T), f"{name} QK positivity")
        for kind in "QKV":
            theirs = tl.all_composition_scores(kind)
            found = composition.composition_scores(model.weights, kind.lower())
            _close(torch.from_numpy(found.scores), getattr(theirs, "scores", theirs), f"{name} {kind}-composition")
