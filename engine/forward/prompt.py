"""One prompt through the model, every head at once: what the explorer's Prompt view shows
(``sweeps.prompts.run_prompt`` labels it, the ``Engine`` caches it; this module runs torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from headscope.engine.forward.torch_weights import torch_weights
from headscope.engine.forward.transformer import ForwardResult, run
from headscope.engine.model.weights import WeightSource

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["PromptPass", "direct_logit_attribution", "prompt_pass"]


@dataclass(frozen=True)
class PromptPass:
    """A prompt's forward pass as numpy: no tensor leaves the forward layer."""

    patterns: np.ndarray  # [L, H, q, k] float32
    dla: np.ndarray  # [L, H, pos] float32
    predicted: tuple[int, ...]  # next-token argmax per position (what ``dla`` attributes to)
    top: tuple[tuple[int, float], ...]  # (token id, probability) after the last position


def prompt_pass(w: WeightSource, ids: Sequence[int], top_k: int = 10) -> PromptPass:
    """Run ``ids`` (validated, at most ``n_ctx``): patterns, DLA and the ``top_k`` next tokens."""
    import torch

    result = run(w, list(ids), return_head_outputs=True)
    logits = result.logits[0]  # [pos, vocab]
    predicted = logits.argmax(dim=-1)  # [pos]
    dla = direct_logit_attribution(w, result, predicted)
    probs = torch.softmax(logits[-1], dim=-1)
    p_top, i_top = torch.topk(probs, min(top_k, probs.shape[0]))
    return PromptPass(
        patterns=result.patterns[0].detach().numpy().astype(np.float32, copy=False),
        dla=dla.detach().numpy().astype(np.float32, copy=False),
        predicted=tuple(int(i) for i in predicted),
        top=tuple((int(i), float(p)) for p, i in zip(p_top, i_top, strict=True)),
    )


def direct_logit_attribution(w: WeightSource, result: ForwardResult, predicted: Any) -> Tensor:
    """[L, H, pos]: each head's output at each position, through the final norm's scale,
    dotted with ``W_U[:, predicted[pos]]`` — its direct share of that position's top logit.

    LayerNorm subtracts the mean, so the head output is centred first (a no-op on processed
    weights, whose writing weights are centred); on raw weights the final norm's gain, not
    yet folded into ``W_U``, multiplies it. Post-LN models (BERT) have no such linear
    decomposition: NaN.
    """
    import torch

    w = torch_weights(w)
    cfg = w.cfg
    out = result.head_outputs[0]  # [L, H, pos, d_model]
    if result.final_scale is None:
        return torch.full(out.shape[:3], float("nan"))
    if cfg.normalization in ("LN", "LNPre"):
        out = out - out.mean(dim=-1, keepdim=True)
    out = out / result.final_scale[0]  # [pos, 1] broadcasts over L, H
    if cfg.normalization in ("LN", "RMS") and w.has("ln_final.w"):
        out = out * w.get("ln_final.w")
    w_u = w.get("unembed.W_U")[:, predicted]  # [d_model, pos]
    return torch.einsum("lhpd,dp->lhp", out, w_u)
