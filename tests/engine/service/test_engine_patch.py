"""``PatchInputsRequest`` and ``InductionPromptsRequest`` through ``Engine.get`` (the Patch tab's requests) on
the bundled attn-only-2l: the numbers are ``forward.patching``'s, the results store keeps
them under the checkpoint's fingerprint and a digest of the inputs, bad inputs are one
line, a run stops when its caller goes away."""

from __future__ import annotations

import asyncio

import pytest

from headscope.engine.core import errors
from headscope.engine.core.requests import InductionPromptsRequest, PatchInputsRequest
from headscope.engine.forward import patch_tasks, patching
from headscope.engine.model.loading import load_model
from headscope.engine.service.engine import Engine
from headscope.engine.sweeps.store import ResultStore
from tests.conftest import sample_model


@pytest.fixture
async def attn2(tmp_path):
    path = sample_model("attn-only-2l")
    eng = Engine(path, workers=2, store=ResultStore(tmp_path / "store"))
    await eng.ready()
    yield eng, load_model(path), tmp_path / "store"
    await eng.aclose()


async def test_the_induction_task_equals_forward_patching_and_l1h2_leads(attn2):
    eng, model, _ = attn2
    progress: list[float] = []
    found = await eng.get(PatchInputsRequest.of(eng.structure), progress.append)
    clean, corrupt = patch_tasks.induction_task(model.cfg.d_vocab, model.cfg.n_ctx, 0)
    ref = patching.patch_heads(model.weights, clean, corrupt, patch_tasks.InductionLogProb(clean))
    assert found.metric == "induction" and (found.batch, found.tokens) == (ref.batch, ref.tokens)
    assert [r.recovered for r in found.rows] == pytest.approx([r.recovered for r in ref.rows])
    best = max(found.rows, key=lambda r: r.recovered)
    assert best.heads == ((1, 2),)
    layer1 = sorted(r.recovered for r in found.rows if r.layer == 1)
    assert min(layer1) > max(r.recovered for r in found.rows if r.layer == 0)
    assert progress and progress[-1] == 1.0
    prompts = await eng.get(InductionPromptsRequest.of(eng.structure))
    assert prompts == (tuple(int(i) for i in clean[0]), tuple(int(i) for i in corrupt[0]))


async def test_results_store_keyed_by_fingerprint_and_inputs(attn2):
    eng, _, store = attn2
    first = await eng.get(PatchInputsRequest.of(eng.structure, site="v"))
    assert eng.stats().origin == "patching: computed now"
    other = Engine(sample_model("attn-only-2l"), store=ResultStore(store))
    try:
        await other.ready()
        again = await other.get(PatchInputsRequest.of(other.structure, site="v"))
        assert other.stats().origin == "patching: from the cache"
        assert (again.clean, again.corrupt) == (first.clean, first.corrupt)
        assert [r.recovered for r in again.rows] == [r.recovered for r in first.rows]
        # other inputs are another entry: computed, not the stored one
        ids = [int(i) for i in (await other.get(InductionPromptsRequest.of(other.structure)))[0]]
        changed = await other.get(PatchInputsRequest.of(other.structure, clean=ids, corrupt=ids[:32] + ids[:32][::-1], site="v", answer=ids[0], wrong=ids[1]))
        assert other.stats().origin == "patching: computed now"
        assert changed.batch == 1 and changed.rows != again.rows
    finally:
        await other.aclose()


async def test_attribution_and_a_logit_difference_by_token(attn2):
    eng, model, _ = attn2
    ids = [int(i) for i in (await eng.get(InductionPromptsRequest.of(eng.structure)))[0]]
    corrupt = ids[:32] + ids[32:][::-1]
    answer, wrong = ids[32], ids[40]  # the repeated half's next token vs another
    found = await eng.get(PatchInputsRequest.of(eng.structure, clean=ids[:33], corrupt=corrupt[:33], answer=f"#{answer}", wrong=str(wrong), method="attribution"))
    ref = patching.attribute_heads(model.weights, [ids[:33]], [corrupt[:33]],
                                   patch_tasks.LogitDiff(answer, wrong))
    assert found.method == "attribution" and found.metric == "logit_diff"
    assert [r.estimate for r in found.rows] == pytest.approx([r.estimate for r in ref.rows],
                                                             abs=1e-5)


async def test_path_patch_equals_forward_path_patch(attn2):
    eng, model, _ = attn2
    edges = [((0, 1), (1, 2)), ((0, 0), (1, 1))]
    found = await eng.get(PatchInputsRequest.of(eng.structure, edges=edges, site="q"))
    clean, corrupt = patch_tasks.induction_task(model.cfg.d_vocab, model.cfg.n_ctx, 0)
    ref = patching.path_patch(model.weights, clean, corrupt, patch_tasks.InductionLogProb(clean),
                              edges, receiver_input="q")
    assert [r.heads for r in found.rows] == [((0, 1), (1, 2)), ((0, 0), (1, 1))]
    assert [r.recovered for r in found.rows] == pytest.approx([r.recovered for r in ref.rows])


async def test_the_first_occurrence_task_is_its_own_request(attn2):
    """``task="first-occurrence"``: its own prompts, its own patching and path patching (not
    the induction task's, in the engine's memory or in the results store)."""
    eng, model, _ = attn2
    clean, corrupt = patch_tasks.induction_task(model.cfg.d_vocab, model.cfg.n_ctx, 0, task="first-occurrence")
    prompts = await eng.get(InductionPromptsRequest.of(eng.structure, "first-occurrence"))
    assert prompts == (tuple(int(i) for i in clean[0]), tuple(int(i) for i in corrupt[0]))
    assert prompts != await eng.get(InductionPromptsRequest.of(eng.structure))
    edge = [((0, 1), (1, 2))]
    induction = await eng.get(PatchInputsRequest.of(eng.structure, edges=edge, site="k"))
    found = await eng.get(PatchInputsRequest.of(eng.structure, edges=edge, site="k", task="first-occurrence"))
    ref = patching.path_patch(model.weights, clean, corrupt, patch_tasks.task_metric("first-occurrence", clean),
                              edge, receiver_input="k")
    assert found.metric == "first-occurrence" and induction.metric == "induction"
    assert found.rows[0].recovered == pytest.approx(ref.rows[0].recovered)
    assert found.rows[0].recovered > induction.rows[0].recovered + 0.3
    heads = await eng.get(PatchInputsRequest.of(eng.structure, task="first-occurrence"))
    assert heads.metric == "first-occurrence" and (heads.clean, heads.corrupt) == (found.clean, found.corrupt)
    with pytest.raises(errors.HeadscopeError, match="--task must be one of"):
        await eng.get(InductionPromptsRequest.of(eng.structure, "logit_diff"))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"clean": "#1 #2", "corrupt": [1, 2, 3]}, "same length"),
    ({"clean": [1, 2], "corrupt": [3, 4], "answer": "#5"}, "needs --answer and --wrong"),
    ({"clean": [1, 2], "corrupt": [3, 4], "answer": "#5", "wrong": "#99999"}, "99999"),
    ({"clean": [1, 2], "corrupt": [3, 4], "answer": 5, "wrong": "the cat"}, "is 2 tokens"),
    ({"clean": [1, 2], "corrupt": [3, 4], "answer": 5, "wrong": "zyzzyva"}, "not in the vocabulary"),
    ({"clean": "", "corrupt": [3, 4]}, "the clean prompt is empty"),
    ({"site": "mlp"}, "site must be one of"),
    ({"method": "path"}, "method must be exact or attribution"),
])
async def test_bad_inputs_are_one_line(attn2, kwargs, message):
    eng, _, _ = attn2
    with pytest.raises(errors.HeadscopeError, match=message) as caught:
        await eng.get(PatchInputsRequest.of(eng.structure, **kwargs))
    assert "\n" not in str(caught.value)


async def test_a_run_stops_when_its_caller_goes_away(attn2):
    eng, _, _ = attn2
    task = asyncio.ensure_future(eng.get(PatchInputsRequest.of(eng.structure, site="pattern")))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # the engine is free for the next request
    found = await eng.get(PatchInputsRequest.of(eng.structure, site="k"))
    assert found.site == "k"
