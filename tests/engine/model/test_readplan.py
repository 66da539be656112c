"""The read plan of a checkpoint larger than RAM (engine/model/readplan.py, docs/internals.md "The
read plan"): a sweep reads each byte once, in file order; what is not needed again is dropped
from the page cache (``POSIX_FADV_DONTNEED``, recorded here through a patched
``os.posix_fadvise``), the attention weights stay when they fit, and nothing is advised for a
checkpoint that fits. The numbers never change."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest

from headscope.engine.core.errors import InvalidRequestError
from headscope.engine.formats.widening import StagingBuffers
from headscope.engine.model import readplan
from headscope.engine.model.loading import load_model
from headscope.engine.sweeps import scores as score_sweeps
from tests import hf_fixtures

N_LAYERS = 12  # > 10: a single safetensors file sorts layer 10 before layer 2


@pytest.fixture(scope="module")
def llama12(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 12-layer bf16 Llama (GQA) in one safetensors file, with a tokenizer."""
    with mock.patch.object(hf_fixtures, "N_LAYERS", N_LAYERS):
        path, _ = hf_fixtures.build_llama(tmp_path_factory.mktemp("llama12"), dtype="bfloat16",
                                          tokenizer=True)
    return path


def record_advice(monkeypatch: pytest.MonkeyPatch, checkpoint: Path, advice: list[tuple[int, int, int]]) -> None:
    """Record ``posix_fadvise(fd, offset, length, advice)`` calls on ``checkpoint``'s files.
    The patch is process-wide, and a read-ahead thread of an earlier test's model may still
    be advising its own files, so calls are kept by the file the descriptor names (Linux's
    /proc; kept whole where it cannot be read)."""
    root = checkpoint.resolve()

    def on_advice(fd: int, offset: int, length: int, kind: int) -> None:
        try:
            file = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            file = root
        if file == root or root in file.parents:
            advice.append((offset, length, kind))

    monkeypatch.setattr(os, "posix_fadvise", on_advice, raising=False)


class Reads:
    """Every read from disk of an open model (``CheckpointWeights.on_read``) and every
    ``posix_fadvise`` call."""

    def __init__(self, model: Any, monkeypatch: pytest.MonkeyPatch, budget: int | None) -> None:
        self.raw = model.weights.raw
        self.raw.page_cache_budget = budget
        self.reads: list[tuple[str, str, int, int]] = []
        self.advice: list[tuple[int, int, int]] = []
        self.raw.on_read = lambda f, t, o, n: self.reads.append((f, t, o, n))
        record_advice(monkeypatch, Path(model.path), self.advice)

    def advised(self, kind: int | None) -> list[tuple[int, int]]:
        if self.raw.advising is not None:
            self.raw.advising.join()
        return [(o, n) for o, n, a in self.advice if a == kind]


def heads_passes(model: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """What ``heads`` runs: one forward pass (scores, sinks, null) with the spectral sweep's
    piece of each layer run as the pass reaches it."""
    table, null = score_sweeps.calibrated_score_table(model, seed=0, null_samples=4)
    assert null is not None
    return {f.name: getattr(table, f.name) for f in dataclasses.fields(table)}, {"mean": null.mean, "std": null.std}


def is_attention(tensor: str) -> bool:
    return ".self_attn." in tensor


def test_the_spectral_sweep_reads_each_attention_byte_once_in_file_order(llama12, monkeypatch) -> None:
    model = load_model(llama12)
    seen = Reads(model, monkeypatch, None)
    score_sweeps.weight_scores(model)
    attention = [(f, t, o, n) for f, t, o, n in seen.reads if is_attention(t)]
    tensors = [t for _, t, _, _ in seen.reads]
    assert len(tensors) == len(set(tensors))  # no tensor read twice in the pass
    stored = {t for t in seen.raw.files if is_attention(t)}
    assert {t for _, t, _, _ in attention} == stored  # every attention weight, whole
    offsets = [o for _, _, o, _ in attention]
    assert offsets == sorted(offsets)  # file order: layer 10 before layer 2
    ends = [o + n for _, _, o, n in attention]
    assert all(end <= nxt for end, nxt in zip(ends, offsets[1:], strict=False))  # no overlap


def test_the_forward_pass_reads_each_tensor_once(llama12, monkeypatch) -> None:
    model = load_model(llama12)
    seen = Reads(model, monkeypatch, None)
    weights = score_sweeps.weight_scores(model)
    first = len(seen.reads)
    score_sweeps.behaviour(model, seed=0, weights_nonfinite=weights["nonfinite"])
    tensors = [t for _, t, _, _ in seen.reads[first:]]
    assert len(tensors) == len(set(tensors))
    # it re-reads the attention weights the spectral sweep read (released after it), and the MLPs
    assert {t for t in seen.raw.files if is_attention(t) or ".mlp." in t} <= set(tensors)


def test_heads_reads_each_tensor_once_for_both_sweeps(llama12, monkeypatch) -> None:
    model = load_model(llama12)
    seen = Reads(model, monkeypatch, None)
    heads_passes(model)
    tensors = [t for _, t, _, _ in seen.reads]
    # the spectral sweep's piece of a layer runs on the attention weights the forward pass
    # reads next: nothing is read twice (the two sweeps one after the other read them twice)
    assert len(tensors) == len(set(tensors))
    assert {t for t in seen.raw.files if is_attention(t) or ".mlp." in t} <= set(tensors)


def test_heads_reads_each_tensor_once_when_the_cache_holds_just_one_layers_attention(
        llama12, monkeypatch) -> None:
    """Where one layer's attention weights (float32; K/V expanded at 70B widths, they were
    exactly the default cache bound, 1 GiB) fill the default bound, the default keeps room
    beside them, so the pass's attention finds what the weight sweep's piece read (an LRU at
    exactly their size cycles every one of them out before its second read). Here the default
    is set to this model's layer size."""
    from headscope.engine.model import processing

    def attention_reads(cache_bytes: int | None) -> list[str]:
        model = load_model(llama12)
        model = dataclasses.replace(model, weights=processing.ProcessedWeights(model.weights.raw,
                                                                              cache_bytes=cache_bytes))
        seen = Reads(model, monkeypatch, None)
        heads_passes(model)
        return [t for _, t, _, _ in seen.reads if is_attention(t)]

    layer = processing._float32_bytes(load_model(llama12).cfg)[1]
    thrashed = attention_reads(layer)  # a bound of exactly one layer's attention weights
    assert len(thrashed) > len(set(thrashed))
    monkeypatch.setattr(processing, "DEFAULT_CACHE_BYTES", layer)
    tensors = attention_reads(None)  # the default: room beside them
    assert tensors and len(tensors) == len(set(tensors)) == len(set(thrashed))


def test_a_checkpoint_that_fits_in_the_page_cache_gets_no_advice(llama12, monkeypatch) -> None:
    model = load_model(llama12)
    seen = Reads(model, monkeypatch, 1 << 40)
    heads_passes(model)
    assert not model.weights.raw.read_plan.streaming
    assert seen.reads and seen.advice == []


def test_larger_than_ram_drops_what_is_read_and_keeps_the_attention_weights(llama12, monkeypatch) -> None:
    model = load_model(llama12)
    plan = model.weights.raw.read_plan  # the real plan: only its sizes are used
    seen = Reads(model, monkeypatch, plan.hot + 1)  # the attention weights fit, the rest not
    assert model.weights.raw.read_plan.keep_hot
    heads_passes(model)
    dropped = seen.advised(readplan.DONTNEED)
    others = [(o, n) for _, t, o, n in seen.reads if not is_attention(t)]
    assert others and sorted(dropped) == sorted(others)  # each range once read, no attention's
    assert len(seen.advised(readplan.SEQUENTIAL)) == 1  # one file
    will = seen.advised(readplan.WILLNEED)
    mlp = {(o, n) for _, t, o, n in seen.reads if ".mlp." in t and ".layers.0." not in t}
    assert mlp <= set(will)  # each later layer announced before the pass reached it


def test_when_even_the_attention_weights_do_not_fit_every_range_read_is_dropped(llama12, monkeypatch) -> None:
    model = load_model(llama12)
    seen = Reads(model, monkeypatch, 1)
    assert model.weights.raw.read_plan.streaming and not model.weights.raw.read_plan.keep_hot
    heads_passes(model)
    assert sorted(seen.advised(readplan.DONTNEED)) == sorted((o, n) for _, _, o, n in seen.reads)


def test_the_plan_never_changes_the_numbers(llama12, monkeypatch) -> None:
    plain = heads_passes(load_model(llama12))
    streamed_model = load_model(llama12)
    Reads(streamed_model, monkeypatch, 1)
    streamed = heads_passes(streamed_model)
    for a, b in zip(plain, streamed, strict=True):
        for name in a:
            assert np.asarray(a[name]).tobytes() == np.asarray(b[name]).tobytes(), name


def test_without_posix_fadvise_the_plan_is_a_no_op(llama12, monkeypatch) -> None:
    monkeypatch.delattr(os, "posix_fadvise", raising=False)
    model = load_model(llama12)
    model.weights.raw.page_cache_budget = 1
    heads_passes(model)
    assert readplan.advise(0, 0, 10, readplan.DONTNEED) is False


def test_staging_buffers_are_reused_and_never_alias_a_returned_array(llama12) -> None:
    model = load_model(llama12, raw=True)
    w = model.weights
    first = w.get("blocks.0.attn.W_Q")
    kept = first.copy()
    for layer in range(1, N_LAYERS):
        w.get(f"blocks.{layer}.attn.W_Q")
        w.get(f"blocks.{layer}.mlp.W_in")
    assert w.staging.reused > 0
    assert first.tobytes() == kept.tobytes()  # the returned array is its own memory
    fresh = load_model(llama12, raw=True).weights.get("blocks.0.attn.W_Q")
    assert fresh.tobytes() == kept.tobytes()


def test_staging_buffers_keep_at_most_their_bound() -> None:
    staging = StagingBuffers(keep=2, limit=1000)
    bufs = [staging.take(n) for n in (100, 200, 300, 2000)]
    for b in bufs:
        staging.give(b)
    assert staging.kept() == [200, 300]  # the two largest within the limit
    assert staging.take(250).size == 250 and staging.reused == 1


def test_the_page_cache_budget_can_be_set_in_the_environment(monkeypatch) -> None:
    monkeypatch.setenv(readplan.PAGE_CACHE_ENV, "0.5")
    assert readplan.page_cache_bytes() == 1 << 19
    assert readplan.plan_reads(1 << 20, 1 << 18).keep_hot
    monkeypatch.setenv(readplan.PAGE_CACHE_ENV, " ")  # set but empty: physical memory decides
    assert readplan.page_cache_bytes() > 1 << 20


@pytest.mark.parametrize("bad", ["inf", "1e309", "nan", "-1", "0", "lots"])
def test_a_page_cache_budget_that_is_not_a_positive_number_is_one_line_naming_it(monkeypatch, bad) -> None:
    monkeypatch.setenv(readplan.PAGE_CACHE_ENV, bad)
    with pytest.raises(InvalidRequestError) as err:
        readplan.page_cache_bytes()
    assert str(err.value) == (f"HEADSCOPE_PAGE_CACHE_MB={bad!r} is not a page-cache size: "
                              "set it to a positive number of MiB (e.g. 4096), or unset it")


@pytest.fixture(scope="module")
def llama12_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 12-layer Llama as a Q8_0 GGUF file (llama.cpp's layout)."""
    from tests.gguf_fixtures import write_gguf

    root = tmp_path_factory.mktemp("llama12-gguf")
    with mock.patch.object(hf_fixtures, "N_LAYERS", N_LAYERS):
        _, model = hf_fixtures.build_llama(root / "hf")
    return write_gguf(model, root / "model.gguf", qtype="Q8_0")


def test_a_streamed_gguf_file_drops_every_range_read_and_keeps_its_numbers(llama12_gguf, monkeypatch) -> None:
    plain = heads_passes(load_model(llama12_gguf))
    model = load_model(llama12_gguf)
    # set where a safetensors checkpoint's is set: a GGUF file's plan is its source's
    model.weights.raw.page_cache_budget = 1
    source = model.weights.raw.source
    assert source.page_cache_budget == 1
    reads: list[tuple[int, int]] = []
    advice: list[tuple[int, int, int]] = []
    source.on_read = lambda f, t, o, n: reads.append((o, n))
    record_advice(monkeypatch, Path(model.path), advice)
    streamed = heads_passes(model)
    assert model.weights.raw.read_plan.streaming
    dropped = [(o, n) for o, n, a in advice if a == readplan.DONTNEED]
    assert reads and sorted(dropped) == sorted(reads)
    assert [a for *_, a in advice].count(readplan.SEQUENTIAL) == 1
    for a, b in zip(plain, streamed, strict=True):
        for name in a:
            assert np.asarray(a[name]).tobytes() == np.asarray(b[name]).tobytes(), name
