"""The independent floor of ``heads``: the same arithmetic written in plain torch on plain reads.

Nothing here imports headscope: the weights come from ``safetensors.safe_open`` (bf16 upcast to
float32 by torch), the products are torch's, and the forward pass is a small hand-written Llama
(RMSNorm, rotary embeddings, causal softmax attention, SwiGLU MLP), so a slow reader, converter
or forward pass in headscope cannot hide in the floor it is measured against.

``floor(path, tokens)`` does, once each:

- read both embeddings, form ``W_U W_E`` and ``W_Eᵀ W_E`` (``[d, d]``);
- per layer: read every weight of the layer (the attention weights and the MLP, as the forward
  pass needs them), the two ``[H·d_head, d] @ [d, d]`` products of the spectral sweeps
  (copying: ``W_O``'s rows against ``W_U W_E``; QK positivity: ``W_Q``'s rows against
  ``W_Eᵀ W_E``), and the layer's forward pass on every sequence of ``tokens`` (the
  per-token parts on all of them as one matrix, attention per sequence);
- the final norm and the unembedding of the last position of each sequence.

``gguf_read(path)``: every tensor of a GGUF file through ``gguf``'s own reader and
``gguf.quants.dequantize`` (llama.cpp's numpy reference), to float32 one tensor at a time: the
read cost of the GGUF rows, reported apart from the bf16 floor.

Both run with the allocator policy of headscope's console script (``keep_freed``, written
out here with ``ctypes``: freed blocks kept in the heap for the next layer's), so a ratio
does not count that policy as less work: on a box that hands freed pages to its host the
floor would otherwise pay for fresh pages that ``heads`` reuses.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

# The behaviour batch of ``heads`` (docs/math.md "Scores", TransformerLens' head detector): 4
# random sequences of 32 tokens written twice. With a tokenizer ``heads`` also runs the four
# natural sentences of its attention-sink score; on the word-level vocabulary of
# ``bench/checkpoints.py`` each word or mark is one token, so their lengths are counted here.
BEHAVIOUR = (4, 64)
SENTENCES = (
    "When Mary and John went to the store , John gave a drink to Mary .",
    "The cat sat on the mat and looked at the dog , and the dog looked back at the cat .",
    "On Monday the old man walked to the river with his small red boat .",
    "In the morning we read the news , then we went out to buy bread and milk .",
)


def since(t: float) -> float:
    return time.perf_counter() - t


def keep_freed() -> None:
    """glibc's ``mallopt``: one arena, no block mapped on its own, no trimming (what
    ``headscope.engine.core.memory.keep_freed_memory`` sets; nothing elsewhere)."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return
    for param, value in ((-8, 1), (-4, 0), (-1, 2**31 - 1)):  # M_ARENA_MAX, M_MMAP_MAX, M_TRIM_THRESHOLD (a C int)
        mallopt(param, value)


def sequence_lengths(batch: str, tokenizer: bool) -> list[int]:
    """The lengths of the sequences the floor's forward pass runs: ``"64"`` one sequence of 64
    tokens (the thin floor), ``"heads"`` the behaviour batch of ``heads`` (4 × 64, plus one
    sequence per natural sentence, BOS first, when the checkpoint has a tokenizer)."""
    if batch != "heads":
        return [int(batch)]
    lengths = [BEHAVIOUR[1]] * BEHAVIOUR[0]
    if tokenizer:
        lengths += [1 + len(s.split()) for s in SENTENCES]
    return lengths


class SafetensorsFiles:
    """Tensors by name from a (sharded) safetensors checkpoint. Each tensor's file is opened
    for that read only, so no file stays mapped (peak RSS counts the floor's own arrays, not
    the checkpoint's pages)."""

    def __init__(self, path: Path) -> None:
        from safetensors import safe_open

        index = path / "model.safetensors.index.json"
        if index.exists():
            where = json.loads(index.read_text())["weight_map"]
        else:
            with safe_open(str(path / "model.safetensors"), framework="pt") as f:
                where = dict.fromkeys(f.keys(), "model.safetensors")
        self._path, self._where = path, where
        self.read_s = 0.0  # time spent reading and upcasting

    def get(self, name: str) -> Any:
        """The tensor, upcast to float32 (a copy: nothing of the file's mapping is kept)."""
        from safetensors import safe_open

        t = time.perf_counter()
        with safe_open(str(self._path / self._where[name]), framework="pt") as f:
            stored = f.get_tensor(name)
            out = stored.float() if stored.is_floating_point() and stored.itemsize < 4 else stored.clone().float()
        self.read_s += since(t)
        return out


def _rms_norm(x: Any, gain: Any, eps: float) -> Any:
    import torch

    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain


def _rotary(x: Any, theta: float) -> Any:
    """Rotary embedding of ``x [heads, n, d_head]`` (the Hugging Face Llama layout: the two
    halves of each head rotate against each other)."""
    import torch

    n, dh = x.shape[-2], x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, dh, 2, dtype=torch.float32) / dh)
    angle = torch.arange(n, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = torch.cat((angle.cos(), angle.cos()), -1), torch.cat((angle.sin(), angle.sin()), -1)
    half = dh // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


def _attention(q: Any, k: Any, v: Any, lengths: list[int], cfg: dict[str, Any]) -> Any:
    """Causal softmax attention per sequence of the concatenated rows ``q [N, H·dh]``,
    ``k, v [N, KV·dh]``; ``[N, H·dh]``."""
    import torch

    h, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    dh, theta = cfg["hidden_size"] // h, cfg.get("rope_theta", 10000.0)
    out, start = [], 0
    for n in lengths:
        qs = _rotary(q[start:start + n].reshape(n, h, dh).transpose(0, 1), theta)
        ks = _rotary(k[start:start + n].reshape(n, kv, dh).transpose(0, 1), theta)
        vs = v[start:start + n].reshape(n, kv, dh).transpose(0, 1)
        ks, vs = ks.repeat_interleave(h // kv, 0), vs.repeat_interleave(h // kv, 0)
        scores = qs @ ks.transpose(1, 2) / dh**0.5
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        out.append((scores.softmax(-1) @ vs).transpose(0, 1).reshape(n, h * dh))
        start += n
    return torch.cat(out)


def floor(path: Path, batch: str = "heads") -> dict[str, Any]:
    """The floor of ``heads`` on a Llama safetensors checkpoint (module docstring); seconds
    spent reading (with the bf16 → float32 upcast), in the spectral products and in the
    forward pass."""
    keep_freed()
    import torch

    cfg = json.loads((path / "config.json").read_text())
    lengths = sequence_lengths(batch, (path / "tokenizer.json").exists())
    files = SafetensorsFiles(path)
    vocab, eps = cfg["vocab_size"], cfg.get("rms_norm_eps", 1e-5)
    spectral = forward = 0.0
    with torch.inference_mode():
        w_e, w_u = files.get("model.embed_tokens.weight"), files.get("lm_head.weight")  # [V, d] both
        t = time.perf_counter()
        middles = (w_u.T @ w_e, w_e.T @ w_e)  # W_U W_E and W_Eᵀ W_E, [d, d]
        spectral += since(t)
        t = time.perf_counter()
        tokens = torch.cat([torch.randint(vocab, (n,), generator=torch.Generator().manual_seed(i))
                            for i, n in enumerate(lengths)])
        x = w_e[tokens]
        del w_e
        forward += since(t)
        for layer in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{layer}."
            a = {n: files.get(f"{p}self_attn.{n}_proj.weight") for n in "qkvo"}  # [out, in]
            t = time.perf_counter()
            a["o"].T @ middles[0]  # copying: W_O as [H·d_head, d] against W_U W_E
            a["q"] @ middles[1]  # QK positivity: W_Q as [H·d_head, d] against W_Eᵀ W_E
            spectral += since(t)
            norms = (files.get(p + "input_layernorm.weight"), files.get(p + "post_attention_layernorm.weight"))
            t = time.perf_counter()
            h = _rms_norm(x, norms[0], eps)
            z = _attention(h @ a["q"].T, h @ a["k"].T, h @ a["v"].T, lengths, cfg)
            x = x + z @ a["o"].T
            forward += since(t)
            del a, h, z
            mlp = {n: files.get(f"{p}mlp.{n}_proj.weight") for n in ("gate", "up", "down")}
            t = time.perf_counter()
            h = _rms_norm(x, norms[1], eps)
            x = x + (torch.nn.functional.silu(h @ mlp["gate"].T) * (h @ mlp["up"].T)) @ mlp["down"].T
            forward += since(t)
            del mlp, h
        final = files.get("model.norm.weight")
        t = time.perf_counter()
        ends = torch.tensor(lengths).cumsum(0) - 1
        _rms_norm(x[ends], final, eps) @ w_u.T
        forward += since(t)
    return {"read": files.read_s, "spectral": spectral, "forward": forward,
            "tokens": sum(lengths), "sequences": len(lengths)}


def gguf_read(path: Path) -> dict[str, Any]:
    """Every tensor of a GGUF file read and dequantised to float32 by the ``gguf`` package."""
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize

    keep_freed()
    t = time.perf_counter()
    reader = GGUFReader(path)
    values = 0
    for tensor in reader.tensors:
        out = dequantize(tensor.data, tensor.tensor_type)
        values += int(np.asarray(out, dtype=np.float32).size)
        del out
    return {"read": since(t), "values": values}
