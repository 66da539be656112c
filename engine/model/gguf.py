"""llama.cpp GGUF files as checkpoints (docs/internals.md, "GGUF").

A GGUF file is turned into what the Hugging Face adapters already understand, so every family
keeps one adapter:

- the GGUF metadata (``{arch}.embedding_length``, ``{arch}.attention.head_count``, ...) becomes
  an HF ``config.json`` dict (``hf_config``);
- llama.cpp's tensor names (``blk.3.attn_q.weight``) map back to the HF names
  (``model.layers.3.self_attn.q_proj.weight``, ``hf_tensor_names``), presented to the adapter as
  float32 tensors of the HF shape;
- ``GGUFWeights`` reads those tensors lazily: the rows asked for are read with ``pread`` and
  dequantised by headscope's kernels (``engine.formats.dequant``: F32, F16, BF16, Q8_0, Q4_0,
  Q4_K, Q5_K, Q6_K, bit for bit llama.cpp's ``gguf.quants.dequantize``, about three times
  faster), other types by ``gguf.quants`` itself; the conversion's changes are undone: the
  Q/K row permutation of Llama-architecture files (``convert_hf_to_gguf.py``'s
  ``LlamaModel.permute``, done there for llama.cpp's interleaved rotary kernel; undone on the
  bytes, before dequantising) and Gemma's ``+ 1`` on norm gains. So circuits and patterns equal those of the original checkpoint, up
  to the quantisation error of the stored type.
- Gemma 2/3 settings the file does not store are what llama.cpp assumes (``gemma_config``):
  the attention scale, Gemma 2's alternating and Gemma 3's five-in-six local layers, Gemma 3's
  local RoPE base.

The tokenizer comes from the metadata (``gguf_tokenizer``).
"""

from __future__ import annotations

import math
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from headscope.engine.core.config import ModelConfig
from headscope.engine.core.errors import (
    ConfigError,
    CorruptFileError,
    MissingTensorError,
    UnknownArchitectureError,
)
from headscope.engine.formats.gguf import GGUFHeader, GGUFTensorInfo
from headscope.engine.formats.safetensors import TensorInfo
from headscope.engine.formats.tokenizer import HFTokenizer, IdTokenizer, Tokenizer, display_token
from headscope.engine.model.adapters.base import spec_parts
from headscope.engine.model.readplan import (
    DONTNEED,
    SEQUENTIAL,
    WILLNEED,
    PlannedReads,
    ReadPlan,
    advise,
)
from headscope.engine.model.weights import CheckpointWeights

if TYPE_CHECKING:
    import numpy as np

    from headscope.engine.model.adapters.base import Spec


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
    d_head = head_dim or (d_model // n_heads if _positive(d_model) and _positive(n_heads) else None)
    if _positive(rope_dims) and _positive(d_head) and rope_dims != d_head:
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
    if head_dim is None and _positive(d_model) and _positive(n_heads):
        head_dim = d_model // n_heads
    scale = key("attention.scale")
    if isinstance(scale, int | float) and not isinstance(scale, bool) and scale > 0:
        out["query_pre_attn_scalar"] = 1.0 / (scale * scale)
    elif n_layers == _GEMMA_27B_LAYERS[name] and _positive(d_model) and _positive(n_heads):
        out["query_pre_attn_scalar"] = d_model // n_heads
    elif head_dim is not None:
        out["query_pre_attn_scalar"] = head_dim
    window = key("attention.sliding_window", 4096 if name == "gemma2" else None)
    if name == "gemma3":
        out["rope_local_base_freq"] = key("rope.freq_base_swa", 10000.0)
        pattern = key("attention.sliding_window_pattern", 6)
        if not _positive(n_layers) or n_layers > len(header.tensors):
            pass  # implausible: the adapter refuses n_layers before anything is built per layer
        elif not window:
            out["layer_types"] = ["full_attention"] * n_layers
        elif isinstance(pattern, list):  # one flag per layer: true = sliding
            out["layer_types"] = ["sliding_attention" if p else "full_attention" for p in pattern]
        elif _positive(pattern):
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
    if _positive(dim) and dim % 2:
        raise ConfigError(header.path, f"RoPE dimension count {dim} is odd, but tensor {name!r} "
                                       f"holds one factor per pair of rotary dimensions "
                                       f"({math.prod(info.shape)} values): they do not match")
    if info.type_name != "F32" or len(info.shape) != 1 or not _positive(dim) or info.shape[0] != dim // 2:
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
    if not _positive(original):
        raise ConfigError(header.path, f"LongRoPE needs {prefix}original_context_length, got {original!r}")
    out: dict[str, Any] = {
        "rope_type": "longrope", "original_max_position_embeddings": original,
        "long_factor": _rope_vector(header, LONGROPE[0], dim).tolist(),
        "short_factor": _rope_vector(header, LONGROPE[1], dim).tolist(),
    }
    if header.metadata.get(prefix + "attn_factor") is not None:
        out["attention_factor"] = header.metadata[prefix + "attn_factor"]
    return out


def _positive(v: Any) -> bool:
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


def check_types(header: GGUFHeader, used: Mapping[str, str]) -> None:
    """Every tensor the model reads has a type headscope can dequantise (its own kernels,
    ``engine.formats.dequant``, or else ``gguf.quants``) and the bytes its type and shape need."""
    from gguf.quants import _type_traits  # llama.cpp's table of implemented block types

    from headscope.engine.formats.dequant import TYPES

    known = {t.name for t in _type_traits} | set(TYPES) | {"F64"}
    for g in used.values():
        t = header.tensors[g]
        if t.type_name not in known:
            raise CorruptFileError(
                header.path, f"tensor {g!r} has type {t.type_name}, which cannot be dequantised"
            )
        problem = size_problem(t)
        if problem:
            raise CorruptFileError(header.path, problem)


def size_problem(t: GGUFTensorInfo) -> str | None:
    """Why a tensor's bytes do not fit its type and shape (None if they do, or if the type is
    not one of headscope's own kernels: gguf.quants checks those)."""
    from headscope.engine.formats.dequant import TYPES

    layout = TYPES.get(t.type_name)
    if layout is None:
        return None
    block, size = layout
    rows = t.numel // t.shape[-1] if t.shape[-1] else 0
    what = f"tensor {t.name!r} ({t.type_name}, shape {list(t.shape)})"
    if t.shape[-1] % block:
        return f"{what} has rows of {t.shape[-1]} values, not a whole number of {t.type_name} blocks of {block}"
    expected = t.numel // block * size
    if t.nbytes != expected or (rows and t.nbytes % rows):
        return f"{what} holds {t.nbytes:,} bytes; its type and shape need {expected:,}"
    return None


def main_dtype(header: GGUFHeader, used: Mapping[str, str]) -> str:
    """The ggml type holding most of the model's bytes, lower-case (``q4_k``, ``f16``)."""
    by_type: dict[str, int] = {}
    for g in used.values():
        t = header.tensors[g]
        by_type[t.type_name] = by_type.get(t.type_name, 0) + t.nbytes
    return max(by_type, key=lambda k: by_type[k]).lower() if by_type else "float32"


# --- reading tensors ------------------------------------------------------------------------


class GGUFSource(PlannedReads):
    """Reads HF-named tensors out of a GGUF file: rows by ``pread``, dequantised, conversion
    undone.

    Dequantising costs more than copying bytes (~2 ns per element for Q4_K), and per-head
    reads of a tensor cut along its columns (``W_O``) need the whole tensor: whole tensors
    are kept, dequantised, in a small LRU bounded by ``cache_bytes`` (tensors over a quarter of
    it, e.g. embeddings, are not kept). Callers always get a copy of their own.
    """

    def __init__(
        self,
        header: GGUFHeader,
        hf_names: Mapping[str, str],
        arch: GGUFArch,
        cfg: ModelConfig,
        cache_bytes: int = 256 << 20,
    ) -> None:
        self.header = header
        self.hf_names = dict(hf_names)
        self.arch = arch
        self.cfg = cfg
        self.cache_bytes = cache_bytes
        self.dequantised = 0  # tensor/row-range dequantisations (tests count them)
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cached_bytes = 0
        self._handle: Any = None
        self._lock = threading.Lock()
        # Called with (file, tensor, offset, bytes) for every read from disk (tests).
        self.on_read: Callable[[str, str, int, int], None] | None = None

    def plan_sizes(self) -> tuple[int, int]:
        """The read plan's sizes: a quantised 70B (40 GB) does not fit in the page cache; its
        attention tensors are the hot ones."""
        tensors = self.header.tensors
        hot = sum(info.nbytes for name, info in tensors.items() if ".attn_" in name)
        return sum(info.nbytes for info in tensors.values()), hot

    def position(self, hf: str) -> int | None:
        """The file offset of ``hf``'s first byte (None if the file has no such tensor)."""
        g = self.hf_names.get(hf)
        return None if g is None else self.header.tensors[g].offset

    def advise_will_need(self, hfs: list[str]) -> None:
        """When the file is streamed, ask the kernel to start reading these tensors, on a
        thread (``CheckpointWeights.advise_will_need``)."""
        if not self.read_plan.streaming:
            return
        ranges = sorted((info.offset, info.nbytes) for info in
                        (self.header.tensors[self.hf_names[h]] for h in hfs if h in self.hf_names))
        handle = self._open()

        def run() -> None:
            for offset, n in ranges:
                advise(handle.fileno(), offset, n, WILLNEED)

        threading.Thread(target=run, name="headscope-will-need", daemon=True).start()

    def _open(self) -> Any:
        with self._lock:
            if self._handle is None:
                self._handle = open(self.header.path, "rb")  # noqa: SIM115 (closed in close())
                streaming = self._plan.streaming if self._plan is not None else None
            else:
                return self._handle
        if streaming is None:
            streaming = self.read_plan.streaming
        if streaming:  # a larger kernel read-ahead for a streamed file
            advise(self._handle.fileno(), 0, self.header.file_size, SEQUENTIAL)
        return self._handle

    def permuted_heads(self, hf: str) -> int | None:
        """How many heads the conversion permuted the rows of ``hf`` in, if it did."""
        if not self.arch.permuted_qk:
            return None
        if ".self_attn.q_proj." in hf:
            return self.cfg.n_heads
        if ".self_attn.k_proj." in hf:
            return self.cfg.kv_heads
        return None

    def read(self, hf: str, rows: slice | None = None, cols: tuple[slice, ...] | None = None) -> np.ndarray:
        """The tensor ``hf`` as float32 in HF layout (rows ``rows`` of its first axis only; and
        ``cols``, an index of the other axes, e.g. one head's columns of ``o_proj``), in
        memory of its own.

        Only a cut along ``cols`` keeps the whole dequantised tensor (for the next head's cut):
        a whole-tensor read (a sweep, the forward pass) is kept by the caller if at all, and a
        copy for the cache would cost a second pass over it."""
        import numpy as np

        g = self.hf_names.get(hf)
        if g is None:
            raise MissingTensorError(self.header.path, f"missing tensor {hf!r}")
        info = self.header.tensors[g]
        n = info.shape[0]
        first, stop = (0, n) if rows is None else rows.indices(n)[:2]
        stop = max(stop, first)
        heads = self.permuted_heads(hf)
        group = n // heads if heads else 1
        rest = tuple(cols or ())
        with self._lock:
            whole = self._cache.get(g)
            if whole is not None:
                self._cache.move_to_end(g)
        if whole is not None:
            return np.array(whole[(slice(first, stop), *rest)], order="C")  # a copy
        if len(info.shape) == 1:  # a vector is read whole (its bytes are not split in rows)
            lo, hi = 0, n
        else:
            lo, hi = first // group * group, -(-stop // group) * group  # whole heads if permuted
        data = self._dequantised(info, g, lo, hi, heads=(hi - lo) // group if heads else None)
        if self.arch.norm_offset and hf.endswith("norm.weight"):
            data = data - self.arch.norm_offset
        part = (slice(first - lo, stop - lo), *rest)
        if rest and (lo, hi) == (0, n) and self._keep(g, data):
            return np.array(data[part], order="C")  # a copy: the cache keeps ``data``
        if (first - lo, stop - lo) == (0, len(data)) and not rest:
            return data  # not kept: already the caller's
        return np.ascontiguousarray(data[part])

    def _keep(self, g: str, data: np.ndarray) -> bool:
        """Keep a whole dequantised tensor (unless it is over a quarter of the budget)."""
        if data.nbytes > self.cache_bytes // 4:
            return False
        with self._lock:
            if g not in self._cache:
                self._cache[g] = data
                self._cached_bytes += data.nbytes
            while self._cached_bytes > self.cache_bytes and self._cache:
                _, old = self._cache.popitem(last=False)
                self._cached_bytes -= old.nbytes
        return True

    def _dequantised(
        self, info: GGUFTensorInfo, g: str, lo: int, hi: int, heads: int | None = None
    ) -> np.ndarray:
        """Rows ``lo:hi`` of tensor ``g`` as a new float32 array: stored order, or with the
        conversion's Q/K permutation undone over ``heads`` whole heads."""
        import numpy as np

        from headscope.engine.formats import dequant

        vector = len(info.shape) == 1
        n = 1 if vector else info.shape[0]
        if vector:
            lo, hi = 0, 1
        kind = f"tensor {g!r} ({info.type_name}, shape {list(info.shape)})"
        problem = size_problem(info)
        if problem:
            raise CorruptFileError(self.header.path, problem)
        row_bytes = info.nbytes // n
        raw = self._pread(info.offset + lo * row_bytes, (hi - lo) * row_bytes, g)
        with self._lock:
            self.dequantised += 1
        shape = info.shape if vector else (hi - lo, *info.shape[1:])
        if heads:
            # Rows are dequantised independently, so the permutation is undone on the bytes
            # (a quarter to a half byte per value for Q4/Q8) instead of on the float32 rows.
            raw = _unpermute(raw.reshape(hi - lo, row_bytes), heads).reshape(-1)
        if info.type_name == "F64":
            return raw.view(np.float64).astype(np.float32).reshape(shape)
        if dequant.can_dequantise(info.type_name):
            out = np.empty(shape, np.float32)
            try:
                return dequant.dequantize(raw, info.type_name, out)
            except dequant.DequantError as e:
                raise CorruptFileError(self.header.path, f"cannot dequantise {kind}: {e}") from None
        return self._dequantised_by_gguf(raw, info, kind, row_bytes, shape)

    def _dequantised_by_gguf(
        self, raw: np.ndarray, info: GGUFTensorInfo, kind: str, row_bytes: int, shape: tuple[int, ...]
    ) -> np.ndarray:
        """Types headscope has no kernel for (Q5_0, Q2_K, the IQ types, ...): llama.cpp's own
        numpy code, about three times slower."""
        import numpy as np
        from gguf.constants import GGMLQuantizationType
        from gguf.quants import dequantize

        try:
            values = dequantize(raw.reshape(-1, row_bytes), GGMLQuantizationType(info.ggml_type))
        except (ValueError, NotImplementedError) as e:
            raise CorruptFileError(self.header.path, f"cannot dequantise {kind}: {str(e)[:160]}") from None
        return np.array(values, dtype=np.float32).reshape(shape)

    def _pread(self, offset: int, n: int, g: str) -> np.ndarray:
        import numpy as np

        path = self.header.path
        handle = self._open()
        try:
            size = os.fstat(handle.fileno()).st_size
            if size != self.header.file_size:
                raise CorruptFileError(
                    path,
                    f"the file changed on disk since it was opened (now {size:,} bytes, "
                    f"was {self.header.file_size:,}); reopen the model",
                )
            buf = np.empty(n, np.uint8)  # not bytearray(n): that zero-fills it first
            view, done = memoryview(buf), 0
            while done < n:
                got = os.preadv(handle.fileno(), [view[done:]], offset + done)
                if got <= 0:
                    raise CorruptFileError(path, f"cannot read tensor {g!r}: the file ends early")
                done += got
        except OSError as e:
            raise CorruptFileError(path, f"cannot read tensor {g!r}: {str(e)[:160]}") from None
        hook = self.on_read
        if hook is not None:
            hook(path, g, offset, n)
        if self.read_plan.drops(".attn_" in g):  # read once into our memory: see read_plan
            advise(handle.fileno(), offset, n, DONTNEED)
        return buf

    def close(self) -> None:
        with self._lock:
            if self._handle is not None:
                self._handle.close()
                self._handle = None
            self._cache.clear()
            self._cached_bytes = 0


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Invert ``convert_hf_to_gguf.py``'s ``LlamaModel.permute``.

    The conversion reorders each head's rows from HF's rotate-half layout (pairs ``(i, i + d/2)``)
    to llama.cpp's interleaved one (pairs ``(2i, 2i + 1)``):
    ``w.reshape(n, 2, d/2, ...).swapaxes(1, 2)``; this is the inverse.
    """
    rest = w.shape[1:]
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, half, 2, *rest).swapaxes(1, 2).reshape(w.shape)


class GGUFWeights(CheckpointWeights):
    """``CheckpointWeights`` whose checkpoint tensors come from a ``GGUFSource``."""

    def __init__(self, cfg: ModelConfig, specs: Mapping[str, Spec], source: GGUFSource, path: str | None = None) -> None:
        super().__init__(cfg, specs, {}, path=path)
        self.source = source

    # The file's reads, and so its plan, are the source's: the budget is set there too.
    @property
    def page_cache_budget(self) -> int | None:
        return self.source.page_cache_budget

    @page_cache_budget.setter
    def page_cache_budget(self, value: int | None) -> None:
        self.source.page_cache_budget = value

    @property
    def read_plan(self) -> ReadPlan:
        return self.source.read_plan

    def file_position(self, name: str) -> tuple[str, int] | None:
        spec = self.specs.get(name)
        parts = [] if spec is None else spec_parts(spec)
        offset = self.source.position(parts[0].tensor) if parts else None
        return None if offset is None else (self.source.header.path, offset)

    def advise_will_need(self, prefix: str) -> None:
        self.source.advise_will_need(sorted({part.tensor for name, spec in self.specs.items()
                                             if name.startswith(prefix) for part in spec_parts(spec)}))

    def _read(self, tensor: str, index: tuple[slice, ...] | None = None, *, borrow: bool = False) -> np.ndarray:
        # always a fresh array of its own (``borrow`` allows less, so nothing to do for it)
        rows = cols = None
        if index is not None:
            rows = None if index[0] == slice(None) else index[0]
            cols = None if all(i == slice(None) for i in index[1:]) else index[1:]
        t = self.source.read(tensor, rows, cols)
        with self._lock:
            self.reads += 1
        return t

    def close(self) -> None:
        super().close()
        self.source.close()


# --- tokenizer --------------------------------------------------------------------------------


class GGUFVocabTokenizer(IdTokenizer):
    """Token strings from the metadata for display; prompts are token ids (no usable model)."""

    def __init__(self, tokens: list[str], vocab_size: int, path: str | None = None) -> None:
        super().__init__(vocab_size, path)
        self.tokens = tokens
        self._ids = {t: i for i, t in reversed(list(enumerate(tokens)))}

    def decode_token(self, token_id: int) -> str:
        from headscope.engine.formats.tokenizer import TOKEN_DISPLAY

        if 0 <= token_id < len(self.tokens):
            return self.tokens[token_id].translate(TOKEN_DISPLAY)
        return f"<{token_id}>"

    def token_to_id(self, token: str) -> int | None:
        i = self._ids.get(token)
        return i if i is not None else super().token_to_id(token)


def gguf_tokenizer(header: GGUFHeader, d_vocab: int) -> Tokenizer:
    """The tokenizer the metadata describes, built with ``tokenizers`` as ``transformers``'
    converters build fast tokenizers:

    - ``tokenizer.ggml.model == "gpt2"`` (byte-level BPE: Llama 3, Qwen2): BPE over ``tokens``
      and ``merges``; the split regex of ``tokenizer.ggml.pre`` when it is one headscope knows
      (``llama-bpe``, ``qwen2``; ``_PRE_TOKENIZER_REGEX``), GPT-2's otherwise;
    - ``"llama"`` (SentencePiece BPE: Llama 1/2, Gemma, Phi-3): BPE whose merges come from the
      pieces' ``scores`` (``transformers``' ``SentencePieceExtractor``), byte fallback, spaces as
      ``▁`` and one prepended (the "legacy" Llama behaviour);
    - anything else, or a table that does not build: the token strings for display, prompts as
      token ids. No tokens at all: ``IdTokenizer``.

    Either is built on the first prompt, not at open (``LazyTokenizer``).
    """
    tokens = header.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        return IdTokenizer(d_vocab, header.path)
    kind = header.get("tokenizer.ggml.model")
    if kind == "gpt2":
        merges = header.get("tokenizer.ggml.merges") or []
        pre = header.get("tokenizer.ggml.pre")
        return LazyTokenizer(tokens, lambda: _bpe(tokens, merges, pre), d_vocab, header.path)
    if kind == "llama":
        scores = header.get("tokenizer.ggml.scores")
        return LazyTokenizer(tokens, lambda: _spm(tokens, scores), d_vocab, header.path)
    return GGUFVocabTokenizer(tokens, d_vocab, header.path)


class LazyTokenizer:
    """A metadata tokenizer that is built (``tokenizers``' BPE from the token table) on the
    first prompt. Building a 32k-piece SentencePiece table is about 0.5-1 s of Python (every
    split of every piece is ranked), and opening a model only needs token strings and ids,
    which come from the table itself: the first head view of a 7B GGUF file must take less
    than 1 s (bench/README.md, "GGUF"). A table ``tokenizers`` refuses leaves the token
    strings for display and prompts as token ids (``GGUFVocabTokenizer``), as before."""

    def __init__(self, tokens: list[str], build: Callable[[], Any], d_vocab: int,
                 path: str | None = None) -> None:
        self.tokens = tokens
        self.path = path
        # As the built BPE's vocabulary: a repeated piece keeps its first id, later copies
        # have none (``id_to_token`` gives None for them).
        self._ids = {t: i for i, t in reversed(list(enumerate(tokens)))}
        self.vocab_size: int = len(self._ids)
        self._build = build
        self._d_vocab = d_vocab
        self._lock = threading.Lock()
        self._built: Tokenizer | None = None

    def _tokenizer(self) -> Tokenizer:
        with self._lock:
            if self._built is None:
                try:
                    self._built = HFTokenizer(self._build(), self.path)
                except Exception:  # a table tokenizers refuses: fall back to display only
                    self._built = GGUFVocabTokenizer(self.tokens, self._d_vocab, self.path)
            return self._built

    def reads_text(self) -> bool:
        return not isinstance(self._tokenizer(), IdTokenizer)

    def encode(self, text: str) -> list[int]:
        return self._tokenizer().encode(text)

    def decode_token(self, token_id: int) -> str:
        token = self.tokens[token_id] if 0 <= token_id < len(self.tokens) else None
        return display_token(token if token is not None and self._ids[token] == token_id
                             else None, token_id)

    def token_to_id(self, token: str) -> int | None:
        return self._ids.get(token)


# The split regexes of the byte-level BPE tokenizers (their tokenizer.json pre_tokenizer), by
# llama.cpp's ``tokenizer.ggml.pre`` name.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_TOKENIZER_REGEX = {"llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT}


def _bpe(tokens: list[str], merges: list[Any], pre: Any = None) -> Any:
    from tokenizers import Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as RustTokenizer

    vocab = {t: i for i, t in reversed(list(enumerate(tokens)))}
    pairs = []
    for m in merges:
        a, sep, b = str(m).partition(" ")
        if sep and a in vocab and b in vocab and a + b in vocab:
            pairs.append((a, b))
    tok = RustTokenizer(models.BPE(vocab, pairs, ignore_merges=pre in _PRE_TOKENIZER_REGEX))
    regex = _PRE_TOKENIZER_REGEX.get(pre) if isinstance(pre, str) else None
    if regex is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    tok.decoder = decoders.ByteLevel()
    return tok


def _spm(tokens: list[str], scores: Any) -> Any:
    """SentencePiece BPE as ``transformers``' LlamaConverter builds it: a merge for every split
    of a piece into two pieces, ranked by the merged piece's score."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, normalizers

    if not isinstance(scores, list) or len(scores) != len(tokens):
        scores = [0.0] * len(tokens)
    vocab = {t: i for i, t in reversed(list(enumerate(tokens)))}
    ranked = []
    for piece, score in zip(tokens, scores, strict=True):
        value = float(score) if isinstance(score, int | float) and math.isfinite(score) else 0.0
        local = [(piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab]
        local.sort(key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))
        ranked += [(value, i, pair) for i, pair in enumerate(local)]
    ranked.sort(key=lambda r: -r[0])  # stable: equal scores keep the order above
    unk = tokens[0] if tokens[0] == "<unk>" else ("<unk>" if "<unk>" in vocab else None)
    tok = RustTokenizer(models.BPE(vocab, [pair for _, _, pair in ranked], unk_token=unk, fuse_unk=True,
                                   byte_fallback=any(t.startswith("<0x") for t in tokens)))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return tok
