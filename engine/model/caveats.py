"""Where a model bends the bilinear picture of the circuits (docs/math.md).

The QK circuit ``W_Q W_Kᵀ`` is the attention score exactly when the score is a bilinear form
of the (normalised) residual stream. Some families add a non-linearity the circuits cannot
carry; the structure (``approximations``), circuit blocks (``note``) and the CLI say so, as
the explorer explains weight folding. Reads the config only (no torch).
"""

from __future__ import annotations

from headscope.engine.core.config import ModelConfig

__all__ = ["model_caveats", "ov_caveats", "qk_caveats"]


def qk_caveats(cfg: ModelConfig) -> list[str]:
    """Why this model's QK circuits are not its attention scores (empty: they are, up to
    biases, RoPE and the 1/scale factor)."""
    notes = []
    kind = cfg.extra.get("qk_norm")
    if kind == "layer":
        notes.append("QK omits the q/k LayerNorm (per head): scores are not bilinear in the residual")
    elif kind:
        where = "per head" if kind == "head" else "over the whole projection"
        notes.append(f"QK omits the q/k RMSNorm ({where}): scores are not bilinear in the residual")
    cap = cfg.extra.get("attn_softcap")
    if cap:
        notes.append(f"scores soft-capped to ±{cap:g} (tanh) after QK")
    return notes


def ov_caveats(cfg: ModelConfig) -> list[str]:
    """Why a head's OV circuit (and its direct logit attribution) is only proportional to
    what it writes: a norm on the summed attention output, or capped logits."""
    notes = []
    if cfg.extra.get("post_attn_norm"):
        notes.append("OV omits the RMSNorm applied to the attention output (all heads together)")
    cap = cfg.extra.get("final_softcap")
    if cap:
        notes.append(f"logits soft-capped to ±{cap:g} (tanh)")
    return notes


def model_caveats(cfg: ModelConfig) -> list[str]:
    """Every caveat of the model, for ``structure()["approximations"]``."""
    return qk_caveats(cfg) + ov_caveats(cfg)
