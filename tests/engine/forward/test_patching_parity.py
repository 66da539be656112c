"""Exact activation patching against TransformerLens' ``patching`` module (issue #27).

For every decoder family of the test fixtures (tests/hf_fixtures.py, tests/hf_fixtures_phi.py,
tests/family_fixtures.py), on the same tokens and metric, ``patching.patch_heads`` must match
``get_act_patch_attn_head_{out,q,k,v,pattern}_all_pos`` to 1e-4; on two families also the
``_by_pos`` functions, the induction metric and heads patched together. TransformerLens runs
each checkpoint through ``TransformerBridge`` (tests/engine/test_tl_parity.py's
``boot_transformer_lens``), the bundled attn-only-2l through its native bridge.

Where TransformerLens' own patch cannot be trusted, the reference is written out with its hooks
(or transformers' own modules), never dropped:
- GPT-Neo, GPT-J, OPT: the bridge hands attention to the transformers module, which has
  already used the pattern, so an edit of ``hook_pattern`` is discarded (TransformerLens warns
  so when the edit is a copy; the test checks that its result is the corrupt run's). The
  reference replaces the head's ``hook_z`` by ``clean pattern @ corrupt v`` instead.
- OPT with post-LN (``do_layer_norm_before=False``): TransformerLens 4.3's bridge cannot run
  it at all (its attention gets a 2-D hidden state). The reference is transformers' model
  with forward hooks on the projections.
- Grouped-query attention: TransformerLens patches a stored K/V head; headscope's heads are
  query heads, and patching the query heads of one group together is the same patch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from headscope.engine.forward import patch_tasks, patching
from headscope.engine.model.loading import load_model
from tests import family_fixtures
from tests.engine.test_tl_parity import boot_transformer_lens
from tests.hf_fixtures_phi import (  # noqa: F401  (session-scoped pytest fixtures)
    gptj_dir,
    opt_dir,
    opt_post_ln_dir,
    phi3_dir,
    phi_dir,
)

DIR_FIXTURES = ["gpt2", "neox", "llama", "qwen2", "phi3", "phi", "gptj", "opt"]
# the bridges that hand attention to transformers' module, where a pattern edit is lost
PATTERN_EDIT_DISCARDED = {"gpt_neo", "gptj", "opt"}
new_family = family_fixtures.new_family
# as tests/engine/test_tl_parity.py: float32 metrics through 2 layers, 1e-4 of the reference's
# magnitude (at least 1: a logit difference of O(1)); ``close`` scales it.
ATOL = 1e-4
# Two short sequences; the corrupt ones differ at a few positions, the metric's tokens are fixed.
CLEAN = [[1, 5, 9, 2, 33, 7, 5, 9], [3, 4, 5, 6, 7, 8, 9, 10]]
CORRUPT = [[1, 5, 9, 2, 40, 7, 11, 9], [3, 4, 50, 6, 7, 8, 9, 11]]
ANSWER, WRONG = 3, 4


def tl_logit_diff(logits: torch.Tensor) -> torch.Tensor:
    return (logits[:, -1, ANSWER] - logits[:, -1, WRONG]).mean()


def grouped(model: Any, site: str) -> list[list[tuple[int, int]]] | None:
    """The query heads of each K/V head, for k/v on a grouped-query model (else None)."""
    cfg = model.cfg
    group = cfg.n_heads // cfg.kv_heads
    if site not in ("k", "v") or group == 1:
        return None
    return [[(layer, g * group + i) for i in range(group)]
            for layer in range(cfg.n_layers) for g in range(cfg.kv_heads)]


def ours(model: Any, site: str, metric: Any, clean: Any = CLEAN, corrupt: Any = CORRUPT,
         by_position: bool = False) -> Any:
    return patching.patch_heads(model.weights, clean, corrupt, metric, site=site,
                                heads=grouped(model, site), by_position=by_position)


def close(found: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    expected = expected.detach().float()
    assert found.shape == expected.shape, f"{what}: shape {tuple(found.shape)} vs {tuple(expected.shape)}"
    err = (found - expected).abs().max().item()
    scale = max(1.0, expected.abs().max().item()) if expected.numel() else 1.0  # relative beyond magnitude 1
    assert err <= ATOL * scale, f"{what}: max |headscope - reference| = {err:.2e} (scale {scale:.3g})"


def patched(result: Any, shape: torch.Size) -> torch.Tensor:
    return torch.tensor([row.patched for row in result.rows]).reshape(shape)


def tl_pattern_by_z(tl: Any, cache: Any, metric: Any) -> torch.Tensor:
    """Patching each head's pattern, written with ``hook_z``: the head reads the clean
    pattern with the corrupt values."""
    cfg = tl.cfg
    _, corrupt_cache = tl.run_with_cache(torch.tensor(CORRUPT))
    group = cfg.n_heads // (getattr(cfg, "n_key_value_heads", None) or cfg.n_heads)
    out = torch.zeros(cfg.n_layers, cfg.n_heads)
    for layer in range(cfg.n_layers):
        v = corrupt_cache[f"blocks.{layer}.attn.hook_v"]  # [b, p, kv, e]
        for head in range(cfg.n_heads):
            z_new = cache[f"blocks.{layer}.attn.hook_pattern"][:, head] @ v[:, :, head // group]

            def hook(z: torch.Tensor, hook: Any, head: int = head, z_new: torch.Tensor = z_new) -> torch.Tensor:
                z = z.clone()
                z[:, :, head] = z_new
                return z

            logits = tl.run_with_hooks(torch.tensor(CORRUPT), fwd_hooks=[(f"blocks.{layer}.attn.hook_z", hook)])
            out[layer, head] = metric(logits)
    return out


def check_family(name: str, path: Path) -> None:
    """All five sites, every head, logit difference, against TransformerLens."""
    from transformer_lens import patching as tl_patching

    model = load_model(path)
    tl = boot_transformer_lens(path)
    with torch.no_grad():
        _, cache = tl.run_with_cache(torch.tensor(CLEAN))
        for site in patch_tasks.SITES:
            theirs = getattr(tl_patching, f"get_act_patch_attn_head_{site}_all_pos")(
                tl, torch.tensor(CORRUPT), cache, tl_logit_diff)
            if site == "pattern" and name in PATTERN_EDIT_DISCARDED:
                # every "patched" run is the corrupt run: the edit had no effect
                assert torch.allclose(theirs, tl_logit_diff(tl(torch.tensor(CORRUPT))).expand_as(theirs))
                theirs = tl_pattern_by_z(tl, cache, tl_logit_diff)
            found = ours(model, site, patch_tasks.LogitDiff(ANSWER, WRONG))
            close(patched(found, theirs.shape), theirs, f"{name} {site}")


@pytest.mark.parametrize("name", DIR_FIXTURES)
def test_exact_patching_matches_transformer_lens(name: str, request: pytest.FixtureRequest) -> None:
    path, _ = request.getfixturevalue(f"{name}_dir")
    check_family(name, path)


def test_exact_patching_matches_transformer_lens_new_families(new_family: tuple[str, Path, Any]) -> None:
    name, path, _ = new_family
    check_family(name, path)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_by_position_and_induction_match_transformer_lens(name: str, request: pytest.FixtureRequest) -> None:
    """``by_position`` against ``..._by_pos`` ([L, pos, H]; the pattern's [L, H, query]),
    and the induction metric (mean log-probability of the clean second half) on ``..._all_pos``."""
    from transformer_lens import patching as tl_patching

    path, _ = request.getfixturevalue(f"{name}_dir")
    model = load_model(path)
    tl = boot_transformer_lens(path)
    metric = patch_tasks.LogitDiff(ANSWER, WRONG)
    with torch.no_grad():
        _, cache = tl.run_with_cache(torch.tensor(CLEAN))
        for site in patch_tasks.SITES:
            theirs = getattr(tl_patching, f"get_act_patch_attn_head_{site}_by_pos")(
                tl, torch.tensor(CORRUPT), cache, tl_logit_diff)
            found = ours(model, site, metric, by_position=True)
            per_pos = torch.tensor([row.positions for row in found.rows])  # [sets, pos]
            if site == "pattern":  # [L, H, dest]
                close(per_pos.reshape(theirs.shape), theirs, f"{name} {site} by position")
            else:  # [L, pos, heads]
                sets = theirs.shape[2]
                close(per_pos.reshape(theirs.shape[0], sets, -1).transpose(1, 2), theirs, f"{name} {site} by position")
            # the all-positions rows are unchanged by asking for positions too
            alone = ours(model, site, metric)
            # the same sums in other batch shapes: float32 noise of a logit difference of O(1)
            assert [r.patched for r in alone.rows] == pytest.approx([r.patched for r in found.rows], abs=1e-5, rel=1e-5)

        clean, corrupt = patch_tasks.induction_task(model.cfg.d_vocab, model.cfg.n_ctx, seed=3, seq_len=6, batch=2)
        half = clean.shape[1] // 2

        def tl_induction(logits: torch.Tensor) -> torch.Tensor:
            logp = torch.log_softmax(logits[:, half:-1].float(), dim=-1)
            return logp.gather(-1, clean[:, half + 1:, None]).mean()

        _, cache = tl.run_with_cache(clean)
        theirs = tl_patching.get_act_patch_attn_head_out_all_pos(tl, corrupt, cache, tl_induction)
        found = ours(model, "out", patch_tasks.InductionLogProb(clean), clean, corrupt)
        close(patched(found, theirs.shape), theirs, f"{name} induction")
        assert found.clean == pytest.approx(float(tl_induction(tl(clean))), abs=ATOL)
        assert found.corrupt == pytest.approx(float(tl_induction(tl(corrupt))), abs=ATOL)


def test_opt_post_ln_matches_transformers_hooks(request: pytest.FixtureRequest) -> None:
    """OPT with post-LN, which TransformerLens cannot run: each site patched with forward
    hooks on transformers' own modules (the projections' outputs; the output projection's
    input for ``out`` and, as ``clean pattern @ corrupt v``, for ``pattern``)."""
    path, hf = request.getfixturevalue("opt_post_ln_dir")
    model = load_model(path)
    implementation = hf.config._attn_implementation
    hf.set_attn_implementation("eager")  # returns the patterns (a shared fixture: put back below)
    try:
        with torch.no_grad():
            clean_acts, corrupt_acts = hf_capture(hf, CLEAN), hf_capture(hf, CORRUPT)
            for site in patch_tasks.SITES:
                expected = hf_patched(hf, site, clean_acts, corrupt_acts)
                found = ours(model, site, patch_tasks.LogitDiff(ANSWER, WRONG))
                close(patched(found, expected.shape), expected, f"opt_post_ln {site}")
    finally:
        hf.set_attn_implementation(implementation)


def hf_capture(hf: Any, tokens: list[list[int]]) -> dict[tuple[int, str], torch.Tensor]:
    """OPT's q/k/v projections, the input of its output projection (``z``, heads side by
    side) and its patterns, per layer."""
    found: dict[tuple[int, str], torch.Tensor] = {}
    handles = []
    for layer, block in enumerate(hf.model.decoder.layers):
        attn = block.self_attn
        for what in ("q", "k", "v"):
            handles.append(getattr(attn, f"{what}_proj").register_forward_hook(
                lambda _m, _i, out, key=(layer, what): found.__setitem__(key, out.detach().clone())))
        handles.append(attn.out_proj.register_forward_pre_hook(
            lambda _m, args, key=(layer, "z"): found.__setitem__(key, args[0].detach().clone())))
    out = hf(torch.tensor(tokens), output_attentions=True)
    for handle in handles:
        handle.remove()
    for layer, pattern in enumerate(out.attentions):
        found[layer, "pattern"] = pattern.detach()
    return found


def hf_patched(hf: Any, site: str, clean_acts: dict, corrupt_acts: dict) -> torch.Tensor:
    """``[L, H]``: the corrupt run's logit difference with one head's ``site`` clean."""
    layers = hf.model.decoder.layers
    n_heads = hf.config.num_attention_heads
    e = hf.config.hidden_size // n_heads
    expected = torch.zeros(len(layers), n_heads)
    for layer, block in enumerate(layers):
        attn = block.self_attn
        for head in range(n_heads):
            cols = slice(head * e, (head + 1) * e)
            if site in ("q", "k", "v"):
                def hook(_m: Any, _i: Any, out: torch.Tensor, key: tuple[int, str] = (layer, site),
                         cols: slice = cols) -> torch.Tensor:
                    out = out.clone()
                    out[..., cols] = clean_acts[key][..., cols]
                    return out

                handle = getattr(attn, f"{site}_proj").register_forward_hook(hook)
            else:
                if site == "out":
                    z_new = clean_acts[layer, "z"][..., cols]
                else:  # the clean pattern reads the corrupt values
                    z_new = clean_acts[layer, "pattern"][:, head] @ corrupt_acts[layer, "v"][..., cols]

                def pre_hook(_m: Any, args: tuple[torch.Tensor, ...], cols: slice = cols,
                             z_new: torch.Tensor = z_new) -> tuple[torch.Tensor, ...]:
                    z = args[0].clone()
                    z[..., cols] = z_new
                    return (z, *args[1:])

                handle = attn.out_proj.register_forward_pre_hook(pre_hook)
            expected[layer, head] = tl_logit_diff(hf(torch.tensor(CORRUPT)).logits)
            handle.remove()
    return expected
