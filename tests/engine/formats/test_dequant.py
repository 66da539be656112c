"""The GGUF dequantisation kernels (engine/formats/dequant.py) against llama.cpp's own numpy
reference, ``gguf.quants.dequantize``: bit for bit, on random valid blocks of every type.

"Valid" (``bench.dequant.random_blocks``): every byte pattern of the packed quants and
sub-block scales is a real block; only the f16 (super-)block scales are drawn as finite
numbers (both signs, some zero, some subnormal), since a NaN or infinite scale has no bit
pattern to agree on.
"""

from __future__ import annotations

import numpy as np
import pytest

from bench.dequant import random_blocks
from headscope.engine.formats import dequant
from headscope.engine.formats.dequant import DequantError, dequantize, row_nbytes


def reference(raw: np.ndarray, type_name: str) -> np.ndarray:
    import gguf.quants
    from gguf.constants import GGMLQuantizationType

    return np.array(gguf.quants.dequantize(raw, GGMLQuantizationType[type_name]), dtype=np.float32)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("type_name", list(dequant.TYPES))
@pytest.mark.parametrize(("rows", "cols"), [(1, 256), (7, 512), (33, 768)])
def test_every_type_is_bit_for_bit_the_reference(type_name: str, rows: int, cols: int) -> None:
    raw = random_blocks(type_name, rows, cols, seed=rows * 1000 + cols, extremes=True)
    want = reference(raw, type_name).reshape(rows, cols)
    out = np.full((rows, cols), np.nan, np.float32)
    got = dequantize(raw.reshape(-1), type_name, out)
    assert got is out
    assert same_bits(out, want)
    # -0.0 scales really occur (the test can tell the signs of zeros apart)
    if type_name not in ("F32", "F16", "BF16"):
        assert (np.signbit(want) & (want == 0)).any()


@pytest.mark.parametrize("type_name", list(dequant.TYPES))
def test_chunks_and_threads_change_nothing(type_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many chunks (the last one short), shared among threads: the same bits as one pass."""
    monkeypatch.setattr(dequant, "CHUNK", 512)
    monkeypatch.setattr(dequant, "THREADED_MIN", 1)
    raw = random_blocks(type_name, 61, 512, seed=5, extremes=True)
    want = reference(raw, type_name)
    for threads in (1, 2, 3):
        out = np.empty(61 * 512, np.float32)
        dequantize(raw.reshape(-1), type_name, out, threads=threads)
        assert same_bits(out.reshape(61, 512), want), threads


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_K", "Q6_K", "BF16"])
def test_a_row_range_reads_only_its_bytes(type_name: str) -> None:
    """One head's rows: their bytes alone, into a reused buffer, give the reference's rows."""
    rows, cols = 24, 512
    raw = random_blocks(type_name, rows, cols, seed=11, extremes=True)
    want = reference(raw, type_name)
    step = row_nbytes(type_name, cols)
    assert raw.shape[1] == step
    flat = raw.reshape(-1)
    buffer = np.empty((8, cols), np.float32)
    for head in range(3):
        part = flat[head * 8 * step : (head + 1) * 8 * step]
        dequantize(part, type_name, buffer)
        assert same_bits(buffer, want[head * 8 : (head + 1) * 8])


def test_nan_and_infinite_scales_give_what_the_reference_gives() -> None:
    raw = random_blocks("Q4_K", 4, 256, seed=3)
    raw[0, 0:2] = np.array([np.nan], np.float16).view(np.uint8)
    raw[1, 2:4] = np.array([np.inf], np.float16).view(np.uint8)
    got = dequantize(raw.reshape(-1), "Q4_K").reshape(4, 256)
    want = reference(raw, "Q4_K")
    assert np.isnan(got[0]).all() and np.array_equal(got, want, equal_nan=True)


def test_bad_input_is_a_one_line_error_naming_the_type() -> None:
    with pytest.raises(DequantError, match="type IQ2_XXS cannot be dequantised"):
        dequantize(np.zeros(66, np.uint8), "IQ2_XXS")
    with pytest.raises(DequantError, match="not a whole number of Q4_K blocks"):
        dequantize(np.zeros(145, np.uint8), "Q4_K")
    with pytest.raises(DequantError, match="not the 512 expected"):
        dequantize(np.zeros(144, np.uint8), "Q4_K", np.empty(512, np.float32))
    with pytest.raises(DequantError, match="float32"):
        dequantize(np.zeros(144, np.uint8), "Q4_K", np.empty(256, np.float64))
    with pytest.raises(DequantError, match="rows of 100 values"):
        row_nbytes("Q8_0", 100)
    for err in (DequantError("x"),):
        assert isinstance(err, ValueError)


def test_a_forked_child_gets_threads_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A child forked after the pool started (a worker process) dequantises with threads of
    its own instead of waiting forever on its parent's, which it does not have."""
    import multiprocessing

    monkeypatch.setattr(dequant, "CHUNK", 512)
    monkeypatch.setattr(dequant, "THREADED_MIN", 1)
    raw = random_blocks("Q8_0", 16, 512, seed=2).reshape(-1)
    want = dequantize(raw, "Q8_0", threads=2)  # starts the pool in this process
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        got = pool.apply_async(_threaded_q8_0, (raw,)).get(timeout=60)
    assert same_bits(got, want)


def _threaded_q8_0(raw: np.ndarray) -> np.ndarray:
    dequant.CHUNK, dequant.THREADED_MIN = 512, 1  # a forked child keeps the parent's values anyway
    return dequantize(raw, "Q8_0", threads=2)
