"""The shortcuts of exact patching are exact (issue #27, speed; docs/math.md, "Patching").

``patch_heads`` runs the patched copies only from the first position where the clean and
corrupt tokens differ (earlier keys and values come from the base run), all of them in one
pass that each joins at its first patched layer, and the last layer only at the positions the
metric reads. Each case below puts the first difference somewhere the shortcut could go wrong
(position 0: no shared prefix; the middle; the last position: one query row) and checks every
site against TransformerLens' ``get_act_patch_attn_head_*`` (denoising, noising, by position,
the induction metric whose read positions start before the first difference) or its hooks
(heads patched together across layers), on a learned-position model with MLPs (gpt2) and a
rotary one with grouped-query attention (llama: the queries' RoPE angles start at the first
difference).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from headscope.engine.forward import patch_tasks, patching
from headscope.engine.forward.torch_weights import torch_weights
from headscope.engine.forward.transformer import attention_pattern
from headscope.engine.model.loading import load_model
from tests.engine.forward.test_patching import ATOL, tl_patch
from tests.engine.forward.test_patching_parity import (
    ANSWER,
    WRONG,
    close,
    grouped,
    patched,
    tl_logit_diff,
)
from tests.engine.test_tl_parity import boot_transformer_lens

P = 8
BASE = [[1, 5, 9, 2, 33, 7, 5, 9], [3, 4, 5, 6, 7, 8, 9, 10]]


def differing_from(first: int) -> list[list[int]]:
    """``BASE`` with new tokens from position ``first`` on in the first sequence, and at the
    last position only in the second (so the batch's first difference is ``first``)."""
    a = [t if i < first else 40 + i for i, t in enumerate(BASE[0])]
    b = [*BASE[1][:-1], 12]
    return [a, b]


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def family(request: pytest.FixtureRequest) -> tuple[str, Any, Any]:
    path, _ = request.getfixturevalue(f"{request.param}_dir")
    return request.param, load_model(path), boot_transformer_lens(path)


@pytest.mark.parametrize("first", [0, 3, P - 1])
@pytest.mark.parametrize("noising", [False, True])
def test_every_site_matches_transformer_lens_wherever_the_inputs_first_differ(
        family: tuple[str, Any, Any], first: int, noising: bool) -> None:
    from transformer_lens import patching as tl_patching

    name, model, tl = family
    clean, corrupt = BASE, differing_from(first)
    # noising is TransformerLens' denoising with the roles swapped: the clean run, the corrupt cache
    run, cached = (clean, corrupt) if noising else (corrupt, clean)
    metric = patch_tasks.LogitDiff(ANSWER, WRONG)
    with torch.no_grad():
        _, cache = tl.run_with_cache(torch.tensor(cached))
        for site in patch_tasks.SITES:
            theirs = getattr(tl_patching, f"get_act_patch_attn_head_{site}_all_pos")(
                tl, torch.tensor(run), cache, tl_logit_diff)
            found = patching.patch_heads(model.weights, clean, corrupt, metric, site=site,
                                         noising=noising, heads=grouped(model, site))
            close(patched(found, theirs.shape), theirs, f"{name} {site} first={first} noising={noising}")


@pytest.mark.parametrize("first", [3, P - 1])
def test_by_position_matches_transformer_lens(family: tuple[str, Any, Any], first: int) -> None:
    """Positions before the first difference change nothing (the base run's metric, exactly);
    after it, each position as TransformerLens' ``..._by_pos``, also in the last layer, which
    computes only the metric's query rows."""
    from transformer_lens import patching as tl_patching

    name, model, tl = family
    clean, corrupt = BASE, differing_from(first)
    metric = patch_tasks.LogitDiff(ANSWER, WRONG)
    with torch.no_grad():
        _, cache = tl.run_with_cache(torch.tensor(clean))
        for site in patch_tasks.SITES:
            theirs = getattr(tl_patching, f"get_act_patch_attn_head_{site}_by_pos")(
                tl, torch.tensor(corrupt), cache, tl_logit_diff)
            found = patching.patch_heads(model.weights, clean, corrupt, metric, site=site,
                                         heads=grouped(model, site), by_position=True)
            per_pos = torch.tensor([row.positions for row in found.rows])  # [sets, pos]
            assert (per_pos[:, :first] == found.corrupt).all()
            if site == "pattern":  # [L, H, dest]
                close(per_pos.reshape(theirs.shape), theirs, f"{name} {site} by position, first={first}")
            else:  # [L, pos, heads]
                per_pos = per_pos.reshape(theirs.shape[0], theirs.shape[2], -1).transpose(1, 2)
                close(per_pos, theirs, f"{name} {site} by position, first={first}")


def test_induction_metric_reads_positions_before_the_first_difference(family: tuple[str, Any, Any]) -> None:
    """The induction metric reads the whole second half; the corrupt input differs at its
    last token only, so the read positions before it come from the base run."""
    from transformer_lens import patching as tl_patching

    name, model, tl = family
    clean, _ = patch_tasks.induction_task(model.cfg.d_vocab, model.cfg.n_ctx, seed=1, seq_len=5, batch=2)
    corrupt = clean.clone()
    corrupt[:, -1] = (clean[:, -1] + 1) % model.cfg.d_vocab
    corrupt[1, -2] = (clean[1, -2] + 1) % model.cfg.d_vocab  # the batch's first difference: -2
    half = clean.shape[1] // 2

    def tl_induction(logits: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(logits[:, half:-1].float(), dim=-1)
        return logp.gather(-1, clean[:, half + 1:, None]).mean()

    with torch.no_grad():
        _, cache = tl.run_with_cache(clean)
        for site in ("out", "k", "v"):
            theirs = getattr(tl_patching, f"get_act_patch_attn_head_{site}_all_pos")(tl, corrupt, cache, tl_induction)
            found = patching.patch_heads(model.weights, clean, corrupt, patch_tasks.InductionLogProb(clean),
                                         site=site, heads=grouped(model, site))
            close(patched(found, theirs.shape), theirs, f"{name} induction {site}")


def test_heads_patched_together_across_layers_match_hooks(family: tuple[str, Any, Any]) -> None:
    """Sets that start at different layers share one pass (each joins at its first layer)."""
    name, model, tl = family
    clean, corrupt = BASE[:1], differing_from(4)[:1]
    sets = [[(1, 2)], [(0, 1), (1, 2)], [(0, 0), (0, 3)], [(1, 0), (1, 1), (1, 3)], [(0, 2), (1, 0)]]
    metric = patch_tasks.LogitDiff(ANSWER, WRONG)
    with torch.no_grad():
        for site in ("out", "q", "pattern"):  # (the hooks' k/v are the stored K/V heads)
            found = patching.patch_heads(model.weights, clean, corrupt, metric, site=site, heads=sets)
            for row, heads in zip(found.rows, sets, strict=True):
                expected = tl_patch(tl, clean[0], corrupt[0], tl_logit_diff, site, heads)
                assert row.patched == pytest.approx(expected, abs=ATOL, rel=ATOL), (name, site, heads)


def test_queries_of_the_last_positions_get_the_rows_of_the_full_pattern(family: tuple[str, Any, Any]) -> None:
    """``attention_pattern`` with fewer queries than keys: the last rows of the square
    pattern (their RoPE angles and mask rows), what the patched runs rely on."""
    _, model, _ = family
    w = torch_weights(model.weights)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, P, model.cfg.d_head, generator=g), torch.randn(2, 4, P, model.cfg.d_head, generator=g)
    full = attention_pattern(w, 0, q, k)
    for s in (1, 3, P):
        assert torch.allclose(attention_pattern(w, 0, q[:, :, P - s:], k), full[:, :, P - s:], atol=1e-6)


def test_a_few_columns_and_rows_of_the_processed_embeddings(family: tuple[str, Any, Any]) -> None:
    """What a logit difference and a short prompt read: ``unembed_columns`` and
    ``embed_rows`` equal those columns (rows) of the processed matrices."""
    _, model, _ = family
    w = torch_weights(model.weights)
    cols = [3, 4, 0, model.cfg.d_vocab - 1]
    w_u, b_u = w.unembed_columns(cols)
    assert torch.allclose(w_u, w.get("unembed.W_U")[:, cols], atol=1e-6)
    assert torch.allclose(b_u, w.get("unembed.b_U")[cols], atol=1e-6)
    # a logit difference skips the centring over the vocabulary: the same shift for every column
    w_s, b_s = w.unembed_columns(cols, centred=False)
    x = torch.randn(5, model.cfg.d_model, generator=torch.Generator().manual_seed(0))
    diff = (x @ w_u + b_u)[:, :, None] - (x @ w_u + b_u)[:, None, :]
    assert torch.allclose((x @ w_s + b_s)[:, :, None] - (x @ w_s + b_s)[:, None, :], diff, atol=1e-5)
    ids = torch.tensor([[5, 9, 5], [0, 1, model.cfg.d_vocab - 1]])
    assert torch.equal(w.embed_rows(ids), w.get("embed.W_E")[ids])


def test_gelu_new_in_place_gives_the_written_out_formula_bit_for_bit() -> None:
    """The MLP's activation outside autograd works in place on one temporary (a patching pass
    makes thousands of activation-sized tensors); the same operations in the same order give
    the same bits as TransformerLens' and Hugging Face's formula, and autograd still works."""
    import math

    from headscope.engine.forward.transformer import activation

    gelu = activation("gelu_new")
    x = torch.randn(300, 257, generator=torch.Generator().manual_seed(0)) * 4
    written = 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    assert torch.equal(gelu(x), written)
    leaf = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(gelu(leaf).sum(), leaf)
    assert torch.equal(gelu(leaf).detach(), written) and torch.isfinite(grad).all()
