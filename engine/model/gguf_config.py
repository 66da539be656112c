"""llama.cpp GGUF files as checkpoints: the config (docs/internals.md, "GGUF").

A GGUF file is turned into what the Hugging Face adapters already understand, so every family
keeps one adapter:

- the GGUF metadata (``{arch}.embedding_length``, ``{arch}.attention.head_count``, ...) becomes
  an HF ``config.json`` dict (``hf_config``);
- llama.cpp's tensor names (``blk.3.attn_q.weight``) map back to the HF names
  (``model.layers.3.self_attn.q_proj.weight``, ``hf_tensor_names``), presented to the adapter as
  float32 tensors of the HF shape (``virtual_tensors``);
- Gemma 2/3 settings the file does not store are what llama.cpp assumes (``gemma_config``):
  the attention scale, Gemma 2's alternating and Gemma 3's five-in-six local layers, Gemma 3's
  local RoPE base.

The tensors are read by ``engine.model.gguf_weights``, the tokenizer comes from the metadata
(``engine.formats.gguf_tokenizer``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from headscope.engine.core.errors import (
    ConfigError,
    CorruptFileError,
    MissingTensorError,
    UnknownArchitectureError,
)
from headscope.engine.formats.gguf import GGUFHeader
from headscope.engine.formats.safetensors import TensorInfo

if TYPE_CHECKING:
    import numpy as np

@dataclass(frozen=True)
class GGUFArch:
    """How one llama.cpp architecture maps back to its Hugging Face family."""

    hf_architecture: str
    model_type: str
    hidden_act: str
    permuted_qk: bool = False  # Q/K rows permuted by the conversion (LlamaModel.permute)
    norm_offset: float = 0.0  # the conversion stored norm gains as (offset + w)
    fused: bool = False  # attn_qkv and a gate|up ffn_up (Phi-3)
    sandwich: bool = False  # norms before and after each sublayer (Gemma 2/3): ffn_norm is the pre-MLP one


ARCHS: dict[str, GGUFArch] = {
    "llama": GGUFArch("LlamaForCausalLM", "llama", "silu", permuted_qk=True),
    "qwen2": GGUFArch("Qwen2ForCausalLM", "qwen2", "silu"),
    "phi3": GGUFArch("Phi3ForCausalLM", "phi3", "silu", fused=True),
    "gemma": GGUFArch("GemmaForCausalLM", "gemma", "gelu_pytorch_tanh", norm_offset=1.0),
    "qwen3": GGUFArch("Qwen3ForCausalLM", "qwen3", "silu"),
    # OLMo2: no norm before the sublayers, post_attention_norm / post_ffw_norm after them
    "olmo2": GGUFArch("Olmo2ForCausalLM", "olmo2", "silu", sandwich=True),
    "gemma2": GGUFArch("Gemma2ForCausalLM", "gemma2", "gelu_pytorch_tanh", norm_offset=1.0, sandwich=True),
    "gemma3": GGUFArch("Gemma3ForCausalLM", "gemma3_text", "gelu_pytorch_tanh", norm_offset=1.0,
                       sandwich=True),
}

# llama.cpp tensor name (after "blk.N.") -> HF name (after "model.layers.N.").
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_q_norm": "self_attn.q_norm",  # Qwen3, OLMo2, Gemma 3
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Gemma 2/3 and OLMo2 (gguf's MODEL_TENSOR maps of GEMMA2/GEMMA3/OLMO2): norms after the
# sublayers, and ``ffn_norm`` is the one before the MLP (Gemma's; OLMo2 has none). Gemma stores
# every ``*norm.weight`` as 1 + w (``norm_offset``).
_SANDWICH_NAMES = {
    **_BLOCK_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_TOP_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
# Tensors that change the computation in ways the engine does not implement (yet): refused,
# never silently dropped. (``rope_freqs.weight`` is read by ``llama3_rope``, the LongRoPE
# factors of phi3 files by ``longrope``.)
_UNSUPPORTED_TENSORS = {
    "rope_factors_long.weight": "LongRoPE scaling factors",
    "rope_factors_short.weight": "LongRoPE scaling factors",
}
ROPE_FREQS = "rope_freqs.weight"
LONGROPE = ("rope_factors_long.weight", "rope_factors_short.weight")
# Llama 3.x RoPE parameters to try against a file's rope_freqs (Llama 3.1/3.3: factor 8,
# 3.2: 32; all: low 1, high 4, original context 8192); the factor is the largest stored one.
_LLAMA3_LOW = (1.0, 2.0, 0.5)
_LLAMA3_HIGH = (4.0, 2.0, 8.0)
_LLAMA3_CONTEXT = tuple(2**k for k in range(3, 21))


def arch_of(header: GGUFHeader) -> tuple[str, GGUFArch]:
    name = header.get("general.architecture")
    if not isinstance(name, str):
        raise ConfigError(header.path, "GGUF metadata has no general.architecture")
    arch = ARCHS.get(name)
    if arch is None:
        raise UnknownArchitectureError(
            header.path,
            f"unsupported GGUF architecture {name!r}; supported: {', '.join(sorted(ARCHS))}",
        )
    return name, arch


def hf_tensor_names(header: GGUFHeader, arch: GGUFArch) -> dict[str, str]:
    """HF tensor name -> GGUF tensor name, for every tensor of the file the model uses."""
    out: dict[str, str] = {}
    block_names = _SANDWICH_NAMES if arch.sandwich else _BLOCK_NAMES
    for name in header.tensors:
        if name == ROPE_FREQS or (name in LONGROPE and arch.fused):
            continue
        if name in _UNSUPPORTED_TENSORS:
            raise ConfigError(
                header.path, f"tensor {name!r} holds {_UNSUPPORTED_TENSORS[name]}, not supported yet"
            )
        stem, _, leaf = name.rpartition(".")
        parts = stem.split(".")
        hf: str | None = None
        if stem in _TOP_NAMES:
            hf = _TOP_NAMES[stem]
        elif len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in block_names:
            module = block_names[parts[2]]
            if arch.fused and parts[2] == "ffn_up":
                module = "mlp.gate_up_proj"
            hf = f"model.layers.{int(parts[1])}.{module}"
        if hf is not None and leaf in ("weight", "bias"):
            out[f"{hf}.{leaf}"] = name
    return out


def hf_config(header: GGUFHeader, name: str, arch: GGUFArch, hf_names: Mapping[str, str]) -> dict[str, Any]:
    """An HF ``config.json`` dict from the GGUF metadata (the adapters validate it further)."""
    meta = header.metadata

    def key(k: str, default: Any = None) -> Any:
        return meta.get(f"{name}.{k}", default)

    embed = header.tensors.get(hf_names.get("model.embed_tokens.weight", ""))
    if embed is None or len(embed.shape) != 2:
        raise MissingTensorError(header.path, "GGUF file has no 2-D token_embd.weight")
    n_heads = key("attention.head_count")
    n_kv = key("attention.head_count_kv", n_heads)
    for k, v in (("attention.head_count", n_heads), ("attention.head_count_kv", n_kv)):
        if isinstance(v, list):
            raise ConfigError(header.path, f"{name}.{k} differs per layer; not supported")
    d_model = key("embedding_length")
    config: dict[str, Any] = {
        "architectures": [arch.hf_architecture],
        "model_type": arch.model_type,
        "hidden_size": d_model,
        "intermediate_size": key("feed_forward_length"),
        "num_hidden_layers": key("block_count"),
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv,
        "max_position_embeddings": key("context_length"),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": key("rope.freq_base", 10000.0),
        "vocab_size": embed.shape[0],
        "hidden_act": arch.hidden_act,
        "hidden_activation": arch.hidden_act,  # Gemma's spelling
        "tie_word_embeddings": "lm_head.weight" not in hf_names,
        "use_sliding_window": False,
    }
    window = key("attention.sliding_window")
    if type(window) is int and window == 0:
        # llama.cpp reads 0 as no sliding window; convert_hf_to_gguf writes 0 for Phi-4
        # ("use zero value ... to distinguish Phi-4"), whose attention is global.
        window = None
    if window is not None:
        config["sliding_window"] = window
    head_dim = key("attention.key_length")
    if head_dim is not None:
        config["head_dim"] = head_dim
    rope_dims = key("rope.dimension_count")
    d_head = head_dim or (d_model // n_heads if _positive_int(d_model) and _positive_int(n_heads) else None)
    if _positive_int(rope_dims) and _positive_int(d_head) and rope_dims != d_head:
        config["partial_rotary_factor"] = rope_dims / d_head
    scaling = key("rope.scaling.type")
    if scaling == "yarn":
        config["rope_scaling"] = yarn_rope(header, name)
    elif scaling not in (None, "none"):
        if scaling != "linear":
            raise ConfigError(header.path, f"GGUF RoPE scaling {scaling!r} is not supported (none, linear, yarn)")
        config["rope_scaling"] = {"rope_type": "linear", "factor": key("rope.scaling.factor", 1.0)}
    if ROPE_FREQS in header.tensors:
        config["rope_scaling"] = llama3_rope(header, config["rope_theta"], rope_dims or d_head)
    if arch.fused and any(t in header.tensors for t in LONGROPE):
        config["rope_scaling"] = longrope(header, name, rope_dims or d_head)
    if any(k.endswith(".bias") and "q_proj" in k for k in hf_names):
        config["attention_bias"] = True
    if arch.sandwich and name.startswith("gemma"):
        config.update(gemma_config(header, name, config))
    elif window is not None and name == "olmo2":  # OLMo 3 files use the olmo2 architecture
        raise ConfigError(header.path, "olmo2 file with sliding-window layers (OLMo 3): not supported")
    return config


# Gemma 2 / 3 checkpoints llama.cpp recognises as 27B by their layer count: their scores are
# scaled by 1/sqrt(d_model / n_heads) instead of 1/sqrt(head_dim) (query_pre_attn_scalar).
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def gemma_config(header: GGUFHeader, name: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The Gemma 2/3 keys of ``config.json`` a GGUF file implies, read as llama.cpp reads them
    (``llama-model.cpp``, ``load_hparams``): the soft-caps from the metadata; the sliding window
    from ``attention.sliding_window`` (Gemma 2: 4096 when absent) on every second layer (Gemma 2)
    or five layers in six (Gemma 3: unless ``attention.sliding_window_pattern`` says otherwise;
    no window key, no local layers), Gemma 3's local layers rotating with base 10000
    (``rope.freq_base_swa`` if present), unscaled; and ``query_pre_attn_scalar``, which the
    conversion does not store: ``head_dim``, or ``d_model / n_heads`` for the 27B models
    (recognised by their layer count), unless ``attention.scale`` is given."""
    meta = header.metadata

    def key(k: str, default: Any = None) -> Any:
        return meta.get(f"{name}.{k}", default)

    out: dict[str, Any] = {}
    for k in ("attn_logit_softcapping", "final_logit_softcapping"):
        if key(k) is not None:
            out[k] = key(k)
    n_layers, d_model, n_heads = config.get("num_hidden_layers"), config.get("hidden_size"), config.get("num_attention_heads")
    head_dim = config.get("head_dim")
    if head_dim is None and _positive_int(d_model) and _positive_int(n_heads):
        head_dim = d_model // n_heads
    scale = key("attention.scale")
    if isinstance(scale, int | float) and not isinstance(scale, bool) and scale > 0:
        out["query_pre_attn_scalar"] = 1.0 / (scale * scale)
    elif n_layers == _GEMMA_27B_LAYERS[name] and _positive_int(d_model) and _positive_int(n_heads):
        out["query_pre_attn_scalar"] = d_model // n_heads
    elif head_dim is not None:
        out["query_pre_attn_scalar"] = head_dim
    window = key("attention.sliding_window", 4096 if name == "gemma2" else None)
    if name == "gemma3":
        out["rope_local_base_freq"] = key("rope.freq_base_swa", 10000.0)
        pattern = key("attention.sliding_window_pattern", 6)
        if not _positive_int(n_layers) or n_layers > len(header.tensors):
            pass  # implausible: the adapter refuses n_layers before anything is built per layer
        elif not window:
            out["layer_types"] = ["full_attention"] * n_layers
        elif isinstance(pattern, list):  # one flag per layer: true = sliding
            out["layer_types"] = ["sliding_attention" if p else "full_attention" for p in pattern]
        elif _positive_int(pattern):
            out["sliding_window_pattern"] = pattern
    if window:
        out["sliding_window"] = window
        out["use_sliding_window"] = True
    return out


# llama.cpp YaRN keys whose meaning differs from transformers' parameters: refused, not mapped.
_YARN_UNMAPPED = ("attn_factor", "yarn_attn_factor", "yarn_ext_factor", "yarn_log_multiplier")


def yarn_rope(header: GGUFHeader, name: str) -> dict[str, Any]:
    """transformers' ``yarn`` parameters from what ``convert_hf_to_gguf.py`` writes for them
    (Qwen2/Qwen3 with YaRN): ``rope.scaling.factor``, ``original_context_length`` and, when
    present, ``yarn_beta_fast`` / ``yarn_beta_slow``; the attention factor then follows from the
    factor as in transformers (and in llama.cpp). Files that set llama.cpp's own attention /
    extrapolation factors are refused."""
    meta = header.metadata
    prefix = f"{name}.rope.scaling."
    for k in _YARN_UNMAPPED:
        if meta.get(prefix + k) is not None:
            raise ConfigError(header.path, f"GGUF YaRN RoPE with {prefix + k} is not supported")
    out: dict[str, Any] = {"rope_type": "yarn", "factor": meta.get(prefix + "factor"),
                           "original_max_position_embeddings": meta.get(prefix + "original_context_length")}
    if out["original_max_position_embeddings"] is None:
        raise ConfigError(header.path, f"GGUF YaRN RoPE needs {prefix}original_context_length")
    for k, hf in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
        if meta.get(prefix + k) is not None:
            out[hf] = meta[prefix + k]
    return out


def llama3_rope(header: GGUFHeader, base: Any, dim: Any) -> dict[str, Any]:
    """The ``llama3`` RoPE scaling parameters that give exactly the file's ``rope_freqs``.

    llama.cpp stores Llama 3.1+ scaling as one divisor per frequency (``convert_hf_to_gguf.py``
    computes them from factor, low/high_freq_factor and the original context); the forward pass
    knows the ``llama3`` formula, so the parameters are recovered by trying the published
    values against the stored divisors. Anything else is refused (ConfigError), never guessed.
    """
    import numpy as np

    if isinstance(base, bool) or not isinstance(base, int | float) or not base > 0:
        raise ConfigError(header.path, f"bad RoPE base {base!r}")
    stored = _rope_vector(header, ROPE_FREQS, dim)
    factor = float(stored.max())
    wavelen = 2 * math.pi * float(base) ** (np.arange(0, dim, 2) / dim)
    for low in _LLAMA3_LOW:
        for high in _LLAMA3_HIGH:
            if high <= low:
                continue
            for ctx in _LLAMA3_CONTEXT:
                smooth = (ctx / wavelen - low) / (high - low)
                want = np.where(wavelen < ctx / high, 1.0,
                                np.where(wavelen > ctx / low, factor, 1 / ((1 - smooth) / factor + smooth)))
                if np.allclose(want, stored, rtol=1e-5, atol=0):
                    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                            "high_freq_factor": high, "original_max_position_embeddings": ctx}
    raise ConfigError(
        header.path,
        f"tensor {ROPE_FREQS!r} holds RoPE scaling factors that match no Llama 3 'llama3' scaling; not supported",
    )


def _rope_vector(header: GGUFHeader, name: str, dim: Any) -> np.ndarray:
    """A float32 tensor of ``dim / 2`` positive finite RoPE factors (one per frequency)."""
    import numpy as np

    info = header.tensors[name]
    if _positive_int(dim) and dim % 2:
        raise ConfigError(header.path, f"RoPE dimension count {dim} is odd, but tensor {name!r} "
                                       f"holds one factor per pair of rotary dimensions "
                                       f"({math.prod(info.shape)} values): they do not match")
    if info.type_name != "F32" or len(info.shape) != 1 or not _positive_int(dim) or info.shape[0] != dim // 2:
        raise ConfigError(header.path, f"tensor {name!r} is not {dim}/2 float32 RoPE factors")
    try:
        with open(header.path, "rb") as f:
            f.seek(info.offset)
            stored = np.frombuffer(f.read(info.nbytes), dtype="<f4").astype(np.float64)
    except OSError as e:
        raise CorruptFileError(header.path, f"cannot read {name!r}: {e.strerror or e}") from None
    if stored.shape[0] != info.shape[0] or not np.isfinite(stored).all() or (stored <= 0).any():
        raise ConfigError(header.path, f"tensor {name!r} holds invalid RoPE factors")
    return stored


def longrope(header: GGUFHeader, name: str, dim: Any) -> dict[str, Any]:
    """transformers' ``longrope`` parameters of a Phi-3 long-context file: the factors are the
    ``rope_factors_long`` / ``_short`` tensors, the original context is
    ``rope.scaling.original_context_length`` and the attention factor the conversion computed
    (``rope.scaling.attn_factor``, transformers' formula; derived again if absent)."""
    missing = [t for t in LONGROPE if t not in header.tensors]
    if missing:
        raise ConfigError(header.path, f"LongRoPE needs both factor tensors; {missing[0]!r} is missing")
    prefix = f"{name}.rope.scaling."
    original = header.metadata.get(prefix + "original_context_length")
    if not _positive_int(original):
        raise ConfigError(header.path, f"LongRoPE needs {prefix}original_context_length, got {original!r}")
    out: dict[str, Any] = {
        "rope_type": "longrope", "original_max_position_embeddings": original,
        "long_factor": _rope_vector(header, LONGROPE[0], dim).tolist(),
        "short_factor": _rope_vector(header, LONGROPE[1], dim).tolist(),
    }
    if header.metadata.get(prefix + "attn_factor") is not None:
        out["attention_factor"] = header.metadata[prefix + "attn_factor"]
    return out


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def virtual_tensors(header: GGUFHeader, hf_names: Mapping[str, str]) -> dict[str, TensorInfo]:
    """What the adapters check: each used tensor as the float32 HF tensor it dequantises to."""
    out = {}
    for hf, g in hf_names.items():
        t = header.tensors[g]
        out[hf] = TensorInfo(hf, "F32", t.shape, 0, t.numel * 4)
    return out


def check_all_used(header: GGUFHeader, used: Mapping[str, str]) -> None:
    """Every tensor of the file is one the model reads (or ``rope_freqs``): a tensor we do not
    understand may change the computation, so it is refused, never ignored."""
    extra = sorted(set(header.tensors) - set(used.values()) - {ROPE_FREQS, *LONGROPE})
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise ConfigError(
            header.path,
            f"tensor {extra[0]!r}{more} is not part of the {header.get('general.architecture')} "
            "architecture as headscope reads it; not supported",
        )


def main_dtype(header: GGUFHeader, used: Mapping[str, str]) -> str:
    """The ggml type holding most of the model's bytes, lower-case (``q4_k``, ``f16``)."""
    by_type: dict[str, int] = {}
    for g in used.values():
        t = header.tensors[g]
        by_type[t.type_name] = by_type.get(t.type_name, 0) + t.nbytes
    return max(by_type, key=lambda k: by_type[k]).lower() if by_type else "float32"

