"""Widening stored dtypes to float32 (engine/formats/widening.py) is exact."""

from __future__ import annotations

import numpy as np
import torch


def test_widen_is_exact_for_every_stored_dtype() -> None:
    """bf16, float16, float8 (e4m3fn, e5m2: every one of the 256 bytes) and float64 bytes
    become the float32 values torch gives them, bit for bit (NaNs as NaNs)."""
    import numpy as np

    from headscope.engine.formats.widening import widen

    def raw(t: torch.Tensor) -> np.ndarray:
        return t.contiguous().view(torch.uint8).numpy()

    special = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-40, 3e38, 1.5])
    for t in (torch.randn(64, 48).to(torch.bfloat16), special.to(torch.bfloat16),
              torch.randn(33).half(), special.double()):
        stored = {torch.bfloat16: "bf16", torch.float16: np.float16, torch.float64: np.float64}[t.dtype]
        got, want = widen(raw(t), stored).reshape(t.shape), t.float().numpy()
        assert np.array_equal(got, want, equal_nan=True), t.dtype
        finite = np.isfinite(want)
        assert np.array_equal(got[finite].view(np.uint32), want[finite].view(np.uint32))  # signed zeros too
    codes = torch.arange(256, dtype=torch.uint8)
    for kind, dtype in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
        want = codes.view(dtype).float().numpy()
        got = widen(codes.numpy(), kind)
        assert np.array_equal(got, want, equal_nan=True), kind
        assert np.array_equal(np.signbit(got), np.signbit(want)), kind


def test_a_large_bf16_read_widened_in_two_halves_is_the_same(monkeypatch) -> None:
    """Above ``SPLIT_BYTES`` the second half is widened on a helper thread: every bit as torch
    gives it, for an even and an odd count, and called from several threads at once (the
    composition sweep reads on two core-pool workers)."""
    from concurrent.futures import ThreadPoolExecutor

    from headscope.engine.formats import widening

    monkeypatch.setattr(widening, "SPLIT_BYTES", 1 << 10)
    tensors = [torch.randn(n).to(torch.bfloat16) for n in (4096, 4097, 70_001)]

    def check(t: torch.Tensor) -> bool:
        got = widening.widen(t.view(torch.uint8).numpy(), "bf16")
        return np.array_equal(got.view(np.uint32), t.float().numpy().view(np.uint32))

    assert all(check(t) for t in tensors)
    with ThreadPoolExecutor(3) as pool:
        assert all(pool.map(check, tensors * 4))


def test_a_forked_child_widens_with_a_helper_of_its_own(monkeypatch) -> None:
    """A child forked after the parent's helper started (a multiprocessing worker) widens a
    large read too, instead of waiting on a thread it does not have."""
    import multiprocessing

    from headscope.engine.formats import widening

    monkeypatch.setattr(widening, "SPLIT_BYTES", 1 << 10)
    t = torch.randn(8192).to(torch.bfloat16)
    raw = t.view(torch.uint8).numpy()
    widening.widen(raw, "bf16")  # the parent's helper exists now
    with multiprocessing.get_context("fork").Pool(1) as pool:
        got = pool.apply_async(widening.widen, (raw, "bf16")).get(timeout=60)
    assert np.array_equal(got.view(np.uint32), t.float().numpy().view(np.uint32))
