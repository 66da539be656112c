"""Weight sources (engine/model/weights.py): per-head reads are slices of the stored tensors, cached, fused tensors read once, grouped heads the same from a dict or a checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from headscope.engine.model.loading import load_model
from headscope.engine.model.weights import CheckpointWeights, DictWeights


def test_get_head_reads_one_slice_and_caches(gpt2_dir: tuple[Path, Any]) -> None:
    m = load_model(gpt2_dir[0], raw=True)
    w = m.raw_weights
    assert isinstance(w, CheckpointWeights) and w.reads == 0  # opening reads no tensor data
    head = w.get_head("blocks.1.attn.W_V", 2)
    assert w.reads == 1 and head.shape == (32, 8)
    w.get_head("blocks.1.attn.W_V", 2)
    assert w.reads == 1  # cached


def test_a_fused_tensor_is_read_once_for_all_its_parts(gpt2_dir: tuple[Path, Any]) -> None:
    """GPT-2's c_attn holds W_Q, W_K, W_V and every head as column ranges: one read serves
    them all (each part used to read the whole tensor again), and each part is its own,
    writable copy, equal to the stored columns."""
    path, model = gpt2_dir
    w = load_model(path, raw=True).raw_weights
    assert isinstance(w, CheckpointWeights)
    stored = model.transformer.h[1].attn.c_attn.weight.detach().numpy()
    parts = [w.get("blocks.1.attn.W_Q"), w.get_fresh("blocks.1.attn.W_K"), w.get_head("blocks.1.attn.W_V", 2)]
    parts += [w.get_head(f"blocks.1.attn.W_{x}", h) for x in "QKV" for h in range(4)]
    assert w.reads == 1
    np.testing.assert_array_equal(parts[0], stored[:, :32].reshape(32, 4, 8).transpose(1, 0, 2))
    np.testing.assert_array_equal(parts[1], stored[:, 32:64].reshape(32, 4, 8).transpose(1, 0, 2))
    np.testing.assert_array_equal(parts[2], stored[:, 64 + 16 : 64 + 24])
    # each part is cut out of the kept read and copied once: none shares memory with it
    # (parts[2] is cached: asked again below as W_V of head 2, the same array)
    distinct = list({id(p): p for p in parts}.values())
    assert not any(np.shares_memory(a, b) for i, a in enumerate(distinct) for b in distinct[i + 1:])
    parts[1] += 1  # get_fresh: the caller's to edit; the next read is unchanged
    np.testing.assert_array_equal(w.get_head("blocks.1.attn.W_K", 0), stored[:, 32:40])


def test_dict_and_checkpoint_weights_agree_on_grouped_heads(llama_dir: tuple[Path, Any]) -> None:
    w = load_model(llama_dir[0], raw=True).weights
    d = DictWeights(w.cfg, {"blocks.0.attn._W_K": w.get("blocks.0.attn.W_K")[::2]})
    for h in range(4):
        torch.testing.assert_close(
            d.get_head("blocks.0.attn.W_K", h), w.get_head("blocks.0.attn.W_K", h)
        )
