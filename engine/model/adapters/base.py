"""What every family adapter is built from (docs/internals.md, "Canonical weight names"):
the spec types (``Whole`` / ``Heads`` / ``Rows`` / ``Zeros`` / ``Product``), the checks of a
spec map against the safetensors headers, per-head layouts shared by several families, and
the ``config.json`` readers and validation. The families (``gpt2.py``, ``llama.py``, ...)
import this module; ``registry.py`` imports the families, so nothing imports itself back.

Nothing here imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from headscope.engine.core.config import ModelConfig
from headscope.engine.core.errors import (
    ConfigError,
    MissingTensorError,
    ShapeMismatchError,
)
from headscope.engine.formats.safetensors import DTYPE_NAMES, TensorInfo


@dataclass(frozen=True)
class Whole:
    """The canonical tensor is the checkpoint tensor ``tensor`` (transposed if asked), times
    ``scale`` plus ``add`` (Gemma: embeddings scaled by √d_model, RMSNorm gains stored as
    ``w`` for a ``1 + w`` gain; docs/math.md)."""

    tensor: str
    shape: tuple[int, ...]  # expected checkpoint shape
    transpose: bool = False
    scale: float = 1.0
    add: float = 0.0


@dataclass(frozen=True)
class Heads:
    """A per-head canonical tensor ``[n_heads, ...]`` cut out of one checkpoint tensor.

    Stored head ``i`` is ``tensor.narrow(axis, offset + i * stride, size)``, transposed
    (last two dims) if ``transpose``, with ``axis`` squeezed away if ``squeeze`` (native
    layout, where the head is already a leading dimension). ``kv``: the checkpoint stores
    only ``cfg.kv_heads`` heads and query head ``h`` reads stored head ``cfg.kv_head_of(h)``.
    """

    tensor: str
    shape: tuple[int, ...]
    axis: int
    offset: int
    stride: int
    size: int
    transpose: bool = False
    kv: bool = False
    squeeze: bool = False
    # GPT-J's interleaved rotary pairs dims (2i, 2i+1) of the first ``deinterleave`` dims; the
    # canonical (rotate-half) layout pairs (i, i + r/2). Reordering Q and K alike leaves every
    # score q·k unchanged (docs/math.md, "Rotary layouts").
    deinterleave: int = 0


@dataclass(frozen=True)
class Rows(Whole):
    """Rows ``[offset, offset + size)`` of the checkpoint tensor ``tensor`` (then transposed if
    asked): one part of a fused tensor, e.g. the gate half of Phi-3's ``gate_up_proj``."""

    offset: int = 0
    size: int = 0


@dataclass(frozen=True)
class Zeros:
    """An absent bias: zeros of the canonical shape."""

    shape: tuple[int, ...]


@dataclass(frozen=True)
class Product:
    """The canonical tensor is the matrix product of two checkpoint tensors, each read as a
    ``Whole`` spec: OPT-350m's embeddings through ``project_in`` (``W_E = E P_inᵀ``) and its
    unembedding after ``project_out`` (``W_U = P_outᵀ Eᵀ``). Exact: both are linear maps
    applied in sequence."""

    left: Whole
    right: Whole


Spec = Whole | Heads | Zeros | Product
SpecMap = dict[str, Spec]
# What every family's ``adapt(config, arch, names, path)`` returns.
Adapted = tuple[ModelConfig, SpecMap]


def spec_parts(spec: Spec) -> tuple[Whole | Heads, ...]:
    """The checkpoint reads a spec makes (none for ``Zeros``, two for a ``Product``)."""
    if isinstance(spec, Zeros):
        return ()
    if isinstance(spec, Product):
        return (spec.left, spec.right)
    return (spec,)


class TensorNames(set[str]):
    """The checkpoint's tensor names, with how many parameters they hold in all
    (``checked`` bounds the work a config may ask for by what the header really contains)."""

    def __init__(self, names: Iterable[str], numel: int) -> None:
        super().__init__(names)
        self.numel = numel


def spec_tensors(specs: Mapping[str, Spec]) -> set[str]:
    """Checkpoint tensor names the specs read."""
    return {part.tensor for s in specs.values() for part in spec_parts(s)}


def check_specs(
    specs: Mapping[str, Spec],
    tensors: Mapping[str, TensorInfo],
    where: Callable[[str], str],
    architecture: str,
) -> None:
    """Every tensor the specs read exists in the checkpoint with the expected shape.

    ``where(name)`` gives the file a tensor lives in (or should live in), for the error.
    """
    for canonical, whole in specs.items():
        for spec in spec_parts(whole):
            _check_part(canonical, spec, tensors, where, architecture)


def _check_part(canonical: str, spec: Whole | Heads, tensors: Mapping[str, TensorInfo],
                where: Callable[[str], str], architecture: str) -> None:
    """One checkpoint tensor a spec reads exists, with the expected shape and a float dtype."""
    info = tensors.get(spec.tensor)
    if info is None:
        raise MissingTensorError(
            where(spec.tensor),
            f"missing tensor {spec.tensor!r} (needed for {canonical} of {architecture})",
        )
    if info.shape != spec.shape:
        raise ShapeMismatchError(
            where(spec.tensor),
            f"tensor {spec.tensor!r} has shape {list(info.shape)}, expected "
            f"{list(spec.shape)} for {architecture}",
        )
    if info.dtype not in ("F32", "F16", "BF16", "F64"):
        raise ConfigError(
            where(spec.tensor),
            f"tensor {spec.tensor!r} has dtype {info.dtype}; only float weights are supported",
        )


def storage_dtype(specs: Mapping[str, Spec], tensors: Mapping[str, TensorInfo]) -> str:
    """The dtype most of the model's bytes are stored in, as torch names it."""
    by_dtype: dict[str, int] = {}
    for name in spec_tensors(specs):
        info = tensors.get(name)
        if info is not None:
            by_dtype[info.dtype] = by_dtype.get(info.dtype, 0) + info.nbytes
    if not by_dtype:
        return "float32"
    return DTYPE_NAMES[max(by_dtype, key=lambda d: by_dtype[d])]


def count_params(specs: Mapping[str, Spec], tensors: Mapping[str, TensorInfo]) -> int:
    """Parameters the model uses (each checkpoint tensor once, tied ones counted once)."""
    return sum(tensors[n].numel for n in spec_tensors(specs) if n in tensors)


# --- per-head layouts shared by several families ---------------------------------------


def linear_heads(
    tensor: str, cfg: ModelConfig, n_stored: int, *, kv: bool = False, offset: int = 0
) -> Heads:
    """nn.Linear ``[n_stored * d_head, d_model]`` (rows = out features) -> ``W [h, d_model, d_head]``."""
    rows = n_stored * cfg.d_head
    return Heads(
        tensor,
        (rows, cfg.d_model),
        axis=0,
        offset=offset,
        stride=cfg.d_head,
        size=cfg.d_head,
        transpose=True,
        kv=kv,
    )


def linear_bias_heads(tensor: str, cfg: ModelConfig, n_stored: int, *, kv: bool = False) -> Heads:
    """Bias ``[n_stored * d_head]`` -> ``b [h, d_head]``."""
    return Heads(
        tensor,
        (n_stored * cfg.d_head,),
        axis=0,
        offset=0,
        stride=cfg.d_head,
        size=cfg.d_head,
        kv=kv,
    )


def linear_out_heads(tensor: str, cfg: ModelConfig) -> Heads:
    """nn.Linear output projection ``[d_model, n_heads * d_head]`` -> ``W_O [h, d_head, d_model]``."""
    return Heads(
        tensor,
        (cfg.d_model, cfg.n_heads * cfg.d_head),
        axis=1,
        offset=0,
        stride=cfg.d_head,
        size=cfg.d_head,
        transpose=True,
    )


def linear(tensor: str, d_in: int, d_out: int) -> Whole:
    """nn.Linear weight ``[d_out, d_in]`` -> canonical ``[d_in, d_out]`` (row vectors)."""
    return Whole(tensor, (d_out, d_in), transpose=True)


def vec(tensor: str, n: int) -> Whole:
    return Whole(tensor, (n,))


def embed_specs(cfg: ModelConfig, embed: str, tied: bool, *, unembed_bias: bool = False) -> SpecMap:
    """``W_E`` from ``embed`` ``[d_vocab, d_model]``; ``W_U`` its transpose when ``tied``, else
    ``lm_head.weight``'s; ``b_U`` is ``lm_head.bias`` or zeros."""
    v, dm = cfg.d_vocab, cfg.d_model
    return {
        "embed.W_E": Whole(embed, (v, dm)),
        "unembed.W_U": Whole(embed if tied else "lm_head.weight", (v, dm), transpose=True),
        "unembed.b_U": vec("lm_head.bias", v) if unembed_bias else Zeros((v,)),
    }


def norm_specs(canonical: str, tensor: str, d: int, *, bias: bool = True) -> SpecMap:
    """A LayerNorm's gain and bias (``{tensor}.weight`` / ``.bias``) as ``{canonical}.w`` /
    ``.b``; ``bias=False``: an RMSNorm's gain alone."""
    out: SpecMap = {f"{canonical}.w": vec(f"{tensor}.weight", d)}
    if bias:
        out[f"{canonical}.b"] = vec(f"{tensor}.bias", d)
    return out


def attention_specs(
    block: str, cfg: ModelConfig, q: str, k: str, v: str, o: str,
    *, qkv_bias: bool, o_bias: bool, grouped: bool = False,
) -> SpecMap:
    """Block ``block``'s attention from separate ``nn.Linear`` projections (``{q}.weight``,
    ``{q}.bias``, ...); ``grouped``: K and V store only ``cfg.kv_heads`` heads. An absent bias
    is zeros."""
    n, dh, dm = cfg.n_heads, cfg.d_head, cfg.d_model
    out: SpecMap = {}
    for x, tensor in zip("QKV", (q, k, v), strict=True):
        kv = grouped and x != "Q"
        stored = cfg.kv_heads if kv else n
        out[f"{block}attn.W_{x}"] = linear_heads(f"{tensor}.weight", cfg, stored, kv=kv)
        out[f"{block}attn.b_{x}"] = (
            linear_bias_heads(f"{tensor}.bias", cfg, stored, kv=kv) if qkv_bias else Zeros((n, dh))
        )
    out[f"{block}attn.W_O"] = linear_out_heads(f"{o}.weight", cfg)
    out[f"{block}attn.b_O"] = vec(f"{o}.bias", dm) if o_bias else Zeros((dm,))
    return out


def mlp_specs(
    block: str, cfg: ModelConfig, w_in: str, w_out: str, *, gate: str | None = None, bias: bool = True
) -> SpecMap:
    """Block ``block``'s MLP ``w_out(act(w_in x))`` from ``nn.Linear`` layers (``gate``:
    ``w_out(w_in x * act(gate x))``, no biases); an absent bias is zeros."""
    dm, mlp = cfg.d_model, cfg.d_mlp or 4 * cfg.d_model
    out: SpecMap = {}
    if gate is not None:
        out[f"{block}mlp.W_gate"] = linear(f"{gate}.weight", dm, mlp)
    out[f"{block}mlp.W_in"] = linear(f"{w_in}.weight", dm, mlp)
    out[f"{block}mlp.b_in"] = vec(f"{w_in}.bias", mlp) if bias else Zeros((mlp,))
    out[f"{block}mlp.W_out"] = linear(f"{w_out}.weight", mlp, dm)
    out[f"{block}mlp.b_out"] = vec(f"{w_out}.bias", dm) if bias else Zeros((dm,))
    return out


# --- one decoder default ------------------------------------------------------------------

# Where config.json keeps each shape field, as most families spell it (transformers' names);
# a family passes a value only where its config differs (GPT-2: n_embd, n_head, n_layer, ...).
SHAPE_KEYS: dict[str, tuple[str, ...]] = {
    "n_layers": ("num_hidden_layers",),
    "n_heads": ("num_attention_heads",),
    "d_model": ("hidden_size",),
    "d_vocab": ("vocab_size",),
    "n_ctx": ("max_position_embeddings",),
    "d_mlp": ("intermediate_size",),
}


def decoder_config(
    config: Mapping[str, Any],
    arch: str,
    names: set[str],
    path: str | None,
    *,
    rope: float | None = None,
    extra: Mapping[str, Any] | None = None,
    **fields: Any,
) -> ModelConfig:
    """A family's ``ModelConfig``: what differs from the one default, given as ``fields``;
    every shape field not given read from ``config.json`` (``SHAPE_KEYS``; ``d_head``:
    ``head_dim``, else ``d_model / n_heads``); ``rope``: rotate-half RoPE on that default
    fraction of each head (``rope_fields``; ``fields`` and ``extra`` win over it); the rest
    ``ModelConfig``'s defaults (pre-LN LayerNorm, learned positions, causal, attention scaled
    by √d_head). Returned ``checked``: before any per-layer spec is built."""
    for name, keys in SHAPE_KEYS.items():
        if name not in fields:
            fields[name] = require_int(config, path, *keys)
    if "d_head" not in fields:
        fields["d_head"] = (
            require_int(config, path, "head_dim")
            if get_key(config, "head_dim") is not None
            else divide_heads(path, fields["d_model"], fields["n_heads"])
        )
    if rope is not None:
        rotary, rotary_extra = rope_fields(config, path, fields["d_head"], rope)
        fields = {**rotary, **fields}
        extra = {**rotary_extra, **(extra or {})}
    cfg = ModelConfig(architecture=arch, extra=dict(extra or {}), **fields)
    return checked(cfg, names, path)


def rope_fields(
    config: Mapping[str, Any], path: str | None, d_head: int, fraction: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Rotate-half RoPE as Hugging Face configs describe it, old and new spellings alike: on
    the first ``partial_rotary_factor`` (default ``fraction``) of each head's dims, base
    ``rope_theta``, scaled as ``rope_scaling`` says. (``ModelConfig`` fields, ``extra``)."""
    pct = optional_float(
        config, path, "rope_parameters.partial_rotary_factor", "rotary_pct", "partial_rotary_factor",
        default=fraction, within=(0.0, 1.0),
    )
    fields = {
        "positional": "rotary",
        "rotary_dim": int(d_head * pct),  # as transformers computes rotary_ndims
        "rotary_base": optional_float(
            config, path, "rope_parameters.rope_theta", "rope_theta", "rotary_emb_base", default=10000.0
        ),
    }
    extra = {
        "rotary_style": "half",
        # The scaling parameters (factor, low/high_freq_factor, ...) that
        # engine.model.rotary.rotary_inv_freq needs for "linear"/"llama3"/... RoPE.
        "rope_scaling": rope_scaling_params(config),
        "rope_type": get_key(
            config, "rope_parameters.rope_type", "rope_scaling.rope_type", "rope_scaling.type",
            default="default",
        ),
    }
    return fields, extra


# --- config.json helpers ------------------------------------------------------------------


def rope_scaling_params(config: Mapping[str, Any]) -> dict[str, Any]:
    """RoPE scaling parameters: ``rope_parameters`` (transformers ≥ 5) or ``rope_scaling``."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    params = dict(params) if isinstance(params, Mapping) else {}
    # Phi-3 long-context configs keep the original context beside rope_scaling (transformers
    # moves it into rope_parameters); YaRN / LongRoPE need it.
    if params and params.get("original_max_position_embeddings") is None:
        original = config.get("original_max_position_embeddings")
        if original is not None:
            params["original_max_position_embeddings"] = original
    return params


def get_key(cfg: Mapping[str, Any], *paths: str, default: Any = None) -> Any:
    """First present key among ``paths``; ``"a.b"`` looks into nested dicts.

    Used to read old and new spellings alike (transformers renames config keys), e.g.
    ``get_key(c, "rope_parameters.rope_theta", "rope_theta", "rotary_emb_base")``.
    """
    for path in paths:
        node: Any = cfg
        for part in path.split("."):
            if isinstance(node, Mapping) and part in node and node[part] is not None:
                node = node[part]
            else:
                break
        else:
            return node
    return default


def require_int(cfg: Mapping[str, Any], path: str | None, *keys: str, minimum: int = 1) -> int:
    value = get_key(cfg, *keys)
    if value is None:
        raise ConfigError(path, f"config is missing {' / '.join(keys)}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(path, f"config field {keys[0]} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(path, f"config field {keys[0]} must be >= {minimum}, got {value}")
    return value


def optional_float(
    cfg: Mapping[str, Any],
    path: str | None,
    *keys: str,
    default: float,
    within: tuple[float, float] | None = None,
) -> float:
    """A finite number (in ``(low, high]`` if ``within`` is given)."""
    value = get_key(cfg, *keys, default=default)
    if not is_number(value):
        raise ConfigError(path, f"config field {keys[0]} must be a finite number, got {value!r}")
    if within is not None and not within[0] < value <= within[1]:
        raise ConfigError(
            path, f"config field {keys[0]} must be in ({within[0]:g}, {within[1]:g}], got {value!r}"
        )
    return float(value)


def is_number(value: object) -> bool:
    """A finite int or float (not a bool, not a string that looks like one)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:  # an int beyond float range
        return False


def optional_bool(cfg: Mapping[str, Any], path: str | None, key: str, default: bool) -> bool:
    value = cfg.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(path, f"config field {key} must be true or false, got {value!r}")
    return value


def divide_heads(path: str | None, d_model: int, n_heads: int) -> int:
    if d_model % n_heads:
        raise ConfigError(path, f"d_model {d_model} is not divisible by n_heads {n_heads}")
    return d_model // n_heads


def validate_config(cfg: ModelConfig, path: str | None) -> ModelConfig:
    """Family-independent checks on a built ``ModelConfig``."""
    for name in ("n_layers", "n_heads", "d_model", "d_head", "d_vocab", "n_ctx"):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(path, f"{name} must be a positive integer, got {value!r}")
    kv = cfg.n_kv_heads
    if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int) or kv < 1):
        raise ConfigError(path, f"n_kv_heads must be a positive integer, got {kv!r}")
    if cfg.n_heads % cfg.kv_heads:
        raise ConfigError(
            path, f"n_heads {cfg.n_heads} is not divisible by n_kv_heads {cfg.kv_heads}"
        )
    d_mlp = cfg.d_mlp
    if d_mlp is not None and (isinstance(d_mlp, bool) or not isinstance(d_mlp, int) or d_mlp < 1):
        raise ConfigError(path, f"d_mlp must be a positive integer, got {cfg.d_mlp!r}")
    if cfg.act_fn is not None and not isinstance(cfg.act_fn, str):
        raise ConfigError(path, f"activation must be a name, got {cfg.act_fn!r}")
    if cfg.positional == "rotary":
        rd = cfg.rotary_dim
        if not isinstance(rd, int) or rd < 2 or rd > cfg.d_head or rd % 2:
            raise ConfigError(
                path, f"rotary_dim must be an even number in [2, d_head={cfg.d_head}], got {rd!r}"
            )
    _check_math_values(cfg, path)
    check_features(cfg, path)
    return cfg


def _positive_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value) and value > 0


def check_features(cfg: ModelConfig, path: str | None) -> None:
    """The ``cfg.extra`` features the forward pass reads (docs/internals.md) have the right
    types: adapters set them, but a native config can carry any key."""
    extra = cfg.extra
    window = extra.get("sliding_window")
    if window is not None and not (_positive_number(window) and int(window) == window):
        raise ConfigError(path, f"sliding_window must be a positive integer, got {window!r}")
    types = extra.get("layer_types")
    if types is not None and not (
        isinstance(types, list) and len(types) == cfg.n_layers and all(isinstance(t, str) for t in types)
    ):
        raise ConfigError(path, f"layer_types must name the attention kind of each of the {cfg.n_layers} layers")
    for key in ("attn_softcap", "final_softcap"):
        if extra.get(key) is not None and not _positive_number(extra[key]):
            raise ConfigError(path, f"{key} must be a positive number, got {extra[key]!r}")
    if extra.get("qk_norm") not in (None, "head", "projection", "layer"):
        raise ConfigError(path, f"qk_norm must be 'head', 'projection' or 'layer', got {extra['qk_norm']!r}")
    local = extra.get("rope_local")
    if local is not None and not (isinstance(local, Mapping) and _positive_number(local.get("rope_theta"))):
        raise ConfigError(path, "rope_local must give a positive rope_theta")
    n, k = extra.get("n_experts"), extra.get("experts_per_token")
    if n is not None and not (
        isinstance(n, int) and isinstance(k, int) and not isinstance(n, bool) and not isinstance(k, bool)
        and 1 <= k <= n
    ):
        raise ConfigError(path, f"n_experts / experts_per_token must be integers with 1 <= k <= n, got {n!r} / {k!r}")


# Largest rotary base whose powers stay finite in float32 (the dtype of the frequencies).
_MAX_ROTARY_BASE = 1e30


def _check_math_values(cfg: ModelConfig, path: str | None) -> None:
    """Values the forward pass and the circuits compute with: each must give finite
    numbers (an accepted ``rope_theta`` of 1e-300 made every pattern NaN)."""
    if not (is_number(cfg.norm_eps) and 0 <= cfg.norm_eps <= 1):
        raise ConfigError(path, f"norm_eps (layer norm epsilon) must be a number in [0, 1], got {cfg.norm_eps!r}")
    if cfg.positional == "rotary" and not (
        is_number(cfg.rotary_base) and 1 < cfg.rotary_base <= _MAX_ROTARY_BASE
    ):
        raise ConfigError(
            path,
            f"rope_theta (rotary base) must be a number in (1, {_MAX_ROTARY_BASE:g}], got "
            f"{cfg.rotary_base!r}: RoPE frequencies base^(-2i/d) would not be finite and decreasing",
        )
    scale = cfg.attn_scale
    if scale is not None and not (is_number(scale) and scale > 0):
        raise ConfigError(path, f"attn_scale must be a finite number > 0, got {scale!r}")
    window = cfg.extra.get("sliding_window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ConfigError(
            path, f"sliding_window must be a positive integer or null, got {window!r}"
        )
    n_types = cfg.extra.get("n_types")
    if n_types is not None and (isinstance(n_types, bool) or not isinstance(n_types, int) or n_types < 1):
        raise ConfigError(path, f"n_types (token type vocabulary) must be a positive integer, got {n_types!r}")
    if cfg.positional == "rotary":
        _check_rope_scaling(cfg, path)


# What each supported RoPE scaling needs (engine.model.rotary.rotary_inv_freq), and the bound
# each value must exceed.
_ROPE_PARAMS: dict[str, tuple[tuple[str, float], ...]] = {
    "linear": (("factor", 0.0),),
    "llama3": (("factor", 0.0), ("low_freq_factor", 0.0), ("high_freq_factor", 0.0),
               ("original_max_position_embeddings", 0.0)),
    "yarn": (("original_max_position_embeddings", 1.0),),
    "longrope": (("original_max_position_embeddings", 1.0),),
}
# Optional parameters: checked when present.
_ROPE_OPTIONAL: dict[str, tuple[tuple[str, float], ...]] = {
    "yarn": (("factor", 0.0), ("attention_factor", 0.0), ("beta_fast", 0.0), ("beta_slow", 0.0),
             ("mscale", 0.0), ("mscale_all_dim", 0.0)),
    "longrope": (("factor", 0.0), ("attention_factor", 0.0)),
}


def _check_rope_scaling(cfg: ModelConfig, path: str | None) -> None:
    kind = cfg.extra.get("rope_type") or "default"
    if not isinstance(kind, str):
        raise ConfigError(path, f"rope_type must be a name, got {kind!r}")
    params = cfg.extra.get("rope_scaling") or {}
    for key, above in _ROPE_PARAMS.get(kind, ()):
        value = params.get(key)
        if value is None:
            raise ConfigError(path, f"RoPE scaling {kind!r} needs the parameter {key}")
        if not (is_number(value) and value > above):
            raise ConfigError(
                path, f"RoPE scaling parameter {key} must be a finite number > {above:g}, got {value!r}"
            )
    for key, above in _ROPE_OPTIONAL.get(kind, ()):
        value = params.get(key)
        if value is not None and not (is_number(value) and value > above):
            raise ConfigError(
                path, f"RoPE scaling parameter {key} must be a finite number > {above:g}, got {value!r}"
            )
    if kind == "longrope":
        half = (cfg.rotary_dim or cfg.d_head) // 2
        for key in ("long_factor", "short_factor"):
            value = params.get(key)
            if not (isinstance(value, list) and len(value) == half and all(is_number(v) and v > 0 for v in value)):
                raise ConfigError(
                    path, f"RoPE scaling 'longrope' needs {key}: {half} positive numbers (one per frequency)"
                )
    if kind == "llama3" and not params["high_freq_factor"] > params["low_freq_factor"]:
        raise ConfigError(
            path,
            f"RoPE scaling parameter high_freq_factor ({params['high_freq_factor']!r}) must be "
            f"greater than low_freq_factor ({params['low_freq_factor']!r})",
        )


def checked(cfg: ModelConfig, names: set[str], path: str | None) -> ModelConfig:
    """``validate_config`` plus a plausibility bound before per-layer specs are built: a
    hostile ``n_layers`` of 10**12 must be an error, not a loop that never ends."""
    validate_config(cfg, path)
    # Every layer stores at least two tensors (Q, K, V possibly fused; O) ...
    if 2 * cfg.n_layers > max(len(names), 1):
        raise ConfigError(
            path, f"n_layers {cfg.n_layers} but the checkpoint holds only {len(names)} tensors"
        )
    # ... holding at least W_Q and W_O, and the embedding is there too (a header of 200,000
    # empty tensors must not pass as 200,000 layers).
    numel = getattr(names, "numel", None)
    per_layer = 2 * cfg.n_heads * cfg.d_head * cfg.d_model
    needed = cfg.n_layers * per_layer + cfg.d_vocab * cfg.d_model
    if numel is not None and numel < needed:
        raise ConfigError(
            path,
            f"n_layers {cfg.n_layers} × {per_layer:,} attention parameters plus the embedding "
            f"need {needed:,} parameters, but the checkpoint holds only {numel:,}",
        )
    return cfg


def first_prefix(names: Iterable[str], candidates: Iterable[str], probe: str) -> str | None:
    """The prefix under which ``probe`` exists (checkpoints with and without a model wrapper)."""
    names = set(names)
    for prefix in candidates:
        if prefix + probe in names:
            return prefix
    return None
