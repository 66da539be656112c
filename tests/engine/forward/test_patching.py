"""Patching on the bundled attn-only-2l and on a fixture with MLPs (issue #27): exact
patching against TransformerLens (single heads, heads patched together, across layers),
attribution patching against an autograd reference through TransformerLens' hooks, path
patching against a hook-based reference, and the bad inputs.

attn-only-2l is a headscope-native checkpoint; TransformerLens runs it through its native
bridge (``boot_native``, the loader of its own attn-only models) with the stored weights.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from headscope.engine.core.errors import (
    IndexOutOfRangeError,
    InvalidRequestError,
    NonFiniteError,
    PromptError,
)
from headscope.engine.core.results import recovered
from headscope.engine.forward import patch_tasks, patching
from headscope.engine.model.loading import load_model
from tests.conftest import sample_model
from tests.engine.test_tl_parity import boot_transformer_lens

# float32 metrics against TransformerLens' float32 hooks, summed in another order: 1e-4 of the
# reference's magnitude, at least 1 (logit differences of O(1..10); tests/engine/test_tl_parity.py).
ATOL = 1e-4
# The same float32 computation batched differently (another copy count, rows in another
# pass): a few ulps of the metric's O(10) terms.
REPEAT = 1e-5


def assert_close(found: torch.Tensor, expected: torch.Tensor, what: str, tol: float = ATOL) -> None:
    """``max |found - expected| <= tol`` relative to the reference's magnitude beyond 1."""
    scale = max(1.0, expected.abs().max().item()) if expected.numel() else 1.0
    err = (found - expected).abs().max().item()
    assert err <= tol * scale, f"{what}: max |found - expected| = {err:.2e} (scale {scale:.3g})"
# A repeated span and the same span followed by other words: L1.H2 and L1.H1 predict "mouse".
CLEAN_TEXT = "cake card kite cup hotel mouse cake card kite cup hotel"
CORRUPT_TEXT = "cake card kite cup hotel mouse Ivy Jack shoe Ryan Lily"


def boot_native(path: Path) -> Any:
    """TransformerLens' native bridge of a headscope-native attention-only checkpoint."""
    import json

    from safetensors.torch import load_file
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge.sources.native import boot
    from transformer_lens.utilities.tl_checkpoint_conversion import convert_tl_checkpoint

    c = json.loads((path / "headscope.json").read_text())
    cfg = TransformerBridgeConfig(
        d_model=c["d_model"], n_layers=c["n_layers"], d_mlp=None, d_head=c["d_head"],
        n_heads=c["n_heads"], n_ctx=c["n_ctx"], d_vocab=c["d_vocab"], act_fn=None, attn_only=True,
        normalization_type=c["normalization"], positional_embedding_type="standard",
        architecture="TransformerLensNative")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge = boot(cfg, device="cpu", dtype=torch.float32, model_name=path.name)
    loaded = bridge.load_state_dict(convert_tl_checkpoint(load_file(path / "model.safetensors"), cfg), strict=True)
    assert not loaded.missing_keys and not loaded.unexpected_keys
    return bridge.eval()


@pytest.fixture(scope="module")
def attn_only() -> tuple[Any, Any, list[int], list[int], patch_tasks.LogitDiff]:
    """(headscope model, TransformerLens bridge, clean ids, corrupt ids, metric)."""
    path = sample_model("attn-only-2l")
    model = load_model(path)
    tok = model.tokenizer
    clean, corrupt = tok.encode(CLEAN_TEXT), tok.encode(CORRUPT_TEXT)
    metric = patch_tasks.LogitDiff(tok.token_to_id("mouse"), tok.token_to_id("Ivy"))
    return model, boot_native(path), clean, corrupt, metric


def tl_metric(metric: patch_tasks.LogitDiff) -> Any:
    return lambda logits: (logits[:, -1, metric.answer] - logits[:, -1, metric.wrong]).mean()


def tl_patch(tl: Any, clean: Any, corrupt: Any, metric: Any, site: str,
             heads: list[tuple[int, int]]) -> float:
    """The corrupt run with each of ``heads``' ``site`` activation clean, through hooks."""
    name = {"out": "z"}.get(site, site)
    _, cache = tl.run_with_cache(torch.tensor([clean]))
    hooks = []
    for layer, head in heads:
        def hook(act: torch.Tensor, hook: Any, layer: int = layer, head: int = head) -> torch.Tensor:
            act = act.clone()
            clean_act = cache[f"blocks.{layer}.attn.hook_{name}"]
            if name == "pattern":
                act[:, head] = clean_act[:, head]
            else:
                act[:, :, head] = clean_act[:, :, head]
            return act

        hooks.append((f"blocks.{layer}.attn.hook_{name}", hook))
    return float(metric(tl.run_with_hooks(torch.tensor([corrupt]), fwd_hooks=hooks)))


# -- exact patching ---------------------------------------------------------------------------


def test_attn_only_2l_matches_transformer_lens(attn_only: Any) -> None:
    """Every head at every site, on the repeated span, against TransformerLens'
    ``get_act_patch_attn_head_*_all_pos`` on its native bridge; the story of the issue:
    L1.H2 recovers most, L1.H1 next, layer 0 nothing, all of layer 1 nearly all of it."""
    from transformer_lens import patching as tl_patching

    model, tl, clean, corrupt, metric = attn_only
    with torch.no_grad():
        _, cache = tl.run_with_cache(torch.tensor([clean]))
        for site in patch_tasks.SITES:
            theirs = getattr(tl_patching, f"get_act_patch_attn_head_{site}_all_pos")(
                tl, torch.tensor([corrupt]), cache, tl_metric(metric))
            found = patching.patch_heads(model.weights, clean, corrupt, metric, site=site)
            ours = torch.tensor([row.patched for row in found.rows]).reshape(theirs.shape)
            assert_close(ours, theirs, site)
    out = patching.patch_heads(model.weights, clean, corrupt, metric)
    rec = {row.label: row.recovered for row in out.rows}
    assert max(rec, key=rec.__getitem__) == "L1.H2"
    assert rec["L1.H2"] > rec["L1.H1"] > rec["L1.H0"] > 0
    assert all(abs(rec[f"L0.H{h}"]) <= 0.02 for h in range(3))
    assert out.clean > 5 > 0 > out.corrupt


def test_heads_patched_together_match_hooks(attn_only: Any) -> None:
    """Sets of heads, in one layer and across layers (the run resumes from the first and
    patches each layer's heads as it reaches them), against TransformerLens' hooks."""
    model, tl, clean, corrupt, metric = attn_only
    sets = [[(1, 0), (1, 1), (1, 2)], [(1, 1), (1, 2)], [(0, 1), (1, 2)], [(0, 0), (0, 2), (1, 1)]]
    with torch.no_grad():
        for site in ("out", "q", "k", "pattern"):
            found = patching.patch_heads(model.weights, clean, corrupt, metric, site=site, heads=sets)
            for row, heads in zip(found.rows, sets, strict=True):
                assert row.heads == tuple(heads)
                expected = tl_patch(tl, clean, corrupt, tl_metric(metric), site, heads)
                assert row.patched == pytest.approx(expected, abs=ATOL, rel=ATOL), (site, heads)
    together = patching.patch_heads(model.weights, clean, corrupt, metric, heads=sets[:2])
    alone = patching.patch_heads(model.weights, clean, corrupt, metric)
    rec = {row.label: row.recovered for row in alone.rows}
    # one head recovers only part: together layer 1 recovers far more than its heads' sum
    assert together.rows[0].recovered > 0.85
    assert together.rows[0].recovered > rec["L1.H0"] + rec["L1.H1"] + rec["L1.H2"] + 0.2
    assert together.rows[0].label == "L1.H0+L1.H1+L1.H2"


def test_noising_runs_the_clean_input(attn_only: Any) -> None:
    """Noising: the clean run with one head's corrupt activation; the same as denoising with
    the two inputs swapped, but ``recovered`` stays relative to (clean, corrupt)."""
    model, _, clean, corrupt, metric = attn_only
    noised = patching.patch_heads(model.weights, clean, corrupt, metric, noising=True)
    swapped = patching.patch_heads(model.weights, corrupt, clean, metric)
    assert noised.noising and noised.clean == pytest.approx(swapped.corrupt)
    for a, b in zip(noised.rows, swapped.rows, strict=True):
        assert a.patched == pytest.approx(b.patched, abs=REPEAT, rel=REPEAT)
        assert a.recovered == pytest.approx(recovered(noised.clean, noised.corrupt, a.patched))
    rec = {row.label: row.recovered for row in noised.rows}
    # noising tells what the clean run needs: without L1.H2 it keeps under half of its margin
    assert min(rec, key=rec.__getitem__) == "L1.H2" and rec["L1.H2"] < 0.5


def test_induction_task_and_by_position(attn_only: Any) -> None:
    """The default task (seeded, any model), and by_position rows equal to patching one
    position as its own head set would (the all-positions row is unchanged)."""
    model = attn_only[0]
    clean, corrupt = patch_tasks.induction_task(model.cfg.d_vocab, model.cfg.n_ctx, seed=0, seq_len=8, batch=2)
    again = patch_tasks.induction_task(model.cfg.d_vocab, model.cfg.n_ctx, seed=0, seq_len=8, batch=2)
    assert torch.equal(clean, again[0]) and torch.equal(corrupt, again[1])
    assert torch.equal(clean[:, :8], clean[:, 8:]) and torch.equal(corrupt[:, :8], clean[:, :8])
    assert not torch.equal(corrupt[:, 8:], clean[:, 8:])
    metric = patch_tasks.InductionLogProb(clean)
    out = patching.patch_heads(model.weights, clean, corrupt, metric, by_position=True)
    assert out.metric == "induction" and out.clean > out.corrupt
    best = max(out.rows, key=lambda r: r.recovered)
    assert best.label == "L1.H2"
    assert len(best.positions) == 16 and len(best.positions_recovered) == 16
    # patching a first-half position changes nothing: the clean and corrupt first halves agree
    assert all(v == pytest.approx(out.corrupt, abs=REPEAT, rel=REPEAT) for v in best.positions[:8])
    plain = patching.patch_heads(model.weights, clean, corrupt, metric)
    assert [r.patched for r in plain.rows] == pytest.approx([r.patched for r in out.rows], abs=REPEAT, rel=REPEAT)


def test_gqa_heads_patch_their_own_copy_of_the_shared_key(llama_dir: tuple[Path, Any]) -> None:
    """A query head's k site is its copy of the stored K head: patching one query head of a
    group differs from patching the group (which is TransformerLens' K-head patch)."""
    model = load_model(llama_dir[0])
    clean, corrupt = [[1, 5, 9, 2, 33, 7, 5, 9]], [[1, 5, 9, 2, 40, 7, 11, 9]]
    metric = patch_tasks.LogitDiff(3, 4)
    one = patching.patch_heads(model.weights, clean, corrupt, metric, site="k", heads=[[(1, 0)]])
    group = patching.patch_heads(model.weights, clean, corrupt, metric, site="k", heads=[[(1, 0), (1, 1)]])
    assert one.rows[0].patched != pytest.approx(group.rows[0].patched, abs=1e-4)


# -- attribution ------------------------------------------------------------------------------


def autograd_reference(tl: Any, clean: Any, corrupt: Any, metric: Any, site: str, scale: float) -> torch.Tensor:
    """``[L, H]``: grad(metric on the corrupt run) · (clean - corrupt), through hooks that
    keep each site activation's gradient; for q/k the gradient at the pattern times the
    change of the pattern when the head's q (k) is clean (softmax recomputed: learned
    positions, causal, ``scale`` = the attention's divisor)."""
    cfg = tl.cfg
    _, clean_cache = tl.run_with_cache(torch.tensor(clean))
    kept: dict[str, torch.Tensor] = {}
    tap = {"out": "z", "q": "pattern", "k": "pattern"}.get(site, site)

    def keep(act: torch.Tensor, hook: Any, name: str) -> torch.Tensor:
        act.retain_grad()
        kept[name] = act
        return act

    names = [f"blocks.{layer}.attn.hook_{n}" for layer in range(cfg.n_layers) for n in {tap, "q", "k"}]
    hooks = [(n, lambda act, hook, n=n: keep(act, hook, n)) for n in names]
    with torch.enable_grad():
        logits = tl.run_with_hooks(torch.tensor(corrupt), fwd_hooks=hooks)
        metric(logits).backward()
    out = torch.zeros(cfg.n_layers, cfg.n_heads)
    for layer in range(cfg.n_layers):
        name = f"blocks.{layer}.attn.hook_{tap}"
        grad, base = kept[name].grad, kept[name].detach()
        if site in ("q", "k"):
            q, k = (kept[f"blocks.{layer}.attn.hook_{n}"].detach() for n in "qk")  # [b, p, h, e]
            q_new = clean_cache[f"blocks.{layer}.attn.hook_q"] if site == "q" else q
            k_new = clean_cache[f"blocks.{layer}.attn.hook_k"] if site == "k" else k
            scores = torch.einsum("bqhe,bkhe->bhqk", q_new, k_new) / scale
            n = scores.shape[-1]
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
            delta = torch.softmax(scores, dim=-1) - base
            out[layer] = (grad * delta).sum(dim=(0, 2, 3))
        else:
            delta = clean_cache[name] - base
            dims = (0, 2, 3) if tap == "pattern" else (0, 1, 3)
            out[layer] = (grad * delta).sum(dim=dims)
    return out


@pytest.mark.parametrize("site", patch_tasks.SITES)
def test_attribution_matches_autograd_reference(attn_only: Any, site: str) -> None:
    model, tl, clean, corrupt, metric = attn_only
    found = patching.attribute_heads(model.weights, clean, corrupt, metric, site=site)
    expected = autograd_reference(tl, [clean], [corrupt], tl_metric(metric), site, math.sqrt(model.cfg.d_head))
    estimates = torch.tensor([row.estimate for row in found.rows]).reshape(expected.shape)
    assert_close(estimates, expected, site)
    for row in found.rows:
        assert row.patched == pytest.approx(found.corrupt + row.estimate)
        assert row.exact is None


@pytest.mark.parametrize("site", ["out", "q", "v"])
def test_attribution_with_mlps_matches_autograd_reference(gpt2_dir: tuple[Path, Any], site: str) -> None:
    """The backward pass runs layer by layer through the MLPs too (GPT-2 fixture)."""
    path, _ = gpt2_dir
    model = load_model(path)
    tl = boot_transformer_lens(path)
    clean, corrupt = [[1, 5, 9, 2, 33, 7, 5, 9]], [[1, 5, 9, 2, 40, 7, 11, 9]]
    metric = patch_tasks.LogitDiff(3, 4)
    found = patching.attribute_heads(model.weights, clean, corrupt, metric, site=site)
    expected = autograd_reference(tl, clean, corrupt, tl_metric(metric), site, math.sqrt(model.cfg.d_head))
    estimates = torch.tensor([row.estimate for row in found.rows]).reshape(expected.shape)
    assert_close(estimates, expected, site)


def test_attribution_verify_runs_exact_patching_on_the_top_heads(attn_only: Any) -> None:
    model, _, clean, corrupt, metric = attn_only
    found = patching.attribute_heads(model.weights, clean, corrupt, metric, verify=2)
    exact = {r.label: r for r in patching.patch_heads(model.weights, clean, corrupt, metric).rows}
    verified = [r for r in found.rows if r.exact is not None]
    assert len(verified) == 2
    ranked = sorted(found.rows, key=lambda r: -abs(r.estimate))
    assert {r.label for r in verified} == {r.label for r in ranked[:2]}
    for row in verified:
        assert row.exact == pytest.approx(exact[row.label].patched, abs=REPEAT, rel=REPEAT)
        assert row.exact_recovered == pytest.approx(exact[row.label].recovered, abs=REPEAT, rel=REPEAT)


# -- path patching ----------------------------------------------------------------------------


def path_reference(tl: Any, clean: Any, corrupt: Any, metric: Any, sender: tuple[int, int],
                   receiver: tuple[int, int], kind: str) -> float:
    """The receiver's ``kind`` input = corrupt residual + (clean - corrupt) sender output,
    projected through its layer's LayerNorm and W_Q/W_K/W_V by hand; everything else corrupt."""
    (l1, h1), (l2, h2) = sender, receiver
    _, c_clean = tl.run_with_cache(torch.tensor(clean))
    _, c_corrupt = tl.run_with_cache(torch.tensor(corrupt))
    z = f"blocks.{l1}.attn.hook_z"
    delta = (c_clean[z][:, :, h1] - c_corrupt[z][:, :, h1]) @ tl.W_O[l1, h1]
    resid = c_corrupt[f"blocks.{l2}.hook_resid_pre"]
    ln1 = tl.blocks[l2].ln1
    assert torch.allclose(ln1(resid), c_corrupt[f"blocks.{l2}.ln1.hook_out"], atol=1e-5)
    w, b = getattr(tl, f"W_{kind.upper()}")[l2, h2], getattr(tl, f"b_{kind.upper()}")[l2, h2]
    fed = ln1(resid + delta) @ w + b

    def hook(act: torch.Tensor, hook: Any) -> torch.Tensor:
        act = act.clone()
        act[:, :, h2] = fed
        return act

    return float(metric(tl.run_with_hooks(torch.tensor(corrupt), fwd_hooks=[(f"blocks.{l2}.attn.hook_{kind}", hook)])))


def test_path_patching_matches_hook_reference_attn_only(attn_only: Any) -> None:
    model, tl, clean, corrupt, metric = attn_only
    edges = [((0, 1), (1, 2)), ((0, 0), (1, 2)), ((0, 2), (1, 1))]
    with torch.no_grad():
        for kind in patching.PATH_INPUTS:
            found = patching.path_patch(model.weights, clean, corrupt, metric, edges, receiver_input=kind)
            assert found.method == "path" and found.site == kind
            for row, (sender, receiver) in zip(found.rows, edges, strict=True):
                assert row.heads == (sender, receiver)
                expected = path_reference(tl, [clean], [corrupt], tl_metric(metric), sender, receiver, kind)
                assert row.patched == pytest.approx(expected, abs=ATOL, rel=ATOL), (kind, sender, receiver)


def test_path_patching_matches_hook_reference_with_mlps(gpt2_dir: tuple[Path, Any]) -> None:
    """GPT-2 fixture: the sender's output skips layer 0's MLP on its way to the receiver."""
    path, _ = gpt2_dir
    model = load_model(path)
    tl = boot_transformer_lens(path)
    clean, corrupt = [[1, 5, 9, 2, 33, 7, 5, 9]], [[1, 5, 9, 2, 40, 7, 11, 9]]
    metric = patch_tasks.LogitDiff(3, 4)
    edges = [((0, h1), (1, h2)) for h1 in range(4) for h2 in (0, 3)]
    with torch.no_grad():
        for kind in patching.PATH_INPUTS:
            found = patching.path_patch(model.weights, clean, corrupt, metric, edges, receiver_input=kind)
            for row, (sender, receiver) in zip(found.rows, edges, strict=True):
                expected = path_reference(tl, clean, corrupt, tl_metric(metric), sender, receiver, kind)
                assert row.patched == pytest.approx(expected, abs=ATOL, rel=ATOL), (kind, sender, receiver)


def test_path_patching_refuses_backward_edges(attn_only: Any) -> None:
    model, _, clean, corrupt, metric = attn_only
    with pytest.raises(InvalidRequestError, match="earlier layer"):
        patching.path_patch(model.weights, clean, corrupt, metric, [((1, 0), (1, 2))])
    with pytest.raises(IndexOutOfRangeError):
        patching.path_patch(model.weights, clean, corrupt, metric, [((0, 0), (2, 0))])


# -- bad input --------------------------------------------------------------------------------


def test_bad_inputs_are_one_line_errors(attn_only: Any, bert_mlm_dir: tuple[Path, Any]) -> None:
    model, _, clean, corrupt, metric = attn_only
    w = model.weights
    with pytest.raises(InvalidRequestError, match="clean has 11 tokens, corrupt 10"):
        patching.patch_heads(w, clean, corrupt[:-1], metric)
    with pytest.raises(PromptError, match="corrupt input is empty"):
        patching.patch_heads(w, clean, [], metric)
    with pytest.raises(IndexOutOfRangeError, match="token id 999"):
        patching.patch_heads(w, clean, [*corrupt[:-1], 999], metric)
    with pytest.raises(IndexOutOfRangeError, match="answer token id 414"):
        patching.patch_heads(w, clean, corrupt, patch_tasks.LogitDiff(414, 0))
    with pytest.raises(InvalidRequestError, match="site must be one of"):
        patching.patch_heads(w, clean, corrupt, metric, site="z")
    with pytest.raises(IndexOutOfRangeError):
        patching.patch_heads(w, clean, corrupt, metric, heads=[[(0, 3)]])
    bert = load_model(bert_mlm_dir[0])
    with pytest.raises(InvalidRequestError, match="encoder"):
        patching.patch_heads(bert.weights, [[5, 6, 7]], [[5, 6, 8]], patch_tasks.LogitDiff(1, 2))


def test_same_metric_leaves_recovered_undefined(attn_only: Any) -> None:
    model, _, clean, _, metric = attn_only
    out = patching.patch_heads(model.weights, clean, clean, metric)
    assert not out.recovered_defined and "recovered is undefined" in out.note
    assert all(row.recovered is None and row.patched is not None for row in out.rows)
    assert np.isnan(out.table()).all()
    attribution = patching.attribute_heads(model.weights, clean, clean, metric)
    assert all(row.recovered is None for row in attribution.rows)


def test_non_finite_activations_are_refused(tmp_path: Path) -> None:
    """A NaN in a weight makes every run non-finite: refused naming the run and the layer."""
    import shutil

    from safetensors.torch import load_file, save_file

    source = sample_model("attn-only-2l")
    for name in ("headscope.json", "vocab.txt"):
        shutil.copy(source / name, tmp_path / name)
    tensors = load_file(source / "model.safetensors")
    tensors["blocks.1.attn.W_V"][0, 0, 0] = float("nan")
    save_file(tensors, tmp_path / "model.safetensors")
    model = load_model(tmp_path, raw=True)
    with pytest.raises(NonFiniteError, match="clean run from layer 1"):
        patching.patch_heads(model.weights, [[1, 2, 3, 1, 2]], [[1, 2, 4, 1, 2]], patch_tasks.LogitDiff(3, 4))


def test_pattern_sources_are_kept_within_their_budget_with_the_same_results(attn_only: Any,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """``--site pattern`` kept every layer's full source pattern for the whole run: bounded by
    ``_SOURCE_BYTES`` (at least the layer being run), the results are unchanged."""
    model, _, clean, corrupt, metric = attn_only
    made: list[Any] = []
    real = patching._activation_source

    def recording(*args: Any) -> Any:
        made.append(real(*args))
        return made[-1]

    monkeypatch.setattr(patching, "_activation_source", recording)
    unbounded = patching.patch_heads(model.weights, clean, corrupt, metric, site="pattern", by_position=True)
    cfg = model.weights.cfg
    layer_bytes = 4 * cfg.n_heads * len(clean) ** 2  # one layer's float32 [1, h, p, p]
    assert made[-1].peak == cfg.n_layers * layer_bytes  # within the default budget: every layer kept
    monkeypatch.setattr(patching, "_SOURCE_BYTES", layer_bytes)  # one layer
    bounded = patching.patch_heads(model.weights, clean, corrupt, metric, site="pattern", by_position=True)
    assert made[-1].peak == layer_bytes
    assert [(r.patched, r.positions) for r in bounded.rows] == [(r.patched, r.positions) for r in unbounded.rows]
