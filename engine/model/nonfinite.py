"""Which heads have a NaN or an infinity in an attention weight or bias (docs/math.md,
"Scores"). The weight sweep (engine.circuits.spectral) and the forward-pass sweeps
(engine.forward.behaviour) flag the same heads, so both ask here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from headscope.engine.core.numeric import max_abs

__all__ = ["HEAD_BIASES", "HEAD_WEIGHTS", "biases_nonfinite", "layer_nonfinite"]

HEAD_WEIGHTS = ("W_Q", "W_K", "W_V", "W_O")
HEAD_BIASES = ("b_Q", "b_K", "b_V")


def biases_nonfinite(w: Any, layer: int) -> np.ndarray:
    """``[H]`` bool: heads of ``layer`` with a NaN/inf in a Q, K or V bias."""
    bad = np.zeros(w.cfg.n_heads, bool)
    for name in HEAD_BIASES:
        if w.has(f"blocks.{layer}.attn.{name}"):
            with np.errstate(invalid="ignore", over="ignore"):
                bad |= ~np.isfinite(w.get(f"blocks.{layer}.attn.{name}").sum(-1))
    return bad


def layer_nonfinite(w: Any, layer: int) -> np.ndarray:
    """``[H]`` bool: heads of ``layer`` with a NaN/inf in a weight or bias."""
    bad = biases_nonfinite(w, layer)
    for name in HEAD_WEIGHTS:
        bad |= ~np.isfinite(max_abs(w.get(f"blocks.{layer}.attn.{name}")))
    return bad
