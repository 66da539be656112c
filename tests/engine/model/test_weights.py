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


def test_stored_kv_heads_are_read_without_the_expanded_copy(llama_dir: tuple[Path, Any]) -> None:
    """``_W_K``/``_W_V``/``_b_K``/``_b_V`` (TransformerLens' names) hold each stored K/V head
    once, raw and processed: equal to every ``group``-th head of the canonical tensor, and a
    forward pass reads them alone (``stored_kv``), so no expanded copy is built or cached."""
    from headscope.engine.forward import transformer
    from headscope.engine.forward.torch_weights import torch_weights
    from headscope.engine.model.weights import stored_kv

    path, model = llama_dir
    for raw in (True, False):
        m = load_model(path, raw=raw)
        w, cfg = m.weights, m.cfg
        group = cfg.n_heads // cfg.kv_heads
        assert group > 1  # the fixture is grouped
        for name in ("W_K", "W_V", "b_K", "b_V"):
            kv = w.get(f"blocks.1.attn._{name}")
            assert kv.shape[0] == cfg.kv_heads
            np.testing.assert_array_equal(kv, w.get(f"blocks.1.attn.{name}")[::group])
            np.testing.assert_array_equal(stored_kv(w, f"blocks.1.attn.{name}"), kv)
    assert not w.has("blocks.1.attn._W_Q") and not w.has("blocks.1.attn._W_O")
    # the stored heads are the checkpoint's rows, whole: k_proj [kv·d_head, d_model]
    raw = load_model(path, raw=True).weights
    k_proj = model.model.layers[1].self_attn.k_proj.weight.detach().numpy()
    np.testing.assert_array_equal(raw.get("blocks.1.attn._W_K"),
                                  k_proj.reshape(cfg.kv_heads, cfg.d_head, cfg.d_model).transpose(0, 2, 1))

    w = load_model(path).weights  # processed, nothing cached yet
    computed: list[str] = []
    compute = w._compute

    def recorded(name: str, head: int | None) -> np.ndarray:
        computed.append(name)
        return compute(name, head)

    w._compute = recorded  # type: ignore[method-assign]
    transformer.run(torch_weights(w), torch.tensor([[1, 2, 3, 4, 5]]))
    assert {f"blocks.{i}.attn._{x}" for i in range(cfg.n_layers) for x in ("W_K", "W_V")} <= set(computed)
    assert not set(computed) & {f"blocks.{i}.attn.W_{x}" for i in range(cfg.n_layers) for x in "KV"}
