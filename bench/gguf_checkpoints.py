"""Random llama.cpp GGUF checkpoints of a ``bench.checkpoints`` shape (``python -m bench.big --gguf``).

Written the way llama.cpp's converter and quantiser lay a Llama file out: its tensor names
(``token_embd``, ``blk.N.attn_q``, ...), the ``llama.*`` metadata keys, norm gains in F32, every
2-D weight in the quantised type (for ``Q4_K``, the output matrix in ``Q6_K``, as llama.cpp's
``Q4_K_M`` / ``Q4_K_S`` do), and a SentencePiece ("llama") vocabulary of ``d_vocab`` pieces
with scores and byte fallback, which headscope builds into a tokenizer as for Llama 1/2.

The weights are random valid blocks (``bench.dequant.random_blocks``; the ``gguf`` package
cannot quantise to K-types) whose scales give values of roughly the ±0.02 of the safetensors
bench checkpoints. Q/K rows are not permuted: random rows are random either way, and the
reader undoes the permutation all the same.

Each file is written once (to ``NAME.part``, renamed when complete) and reused; only one
tensor's bytes are in memory at a time.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from .checkpoints import Shape
from .dequant import random_blocks

# f16 block scale per type for values of magnitude ~0.02 (q ranges: Q8_0 int8; Q4_0 ±8;
# K-types sc·q up to 63·15 (Q4_K), 63·31 (Q5_K), 128·32 (Q6_K)).
SCALES = {"Q8_0": 3e-4, "Q4_0": 3e-3, "Q4_K": 3e-5, "Q5_K": 1.5e-5, "Q6_K": 5e-6}


def gguf_path(shape: Shape, root: Path, qtype: str) -> Path:
    return Path(root) / f"{shape.name}-{qtype.lower()}.gguf"


def _tensors(shape: Shape, qtype: str) -> list[tuple[str, tuple[int, ...], str]]:
    """(GGUF name, numpy shape, ggml type) in the converter's order."""
    d, kv = shape.d_model, (shape.n_kv_heads or shape.n_heads) * shape.d_head
    out = [("token_embd.weight", (shape.d_vocab, d), qtype)]
    for i in range(shape.n_layers):
        p = f"blk.{i}."
        out += [
            (p + "attn_norm.weight", (d,), "F32"),
            (p + "ffn_down.weight", (d, shape.d_mlp), qtype),
            (p + "ffn_gate.weight", (shape.d_mlp, d), qtype),
            (p + "ffn_up.weight", (shape.d_mlp, d), qtype),
            (p + "ffn_norm.weight", (d,), "F32"),
            (p + "attn_k.weight", (kv, d), qtype),
            (p + "attn_output.weight", (d, d), qtype),
            (p + "attn_q.weight", (d, d), qtype),
            (p + "attn_v.weight", (kv, d), qtype),
        ]
    out += [("output_norm.weight", (d,), "F32"),
            ("output.weight", (shape.d_vocab, d), "Q6_K" if qtype == "Q4_K" else qtype)]
    return out


def _data(name: str, dims: tuple[int, ...], qtype: str, seed: int) -> np.ndarray:
    if qtype == "F32":
        return (1.0 + 0.05 * np.random.default_rng(seed).standard_normal(dims)).astype(np.float32)
    return random_blocks(qtype, dims[0], dims[1], seed=seed, scale=SCALES[qtype])


def vocabulary(d_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece-style vocabulary of ``d_vocab`` pieces (tokens, scores, token types):
    ``<unk> <s> </s>``, the 256 byte pieces, the words of ``sinks.NATURAL_PROMPTS`` (so the
    sink prompts tokenise into real pieces), then letters and letter runs with and without the
    ``▁`` word mark, shortest first (so many pieces split into two others: merges to build)."""
    from headscope.engine.forward.sinks import NATURAL_PROMPTS

    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    types = [2, 3, 3, *([6] * 256)]  # gguf.TokenType: UNKNOWN, CONTROL, BYTE
    words = dict.fromkeys("▁" + w for text in NATURAL_PROMPTS for w in re.findall(r"\S+", text))
    # each word's characters and prefixes first (the best scores): BPE reaches a word only
    # through merges of pieces it holds, and without "▁", "W", "▁W", "▁Wh", "▁Whe" the
    # sentences fell apart into bytes (326 tokens for the four, against 70 for the bf16
    # checkpoint's word-level tokenizer: heads on these files ran a 1.8× longer forward pass)
    prefixes = dict.fromkeys(w[:n] for w in words for n in range(1, len(w) + 1))
    prefixes.update(dict.fromkeys(c for w in words for c in w))
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    pieces: dict[str, None] = dict(prefixes)
    pieces.update(dict.fromkeys([*letters, *("▁" + c for c in letters)]))
    pieces.update(words)
    runs = list(letters)
    while len(tokens) + len(pieces) < d_vocab:
        runs = [a + b for a in runs for b in letters][: 2 * d_vocab]
        for r in runs:
            pieces.update({r: None, "▁" + r: None})
            if len(tokens) + len(pieces) >= d_vocab:
                break
    tokens += list(pieces)[: d_vocab - len(tokens)]
    types += [1] * (len(tokens) - len(types))  # NORMAL
    scores = [0.0] * 259 + [-float(i) for i in range(len(tokens) - 259)]
    return tokens, scores, types


def write_gguf_checkpoint(shape: Shape, root: Path, qtype: str) -> Path:
    """``shape`` as a ``qtype`` GGUF file under ``root`` (once; reused if complete)."""
    import gguf

    path = gguf_path(shape, root, qtype)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    w = gguf.GGUFWriter(str(part), "llama")
    w.add_block_count(shape.n_layers)
    w.add_context_length(shape.n_ctx)
    w.add_embedding_length(shape.d_model)
    w.add_feed_forward_length(shape.d_mlp)
    w.add_head_count(shape.n_heads)
    w.add_head_count_kv(shape.n_kv_heads or shape.n_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(shape.d_head)
    w.add_file_type({"Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "Q4_K": gguf.LlamaFileType.MOSTLY_Q4_K_M,
                     "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0, "Q5_K": gguf.LlamaFileType.MOSTLY_Q5_K_M,
                     "Q6_K": gguf.LlamaFileType.MOSTLY_Q6_K}[qtype])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tokens, scores, types = vocabulary(shape.d_vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    plan = _tensors(shape, qtype)
    for name, dims, kind in plan:
        if kind == "F32":
            w.add_tensor_info(name, dims, np.dtype(np.float32), 4 * int(np.prod(dims)))
        else:
            block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
            row = dims[1] // block * size
            w.add_tensor_info(name, (dims[0], row), np.dtype(np.uint8), dims[0] * row,
                              raw_dtype=gguf.GGMLQuantizationType[kind])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for seed, (name, dims, kind) in enumerate(plan):
        w.write_tensor_data(_data(name, dims, kind, seed))  # one tensor in memory at a time
    w.close()
    os.replace(part, path)
    return path
