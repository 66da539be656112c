"""headscope's native layout: canonical names stored as they are (docs/internals.md).

The config is a JSON object of ``ModelConfig`` field names, in the safetensors metadata
key ``headscope_config`` or in ``headscope.json`` beside the weights. Grouped-query K/V
weights are stored un-expanded as ``_W_K``/``_W_V``/``_b_K``/``_b_V`` ``[n_kv_heads, ...]``
as TransformerLens does; optional biases may be absent (zeros).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, get_args

from headscope.engine.core.config import Family, ModelConfig, Normalization, Positional
from headscope.engine.core.errors import ConfigError
from headscope.engine.core.files import loads_json
from headscope.engine.model.adapters.base import Heads, Spec, SpecMap, Whole, Zeros, checked

CONFIG_KEY = "headscope_config"
CONFIG_FILE = "headscope.json"

_FIELDS = {f.name: f for f in dataclasses.fields(ModelConfig)}
_REQUIRED = ("n_layers", "n_heads", "d_model", "d_head", "d_vocab", "n_ctx")
_INTS = {
    "n_layers",
    "n_heads",
    "d_model",
    "d_head",
    "d_vocab",
    "n_ctx",
    "n_kv_heads",
    "d_mlp",
    "rotary_dim",
    "n_params",
}
_FLOATS = {"norm_eps", "rotary_base", "attn_scale"}
_BOOLS = {"gated_mlp", "parallel_attn_mlp", "causal", "post_ln", "tied_unembed", "has_mlm_head"}
_CHOICES: dict[str, tuple[Any, ...]] = {
    "family": get_args(Family),
    "positional": get_args(Positional),
    "normalization": (*get_args(get_args(Normalization)[0]), None),
}


def parse_config_json(text: str, path: str | None) -> dict[str, Any]:
    fields = loads_json(text, path, ConfigError, "native config")
    if not isinstance(fields, dict):
        raise ConfigError(path, "native config must be a JSON object of ModelConfig fields")
    return fields


def build_config(fields: Mapping[str, Any], path: str | None) -> ModelConfig:
    """``ModelConfig`` from native fields, type-checked (unknown keys land in ``extra``)."""
    missing = [k for k in _REQUIRED if k not in fields]
    if missing:
        raise ConfigError(path, f"native config is missing {', '.join(missing)}")
    known: dict[str, Any] = {"family": "native", "architecture": "native"}
    extra: dict[str, Any] = {}
    for key, value in fields.items():
        if key in ("attn_only",):  # derived properties written by ModelConfig.to_dict
            continue
        if key not in _FIELDS:
            extra[key] = value
            continue
        _check_field(key, value, path)
        known[key] = value
    if isinstance(known.get("extra"), dict):
        extra = {**known.pop("extra"), **extra}
    else:
        known.pop("extra", None)
    known["n_params"] = 0  # recomputed from the header
    return ModelConfig(**known, extra=extra)


def _check_field(key: str, value: Any, path: str | None) -> None:
    def bad(kind: str) -> ConfigError:
        return ConfigError(path, f"native config field {key} must be {kind}, got {value!r}")

    if key in _INTS:
        if value is None and key in ("n_kv_heads", "d_mlp", "rotary_dim"):
            return
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("an integer")
    elif key in _FLOATS:
        if value is None and key == "attn_scale":
            return
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad("a number")
    elif key in _BOOLS:
        if not isinstance(value, bool):
            raise bad("true or false")
    elif key in _CHOICES:
        if value not in _CHOICES[key]:
            raise bad("one of " + ", ".join(map(str, _CHOICES[key])))
    elif key in ("architecture", "dtype", "act_fn"):
        if not (isinstance(value, str) or (value is None and key == "act_fn")):
            raise bad("a string")
    elif key == "extra" and not isinstance(value, dict):
        raise bad("an object")


def adapt(
    fields: Mapping[str, Any], names: set[str], path: str | None
) -> tuple[ModelConfig, SpecMap]:
    cfg = build_config(fields, path)
    tied = "unembed.W_U" not in names
    cfg = cfg.replace(tied_unembed=tied)
    checked(cfg, names, path)
    return cfg, specs(cfg, names)


def specs(cfg: ModelConfig, names: set[str]) -> SpecMap:
    dm, dh, n, kv, v = cfg.d_model, cfg.d_head, cfg.n_heads, cfg.kv_heads, cfg.d_vocab
    out: SpecMap = {"embed.W_E": Whole("embed.W_E", (v, dm))}

    def opt(name: str, shape: tuple[int, ...]) -> Spec:
        return Whole(name, shape) if name in names else Zeros(shape)

    def norm(prefix: str) -> None:
        if cfg.normalization in ("LN", "RMS"):
            out[f"{prefix}.w"] = Whole(f"{prefix}.w", (dm,))
        if cfg.normalization == "LN":
            out[f"{prefix}.b"] = opt(f"{prefix}.b", (dm,))

    if cfg.positional == "learned":
        out["pos_embed.W_pos"] = Whole("pos_embed.W_pos", (cfg.n_ctx, dm))
    if "embed.W_token_type" in names:
        t = "embed.W_token_type"
        out[t] = Whole(t, (int(cfg.extra.get("n_types", 2)), dm))
    if cfg.post_ln and "embed.ln.w" in names:
        norm("embed.ln")
    for layer in range(cfg.n_layers):
        a = f"blocks.{layer}."
        for x in "QKV":
            grouped = x != "Q" and f"{a}attn._W_{x}" in names
            w = f"{a}attn._W_{x}" if grouped else f"{a}attn.W_{x}"
            b = f"{a}attn._b_{x}" if grouped else f"{a}attn.b_{x}"
            stored = kv if grouped else n
            out[f"{a}attn.W_{x}"] = Heads(
                w, (stored, dm, dh), axis=0, offset=0, stride=1, size=1, kv=grouped, squeeze=True
            )
            out[f"{a}attn.b_{x}"] = (
                Heads(b, (stored, dh), axis=0, offset=0, stride=1, size=1, kv=grouped, squeeze=True)
                if b in names
                else Zeros((n, dh))
            )
        out[f"{a}attn.W_O"] = Heads(
            f"{a}attn.W_O", (n, dh, dm), axis=0, offset=0, stride=1, size=1, squeeze=True
        )
        out[f"{a}attn.b_O"] = opt(f"{a}attn.b_O", (dm,))
        norm(f"{a}ln1")
        if cfg.d_mlp is not None:
            norm(f"{a}ln2")
            out[f"{a}mlp.W_in"] = Whole(f"{a}mlp.W_in", (dm, cfg.d_mlp))
            out[f"{a}mlp.b_in"] = opt(f"{a}mlp.b_in", (cfg.d_mlp,))
            if cfg.gated_mlp:
                out[f"{a}mlp.W_gate"] = Whole(f"{a}mlp.W_gate", (dm, cfg.d_mlp))
            out[f"{a}mlp.W_out"] = Whole(f"{a}mlp.W_out", (cfg.d_mlp, dm))
            out[f"{a}mlp.b_out"] = opt(f"{a}mlp.b_out", (dm,))
    if not cfg.post_ln:
        norm("ln_final")
    if cfg.has_mlm_head:
        out["mlm.W"] = Whole("mlm.W", (dm, dm))
        out["mlm.b"] = opt("mlm.b", (dm,))
        out["mlm.ln.w"] = Whole("mlm.ln.w", (dm,))
        out["mlm.ln.b"] = opt("mlm.ln.b", (dm,))
    out["unembed.W_U"] = (
        Whole("embed.W_E", (v, dm), transpose=True)
        if cfg.tied_unembed
        else Whole("unembed.W_U", (dm, v))
    )
    out["unembed.b_U"] = opt("unembed.b_U", (v,))
    return out
