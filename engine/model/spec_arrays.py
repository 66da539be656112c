"""What a spec (``engine.model.adapters.base``) does to the stored array it reads: scale and
shift (``Whole``), one head's strided slice (``Heads``), GPT-J's rotary pairs reordered, and
which stored tensors several specs share (read whole, then cut)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from headscope.engine.model.adapters.base import Heads, Spec, Whole, spec_parts


def affine(t: np.ndarray, spec: Whole) -> np.ndarray:
    """``t * spec.scale + spec.add`` (float32) in place (``t`` is a fresh float32 array)."""
    if spec.scale != 1.0:
        t *= np.float32(spec.scale)
    if spec.add != 0.0:
        t += np.float32(spec.add)
    return t


def deinterleaved(block: np.ndarray, r: int) -> np.ndarray:
    """The last axis (a head's dims) with its first ``r`` reordered from interleaved rotary pairs
    ``(2i, 2i+1)`` to rotate-half pairs ``(i, i + r/2)``: evens, then odds, then the rest."""
    order = np.concatenate([np.arange(0, r, 2), np.arange(1, r, 2), np.arange(r, block.shape[-1])])
    return block[..., order]


def head_view(t: np.ndarray, spec: Heads, stored: int) -> np.ndarray:
    """``stack([t.narrow(spec.axis, spec.offset + i * spec.stride, spec.size) for i in
    range(stored)])`` as a strided view of ``t`` (no copy)."""
    t = np.ascontiguousarray(t)
    shape, strides = list(t.shape), list(t.strides)
    shape[spec.axis] = spec.size
    start = t[(slice(None),) * spec.axis + (slice(spec.offset, None),)]
    return np.lib.stride_tricks.as_strided(
        start, (stored, *shape), (spec.stride * strides[spec.axis], *strides))


def shared_tensors(specs: Mapping[str, Spec]) -> frozenset[str]:
    """The stored tensors that back more than one canonical tensor, or whose heads are cut
    along a later axis than the first (a part of them cannot be read alone)."""
    uses: dict[str, int] = {}
    columns = set()
    for spec in specs.values():
        for part in spec_parts(spec):
            uses[part.tensor] = uses.get(part.tensor, 0) + 1
            if isinstance(part, Heads) and part.axis > 0:
                columns.add(part.tensor)
    return frozenset(columns | {t for t, n in uses.items() if n > 1})
