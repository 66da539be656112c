"""The Engine on real (tiny, random) checkpoints: its results equal the pure functions."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from headscope.engine.circuits import head_circuits as circuits
from headscope.engine.core import errors
from headscope.engine.core.requests import (
    AblationRequest,
    AblationSweepRequest,
    CircuitRequest,
    CompositionRequest,
    HeadScoresRequest,
    PromptRequest,
    ScoreTableRequest,
    SpectrumRequest,
    TokenizeRequest,
)
from headscope.engine.forward import behaviour
from headscope.engine.forward import transformer as forward
from headscope.engine.model.loading import load_model, read_structure
from headscope.engine.service.engine import Engine
from tests import weight_algebra as algebra


@pytest.fixture
async def gpt2(gpt2_dir):
    path, _ = gpt2_dir
    eng = Engine(path, workers=2)
    await eng.ready()
    yield eng, load_model(path)
    await eng.aclose()


async def test_structure_at_once_and_blocks_equal_pure_circuits(gpt2):
    eng, model = gpt2
    assert eng.structure == read_structure(eng.path)
    w = model.weights
    rows, cols = [0, 5, 7, 3], [1, 2, 9]
    qk = await eng.get(CircuitRequest.of(eng.structure, 1, 2, "qk", "token", rows, cols, limit=eng.max_block_bytes))
    ov = await eng.get(CircuitRequest.of(eng.structure, 1, 2, "ov", "token", rows, cols, limit=eng.max_block_bytes))
    pos = await eng.get(CircuitRequest.of(eng.structure, 0, 1, "qk", "position", [0, 3], [0, 1, 2], limit=eng.max_block_bytes))
    np.testing.assert_allclose(qk.values, circuits.token_qk(w, 1, 2).block(rows, cols), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ov.values, circuits.full_ov(w, 1, 2).block(rows, cols), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(pos.values, circuits.positional_qk(w, 0, 1).block([0, 3], [0, 1, 2]), rtol=1e-4, atol=1e-5)
    assert qk.row_ids == tuple(rows) and len(qk.row_labels) == 4
    assert qk.vmin == pytest.approx(float(qk.values.min())) and not qk.values.flags.writeable
    assert ov.note == "W_U is tied W_Eᵀ"


async def test_cache_hit_is_identical_object_without_recompute(gpt2):
    eng, _ = gpt2
    first = await eng.get(CircuitRequest.of(eng.structure, 0, 0, "ov", "token", [1, 2], [3, 4], limit=eng.max_block_bytes))
    started = eng.computations_started
    again = await eng.get(CircuitRequest.of(eng.structure, 0, 0, "ov", "token", [1, 2], [3, 4], limit=eng.max_block_bytes))
    assert again is first
    assert eng.computations_started == started
    assert eng.stats().hits >= 1 and eng.stats().bytes > 0


async def test_spectrum_and_sweeps_equal_pure_scores(gpt2):
    eng, model = gpt2
    w = model.weights
    spec = await eng.get(SpectrumRequest.of(eng.structure, 1, 0, "ov"))
    assert spec.score == pytest.approx(algebra.copying_score(circuits.full_ov(w, 1, 0)), abs=1e-5)
    expected = np.sort_complex(circuits.full_ov(w, 1, 0).eigenvalues)
    np.testing.assert_allclose(np.sort_complex(spec.eigenvalues), expected, rtol=1e-3, atol=1e-4)

    seen = []
    table = await eng.get(ScoreTableRequest(), seen.append)
    np.testing.assert_allclose(table.copying_score, algebra.all_copying_scores(w), atol=1e-5)
    np.testing.assert_allclose(table.qk_positivity, algebra.all_qk_positivity(w), atol=1e-5)
    behaviours = behaviour.behaviour_scores(w, seed=0)
    for name in ("prev_token", "duplicate_token", "induction"):
        np.testing.assert_allclose(getattr(table, f"{name}_score"), behaviours[name], atol=1e-5)
    await asyncio.sleep(0)  # progress callbacks are delivered through the loop
    assert seen and seen[-1] == 1.0
    # the sweep filled the per-head cache: no new computation for a head's scores
    started = eng.computations_started
    hs = await eng.get(HeadScoresRequest.of(eng.structure, 1, 1))
    assert eng.computations_started == started
    assert hs.copying_score == pytest.approx(float(table.copying_score[1, 1]))

    comp = await eng.get(CompositionRequest.of(eng.structure, "k"))
    ref = algebra.composition_scores(w, "k", seed=0)
    np.testing.assert_allclose(comp.scores, ref.scores, atol=1e-5)
    assert comp.baseline == pytest.approx(float(ref.baseline))
    l1, _h1, l2, _h2, excess = comp.top_edges[0]
    assert l1 < l2 and excess == pytest.approx(float(comp.scores.max()) - comp.baseline, abs=1e-6)


async def test_ablation_sweep_equals_single_head_ablations_and_fills_the_cache(gpt2):
    eng, model = gpt2
    seen = []
    effects = await eng.get(AblationSweepRequest(), seen.append)
    np.testing.assert_allclose(effects, behaviour.ablation_effects(model.weights, seed=0), atol=1e-5)
    assert effects.shape == (model.cfg.n_layers, model.cfg.n_heads) and not effects.flags.writeable
    await asyncio.sleep(0)
    assert seen and seen[-1] == pytest.approx(1.0)
    # every head's value was published: the single-head request computes nothing new, and
    # equals a full forward pass with that head zeroed
    started = eng.computations_started
    value = await eng.get(AblationRequest.of(eng.structure, 1, 2))
    assert eng.computations_started == started
    assert value == pytest.approx(behaviour.ablation_effect(model.weights, 1, 2, seed=0), abs=1e-5)
    assert await eng.get(AblationSweepRequest()) is effects


async def test_prompt_view_matches_forward_and_rejects_empty(gpt2):
    eng, model = gpt2
    with pytest.raises(errors.PromptError):
        (await eng.get(PromptRequest.of(eng.structure, "   ", limit=eng.max_block_bytes))).view(0, 0)
    text = "the cat sat on the mat"
    view = (await eng.get(PromptRequest.of(eng.structure, text, limit=eng.max_block_bytes))).view(1, 3)
    ids = model.tokenizer.encode(text)
    ref = forward.run(model.weights, ids)
    assert view.ids == tuple(ids) and not view.truncated
    np.testing.assert_allclose(view.pattern, ref.patterns[0, 1, 3], atol=1e-5)
    assert view.predicted == tuple(int(i) for i in ref.logits[0].argmax(-1))
    assert view.dla.shape == (len(ids),) and np.isfinite(view.dla).all()
    probs = torch.softmax(ref.logits[0, -1], -1)
    assert view.top_predictions[0][0] == int(probs.argmax())
    long = " ".join(["the cat"] * (model.cfg.n_ctx + 5))
    cut = (await eng.get(PromptRequest.of(eng.structure, long, limit=eng.max_block_bytes))).view(0, 0)
    assert cut.truncated and len(cut.ids) == model.cfg.n_ctx


async def test_typed_errors_for_bad_requests(gpt2):
    eng, _ = gpt2
    with pytest.raises(errors.IndexOutOfRangeError):
        await eng.get(CircuitRequest.of(eng.structure, 99, 0, "qk", limit=eng.max_block_bytes))
    with pytest.raises(errors.ResourceLimitError):
        eng.max_block_bytes = 64
        await eng.get(CircuitRequest.of(eng.structure, 0, 0, "qk", "token", list(range(10)), list(range(10)), limit=eng.max_block_bytes))


async def test_focus_change_drops_queued_views_of_the_left_head(gpt2):
    eng, _ = gpt2
    eng.focus(0, 0)
    # many queued requests for (0, 0); the focus moves before most of them start
    tasks = [
        asyncio.create_task(eng.get(CircuitRequest.of(eng.structure, 0, 0, "ov", "token", [i], list(range(30)), limit=eng.max_block_bytes)))
        for i in range(40)
    ]
    await asyncio.sleep(0)
    eng.focus(1, 1)
    fresh = await eng.get(CircuitRequest.of(eng.structure, 1, 1, "qk", "token", [0], [0], limit=eng.max_block_bytes))
    done = await asyncio.gather(*tasks, return_exceptions=True)
    dropped = [d for d in done if isinstance(d, errors.CancelledError)]
    assert dropped, "no stale request was dropped"
    assert all(isinstance(d, errors.CancelledError) or d.layer == 0 for d in done)
    assert fresh.layer == 1


async def test_raw_switch_changes_cache_key(gpt2):
    eng, _ = gpt2
    processed = await eng.get(CircuitRequest.of(eng.structure, 0, 0, "qk", "token", [0, 1], [0, 1], limit=eng.max_block_bytes))
    await eng.set_raw(True)
    raw = await eng.get(CircuitRequest.of(eng.structure, 0, 0, "qk", "token", [0, 1], [0, 1], limit=eng.max_block_bytes))
    assert raw is not processed
    w_raw = load_model(eng.path, raw=True).weights
    np.testing.assert_allclose(raw.values, circuits.token_qk(w_raw, 0, 0).block([0, 1], [0, 1]), rtol=1e-4, atol=1e-5)


async def test_tokenize_uses_the_model_tokenizer(tmp_path) -> None:
    from headscope.engine.core.errors import PromptError
    from headscope.engine.model.loading import load_model
    from headscope.engine.service.engine import Engine
    from tests.hf_fixtures import build_gpt2

    path, _ = build_gpt2(tmp_path / "m", tokenizer=True)
    engine = Engine(path)
    try:
        assert await engine.get(TokenizeRequest.of(engine.structure, "the cat sat")) == load_model(path).tokenizer.encode("the cat sat")
        with pytest.raises(PromptError):
            await engine.get(TokenizeRequest.of(engine.structure, "  "))
    finally:
        await engine.aclose()


async def test_ready_and_first_view_do_not_wait_for_torch_or_the_warm_up(gpt2_dir, monkeypatch) -> None:
    """Importing torch (and setting its threads) and reading W_E and W_U ahead of the token
    views happen after the model is open: the first head view of a 7B GGUF file must not wait
    for them (bench/README.md, "GGUF"). Once torch is ready, jobs run in inference mode."""
    import threading

    from headscope.engine.service import engine as engine_module

    release, started = threading.Event(), threading.Event()
    warmed: list[str] = []
    real = engine_module._warm_up

    def slow_warm_up(model) -> None:
        started.set()
        release.wait(30)
        real(model)
        warmed.append("done")

    real_threads = Engine._set_torch_threads

    def slow_threads(self) -> None:
        release.wait(30)
        real_threads(self)

    monkeypatch.setattr(engine_module, "_warm_up", slow_warm_up)
    monkeypatch.setattr(Engine, "_set_torch_threads", slow_threads)
    eng = Engine(gpt2_dir[0], workers=2)
    try:
        await asyncio.wait_for(eng.ready(), 30)
        block = await asyncio.wait_for(eng.get(CircuitRequest.of(eng.structure, 0, 0, "qk", "position", [0, 1], [0, 1], limit=eng.max_block_bytes)), 30)
        assert block.values.shape == (2, 2) and warmed == [] and not eng._torch_ready.is_set()
        with eng._job_mode():
            assert not torch.is_inference_mode_enabled()
    finally:
        release.set()
    for _ in range(300):
        if warmed:
            break
        await asyncio.sleep(0.1)
    assert started.is_set() and warmed == ["done"] and eng._torch_ready.is_set()
    with eng._job_mode():
        assert torch.is_inference_mode_enabled()
    await eng.aclose()


def test_a_failing_warm_up_is_left_to_the_view(monkeypatch) -> None:
    from headscope.engine.service import engine as engine_module

    class Broken:
        def has(self, name: str) -> bool:
            return True

        def get(self, name: str):
            raise errors.CorruptFileError("m.gguf", f"{name}: bad block")

    class Model:
        weights = Broken()

    engine_module._warm_up(Model())  # no exception: nothing to report before a view asks


async def test_an_engine_closed_while_opening_leaves_torch_threads_alone(gpt2_dir, monkeypatch) -> None:
    """The opener sets torch's threads after the model is open; an Engine closed before that
    (the explorer quit at once) must not change them afterwards: aclose restores them, and
    the opener, finding the engine closed, does not set them."""
    import threading

    from headscope.engine.model import loading

    before = torch.get_num_threads()
    release, done = threading.Event(), threading.Event()
    real = loading.load_model

    def slow_open(*args, **kwargs):
        release.wait(30)
        try:
            return real(*args, **kwargs)
        finally:
            done.set()

    monkeypatch.setattr(loading, "load_model", slow_open)
    eng = Engine(gpt2_dir[0], workers=1)
    eng._torch_threads = before + 1
    await eng.aclose()
    release.set()
    await asyncio.wait_for(asyncio.to_thread(done.wait, 30), 40)
    await asyncio.wait_for(eng.ready(), 30)
    await asyncio.sleep(0.2)  # the opener's last steps, after ready()
    assert torch.get_num_threads() == before and not eng._torch_ready.is_set()


async def test_aclose_leaves_no_join_on_the_default_executor(gpt2_dir) -> None:
    """Issue 39 §3: `q` took 3.3 s. The quit waits for ``aclose`` 0.25 s at most, but aclose
    joined the workers through asyncio's default executor, whose threads ``asyncio.run``
    waits for at exit: a job still running kept the process up to 5 s per worker. aclose
    must not put anything on that executor."""
    import concurrent.futures

    class Refusing(concurrent.futures.ThreadPoolExecutor):
        def submit(self, *args: object, **kwargs: object) -> concurrent.futures.Future:
            raise AssertionError("aclose used the default executor")

    eng = Engine(gpt2_dir[0], workers=1)
    await eng.ready()
    await eng.get(HeadScoresRequest(0, 0))  # a worker thread to join
    asyncio.get_running_loop().set_default_executor(Refusing(max_workers=1))
    await eng.aclose()
