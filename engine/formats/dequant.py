"""Dequantise llama.cpp GGUF tensor bytes to float32, fast, into a buffer the caller owns.

The block layouts are ggml's (``ggml-common.h``; the ``gguf`` package's ``gguf/quants.py`` is
the reference these kernels are tested against, bit for bit):

- ``F32``: 4 bytes, ``F16``: 2 bytes (IEEE half), ``BF16``: 2 bytes (the top half of a float32);
- ``Q8_0``, 32 values in 34 bytes: ``d`` (f16), 32 × int8 ``q``; ``x = q · d``;
- ``Q4_0``, 32 values in 18 bytes: ``d`` (f16), 16 bytes whose low nibbles are values 0..15 and
  high nibbles values 16..31; ``x = d · (q - 8)``;
- ``Q4_K``, 256 values in 144 bytes: ``d``, ``dmin`` (f16), 12 bytes packing eight 6-bit
  scales ``sc`` and mins ``m`` (one per 32 values), 128 bytes of nibbles: each run of 32 bytes
  holds two sub-blocks (low nibbles first); ``x = (d·sc) · q - (dmin·m)``;
- ``Q5_K``, 256 values in 176 bytes: as ``Q4_K`` with 32 bytes ``qh`` after the scales, bit
  ``j`` of ``qh[i]`` the fifth bit of value ``i`` of sub-block ``j``;
- ``Q6_K``, 256 values in 210 bytes: 128 bytes of low nibbles ``ql``, 64 bytes of 2-bit high
  parts ``qh``, 16 int8 scales (one per 16 values), ``d`` (f16);
  ``x = (d·scale) · (q - 32)``.

Each kernel does the reference's float32 operations in the reference's order (products and
differences rounded the same way), so results are identical; the integer parts (nibbles, high
bits, the ``- 8`` / ``- 32`` offsets) are exact either way and are done on bytes.

Speed comes from three things the reference does not do: every step writes into preallocated
arrays (no temporaries), the work goes in chunks of whole blocks small enough that the
intermediates stay in the CPU cache (one pass over memory, not eight), and chunks are shared
among a few threads (numpy releases the GIL inside each operation). A row range of a matrix
is dequantised by passing just its bytes (``row_nbytes``); nothing else is touched.

Pure numpy on bytes: no file, no path. A wrong type or size is a ``DequantError`` (a
``ValueError``) whose message the reader puts after the tensor's name.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

__all__ = ["TYPES", "DequantError", "block_layout", "can_dequantise", "default_threads", "dequantize", "row_nbytes"]

QK_K = 256
# type name -> (values per block, bytes per block), as ggml's type traits.
TYPES: dict[str, tuple[int, int]] = {
    "F32": (1, 4),
    "F16": (1, 2),
    "BF16": (1, 2),
    "Q8_0": (32, 34),
    "Q4_0": (32, 18),
    "Q4_K": (QK_K, 144),
    "Q5_K": (QK_K, 176),
    "Q6_K": (QK_K, 210),
}
# Values per chunk: the chunk's bytes and float32 intermediates (~2 × 256 KB) stay in L2.
CHUNK = 1 << 16
# Below this many values one thread does it all (a pool hand-off costs ~50 µs).
THREADED_MIN = 1 << 20


class DequantError(ValueError):
    """A type these kernels do not implement, or bytes that do not fit the type and shape."""


def block_layout(type_name: str) -> tuple[int, int]:
    """``(values per block, bytes per block)`` of a type these kernels implement."""
    layout = TYPES.get(type_name)
    if layout is None:
        raise DequantError(f"type {type_name} cannot be dequantised (headscope reads {', '.join(TYPES)})")
    return layout


def can_dequantise(type_name: str) -> bool:
    return type_name in TYPES


def row_nbytes(type_name: str, cols: int) -> int:
    """Bytes of one row of ``cols`` values (a whole number of blocks)."""
    block, size = block_layout(type_name)
    if cols % block:
        raise DequantError(f"rows of {cols} values are not a whole number of {type_name} blocks of {block}")
    return cols // block * size


def dequantize(
    raw: np.ndarray, type_name: str, out: np.ndarray | None = None, *, threads: int | None = None
) -> np.ndarray:
    """The float32 values of ``raw`` (uint8, C-contiguous, whole ``type_name`` blocks).

    ``out``: a C-contiguous float32 array with exactly that many values (any shape; reuse it
    across calls), or None for a new flat one. Returns ``out``. ``threads``: at most this many
    threads (default: the CPU count, capped at 4; 1 for small inputs).
    """
    block, size = block_layout(type_name)
    if raw.dtype != np.uint8 or not raw.flags.c_contiguous:
        raise DequantError(f"{type_name} bytes must be a contiguous uint8 array, got {raw.dtype}")
    if raw.size % size:
        raise DequantError(f"{raw.size:,} bytes are not a whole number of {type_name} blocks of {size} bytes")
    n_blocks = raw.size // size
    if out is None:
        out = np.empty(n_blocks * block, np.float32)
    if out.dtype != np.float32 or not out.flags.c_contiguous or not out.flags.writeable:
        raise DequantError(f"the output of {type_name} values must be a writable contiguous float32 array")
    if out.size != n_blocks * block:
        raise DequantError(
            f"{raw.size:,} bytes of {type_name} hold {n_blocks * block:,} values, not the {out.size:,} expected"
        )
    src = raw.reshape(n_blocks, size)
    dst = out.reshape(n_blocks, block)
    kernel = _KERNELS[type_name]
    per_chunk = max(1, CHUNK // block)
    starts = list(range(0, n_blocks, per_chunk))
    n_threads = min(threads or default_threads(), len(starts))
    if n_blocks * block < THREADED_MIN or n_threads <= 1:
        _run(kernel, src, dst, starts, per_chunk)
        return out
    # Contiguous runs of chunks per thread: each thread streams its own part of the memory.
    per_thread = -(-len(starts) // n_threads)
    runs = [starts[i : i + per_thread] for i in range(0, len(starts), per_thread)]
    pool = _pool()
    for f in [pool.submit(_run, kernel, src, dst, run, per_chunk) for run in runs]:
        f.result()
    return out


Kernel = Callable[[np.ndarray, np.ndarray, "_Scratch"], None]


class _Scratch:
    """One thread's reusable intermediates for one type, sized for a full chunk."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def get(self, key: str, shape: tuple[int, ...], dtype: type) -> np.ndarray:
        a = self.arrays.get(key)
        if a is None or a.shape != shape or a.dtype != dtype:  # the last chunk is shorter
            a = self.arrays[key] = np.empty(shape, dtype)
        return a


def _run(kernel: Kernel, src: np.ndarray, dst: np.ndarray, starts: list[int], per_chunk: int) -> None:
    scratch = _Scratch()
    with np.errstate(all="ignore"):  # a NaN/inf scale gives NaN/inf values, as in llama.cpp
        for s in starts:
            kernel(src[s : s + per_chunk], dst[s : s + per_chunk], scratch)


_POOL: tuple[int, ThreadPoolExecutor] | None = None  # (the pid that made it, the pool)
_POOL_LOCK = threading.Lock()


def default_threads() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def _pool() -> ThreadPoolExecutor:
    """The process's pool. A forked child (a worker process) gets a new one: it inherits the
    parent's pool object but not its threads, and work handed to that would never run."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL[0] != os.getpid():
            _POOL = (os.getpid(), ThreadPoolExecutor(max_workers=default_threads(), thread_name_prefix="dequant"))
        return _POOL[1]


# --- kernels: (blocks [n, bytes] uint8, values [n, block] float32, scratch) ---------------------


def _f16(blocks: np.ndarray, scratch: _Scratch, first: int) -> np.ndarray:
    """The f16 at byte ``first`` of each block, as float32 ``[n, 1]`` (blocks of 34, 18 and 210
    bytes: every field starts on an even byte, so the bytes can be viewed as f16 in place)."""
    wide = scratch.get("d", (len(blocks), 1), np.float32)
    np.copyto(wide, blocks[:, first : first + 2].view(np.float16))
    return wide


def _k_f32(blocks: np.ndarray, out: np.ndarray, scratch: _Scratch) -> None:
    np.copyto(out, blocks.view(np.float32))


def _k_f16(blocks: np.ndarray, out: np.ndarray, scratch: _Scratch) -> None:
    np.copyto(out, blocks.view(np.float16))


def _k_bf16(blocks: np.ndarray, out: np.ndarray, scratch: _Scratch) -> None:
    # bf16 is the top half of a float32: widen each uint16 into the high half (exact).
    np.left_shift(blocks.view(np.uint16), 16, out=out.view(np.uint32), dtype=np.uint32)


def _k_q8_0(blocks: np.ndarray, out: np.ndarray, scratch: _Scratch) -> None:
    d = _f16(blocks, scratch, 0)
    np.copyto(out, blocks[:, 2:].view(np.int8))  # int8 -> float32 exactly
    np.multiply(out, d, out=out)  # the reference's x * d


def _k_q4_0(blocks: np.ndarray, out: np.ndarray, scratch: _Scratch) -> None:
    n = len(blocks)
    d = _f16(blocks, scratch, 0)
    q = scratch.get("q", (n, 2, 16), np.uint8)
    _split_nibbles(blocks[:, 2:], q)  # values 0..15: low nibbles; 16..31: high
    np.subtract(q, 8, out=q)  # wraps to the int8 q - 8 (exact)
    np.copyto(out, q.view(np.int8).reshape(n, 32))
    np.multiply(out, d, out=out)  # the reference's d * (q - 8)


def _split_nibbles(packed: np.ndarray, pairs: np.ndarray) -> None:
    """``pairs[..., 0, :] = packed & 15``, ``pairs[..., 1, :] = packed >> 4`` (``pairs`` a
    contiguous uint8 array, ``packed`` with its last axis even and contiguous). x86 has no
    8-bit vector shift, so numpy would shift bytes one at a time: the shift is done on 16-bit
    words (two bytes at once), then one long mask over all of ``pairs`` clears the stray bits."""
    np.copyto(pairs[..., 0, :], packed)
    np.right_shift(packed.view(np.uint16), 4, out=pairs[..., 1, :].view(np.uint16))
    np.bitwise_and(pairs, 0x0F, out=pairs)


_M6 = np.uint32(0x3F3F3F3F)  # the same byte mask in each byte of a word
_M4 = np.uint32(0x0F0F0F0F)
_M30 = np.uint32(0x30303030)
_HI_LO = np.array([[0], [4]], np.uint32)


def _k_scales(blocks: np.ndarray, scratch: _Scratch) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: ``(d·sc, dmin·m)`` as float32 ``[n, 8, 1]`` views (gguf's get_scale_min).

    Bytes 4..15 pack the 6-bit ``sc`` and ``m`` of the 8 sub-blocks: with ``lo``, ``mid``,
    ``hi`` the three 4-byte words, sub-blocks 0..3 have ``sc = lo & 63``, ``m = mid & 63``
    and 4..7 ``sc = (hi & 15) | (lo >> 6) << 4``, ``m = (hi >> 4) | (mid >> 6) << 4``. Done
    on whole words (four bytes at once, the masks repeated in each byte) with the blocks along
    the last axis, so each step is one long loop instead of one short loop per block.
    """
    n = len(blocks)
    words = scratch.get("words", (4, n), np.uint32)
    np.copyto(words.T, blocks[:, :16].view(np.uint32))  # [d|dmin, lo, mid, hi] per block
    dd = scratch.get("dd", (2, 1, n), np.float32)
    np.copyto(dd.reshape(2, n), words[0].view(np.float16).reshape(n, 2).T)
    packed = scratch.get("packed", (2, 2, n), np.uint32)  # [sc, m] x [sub-blocks 0..3, 4..7]
    top = scratch.get("top", (2, n), np.uint32)
    np.bitwise_and(words[1:3], _M6, out=packed[:, 0])
    np.right_shift(words[3], _HI_LO, out=packed[:, 1])
    np.bitwise_and(packed[:, 1], _M4, out=packed[:, 1])
    np.right_shift(words[1:3], 2, out=top)
    np.bitwise_and(top, _M30, out=top)
    np.bitwise_or(packed[:, 1], top, out=packed[:, 1])
    scales = scratch.get("scales", (2, 2, 4, n), np.float32)  # [sc, m] x sub-block x block
    np.copyto(scales, packed.view(np.uint8).reshape(2, 2, n, 4).transpose(0, 1, 3, 2))
    by_sub = scales.reshape(2, 8, n)
    np.multiply(by_sub, dd, out=by_sub)  # the reference's d * sc, dmin * m
    return by_sub[0].T.reshape(n, 8, 1), by_sub[1].T.reshape(n, 8, 1)


def _k_nibbles(qs: np.ndarray, scratch: _Scratch) -> np.ndarray:
    """128 bytes of nibbles per block -> uint8 ``[n, 8, 32]``: each run of 32 bytes gives 32
    low nibbles, then 32 high ones."""
    n = len(qs)
    q = scratch.get("q", (n, 4, 2, 32), np.uint8)
    _split_nibbles(qs.reshape(n, 4, 32), q)
    return q.reshape(n, 8, 32)


def _k_finish(q: np.ndarray, dsc: np.ndarray, dm: np.ndarray, out: np.ndarray) -> None:
    o = out.reshape(q.shape)
    np.copyto(o, q)
    np.multiply(o, dsc, out=o)
    np.subtract(o, dm, out=o)  # the reference's d * q - dm: two roundings, no fused multiply-add


def _k_q4_k(blocks: np.ndarray, out: np.ndarray, scratch: _Scratch) -> None:
    dsc, dm = _k_scales(blocks, scratch)
    _k_finish(_k_nibbles(blocks[:, 16:144], scratch), dsc, dm, out)


_BIT_SHIFT = np.arange(8, dtype=np.uint16).reshape(1, 8, 1)


def _k_q5_k(blocks: np.ndarray, out: np.ndarray, scratch: _Scratch) -> None:
    n = len(blocks)
    dsc, dm = _k_scales(blocks, scratch)
    q = _k_nibbles(blocks[:, 48:176], scratch)
    # bit j of qh[i] is the fifth bit of value i of sub-block j. On 16-bit words (see
    # _split_nibbles): (word >> j) & 0x0101 is bit j of both bytes, and << 4 puts it in place.
    h = scratch.get("h", (n, 8, 16), np.uint16)
    np.right_shift(blocks[:, None, 16:48].view(np.uint16), _BIT_SHIFT, out=h)
    np.bitwise_and(h, 0x0101, out=h)
    np.left_shift(h, 4, out=h)
    np.bitwise_or(q, h.view(np.uint8).reshape(n, 8, 32), out=q)
    _k_finish(q, dsc, dm, out)


_PAIR_SHIFT = np.array([0, 2, 4, 6], np.uint16).reshape(1, 1, 4, 1)


def _k_q6_k(blocks: np.ndarray, out: np.ndarray, scratch: _Scratch) -> None:
    n = len(blocks)
    d = _f16(blocks, scratch, 208)
    scales = scratch.get("s", (n, 16), np.float32)
    np.copyto(scales, blocks[:, 192:208].view(np.int8))
    np.multiply(d, scales, out=scales)  # the reference's d * scales
    # Value 128·h + 64·s + i (h, s in 0..1, i in 0..63): low nibble (s = 0) or high nibble
    # (s = 1) of ql[64·h + i]; value 128·h + 32·k + i (k in 0..3, i in 0..31): bits 2k, 2k+1
    # of qh[32·h + i] (shifted on 16-bit words, as in _split_nibbles).
    q = scratch.get("q", (n, 2, 2, 64), np.uint8)
    low = blocks[:, :128].reshape(n, 2, 64)
    _split_nibbles(low, q)
    h = scratch.get("h", (n, 2, 4, 16), np.uint16)
    np.right_shift(blocks[:, 128:192].view(np.uint16).reshape(n, 2, 1, 16), _PAIR_SHIFT, out=h)
    np.bitwise_and(h, 0x0303, out=h)
    np.left_shift(h, 4, out=h)
    flat = q.reshape(n, QK_K)
    np.bitwise_or(flat, h.view(np.uint8).reshape(n, QK_K), out=flat)
    np.subtract(flat, 32, out=flat)  # wraps to the int8 q - 32 (exact)
    np.copyto(out, flat.view(np.int8))
    # the reference's (d * scales) * q; one scale per 16 values: repeated once to full length,
    # a long multiply is cheaper than one short broadcast loop per 16 values
    np.multiply(out, np.repeat(scales.reshape(-1), 16).reshape(n, QK_K), out=out)


_KERNELS: dict[str, Kernel] = {
    "F32": _k_f32,
    "F16": _k_f16,
    "BF16": _k_bf16,
    "Q8_0": _k_q8_0,
    "Q4_0": _k_q4_0,
    "Q4_K": _k_q4_k,
    "Q5_K": _k_q5_k,
    "Q6_K": _k_q6_k,
}
