"""Exact patching in sub-batches and chunks gives the same numbers (issue #27, speed at 7B).

``patch_heads`` runs every patched copy in one pass over the layers, each layer over the
copies in sub-batches (``_LAYER_BYTES``, the transient tensors of one layer), and splits the
copies into several passes only when their kept streams exceed ``_STREAM_BYTES``
(docs/math.md, "Patching", cost). On the test fixtures both budgets are far from binding, so
each test here shrinks them until sub-batching and chunking both happen (several sub-batches
per layer; the copies that join at a layer, which share the base stream, split across
sub-batches) and checks the result against the unsplit one and against TransformerLens, for
every site, noising, by position, sets of heads across layers, path patching, and the q/k
norm that spans the heads (OLMo2) and the experts' MLP (Mixtral). The last test counts weight
reads: each layer's weights are read once per pass however many sub-batches share them.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from headscope.engine.forward import behaviour, patch_tasks, patching
from headscope.engine.model.loading import load_model
from headscope.engine.model.processing import ProcessedWeights
from tests import family_fixtures
from tests.engine.forward import test_patching_suffix
from tests.engine.forward.test_patching import ATOL, REPEAT, assert_close, tl_patch
from tests.engine.forward.test_patching_parity import (
    ANSWER,
    WRONG,
    check_family,
    close,
    grouped,
    patched,
    tl_logit_diff,
)
from tests.engine.forward.test_patching_suffix import BASE, differing_from

family = test_patching_suffix.family  # gpt2 and llama with TransformerLens, once per module

# Sub-batch and pass sizes that leave remainders on the fixtures (4 heads a layer, 2-3 layers).
SPLITS: dict[str, dict[str, int]] = {
    "1 a sub-batch": {"layer_bytes": 1},  # the budget's floor: every copy alone
    "1 a pass": {"stream_bytes": 1},  # the other budget's floor: every copy its own pass
    "3 a sub-batch, 5 a pass": {"runs": 3, "copies": 5},
    "2 a sub-batch": {"runs": 2},
}


@dataclass
class Trace:
    """What the patched passes did: how many (``_run_variants`` calls) and, for every
    ``_patched_layer`` call, ``(pass, layer, the addresses of the streams it read)``."""

    passes: int = 0
    calls: list[tuple[int, int, tuple[int, ...]]] = field(default_factory=list)

    def check(self, *, parts: bool = True, shared: bool = True, passes: bool = False) -> None:
        """``parts``: some layer of a pass ran in several sub-batches; ``shared``: one stream
        (the base stream the copies joining at a layer share) was read by several of them;
        ``passes``: the copies went in several passes."""
        per_layer = Counter((p, layer) for p, layer, _ in self.calls)
        per_stream = Counter((p, layer, ptr) for p, layer, ptrs in self.calls for ptr in ptrs)
        assert not parts or max(per_layer.values()) > 1, per_layer
        assert not shared or max(per_stream.values()) > 1, self.calls
        assert not passes or self.passes > 1, self.passes


@contextlib.contextmanager
def split(monkeypatch: pytest.MonkeyPatch, *, layer_bytes: int | None = None, runs: int | None = None,
          stream_bytes: int | None = None, copies: int | None = None) -> Iterator[Trace]:
    """The budgets shrunk (``runs``/``copies``: the sizes they give capped, as a budget a few
    copies large would); yields the ``Trace`` of the calls."""
    trace = Trace()
    layer_fn, pass_fn = patching._patched_layer, patching._run_variants

    def spy_layer(ctx: Any, layer: int, x: torch.Tensor, *args: Any) -> Any:
        b = ctx.runs.base_in[0].shape[0]
        ptrs = tuple(x[i * b].data_ptr() for i in range(x.shape[0] // b))
        trace.calls.append((trace.passes, layer, ptrs))
        return layer_fn(ctx, layer, x, *args)

    def spy_pass(*args: Any) -> Any:
        trace.passes += 1
        return pass_fn(*args)

    with monkeypatch.context() as m:
        m.setattr(patching, "_patched_layer", spy_layer)
        m.setattr(patching, "_run_variants", spy_pass)
        if layer_bytes is not None:
            m.setattr(patching, "_LAYER_BYTES", layer_bytes)
        if stream_bytes is not None:
            m.setattr(patching, "_STREAM_BYTES", stream_bytes)
        if runs is not None:
            sizes = patching._Suffix.runs_per_part
            m.setattr(patching._Suffix, "runs_per_part", lambda self, layer, n: min(sizes(self, layer, n), runs))
        if copies is not None:
            m.setattr(patching._Suffix, "copies_per_pass", lambda self, n: min(n, copies))
        yield trace


def expect(how: str, heads: Any) -> dict[str, bool]:
    """What ``SPLITS[how]`` must have done on a fixture (``heads``: the grouped k/v sets of a
    grouped-query model, or None: every head)."""
    if how == "1 a pass":
        return {"parts": False, "shared": False, "passes": True}
    # two copies a sub-batch keep the 4 (or 2 grouped) copies joining at a layer together;
    # the 4 grouped sets of llama fit one pass of 5
    return {"parts": True, "shared": how != "2 a sub-batch" and heads is None, "passes": "pass" in how and heads is None}


def split_and_unsplit(fn: Any, monkeypatch: pytest.MonkeyPatch, splits: dict[str, Any],
                      expected: dict[str, bool], what: str, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` (``patch_heads``, ``path_patch``) split as ``splits`` say
    (``split``): checked to have split as ``expected`` and to equal the unsplit result
    (``same``), which it returns."""
    unsplit = fn(*args, **kwargs)
    with split(monkeypatch, **splits) as trace:
        found = fn(*args, **kwargs)
    trace.check(**expected)
    same(found, unsplit, what)
    return found


def same(found: Any, unsplit: Any, what: str) -> None:
    """The split result equals the unsplit one to float noise (the products' row blocking)."""
    a = torch.tensor([r.patched for r in found.rows])
    b = torch.tensor([r.patched for r in unsplit.rows])
    assert_close(a, b, what, REPEAT)
    if unsplit.rows[0].positions is not None:
        pa = torch.tensor([r.positions for r in found.rows])
        pb = torch.tensor([r.positions for r in unsplit.rows])
        assert_close(pa, pb, what, REPEAT)
    assert (found.clean, found.corrupt) == (unsplit.clean, unsplit.corrupt)


@pytest.mark.parametrize("how", list(SPLITS))
@pytest.mark.parametrize("noising", [False, True])
def test_every_site_split_matches_unsplit_and_transformer_lens(
        family: tuple[str, Any, Any], how: str, noising: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformer_lens import patching as tl_patching

    name, model, tl = family
    clean, corrupt = BASE, differing_from(3)
    run, cached = (clean, corrupt) if noising else (corrupt, clean)
    metric = patch_tasks.LogitDiff(ANSWER, WRONG)
    with torch.no_grad():
        _, cache = tl.run_with_cache(torch.tensor(cached))
        for site in patch_tasks.SITES:
            heads = grouped(model, site)
            what = f"{name} {site} {how} noising={noising}"
            found = split_and_unsplit(patching.patch_heads, monkeypatch, SPLITS[how], expect(how, heads), what,
                                      model.weights, clean, corrupt, metric, site=site, noising=noising,
                                      heads=heads)
            theirs = getattr(tl_patching, f"get_act_patch_attn_head_{site}_all_pos")(
                tl, torch.tensor(run), cache, tl_logit_diff)
            close(patched(found, theirs.shape), theirs, what)


@pytest.mark.parametrize("how", ["1 a sub-batch", "3 a sub-batch, 5 a pass"])
def test_by_position_split_matches_unsplit_and_transformer_lens(
        family: tuple[str, Any, Any], how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformer_lens import patching as tl_patching

    name, model, tl = family
    clean, corrupt = BASE, differing_from(3)
    metric = patch_tasks.LogitDiff(ANSWER, WRONG)
    with torch.no_grad():
        _, cache = tl.run_with_cache(torch.tensor(clean))
        for site in ("out", "k", "pattern"):
            heads = grouped(model, site)
            found = split_and_unsplit(patching.patch_heads, monkeypatch, SPLITS[how], expect(how, None),
                                      f"{name} {site} by position, {how}", model.weights, clean, corrupt,
                                      metric, site=site, heads=heads, by_position=True)
            theirs = getattr(tl_patching, f"get_act_patch_attn_head_{site}_by_pos")(
                tl, torch.tensor(corrupt), cache, tl_logit_diff)
            per_pos = torch.tensor([row.positions for row in found.rows])
            if site == "pattern":
                close(per_pos.reshape(theirs.shape), theirs, f"{name} {site} by position, {how}")
            else:
                close(per_pos.reshape(theirs.shape[0], theirs.shape[2], -1).transpose(1, 2), theirs,
                      f"{name} {site} by position, {how}")


def test_head_sets_and_paths_split_match_unsplit_and_hooks(
        family: tuple[str, Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """``--heads`` sets across layers (each joins at its first layer; a sub-batch holds sets
    that started below and sets that join here) and path patching, whose sources come per
    sub-batch."""
    name, model, tl = family
    clean, corrupt = BASE[:1], differing_from(4)[:1]
    sets = [[(1, 2)], [(0, 1), (1, 2)], [(0, 0), (0, 3)], [(1, 0), (1, 1), (1, 3)], [(0, 2), (1, 0)],
            [(1, 3)], [(0, 3), (1, 3)]]
    metric = patch_tasks.LogitDiff(ANSWER, WRONG)
    edges = [((0, h), (1, r)) for h in range(4) for r in range(4)]
    with torch.no_grad():
        for site in ("out", "q", "v", "pattern"):
            found = split_and_unsplit(patching.patch_heads, monkeypatch, {"runs": 2, "copies": 5}, {"passes": True},
                                      f"{name} {site} sets", model.weights, clean, corrupt, metric, site=site,
                                      heads=sets)
            if site != "v":  # (the hooks' v is the stored K/V head)
                for row, heads in zip(found.rows, sets, strict=True):
                    expected = tl_patch(tl, clean[0], corrupt[0], tl_logit_diff, site, heads)
                    assert row.patched == pytest.approx(expected, abs=ATOL, rel=ATOL), (name, site, heads)
        for receiver_input in patching.PATH_INPUTS:
            found = split_and_unsplit(patching.path_patch, monkeypatch, {"runs": 3, "copies": 7}, {"passes": True},
                                      f"{name} path {receiver_input}", model.weights, clean, corrupt, metric,
                                      edges, receiver_input=receiver_input)


@pytest.mark.parametrize("name", ["olmo2", "mixtral"])
def test_norm_across_heads_and_experts_split_match_transformer_lens(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """OLMo2's q/k norm spans the heads (a patched run recomputes its whole attention per
    copy), Mixtral's MLP routes tokens to experts: every site against TransformerLens with
    the layers in sub-batches of 3 and passes of 5 copies."""
    path, _ = family_fixtures.NEW_FAMILIES[name](tmp_path)
    with split(monkeypatch, runs=3, copies=5) as trace:
        check_family(name, path)
    trace.check(passes=True)


@pytest.mark.parametrize("fixture", ["gpt2", "llama"])
def test_each_layers_weights_are_read_once_per_pass(fixture: str, request: pytest.FixtureRequest,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """With a weight cache too small to keep anything (as a 7B model's layers overflow its
    budget) and the activation budgets at their floor (every copy a sub-batch of its own),
    ``get`` of each layer tensor is called twice: once by the clean and corrupt run, once by
    the pass of the patched copies, which holds each layer's weights for its sub-batches."""
    path, _ = request.getfixturevalue(f"{fixture}_dir")
    raw = load_model(path).weights.raw
    w = ProcessedWeights(raw, cache_bytes=1)
    counts: Counter[str] = Counter()
    get = w.get

    def counting(name: str, **kw: Any) -> Any:
        counts[name] += 1
        return get(name, **kw)

    monkeypatch.setattr(w, "get", counting)
    monkeypatch.setattr(behaviour, "_ABLATION_BATCH_BYTES", 1)  # what the copies were batched by before
    monkeypatch.setattr(patching, "_LAYER_BYTES", 1, raising=False)
    metric = patch_tasks.LogitDiff(ANSWER, WRONG)
    for site in ("out", "k"):
        counts.clear()
        with split(monkeypatch, layer_bytes=1) as trace:
            found = patching.patch_heads(w, BASE, differing_from(3), metric, site=site)
        layer_reads = {name: k for name, k in counts.items() if name.startswith("blocks.")}
        assert layer_reads and all(k == 2 for k in layer_reads.values()), (site, layer_reads)
        trace.check()  # though every layer ran in sub-batches
        unsplit = patching.patch_heads(load_model(path).weights, BASE, differing_from(3), metric, site=site)
        same(found, unsplit, f"{fixture} {site} small cache")


def test_progress_per_sub_batch_and_cancelling_inside_a_layer(
        family: tuple[str, Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Progress moves after every sub-batch (more steps than layers, never back, ending at
    1); a cancel seen between two sub-batches of one layer stops the pass there."""
    from headscope.engine.core.errors import CancelledError

    _, model, _ = family
    metric = patch_tasks.LogitDiff(ANSWER, WRONG)
    seen: list[float] = []
    with split(monkeypatch, layer_bytes=1):
        patching.patch_heads(model.weights, BASE, differing_from(3), metric, progress=seen.append)
    assert seen == sorted(seen) and seen[-1] == 1.0 and len(seen) > 2 * model.cfg.n_layers
    asked = 0

    def cancelled() -> bool:
        nonlocal asked
        asked += 1
        return asked > 3  # after the first layer's first sub-batches

    with split(monkeypatch, layer_bytes=1) as trace, pytest.raises(CancelledError):
        patching.patch_heads(model.weights, BASE, differing_from(3), metric, cancelled=cancelled)
    assert trace.calls and {layer for _, layer, _ in trace.calls} == {0}
