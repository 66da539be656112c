"""The results store (engine/sweeps/store.py): stored sweeps equal computed ones to the bit, a
second run computes nothing, an interrupted sweep resumes with only the missing layers, a
changed checkpoint or a damaged file is never trusted, and a broken store never fails."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest

from headscope.engine.api import report
from headscope.engine.circuits import composition as composition_module
from headscope.engine.circuits import spectral as spectral_module
from headscope.engine.core.requests import (
    CompositionRequest,
    HeadScoresRequest,
    ScoreTableRequest,
    SpectrumRequest,
)
from headscope.engine.forward import behaviour as behaviour_module
from headscope.engine.model.loading import load_model
from headscope.engine.sweeps import head_views
from headscope.engine.sweeps import scores as score_sweeps
from headscope.engine.sweeps.store import ResultStore, fingerprint
from tests import hf_fixtures

N_LAYERS = 5


@pytest.fixture(scope="module")
def deep_gpt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sharded 5-layer GPT-2: enough layers to interrupt a sweep in the middle."""
    with mock.patch.object(hf_fixtures, "N_LAYERS", N_LAYERS):
        path, _ = hf_fixtures.build_gpt2(tmp_path_factory.mktemp("deep-gpt2"), shard=True)
    return path


@pytest.fixture
def model_copy(deep_gpt2: Path, tmp_path: Path) -> Path:
    """A private copy of the checkpoint, free to modify."""
    return Path(shutil.copytree(deep_gpt2, tmp_path / "model"))


@pytest.fixture
def store(tmp_path: Path) -> ResultStore:
    return ResultStore(tmp_path / "store")


# where each counted function lives
HOME = {"_batched_spectral_score": spectral_module, "_prepare_target": composition_module,
        "behaviour_scores": behaviour_module}


class Counter:
    """Wraps a function of ``HOME[name]`` and counts its calls; counters made with the same
    ``tally`` share one count."""

    def __init__(self, name: str, tally: list[int] | None = None) -> None:
        self.name, self.tally = name, [0] if tally is None else tally
        self.real = getattr(HOME[name], name)

    @property
    def calls(self) -> int:
        return self.tally[0]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.tally[0] += 1
        return self.real(*args, **kwargs)


def counting(monkeypatch: pytest.MonkeyPatch, name: str) -> Counter:
    """Counts the calls of ``HOME[name].<name>`` (the one code path ``compute`` takes)."""
    counter = Counter(name)
    monkeypatch.setattr(HOME[name], name, counter)
    return counter


def raise_after(fractions: int) -> Any:
    """A progress callback that interrupts the sweep on its ``fractions``-th report."""
    seen = []

    def progress(fraction: float) -> None:
        seen.append(fraction)
        if len(seen) == fractions:
            raise KeyboardInterrupt

    return progress


def same(a: Any, b: Any) -> None:
    """Equal to the bit (NaN where NaN)."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()


# -- stored results equal the definitions, and a second run computes nothing -------------


def test_score_table_from_the_store_equals_the_computed_one(deep_gpt2, store, monkeypatch) -> None:
    model = load_model(deep_gpt2)
    plain = score_sweeps.score_table(model)
    first = score_sweeps.score_table(model, store=store.for_model(model))
    # a fresh process: a new model object and a new entry, the same store on disk
    again = load_model(deep_gpt2)
    spectral = counting(monkeypatch, "_batched_spectral_score")
    behaviour = counting(monkeypatch, "behaviour_scores")
    entry = store.for_model(again)
    second = score_sweeps.score_table(again, store=entry)
    assert spectral.calls == 0 and behaviour.calls == 0
    assert entry.computed == 0 and entry.loaded > 0
    for name in ("copying_score", "qk_positivity", "prev_token_score", "duplicate_token_score",
                 "induction_score", "nonfinite"):
        same(getattr(first, name), getattr(plain, name))
        same(getattr(second, name), getattr(plain, name))


def test_spectral_sweep_equals_the_per_head_definition(deep_gpt2, store) -> None:
    """The stored sweep's numbers are the per-head scores of docs/math.md."""
    from headscope.engine.circuits import head_circuits as circuits

    model = load_model(deep_gpt2)
    entry = store.for_model(model)
    memos = {name: entry.memo(name, (model.cfg.n_heads,)) for name in ("copying_score", "qk_positivity")}
    w = model.weights
    spectral_module.spectral_scores(w, memos=memos)
    stored = spectral_module.spectral_scores(w, memos=memos)["copying_score"]
    for layer in range(N_LAYERS):
        for head in range(model.cfg.n_heads):
            expected = spectral_module.copying_score(circuits.full_ov(w, layer, head))
            assert float(stored[layer, head]) == pytest.approx(expected, rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("kind", ["q", "k", "v"])
def test_composition_from_the_store_equals_the_computed_one(deep_gpt2, store, monkeypatch, kind) -> None:
    model = load_model(deep_gpt2)
    plain = score_sweeps.composition(model, kind)
    first = score_sweeps.composition(model, kind, store=store.for_model(model))
    targets = counting(monkeypatch, "_prepare_target")
    second = score_sweeps.composition(load_model(deep_gpt2), kind, store=store.for_model(model))
    assert targets.calls == 0
    same(first.scores, plain.scores)
    same(second.scores, plain.scores)
    assert second.top_edges == plain.top_edges and second.baseline == plain.baseline


def test_ablation_effects_from_the_store_run_no_forward_pass(deep_gpt2, store, monkeypatch) -> None:
    from headscope.engine.forward import transformer as forward

    model = load_model(deep_gpt2)
    plain = score_sweeps.ablation_sweep(model)
    first = score_sweeps.ablation_sweep(model, store=store.for_model(model))
    passes = mock.Mock(wraps=forward.blocks)
    monkeypatch.setattr(forward, "blocks", passes)
    second = score_sweeps.ablation_sweep(load_model(deep_gpt2), store=store.for_model(model))
    assert passes.call_count == 0
    same(first, plain)
    same(second, plain)


def test_processing_mode_and_seed_are_separate_entries(deep_gpt2, store) -> None:
    processed, raw = load_model(deep_gpt2), load_model(deep_gpt2, raw=True)
    assert store.for_model(processed).key != store.for_model(raw).key
    table = score_sweeps.score_table(processed, store=store.for_model(processed))
    raw_table = score_sweeps.score_table(raw, store=store.for_model(raw))
    same(raw_table.copying_score, score_sweeps.score_table(raw).copying_score)
    assert not np.array_equal(raw_table.copying_score, table.copying_score)
    other_seed = score_sweeps.score_table(processed, seed=3, store=store.for_model(processed))
    same(other_seed.induction_score, score_sweeps.score_table(processed, seed=3).induction_score)


# -- interrupted sweeps resume ------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 3])
def test_interrupted_spectral_sweep_resumes_with_the_missing_layers(deep_gpt2, store, monkeypatch, k) -> None:
    model = load_model(deep_gpt2)
    entry = store.for_model(model)
    memos = {name: entry.memo(name, (model.cfg.n_heads,)) for name in ("copying_score", "qk_positivity")}
    with pytest.raises(KeyboardInterrupt):
        spectral_module.spectral_scores(model.weights, progress=raise_after(k), memos=memos)
    assert entry.computed == 2 * k  # each layer's two parts stored as soon as it was done
    spectral = counting(monkeypatch, "_batched_spectral_score")
    resumed = spectral_module.spectral_scores(load_model(deep_gpt2).weights, memos=memos)
    assert spectral.calls == 2 * (N_LAYERS - k)  # copying and QK positivity of the missing layers
    monkeypatch.setattr(spectral_module, "_batched_spectral_score", spectral.real)
    fresh = spectral_module.spectral_scores(model.weights)
    same(resumed["qk_positivity"], fresh["qk_positivity"])
    same(resumed["copying_score"], fresh["copying_score"])


@pytest.mark.parametrize("k", [1, 3])
def test_interrupted_composition_resumes_with_the_missing_tiles(deep_gpt2, store, monkeypatch, k) -> None:
    model = load_model(deep_gpt2)
    entry = store.for_model(model)
    # progress is reported once per target layer 1..L-1 (the k-th report follows tile k)
    with pytest.raises(KeyboardInterrupt):
        score_sweeps.composition(model, "k", progress=raise_after(k), store=entry)
    assert entry.computed == k
    targets = counting(monkeypatch, "_prepare_target")
    resumed = score_sweeps.composition(load_model(deep_gpt2), "k", store=store.for_model(model))
    assert targets.calls == N_LAYERS - 1 - k
    monkeypatch.setattr(composition_module, "_prepare_target", targets.real)
    same(resumed.scores, score_sweeps.composition(model, "k").scores)


def test_interrupted_ablation_sweep_resumes_with_the_missing_layers(deep_gpt2, store, monkeypatch) -> None:
    from headscope.engine.forward import transformer as forward

    model = load_model(deep_gpt2)
    entry = store.for_model(model)
    with pytest.raises(KeyboardInterrupt):
        score_sweeps.ablation_sweep(model, progress=raise_after(2), store=entry)
    assert entry.computed == 2
    ablated_layers: list[int] = []
    real = forward.run_ablations

    def spy(w: Any, x: Any, layer: int, *rest: Any) -> Any:
        ablated_layers.append(layer)
        return real(w, x, layer, *rest)

    monkeypatch.setattr(forward, "run_ablations", spy)
    resumed = score_sweeps.ablation_sweep(load_model(deep_gpt2), store=store.for_model(model))
    assert sorted(set(ablated_layers)) == [2, 3, 4]
    monkeypatch.setattr(forward, "run_ablations", real)
    same(resumed, score_sweeps.ablation_sweep(model))


def test_a_sweep_with_a_gap_loads_each_stored_part_once(deep_gpt2, store) -> None:
    """The numpy sweep peeks at the next layer (to read its weights ahead); a stored layer
    after a computed one is still loaded, and counted, once."""
    model = load_model(deep_gpt2)
    score_sweeps.weight_scores(model, store=store.for_model(model))
    for path in _stored_files(store, "copying_score") + _stored_files(store, "qk_positivity"):
        if ".1.hsr" in path.name:
            path.unlink()  # layer 1 is computed again, layers 2.. are read back after it
    entry = store.for_model(load_model(deep_gpt2))
    score_sweeps.weight_scores(load_model(deep_gpt2), store=entry)
    assert (entry.loaded, entry.computed) == (2 * (N_LAYERS - 1) + 1, 2)  # + the nonfinite flags


def test_interrupted_head_table_resumes_and_equals_an_uninterrupted_one(deep_gpt2, store, monkeypatch) -> None:
    model = load_model(deep_gpt2)
    # reports: 0 at the start, then one per layer of the spectral sweep (both scores of a
    # layer are stored before its report): the 4th stops it after 3 layers
    with pytest.raises(KeyboardInterrupt):
        report.head_table(model, store=store, progress=raise_after(1 + 3))
    spectral = counting(monkeypatch, "_batched_spectral_score")
    resumed = report.head_table(load_model(deep_gpt2), store=store)
    assert spectral.calls == 2 * (N_LAYERS - 3)  # copying and QK positivity of the 2 missing layers
    monkeypatch.setattr(spectral_module, "_batched_spectral_score", spectral.real)
    assert json.dumps(resumed) == json.dumps(report.head_table(model))


# -- never stale, never trusted -----------------------------------------------------------


def _rewrite_one_tensor(path: Path) -> Path:
    """Change the bytes of an attention weight in place (same size, header unchanged) and
    move its shard's mtime on."""
    for shard in sorted(path.glob("*.safetensors")):
        data = bytearray(shard.read_bytes())
        header_len = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + header_len])
        names = [n for n in header if "attn.c_attn.weight" in n]
        if names:
            break
    else:
        raise AssertionError("no attention weight found")
    start, stop = header[names[0]]["data_offsets"]
    base = 8 + header_len
    tensor = np.frombuffer(bytes(data[base + start : base + stop]), dtype=np.float32)
    data[base + start : base + stop] = (tensor * 1.7 + 0.1).astype(np.float32).tobytes()
    st = shard.stat()
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    return shard


def test_a_rewritten_tensor_invalidates_the_entry(model_copy, store, monkeypatch) -> None:
    model = load_model(model_copy)
    old_key = store.for_model(model).key
    old = score_sweeps.score_table(model, store=store.for_model(model))
    size = {p.name: p.stat().st_size for p in model_copy.glob("*.safetensors")}
    shard = _rewrite_one_tensor(model_copy)
    assert shard.stat().st_size == size[shard.name]
    changed = load_model(model_copy)
    entry = store.for_model(changed)
    assert entry.key != old_key
    spectral = counting(monkeypatch, "_batched_spectral_score")
    new = score_sweeps.score_table(changed, store=entry)
    assert spectral.calls == 2 * N_LAYERS and entry.loaded == 0
    monkeypatch.setattr(spectral_module, "_batched_spectral_score", spectral.real)
    same(new.copying_score, score_sweeps.score_table(load_model(model_copy)).copying_score)
    assert not np.array_equal(new.copying_score, old.copying_score)


def test_touching_a_shard_or_editing_the_config_changes_the_fingerprint(model_copy) -> None:
    ckpt = load_model(model_copy).checkpoint
    before = fingerprint(ckpt, raw=False)
    assert fingerprint(ckpt, raw=False) == before  # stable
    shard = sorted(model_copy.glob("*.safetensors"))[1]
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000))
    touched = fingerprint(ckpt, raw=False)
    assert touched != before
    config = model_copy / "config.json"
    config.write_text(config.read_text().replace('"n_layer"', ' "n_layer"'))
    assert fingerprint(ckpt, raw=False) != touched


def test_a_changed_tokenizer_is_never_served_stale_sink_scores(model_copy, store) -> None:
    """The delimiter sink reads the tokenizer (its natural sentences, which tokens are
    delimiters): an edited tokenizer is a new entry and new numbers."""
    before = report.head_table(load_model(model_copy), store=store)
    assert all(math.isnan(row["delimiter_sink_score"]) for row in before)  # no punctuation tokens
    words = [*hf_fixtures.WORDS]
    words[-2:] = [",", "."]  # now the sentences have delimiters
    hf_fixtures.write_word_tokenizer(model_copy, words)
    model = load_model(model_copy)
    after = report.head_table(model, store=store)
    assert json.dumps(after) == json.dumps(report.head_table(load_model(model_copy)))
    assert all(math.isfinite(row["delimiter_sink_score"]) for row in after)
    key = fingerprint(model.checkpoint, raw=False)
    tokenizer = model_copy / "tokenizer.json"
    st = tokenizer.stat()
    os.utime(tokenizer, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000))
    assert fingerprint(model.checkpoint, raw=False) != key


def _stored_files(store: ResultStore, name: str) -> list[Path]:
    return sorted(store.root.glob(f"*/{name}.*.hsr"))


@pytest.mark.parametrize("damage", ["truncated", "garbage", "flipped", "foreign", "empty"])
def test_damaged_files_are_ignored_recomputed_and_replaced(deep_gpt2, store, monkeypatch, damage) -> None:
    model = load_model(deep_gpt2)
    plain = score_sweeps.score_table(model, store=store.for_model(model))
    target = _stored_files(store, "copying_score")[2]
    blob = target.read_bytes()
    if damage == "truncated":
        target.write_bytes(blob[: len(blob) - 7])
    elif damage == "garbage":
        target.write_bytes(os.urandom(len(blob)))
    elif damage == "flipped":  # one bit of the payload: the digest catches it
        target.write_bytes(blob[:-3] + bytes([blob[-3] ^ 1]) + blob[-2:])
    elif damage == "foreign":  # a valid file of another layer
        shutil.copyfile(_stored_files(store, "copying_score")[0], target)
    else:
        target.write_bytes(b"")
    spectral = counting(monkeypatch, "_batched_spectral_score")
    again = score_sweeps.score_table(load_model(deep_gpt2), store=store.for_model(model))
    assert spectral.calls == 2  # only the damaged layer (its two scores are computed together)
    same(again.copying_score, plain.copying_score)
    assert target.read_bytes() == blob  # replaced by a good file


def test_a_file_of_another_checkpoint_is_not_trusted(deep_gpt2, gpt2_dir, store) -> None:
    a, b = load_model(deep_gpt2), load_model(gpt2_dir[0])
    score_sweeps.score_table(a, store=store.for_model(a))
    score_sweeps.score_table(b, store=store.for_model(b))
    entry_a, entry_b = store.for_model(a), store.for_model(b)
    assert entry_a.dir is not None and entry_b.dir is not None
    shutil.copyfile(entry_b.dir / "copying_score.0.hsr", entry_a.dir / "copying_score.0.hsr")
    assert entry_a.load("copying_score", 0, (a.cfg.n_heads,)) is None


def test_an_unwritable_store_warns_once_and_still_answers(deep_gpt2, tmp_path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the cache directory should be")
    warnings: list[str] = []
    store = ResultStore(blocker / "headscope", warn=warnings.append)
    model = load_model(deep_gpt2)
    table = score_sweeps.score_table(model, store=store.for_model(model))
    effects = score_sweeps.ablation_sweep(model, store=store.for_model(model))
    same(table.copying_score, score_sweeps.score_table(model).copying_score)
    same(effects, score_sweeps.ablation_sweep(model))
    assert len(warnings) == 1 and str(blocker) in warnings[0]


def test_the_size_cap_evicts_the_least_recently_used_entries(deep_gpt2, gpt2_dir, tmp_path) -> None:
    store = ResultStore(tmp_path / "store", max_bytes=1)  # smaller than any entry
    a, b = load_model(deep_gpt2), load_model(gpt2_dir[0])
    score_sweeps.score_table(a, store=store.for_model(a))
    assert [e.path for e in store.entries()] == [str(deep_gpt2.resolve())]
    score_sweeps.score_table(b, store=store.for_model(b))  # a is evicted, b (in use) is kept
    assert [e.path for e in store.entries()] == [str(gpt2_dir[0].resolve())]
    roomy = ResultStore(tmp_path / "store", max_bytes=1 << 20)
    score_sweeps.score_table(a, store=roomy.for_model(a))
    assert len(roomy.entries()) == 2


# -- the explorer's Engine ----------------------------------------------------------------


async def test_engine_sweeps_read_the_store_and_say_so(deep_gpt2, store, monkeypatch) -> None:
    from headscope.engine.service.engine import Engine

    engine = Engine(None, model=load_model(deep_gpt2), store=store, prefetch=False)
    try:
        first = await engine.get(ScoreTableRequest())
        assert engine.stats().origin == "head scores: computed now"
        comp = await engine.get(CompositionRequest.of(engine.structure, "q"))
        assert engine.stats().origin == "composition q: computed now"
    finally:
        await engine.aclose()
    spectral = counting(monkeypatch, "_batched_spectral_score")
    targets = counting(monkeypatch, "_prepare_target")
    reopened = Engine(None, model=load_model(deep_gpt2), store=store, prefetch=False)
    try:
        second = await reopened.get(ScoreTableRequest())
        assert reopened.stats().origin == "head scores: from the cache"
        comp2 = await reopened.get(CompositionRequest.of(reopened.structure, "q"))
        assert reopened.stats().origin == "composition q: from the cache"
        scores_of_head = await reopened.get(HeadScoresRequest.of(reopened.structure, 3, 1))  # per-head cache filled by the sweep
    finally:
        await reopened.aclose()
    assert spectral.calls == 0 and targets.calls == 0
    same(second.induction_score, first.induction_score)
    same(comp2.scores, comp.scores)
    # (NaN-aware: the fixture's vocabulary has no punctuation, so its delimiter sink is NaN)
    np.testing.assert_equal(dataclasses.asdict(scores_of_head), dataclasses.asdict(first.head(3, 1)))


async def test_a_cancelled_engine_sweep_resumes_in_the_next_engine(deep_gpt2, store, monkeypatch) -> None:
    import asyncio
    import threading

    from headscope.engine.core.errors import CancelledError
    from headscope.engine.service.engine import Engine

    engine = Engine(None, model=load_model(deep_gpt2), store=store, prefetch=False)
    loop = asyncio.get_running_loop()
    task: asyncio.Task[Any] | None = None
    real_prepare = composition_module._prepare_target
    prepared = []

    def then_cancel(real: Any) -> Any:
        def prepare_then_cancel(*args: Any) -> Any:  # on a worker, as target 3 is prepared:
            prepared.append(1)                        # targets 1 and 2 are done
            if len(prepared) == 3 and task is not None:
                loop.call_soon_threadsafe(task.cancel)
                for _ in range(3000):  # until the caller is gone: the job stops at its next check
                    if task.done():
                        break
                    threading.Event().wait(0.01)
            return real(*args)

        return prepare_then_cancel

    monkeypatch.setattr(composition_module, "_prepare_target", then_cancel(real_prepare))
    try:
        task = asyncio.ensure_future(engine.get(CompositionRequest.of(engine.structure, "v")))
        with pytest.raises((asyncio.CancelledError, CancelledError)):
            await task
        for _ in range(3000):  # let the job stop (in_flight drops at the cancel, before that)
            if not engine._scheduler._running:
                break
            await asyncio.sleep(0.01)
        stored = engine._entry(False)
        assert stored is not None
        assert stored.computed == 2  # tiles 1 and 2 were finished, and kept
    finally:
        await engine.aclose()
    monkeypatch.setattr(composition_module, "_prepare_target", real_prepare)
    targets = counting(monkeypatch, "_prepare_target")
    reopened = Engine(None, model=load_model(deep_gpt2), store=store, prefetch=False)
    try:
        resumed = await reopened.get(CompositionRequest.of(reopened.structure, "v"))
        assert reopened.stats().origin == "composition v: 2 parts from the cache, 2 computed now"
    finally:
        await reopened.aclose()
    assert targets.calls == N_LAYERS - 1 - 2
    monkeypatch.setattr(composition_module, "_prepare_target", targets.real)
    same(resumed.scores, score_sweeps.composition(load_model(deep_gpt2), "v").scores)


async def test_engine_spectra_are_stored_per_head(deep_gpt2, store, monkeypatch) -> None:
    from headscope.engine.service.engine import Engine

    async def spectra() -> list[Any]:
        engine = Engine(None, model=load_model(deep_gpt2), store=store, prefetch=False)
        try:
            return [await engine.get(SpectrumRequest.of(engine.structure, layer, 1, kind)) for layer in (0, 4) for kind in ("ov", "qk")]
        finally:
            await engine.aclose()

    first = await spectra()
    calls = mock.Mock(wraps=head_views._spectrum_now)  # the eigenvalues, when not stored
    monkeypatch.setattr(head_views, "_spectrum_now", calls)
    second = await spectra()
    assert calls.call_count == 0
    for a, b in zip(first, second, strict=True):
        same(a.eigenvalues, b.eigenvalues)
        assert (a.score, a.kind, a.layer, a.head) == (b.score, b.kind, b.layer, b.head)


def test_a_sweep_counts_only_what_its_own_thread_loaded_and_computed(deep_gpt2, store) -> None:
    """The explorer's status bar says where a sweep's numbers came from (Engine._stored): other
    requests saving into the same entry meanwhile (the null, a head's directions) are not the
    sweep's (a race that showed as "9 parts from the cache, 1 computed now" on a warm open)."""
    import threading

    entry = store.for_model(load_model(deep_gpt2))
    entry.save("mine", np.zeros(3, np.float32))
    assert entry.counts() == (0, 1)
    other = threading.Thread(target=lambda: (entry.save("theirs", np.ones(3, np.float32)),
                                             entry.load("mine", "all", (3,))))
    other.start()
    other.join()
    assert entry.counts() == (0, 1)
    assert (entry.loaded, entry.computed) == (0, 2)  # "mine" was written here: not a cache hit
    again = store.for_model(load_model(deep_gpt2))
    again.load("theirs", "all", (3,))
    assert again.counts() == (1, 0)


async def test_the_explorer_status_bar_says_where_the_scores_came_from(gpt2_dir, tmp_path, monkeypatch) -> None:
    import time

    from headscope.tui.app import HeadscopeApp
    from headscope.tui.base.settings import Settings
    from headscope.tui.widgets.status import StatusBar

    monkeypatch.setenv("HEADSCOPE_CONFIG", str(tmp_path / "none.toml"))

    async def origin_after_sweep() -> str:
        app = HeadscopeApp(gpt2_dir[0], settings=Settings(), debounce=0.01, sweep=True)
        async with app.run_test(size=(200, 40)) as pilot:
            deadline = time.monotonic() + 120
            while not app.explorer_up:  # the opening screen comes first (tui/opening.py)
                assert time.monotonic() < deadline
                await pilot.pause(0.05)
            status = app.explorer.query_one(StatusBar)
            while not status.origin.startswith("head scores"):
                assert time.monotonic() < deadline and not app.errors, app.errors
                await pilot.pause(0.1)
            assert status.origin in status.render().plain
            origin = status.origin
            await pilot.press("q")
        return origin

    assert await origin_after_sweep() == "head scores: computed now"
    assert await origin_after_sweep() == "head scores: from the cache"


@pytest.mark.parametrize("tile_bytes", [1, 768 << 20])  # one source layer per block, or all in one
def test_composition_sweep_resumes_from_its_memo(deep_gpt2, store, monkeypatch, tile_bytes) -> None:
    model = load_model(deep_gpt2)
    entry = store.for_model(model)
    memo = entry.memo("composition-q", ())
    with pytest.raises(KeyboardInterrupt):  # during target layer 3: targets 1 and 2 are whole
        composition_module.composition_scores(model.weights, "q", memo=memo, tile_bytes=1 << 40,
                                  on_tile=lambda t: (_ for _ in ()).throw(KeyboardInterrupt)
                                  if t.target == 3 else None)
    assert entry.computed == 2
    targets = counting(monkeypatch, "_prepare_target")
    seen: list[tuple[int, int]] = []
    resumed = composition_module.composition_scores(load_model(deep_gpt2).weights, "q", memo=memo,
                                                    tile_bytes=tile_bytes,
                                        on_tile=lambda t: seen.append((t.source, t.target)))
    # stored targets 1, 2 are not recomputed; every pair still reaches on_tile once
    assert sorted(seen) == sorted(composition_module.composition_pairs(N_LAYERS))
    assert entry.computed == N_LAYERS - 1
    monkeypatch.setattr(composition_module, "_prepare_target", targets.real)
    fresh = composition_module.composition_scores(model.weights, "q")
    same(resumed.scores, fresh.scores)
    assert targets.calls == (N_LAYERS - 3 if tile_bytes > 1 else sum(range(3, N_LAYERS)))


# -- hostile stores (issue #29): only the store's own files are read or deleted -----------


def _entry_of(store: ResultStore, model_dir: Path) -> Path:
    model = load_model(model_dir)
    score_sweeps.score_table(model, store=store.for_model(model))
    entry = store.for_model(model).dir
    assert entry is not None and (entry / "entry.json").is_file()
    return entry


def test_clear_deletes_only_the_entries_it_wrote_and_lists_them(gpt2_dir, tmp_path) -> None:
    """With HEADSCOPE_CACHE_DIR=~/.cache, `cache clear` must not wipe huggingface/."""
    store = ResultStore(tmp_path / "cache")
    entry = _entry_of(store, gpt2_dir[0])
    foreign = tmp_path / "cache" / "huggingface"
    (foreign / "hub").mkdir(parents=True)
    (foreign / "hub" / "weights.bin").write_bytes(b"not ours")
    lookalike = tmp_path / "cache" / ("0" * 32)  # named like an entry, holds another's file
    lookalike.mkdir()
    (lookalike / "notes.txt").write_text("not ours")
    damaged = tmp_path / "cache" / ("1" * 32)  # ours, but its entry.json is damaged
    damaged.mkdir()
    (damaged / "entry.json").write_text("{")
    (damaged / "copying_score.0.hsr").write_bytes(b"HEADSCOPE-RESULT\n")
    outside = tmp_path / "elsewhere"
    shutil.copytree(entry, outside / entry.name)
    (tmp_path / "cache" / ("2" * 32)).symlink_to(outside / entry.name)  # a link to an entry

    removed = store.clear()
    assert sorted(e.key for e in removed) == sorted([entry.name, damaged.name])
    assert str(gpt2_dir[0].resolve()) in [e.path for e in removed]
    assert not entry.exists() and not damaged.exists()
    assert (foreign / "hub" / "weights.bin").read_bytes() == b"not ours"
    assert (lookalike / "notes.txt").is_file()
    assert (outside / entry.name / "entry.json").is_file()
    assert (tmp_path / "cache" / ("2" * 32)).is_symlink()


def test_the_stale_temporary_clean_up_never_follows_a_symlink(gpt2_dir, tmp_path) -> None:
    store = ResultStore(tmp_path / "cache")
    entry = _entry_of(store, gpt2_dir[0])
    outside = tmp_path / "elsewhere"
    (outside / ".tmp-dir").mkdir(parents=True)
    (outside / ".tmp-dir" / "file").write_text("keep")
    (outside / ".tmp-file").write_text("keep")
    (outside / "victim").mkdir()
    (outside / "victim" / "data").write_text("keep")
    own_stale = entry / ".tmp-abc.hsr"
    own_stale.write_bytes(b"left by a killed writer")
    (entry / ".tmp-link").symlink_to(outside / "victim")  # unlinked, target untouched
    (tmp_path / "cache" / "link").symlink_to(outside)
    (tmp_path / "cache" / ("3" * 32)).symlink_to(outside)
    (tmp_path / "cache" / ".trash-x").symlink_to(outside / "victim")
    hour_ago = time.time() - 7200
    for p in [outside / ".tmp-dir", outside / ".tmp-file", outside / "victim", own_stale]:
        os.utime(p, (hour_ago, hour_ago))
    for p in [entry / ".tmp-link", tmp_path / "cache" / ".trash-x"]:
        os.utime(p, (hour_ago, hour_ago), follow_symlinks=False)

    store.trim()
    assert not own_stale.exists()  # the clean-up still runs on the store's own files
    assert not (entry / ".tmp-link").is_symlink()
    assert (outside / ".tmp-dir" / "file").read_text() == "keep"
    assert (outside / ".tmp-file").read_text() == "keep"
    assert (outside / "victim" / "data").read_text() == "keep"


def test_editing_the_native_config_changes_the_fingerprint_and_the_scores(tmp_path) -> None:
    """attn_scale lives in headscope.json: a stale entry served prev-token 0.163 for 0.033."""
    from safetensors.numpy import load_file, save_file

    from tests.conftest import SAMPLE_MODELS

    model_dir = Path(shutil.copytree(SAMPLE_MODELS / "attn-only-2l", tmp_path / "model"))
    weights = model_dir / "model.safetensors"  # its config only in headscope.json, not in
    save_file(load_file(weights), weights)  # the safetensors metadata (which would win)
    store = ResultStore(tmp_path / "cache")
    before = report.head_table(load_model(model_dir), store=store)
    key = fingerprint(load_model(model_dir).checkpoint, raw=False)
    config = model_dir / "headscope.json"
    fields = json.loads(config.read_text())
    fields["attn_scale"] = 1.0
    config.write_text(json.dumps(fields))
    assert fingerprint(load_model(model_dir).checkpoint, raw=False) != key
    after = report.head_table(load_model(model_dir), store=store)
    fresh = report.head_table(load_model(model_dir))
    assert json.dumps(after) == json.dumps(fresh)
    assert json.dumps(after) != json.dumps(before)


def _unblock(fifo: Path) -> None:
    """Open and close the FIFO's write end, so a reader stuck on it sees the end."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def _within(seconds: float, fn: Any, fifo: Path) -> Any:
    """``fn()`` run in a thread; fails if it is still blocked after ``seconds``."""
    out: list[Any] = []
    worker = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    worker.start()
    worker.join(seconds)
    stuck = worker.is_alive()
    if stuck:
        _unblock(fifo)
        worker.join(5)
    assert not stuck, "blocked reading a FIFO in the store"
    return out[0]


def test_a_fifo_in_the_store_is_skipped_not_waited_on(deep_gpt2, store) -> None:
    model = load_model(deep_gpt2)
    plain = score_sweeps.score_table(model, store=store.for_model(model))
    target = _stored_files(store, "copying_score")[1]
    target.unlink()
    os.mkfifo(target)
    again = _within(20, lambda: score_sweeps.score_table(load_model(deep_gpt2),
                                                    store=store.for_model(model)), target)
    same(again.copying_score, plain.copying_score)
    assert target.is_file()  # replaced by a good file
    entry_json = target.parent / "entry.json"
    entry_json.unlink()
    os.mkfifo(entry_json)
    assert _within(20, store.entries, entry_json) == []


def test_a_stored_part_linked_to_dev_zero_is_ignored_in_bounded_memory(deep_gpt2, store) -> None:
    """Read before: until memory ran out, then reported as the model not fitting."""
    model = load_model(deep_gpt2)
    score_sweeps.score_table(model, store=store.for_model(model))
    target = _stored_files(store, "copying_score")[1]
    target.unlink()
    target.symlink_to("/dev/zero")
    entry_json = target.parent / "entry.json"
    entry_json.rename(target.parent / "entry.saved")
    entry_json.symlink_to("/dev/zero")
    big = target.parent / "copying_score.2.hsr"  # a regular file far larger than its part
    big.unlink()
    with open(big, "wb") as f:
        f.truncate(1 << 30)  # sparse
    script = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from headscope.engine.sweeps.store import ModelStore, ResultStore\n"
        f"store = ResultStore({str(store.root)!r})\n"
        "assert store.entries() == []\n"
        f"entry = ModelStore(store, {target.parent.name!r}, 'x', False)\n"
        f"assert entry.load('copying_score', 1, ({model.cfg.n_heads},)) is None\n"
        f"assert entry.load('copying_score', 2, ({model.cfg.n_heads},)) is None\n"
        "assert entry.load('copying_score', 1) is None\n"
        "print('ok')\n"
    )
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-800:]


# -- round 4: a GGUF file is part of its fingerprint; a checkpoint path need not be UTF-8 ------


def test_a_replaced_gguf_file_is_never_served_the_old_numbers(tmp_path) -> None:
    """The fingerprint of a GGUF checkpoint ignored the file: another model of the same shapes
    in its place showed the first one's scores."""
    import torch

    from tests.gguf_fixtures import write_gguf

    _, model = hf_fixtures.build_llama(tmp_path / "hf")
    path = write_gguf(model, tmp_path / "model.gguf")
    store = ResultStore(tmp_path / "cache")
    key = fingerprint(load_model(path).checkpoint, raw=False)
    first = report.head_table(load_model(path), store=store)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(-1.5)  # same shapes, same header size and bytes: only the data differs
    other = write_gguf(model, tmp_path / "other.gguf")
    os.replace(other, path)
    assert fingerprint(load_model(path).checkpoint, raw=False) != key
    again = report.head_table(load_model(path), store=store)
    assert json.dumps(again) == json.dumps(report.head_table(load_model(path)))
    assert json.dumps(again) != json.dumps(first)


def test_a_checkpoint_folder_whose_name_is_not_utf8_uses_the_store(tmp_path) -> None:
    """``mod\\xe8le/`` (Latin-1): the fingerprint encoded the path as UTF-8 and every command
    using the store died with a UnicodeEncodeError."""
    from tests.conftest import SAMPLE_MODELS

    folder = os.fsencode(tmp_path) + b"/mod\xe8le"
    shutil.copytree(SAMPLE_MODELS / "attn-only-2l", os.fsdecode(folder))
    model_dir = Path(os.fsdecode(folder))
    store = ResultStore(tmp_path / "cache")
    first = report.head_table(load_model(model_dir), store=store)
    assert json.dumps(report.head_table(load_model(model_dir), store=store)) == json.dumps(first)
    [entry] = store.entries()
    assert os.fsencode(entry.path) == os.fsencode(model_dir.resolve())  # the bytes, round-tripped
    assert json.loads(json.dumps(entry.as_dict()))["path"] == entry.path  # `cache ls --json`


def test_heads_with_a_partly_stored_weight_sweep_computes_only_the_missing_layers(deep_gpt2, store) -> None:
    """`heads` runs the weight sweep's pieces inside its forward pass (spectral.SpectralPass):
    a stored layer is read back, a missing one computed there, and the table is the one the
    two sweeps give alone, bit for bit."""
    model = load_model(deep_gpt2)
    expected = score_sweeps.calibrated_score_table(model, null_samples=None)[0]
    score_sweeps.weight_scores(model, store=store.for_model(model))
    for path in _stored_files(store, "copying_score") + _stored_files(store, "qk_positivity"):
        if ".1.hsr" in path.name:
            path.unlink()
    entry = store.for_model(load_model(deep_gpt2))
    found = score_sweeps.calibrated_score_table(load_model(deep_gpt2), store=entry, null_samples=None)[0]
    assert entry.computed >= 2  # layer 1's two parts (and the behaviour part)
    for name in ("copying_score", "qk_positivity", "nonfinite", "induction_score"):
        np.testing.assert_array_equal(getattr(found, name), getattr(expected, name))


def test_a_behaviour_part_stored_meanwhile_still_gives_the_weight_scores(tmp_path, store) -> None:
    """Another process may store the behaviour part after `heads` chose one pass for both
    sweeps: no pass drives the weight sweep then, and it runs alone (every layer visited, a
    head with a NaN weight flagged), giving the table's numbers."""
    from safetensors.torch import load_file, save_file

    path, _ = hf_fixtures.build_gpt2(tmp_path / "nan")
    tensors = load_file(path / "model.safetensors")
    c_attn = tensors["transformer.h.0.attn.c_attn.weight"].clone()
    c_attn[3, 2] = float("nan")  # layer 0, head 0: a NaN in W_Q
    tensors["transformer.h.0.attn.c_attn.weight"] = c_attn
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    expected = score_sweeps.calibrated_score_table(load_model(path), null_samples=None)[0]
    assert expected.nonfinite[0, 0]
    entry = store.for_model(load_model(path))
    score_sweeps.behaviour(load_model(path), store=entry)  # the behaviour part, stored
    entry = store.for_model(load_model(path))  # without the nonfinite part the pass would save
    for part in _stored_files(store, "nonfinite"):
        part.unlink()
    weights, found, _ = score_sweeps._weights_and_behaviour(
        load_model(path), score_sweeps.SEED, None, None, entry, None)
    np.testing.assert_array_equal(weights["copying_score"], expected.copying_score)
    np.testing.assert_array_equal(weights["qk_positivity"], expected.qk_positivity)
    np.testing.assert_array_equal(found["nonfinite"], expected.nonfinite)
