"""Stored tensor bytes as float32 (docs/internals.md, "Weights"): safetensors' bf16, float16,
float8 and float64 widened exactly (``widen``), read with positional reads (``pread_into``) into
reused staging buffers (``StagingBuffers``). GGUF block types are ``dequant``'s."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from headscope.engine.core.errors import CorruptFileError

# safetensors dtype -> how its bytes become float32 (``widen``)
STORED_AS = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": "bf16",
             "F8_E5M2": "e5m2", "F8_E4M3": "e4m3"}


def float8_table(kind: str) -> np.ndarray:
    """The 256 float32 values of a float8 byte: ``e4m3`` (OCP E4M3FN: bias 7, no infinities,
    ``S.1111.111`` NaN) or ``e5m2`` (IEEE-like: bias 15, infinities and NaNs). Exact."""
    exp_bits, bias = (4, 7) if kind == "e4m3" else (5, 15)
    man_bits = 7 - exp_bits
    code = np.arange(256)
    sign = np.where(code & 0x80, -1.0, 1.0)
    exp = (code >> man_bits) & ((1 << exp_bits) - 1)
    man = code & ((1 << man_bits) - 1)
    normal = (1.0 + man / (1 << man_bits)) * np.exp2(exp.astype(np.float64) - bias)
    subnormal = (man / (1 << man_bits)) * 2.0 ** (1 - bias)
    value = sign * np.where(exp == 0, subnormal, normal)
    top = exp == (1 << exp_bits) - 1
    nan = np.copysign(np.nan, sign)  # a NaN keeps its byte's sign, as torch's conversion does
    if kind == "e4m3":
        value = np.where(top & (man == 7), nan, value)
    else:
        value = np.where(top, np.where(man == 0, sign * np.inf, nan), value)
    return value.astype(np.float32)


_FLOAT8 = {kind: float8_table(kind) for kind in ("e4m3", "e5m2")}


def widen(raw: np.ndarray, dtype: Any) -> np.ndarray:
    """Stored bytes (``uint8``) as float32: bf16 is the upper half of a float32 (exact, one
    float32-sized array, no second one); float8 through its 256-value table; float16/float64
    cast (float32 bytes are viewed, not copied)."""
    if dtype == "bf16":  # one pass: each uint16 widened and shifted into its float32's top half
        halves = raw.view(np.uint16)
        wide = np.empty(halves.shape, np.uint32)
        _shift_into(halves, wide)
        return wide.view(np.float32)
    if isinstance(dtype, str):
        return _FLOAT8[dtype][raw]
    return raw.view(dtype).astype(np.float32, copy=False)


# A bf16 read at least this large is widened in two halves, the second on a helper thread.
SPLIT_BYTES = 16 << 20
_HELPER: list[ThreadPoolExecutor] = []
_HELPER_LOCK = threading.Lock()


def _forget_helper() -> None:
    """In a forked child: none of the parent's threads are there, so it starts its own helper
    when it needs one (an executor whose thread is gone would take the half and never run
    it), under a new lock (the parent's may have been held by another thread at the fork)."""
    global _HELPER_LOCK
    _HELPER_LOCK = threading.Lock()
    _HELPER.clear()


os.register_at_fork(after_in_child=_forget_helper)


def _helper() -> ThreadPoolExecutor | None:
    """One thread that widens the second half of a large read while the caller widens the
    first (None on a one-core box). Its own pool, not ``core.threads.core_pool``: a read made
    from a core-pool worker (the composition sweep's) must not wait on that pool."""
    with _HELPER_LOCK:
        if not _HELPER:
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
            if cores < 2:
                return None
            _HELPER.append(ThreadPoolExecutor(1, thread_name_prefix="headscope-widen"))
        return _HELPER[0]


def _shift_into(halves: np.ndarray, wide: np.ndarray) -> None:
    """``wide = halves << 16`` (uint16 -> uint32), in two halves side by side when large: the
    loop is one core's work (1.2–2 GB/s of bf16 here), and the forward pass reads a 7B
    model's 13 GB between its products, with the other core idle (12 s of a `heads` run)."""
    helper = _helper() if halves.nbytes >= SPLIT_BYTES else None
    if helper is None:
        np.left_shift(halves, 16, out=wide, dtype=np.uint32)
        return
    mid = halves.shape[0] // 2
    second = helper.submit(np.left_shift, halves[mid:], 16, out=wide[mid:], dtype=np.uint32)
    try:
        np.left_shift(halves[:mid], 16, out=wide[:mid], dtype=np.uint32)
    finally:
        second.result()


def pread_into(handle: Any, buffer: np.ndarray, offset: int, file: str, tensor: str) -> None:
    """Fill the uint8 ``buffer`` from ``offset`` of the open file (positional reads: no shared
    file position, so threads can read the same file at once)."""
    view = memoryview(buffer)
    done = 0
    while done < len(view):  # one read returns at most ~2 GB on Linux
        got = os.preadv(handle.fileno(), [view[done:]], offset + done)
        if got <= 0:
            raise CorruptFileError(file, f"cannot read tensor {tensor!r}: the file ends after "
                                         f"{done:,} of its {len(view):,} bytes")
        done += got


class StagingBuffers:
    """A few ``uint8`` buffers the stored bytes of a tensor are read into before widening,
    reused from read to read (any thread; one reader holds a buffer at a time).

    Only bytes that ``widen`` copies out of (bf16, float16, float8, float64) are read into a
    staging buffer: the float32 array a read returns is the caller's and is never reused. A
    buffer of a fresh allocation above glibc's mmap threshold (32 MB) is mapped, faulted in and
    zeroed page by page on every read and unmapped after it; a 13B layer is 650 MB of such
    reads. ``keep`` buffers of at most ``limit`` bytes are kept (a bigger read allocates its
    own): peak memory grows by at most ``keep * limit``. One is enough: the sweeps read on one
    thread at a time (the read-ahead thread, or the forward pass); a second reader at the same
    moment allocates its own."""

    def __init__(self, keep: int = 1, limit: int = 160 << 20) -> None:
        self.keep, self.limit = keep, limit
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()
        self.reused = 0  # reads served by a kept buffer (tests count them)

    def take(self, n: int) -> np.ndarray:
        """A ``uint8`` array of ``n`` bytes (contents undefined); ``give`` it back after use."""
        with self._lock:
            for i, buf in enumerate(self._free):
                if buf.size >= n:
                    self.reused += 1
                    return self._free.pop(i)[:n]
        return np.empty(n, np.uint8)

    def give(self, buf: np.ndarray) -> None:
        """Return a buffer ``take`` gave (nothing may use it afterwards)."""
        base = buf.base if isinstance(buf.base, np.ndarray) else buf
        if base.size > self.limit:
            return
        with self._lock:
            self._free.append(base)
            self._free.sort(key=lambda b: b.size)
            del self._free[: max(0, len(self._free) - self.keep)]  # the smallest go first

    def kept(self) -> list[int]:
        """The sizes of the buffers kept, smallest first."""
        with self._lock:
            return [b.size for b in self._free]

    def clear(self) -> None:
        with self._lock:
            self._free.clear()


def widens_by_copy(dtype: Any) -> bool:
    """Whether ``widen(raw, dtype)`` returns new memory (not a view of ``raw``)."""
    return dtype is not np.float32
