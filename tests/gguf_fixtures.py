"""Tiny GGUF files made from the tiny HF checkpoints of tests/hf_fixtures.py.

``write_gguf`` converts a ``transformers`` model the way llama.cpp's ``convert_hf_to_gguf.py``
does, with llama.cpp's own pieces from the ``gguf`` package: tensor names from
``gguf.get_tensor_name_map`` (not headscope's reverse table), the ``{arch}.*`` metadata keys
of ``GGUFWriter``, the Q/K row permutation of ``LlamaModel.permute`` for the ``llama``
architecture, and ``gguf.quants.quantize`` for the quantised types. As in llama.cpp, 1-D
tensors (norm gains, biases) stay F32.

``gguf.quants`` cannot quantise the K-quants (Q4_K, Q6_K): ``k_quant_blocks`` makes valid
random blocks instead (random bytes with the block's f16 scale fields set to small finite
values), so a test can put their dequantised values into the HF model and compare the GGUF
file with a safetensors checkpoint holding exactly the same numbers.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ARCH_OF_MODEL_TYPE = {"llama": "llama", "qwen2": "qwen2", "phi3": "phi3", "mistral": "llama", "gemma": "gemma",
                      "gemma2": "gemma2", "gemma3_text": "gemma3", "qwen3": "qwen3", "olmo2": "olmo2"}


def permute(w: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """``convert_hf_to_gguf.py``'s ``LlamaModel.permute`` (rows of Q/K for the rotary kernel)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _qtype(name: str) -> Any:
    from gguf.constants import GGMLQuantizationType

    return GGMLQuantizationType[name]


def encode(arr: np.ndarray, qtype: str) -> tuple[np.ndarray, Any]:
    """(data, raw_dtype) for ``GGUFWriter.add_tensor``: ``arr`` stored as ``qtype``."""
    import gguf.quants

    if qtype == "F32":
        return arr.astype(np.float32), None
    if qtype == "F16":
        return arr.astype(np.float16), None
    return gguf.quants.quantize(arr.astype(np.float32), _qtype(qtype)), _qtype(qtype)


def write_gguf(
    model: Any,
    out: Path,
    *,
    qtype: str | Callable[[str, tuple[int, ...]], str] = "F32",
    raw_blocks: dict[str, tuple[np.ndarray, str]] | None = None,
    tokens: list[str] | None = None,
    merges: list[str] | None = None,
    tokenizer_model: str = "gpt2",
    scores: list[float] | None = None,
    extra_tensors: dict[str, np.ndarray] | None = None,
    tokenizer_pre: str | None = None,
    metadata: Callable[[Any], Any] | None = None,
) -> Path:
    """Write ``model`` (a transformers Llama / Qwen2 / Phi-3 / Gemma 1/2/3) as a GGUF file at ``out``.

    ``qtype``: the ggml type of 2-D weights (or a function of (hf name, shape)); 1-D tensors are
    F32. ``raw_blocks``: HF name -> (already quantised bytes [rows, row_bytes], type), written as
    they are (permuted like the weights where the conversion permutes).
    """
    import gguf

    c = model.config
    arch = ARCH_OF_MODEL_TYPE[c.model_type]
    enum = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2, "phi3": gguf.MODEL_ARCH.PHI3,
            "gemma": gguf.MODEL_ARCH.GEMMA, "gemma2": gguf.MODEL_ARCH.GEMMA2, "gemma3": gguf.MODEL_ARCH.GEMMA3,
            "qwen3": gguf.MODEL_ARCH.QWEN3, "olmo2": gguf.MODEL_ARCH.OLMO2}[arch]
    names = gguf.get_tensor_name_map(enum, c.num_hidden_layers)
    n_heads, n_kv = c.num_attention_heads, getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // n_heads
    rope = dict(getattr(c, "rope_parameters", None) or {})
    if arch == "gemma3":  # per layer kind: the file stores the global layers' (Gemma3Model)
        rope = dict(rope.get("full_attention") or {})
    pct = rope.get("partial_rotary_factor", getattr(c, "partial_rotary_factor", 1.0)) or 1.0

    w = gguf.GGUFWriter(str(out), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(rope.get("rope_theta", getattr(c, "rope_theta", 10000.0)))
    w.add_rope_dimension_count(int(head_dim * pct))
    if metadata is not None:
        metadata(w)  # extra keys, e.g. RoPE scaling
    if arch == "phi3" and getattr(c, "sliding_window", None):
        w.add_sliding_window(c.sliding_window)
    if head_dim != c.hidden_size // n_heads or arch in ("gemma2", "gemma3"):
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if rope.get("rope_type") == "yarn":  # Qwen2Model / Qwen3Model.set_gguf_parameters
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    if rope.get("rope_type") == "longrope":  # Phi3MiniModel: factors as tensors, attn factor computed
        import math

        original = rope["original_max_position_embeddings"]
        scale = c.max_position_embeddings / original
        w.add_rope_scaling_orig_ctx_len(original)
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)
        extra_tensors = {**(extra_tensors or {}),
                         "rope_factors_long.weight": np.array(rope["long_factor"], dtype=np.float32),
                         "rope_factors_short.weight": np.array(rope["short_factor"], dtype=np.float32)}
    if arch in ("gemma2", "gemma3"):  # Gemma2Model / Gemma3Model.set_gguf_parameters
        if getattr(c, "attn_logit_softcapping", None):
            w.add_attn_logit_softcapping(c.attn_logit_softcapping)
        if getattr(c, "final_logit_softcapping", None):
            w.add_final_logit_softcapping(c.final_logit_softcapping)
        w.add_sliding_window(c.sliding_window)
        if rope.get("rope_type") == "linear":  # Gemma 3: applies to the global layers only
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(rope["factor"])
    if tokens is not None:
        w.add_tokenizer_model(tokenizer_model)
        if tokenizer_pre is not None:
            w.add_tokenizer_pre(tokenizer_pre)
        w.add_token_list(tokens)
        if merges is not None:
            w.add_token_merges(merges)
        if scores is not None:
            w.add_token_scores(scores)
    raw_blocks = raw_blocks or {}
    for hf_name, t in model.state_dict().items():
        if hf_name.endswith("rotary_emb.inv_freq"):
            continue
        if hf_name == "lm_head.weight" and getattr(c, "tie_word_embeddings", False):
            continue  # save_pretrained (and so the conversion) drops the tied copy
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf_name
        arr = t.detach().float().numpy()
        if hf_name in raw_blocks:
            data, kind = raw_blocks[hf_name]
            raw = _qtype(kind)
        else:
            kind = qtype(hf_name, arr.shape) if callable(qtype) else qtype
            data, raw = encode(arr, kind if arr.ndim == 2 else "F32")
        if arch.startswith("gemma") and hf_name.endswith("norm.weight"):
            data = data + 1  # Gemma*Model.modify_tensors: llama.cpp's RMSNorm multiplies by w, not 1 + w
        if arch == "llama" and "self_attn.q_proj" in hf_name:
            data = permute(data, n_heads, n_heads)
        elif arch == "llama" and "self_attn.k_proj" in hf_name:
            data = permute(data, n_heads, n_kv)
        w.add_tensor(name, np.ascontiguousarray(data), raw_dtype=raw)
    for name, arr in (extra_tensors or {}).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(out)


def llama3_rope_freqs(config: Any) -> np.ndarray:
    """``rope_freqs.weight`` as ``convert_hf_to_gguf.py`` computes it for ``llama3`` RoPE scaling
    (one divisor per frequency), transcribed from llama.cpp's converter."""
    import math

    rope = dict(config.rope_parameters)
    base = rope.get("rope_theta", 10000.0)
    dim = config.hidden_size // config.num_attention_heads
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, low, high = rope.get("factor", 8.0), rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old_context_len = rope.get("original_max_position_embeddings", 8192)
    low_freq_wavelen, high_freq_wavelen = old_context_len / low, old_context_len / high
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            out.append(1)
        elif wavelen > low_freq_wavelen:
            out.append(factor)
        else:
            smooth = (old_context_len / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def k_quant_blocks(rows: int, cols: int, kind: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Valid random ``kind`` ("Q4_K" or "Q6_K") blocks for a [rows, cols] tensor and their values.

    Every byte pattern of the packed quants and sub-block scales is a valid block; only the f16
    super-block scales need care (finite, small): Q4_K's d and dmin (bytes 0..3) ~ 3e-4, so
    values are d·sc·q - dmin·m with 6-bit sc, m and 4-bit q: |x| < 0.3; Q6_K's d (the last two
    bytes) ~ 1e-4, so values d·scale·(q - 32) with int8 scale and 6-bit q: |x| < 0.45.
    Returns (bytes [rows, row_bytes], float32 values [rows, cols]) via ``gguf.quants.dequantize``.
    """
    import gguf.quants
    from gguf.constants import GGML_QUANT_SIZES

    qtype = _qtype(kind)
    block, size = GGML_QUANT_SIZES[qtype]
    assert cols % block == 0
    gen = np.random.default_rng(seed)
    n_blocks = rows * cols // block
    blocks = gen.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    if kind == "Q4_K":
        scales = (gen.uniform(1e-4, 3e-4, size=(n_blocks, 2))).astype(np.float16)
        blocks[:, 0:4] = scales.view(np.uint8)
    elif kind == "Q6_K":
        d = gen.uniform(0.5e-4, 1e-4, size=(n_blocks, 1)).astype(np.float16)
        blocks[:, size - 2 : size] = d.view(np.uint8)
    else:
        raise ValueError(kind)
    data = blocks.reshape(rows, cols // block * size)
    values = gguf.quants.dequantize(data, qtype).astype(np.float32)
    return data, values


# --- hand-made GGUF bytes for hostile-input tests ---------------------------------------------


def _string(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gguf_bytes(
    *,
    magic: bytes = b"GGUF",
    version: int = 3,
    kv: list[tuple[str | bytes, int, bytes]] | None = None,
    tensors: list[tuple[str | bytes, list[int], int, int]] | None = None,
    n_tensors: int | None = None,
    n_kv: int | None = None,
    data: bytes = b"",
    alignment: int = 32,
) -> bytes:
    """A GGUF file: ``kv`` as (key, value type, packed value), ``tensors`` as
    (name, ne, ggml type, offset); the counts can be overridden to lie."""
    kv = kv if kv is not None else [("general.architecture", 8, _string("llama"))]
    tensors = tensors or []
    out = magic + struct.pack("<I", version)
    out += struct.pack("<QQ", len(tensors) if n_tensors is None else n_tensors, len(kv) if n_kv is None else n_kv)
    for key, vtype, value in kv:
        out += _string(key) + struct.pack("<I", vtype) + value
    for name, ne, ttype, offset in tensors:
        out += _string(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", ttype, offset)
    out += b"\0" * (-len(out) % alignment)
    return out + data


def string_value(s: str) -> bytes:
    return _string(s)
