"""Rotary position embeddings, once, in numpy (docs/math.md, "Rotary layouts").

The frequencies (with every RoPE scaling headscope supports), the cos/sin factor of YaRN and
LongRoPE, the per-layer RoPE of Gemma 3's local layers, and the rotation itself: the forward
pass (``engine.forward.transformer``, which turns the frequencies into a tensor) and the
weight-only circuits (``rotary_matrix``, ``rope``) read them from here, so both rotate by the
same numbers. NeoX / Hugging Face ``rotate_half`` convention: dims ``(i, i + r/2)`` form a
pair rotated by ``position · inv_freq[i]`` on the first ``r = cfg.rotary_dim`` dims of a head;
the rest pass through (partial rotary).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from headscope.engine.core.config import ModelConfig
from headscope.engine.core.errors import ConfigError, InvalidRequestError

__all__ = ["ROPE_TYPES", "apply_rotary", "is_local_layer", "layer_config", "rope", "rotary_inv_freq",
           "rotary_matrix", "rotary_scale"]

ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")


def is_local_layer(cfg: ModelConfig, layer: int | None) -> bool:
    """Whether ``layer`` uses the sliding window: every layer unless ``extra["layer_types"]``
    (Hugging Face's per-layer ``"sliding_attention"``/``"full_attention"``) says otherwise."""
    types = cfg.extra.get("layer_types")
    if layer is None or not types:
        return True
    return types[layer] == "sliding_attention"


def layer_config(cfg: ModelConfig, layer: int) -> ModelConfig:
    """``cfg`` with the RoPE of ``layer``: Gemma 3's local layers rotate with their own base
    and scaling (``extra["rope_local"]``); every other model returns ``cfg`` itself."""
    local = cfg.extra.get("rope_local")
    if not local or not cfg.extra.get("layer_types") or not is_local_layer(cfg, layer):
        return cfg
    extra = {**cfg.extra, "rope_type": local.get("rope_type") or "default", "rope_scaling": local}
    return cfg.replace(rotary_base=float(local.get("rope_theta", cfg.rotary_base)), extra=extra)


def rotary_inv_freq(cfg: ModelConfig, path: str | None = None, seq_len: int | None = None) -> np.ndarray:
    """Rotation frequencies ``base^(-2i/r)`` (float32 ``[r/2]``) of the ``r = rotary_dim``
    rotated dims, with the RoPE scaling of ``cfg.extra["rope_type"]`` (``ROPE_TYPES``) as
    transformers computes it (in float32). LongRoPE depends on the sequence: its long factors
    apply once ``seq_len`` (positions ``0 .. seq_len-1``) exceeds the original context, its
    short ones otherwise. Other scalings raise ConfigError rather than give silently wrong
    patterns."""
    r = cfg.rotary_dim or cfg.d_head
    style = cfg.extra.get("rotary_style", "half")
    if style != "half":
        raise ConfigError(path, f"rotary style {style!r} is not supported (only NeoX/Llama 'half')")
    kind = cfg.extra.get("rope_type") or "default"
    inv_freq = (1.0 / (cfg.rotary_base ** (np.arange(0, r, 2, dtype=np.float32) / np.float32(r)))
                ).astype(np.float32)
    if kind == "default":
        return inv_freq
    params = cfg.extra.get("rope_scaling") or {}
    try:
        if kind == "linear":
            return (inv_freq / np.float32(params["factor"])).astype(np.float32)
        if kind == "llama3":
            return _llama3(inv_freq, params)
        if kind == "yarn":
            return _yarn(cfg, params, r)
        if kind == "longrope":
            long = seq_len is not None and seq_len > params["original_max_position_embeddings"]
            factors = np.asarray(params["long_factor" if long else "short_factor"], dtype=np.float32)
            shape = np.arange(0, r, 2, dtype=np.float32) / np.float32(r)
            return (np.float32(1.0) / (factors * np.float32(cfg.rotary_base) ** shape)).astype(np.float32)
    except KeyError as missing:
        raise ConfigError(path, f"RoPE scaling {kind!r} needs parameter {missing}") from None
    raise ConfigError(path, f"RoPE scaling {kind!r} is not supported ({', '.join(ROPE_TYPES)})")


def _llama3(inv_freq: np.ndarray, params: dict[str, Any]) -> np.ndarray:
    """Llama 3.1's scaling (transformers' ``_compute_llama3_parameters``): long wavelengths
    divided by ``factor``, short ones kept, a smooth blend between."""
    factor, low = float(params["factor"]), float(params["low_freq_factor"])
    high, old_ctx = float(params["high_freq_factor"]), float(params["original_max_position_embeddings"])
    wavelen = np.float32(2 * np.pi) / inv_freq
    scaled = np.where(wavelen > old_ctx / low, inv_freq / np.float32(factor), inv_freq)
    smooth = (np.float32(old_ctx) / wavelen - np.float32(low)) / np.float32(high - low)
    smoothed = (1 - smooth) * scaled / np.float32(factor) + smooth * scaled
    medium = ~(wavelen < old_ctx / high) & ~(wavelen > old_ctx / low)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def _yarn(cfg: ModelConfig, params: dict[str, Any], r: int) -> np.ndarray:
    """YaRN (transformers' ``_compute_yarn_parameters``): each frequency interpolated (divided by
    ``factor``) or kept, with a linear ramp between the dims that turn ``beta_fast`` and
    ``beta_slow`` times over the original context."""
    base, original = cfg.rotary_base, float(params["original_max_position_embeddings"])
    factor = params.get("factor")
    factor = float(factor) if factor is not None else cfg.n_ctx / original
    beta_fast, beta_slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (r * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, r - 1)
    if low == high:
        high += 0.001  # as transformers: no division by zero
    ramp = np.clip((np.arange(r // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    pos_freqs = np.float32(base) ** (np.arange(0, r, 2, dtype=np.float32) / np.float32(r))
    keep = 1 - ramp  # extrapolation weight
    one = np.float32(1.0)
    return ((one / (np.float32(factor) * pos_freqs)) * (1 - keep) + (one / pos_freqs) * keep).astype(np.float32)


def rotary_scale(cfg: ModelConfig) -> float:
    """What YaRN and LongRoPE multiply cos and sin by (transformers' ``attention_scaling``),
    1 for the other scalings: the rotated dims of queries and keys are scaled by it, so their
    part of each score by its square (``attention_factor`` if the config gives it, else
    ``0.1 ln(s) + 1`` (YaRN, with DeepSeek's ``mscale`` / ``mscale_all_dim``) or
    ``sqrt(1 + ln(s) / ln(original context))`` (LongRoPE) for a scaling factor ``s > 1``)."""
    kind = cfg.extra.get("rope_type") or "default"
    if kind not in ("yarn", "longrope"):
        return 1.0
    params = cfg.extra.get("rope_scaling") or {}
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    original = float(params["original_max_position_embeddings"])
    factor = params.get("factor")
    factor = float(factor) if factor is not None else cfg.n_ctx / original
    if kind == "longrope":
        return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    m, m_all = params.get("mscale"), params.get("mscale_all_dim")
    if m and m_all:
        return float(mscale(factor, m) / mscale(factor, m_all))
    return mscale(factor)


def apply_rotary(x: np.ndarray, angles: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """Rotate the first ``r = 2·angles.shape[-1]`` dims of ``x`` by ``angles`` (broadcast
    against ``x[..., :r/2]``; cos and sin taken in the angles' precision, then cast to
    ``x``'s dtype, as the forward pass does), times ``scale``; the rest pass through."""
    r = 2 * angles.shape[-1]
    cos, sin = np.cos(angles), np.sin(angles)
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    cos = np.concatenate((cos, cos), axis=-1).astype(x.dtype)
    sin = np.concatenate((sin, sin), axis=-1).astype(x.dtype)
    x_rot, x_pass = x[..., :r], x[..., r:]
    rotated = np.concatenate((-x_rot[..., r // 2:], x_rot[..., : r // 2]), axis=-1)  # rotate_half
    return np.concatenate((x_rot * cos + rotated * sin, x_pass), axis=-1)


def require_rotary(cfg: ModelConfig, path: str | None) -> None:
    if cfg.positional != "rotary":
        raise InvalidRequestError(
            path, f"rotary circuits need rotary positions; this model's are {cfg.positional!r}")


def rope(x: np.ndarray, positions: np.ndarray, cfg: ModelConfig, path: str | None = None) -> np.ndarray:
    """Rotate row vectors ``x [..., d_head]`` (float32) to ``positions`` (broadcast against
    ``x[..., 0]``), with the checkpoint's RoPE scaling; angles in float64. LongRoPE: the
    factors of a sequence reaching the largest position asked for."""
    positions = np.asarray(positions, dtype=np.float64)
    x = np.broadcast_to(x, np.broadcast_shapes(x.shape, (*positions.shape, x.shape[-1])))
    seq_len = int(positions.max()) + 1 if positions.size else None
    inv_freq = rotary_inv_freq(cfg, path, seq_len=seq_len).astype(np.float64)
    return apply_rotary(x, positions[..., None] * inv_freq, rotary_scale(cfg))


def rotary_matrix(cfg: ModelConfig, offset: int, path: str | None = None) -> np.ndarray:
    """``R(Δ) [d_head, d_head]`` (float32) with ``rope(x, p) = x @ R(p)``.

    Rotations compose, ``R(i) R(j)ᵀ = R(i - j)``, so the score of a query at position ``i``
    and a key at ``j`` is ``q R(i) (k R(j))ᵀ = q R(i - j) kᵀ``: it depends on ``Δ = i - j`` only.
    """
    require_rotary(cfg, path)
    eye = np.eye(cfg.d_head, dtype=np.float32)
    return rope(eye, np.full((cfg.d_head,), float(offset)), cfg, path)
