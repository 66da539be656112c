"""Per-head circuits (numpy) against their dense definitions (docs/math.md, "Circuits") and
Hugging Face's rotary embedding (torch) on small random weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headscope.engine.circuits import head_circuits as circuits
from headscope.engine.core.config import ModelConfig
from headscope.engine.core.errors import IndexOutOfRangeError, InvalidRequestError
from headscope.engine.forward.torch_weights import torch_weights
from headscope.engine.model.weights import DictWeights


def random_weights(*, n_layers: int = 2, n_heads: int = 4, d_model: int = 12, d_head: int = 5,
                   d_vocab: int = 23, n_ctx: int = 16, positional: str = "learned",
                   rotary_dim: int | None = None, n_kv_heads: int | None = None,
                   seed: int = 0) -> DictWeights:
    cfg = ModelConfig(family="native", architecture="test", n_layers=n_layers, n_heads=n_heads,
                      d_model=d_model, d_head=d_head, d_vocab=d_vocab, n_ctx=n_ctx,
                      n_kv_heads=n_kv_heads, normalization=None, positional=positional,
                      rotary_dim=rotary_dim, rotary_base=50.0)
    g = torch.Generator().manual_seed(seed)
    kv = n_kv_heads or n_heads
    t = {"embed.W_E": torch.randn(d_vocab, d_model, generator=g),
         "unembed.W_U": torch.randn(d_model, d_vocab, generator=g),
         "unembed.b_U": torch.zeros(d_vocab)}
    if positional == "learned":
        t["pos_embed.W_pos"] = torch.randn(n_ctx, d_model, generator=g)
    kv_prefix = "_" if n_kv_heads else ""
    for layer in range(n_layers):
        p = f"blocks.{layer}.attn."
        t[p + "W_Q"] = torch.randn(n_heads, d_model, d_head, generator=g)
        t[p + kv_prefix + "W_K"] = torch.randn(kv, d_model, d_head, generator=g)
        t[p + kv_prefix + "W_V"] = torch.randn(kv, d_model, d_head, generator=g)
        t[p + "W_O"] = torch.randn(n_heads, d_head, d_model, generator=g)
        t[p + "b_Q"] = torch.zeros(n_heads, d_head)
        t[p + kv_prefix + "b_K"] = torch.zeros(kv, d_head)
        t[p + kv_prefix + "b_V"] = torch.zeros(kv, d_head)
        t[p + "b_O"] = torch.zeros(d_model)
    return DictWeights(cfg, t, path="test.safetensors")


def dense(w: DictWeights, layer: int, name: str) -> np.ndarray:
    return w.get(f"blocks.{layer}.attn.{name}")


def dense_torch(w: DictWeights, layer: int, name: str) -> torch.Tensor:
    """``dense`` as a tensor (zero-copy), for the comparisons with Hugging Face's rotary code."""
    return torch_weights(w).get(f"blocks.{layer}.attn.{name}")


def t(x: object) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x  # type: ignore[return-value]


def close(x: torch.Tensor | np.ndarray, y: torch.Tensor | np.ndarray) -> None:
    x, y = t(x), t(y)
    torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4 * float(y.abs().max()))


@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_circuits_equal_their_dense_definitions(n_kv_heads):
    w = random_weights(n_kv_heads=n_kv_heads)
    w_e, w_u, w_pos = w.get("embed.W_E"), w.get("unembed.W_U"), w.get("pos_embed.W_pos")
    for layer in range(2):
        for head in range(4):
            q, k = dense(w, layer, "W_Q")[head], dense(w, layer, "W_K")[head]
            v, o = dense(w, layer, "W_V")[head], dense(w, layer, "W_O")[head]
            close(circuits.qk(w, layer, head).AB, q @ k.T)
            close(circuits.ov(w, layer, head).AB, v @ o)
            close(circuits.token_qk(w, layer, head).AB, w_e @ q @ k.T @ w_e.T)
            close(circuits.positional_qk(w, layer, head).AB, w_pos @ q @ k.T @ w_pos.T)
            close(circuits.full_ov(w, layer, head).AB, w_e @ v @ o @ w_u)


def test_gqa_heads_read_their_kv_head():
    w = random_weights(n_kv_heads=2)
    # Heads 2 and 3 both read K/V head 1 (group size 2).
    raw_k, raw_v = w._t["blocks.1.attn._W_K"][1].numpy(), w._t["blocks.1.attn._W_V"][1].numpy()
    for head in (2, 3):
        close(circuits.qk(w, 1, head).AB, dense(w, 1, "W_Q")[head] @ raw_k.T)
        close(circuits.ov(w, 1, head).AB, raw_v @ dense(w, 1, "W_O")[head])


def test_circuit_blocks_equal_blocks_of_the_full_circuits():
    w = random_weights()
    rows, cols = [3, 0, 22], [5, 5, 1, 9]
    close(circuits.circuit_block(w, 1, 2, "qk", "token", rows, cols),
          circuits.token_qk(w, 1, 2).block(rows, cols))
    close(circuits.circuit_block(w, 0, 3, "ov", "token", rows, cols),
          circuits.full_ov(w, 0, 3).block(rows, cols))
    close(circuits.circuit_block(w, 0, 3, "qk", "position", rows[:2], cols),
          circuits.positional_qk(w, 0, 3).block(rows[:2], cols))


def test_out_of_range_heads_and_wrong_position_kinds_are_typed_errors():
    w = random_weights()
    with pytest.raises(IndexOutOfRangeError, match=r"test\.safetensors"):
        circuits.qk(w, 2, 0)
    with pytest.raises(IndexOutOfRangeError):
        circuits.ov(w, 0, 4)
    with pytest.raises(InvalidRequestError):
        circuits.rotary_qk(w, 0, 0, 1)
    rot = random_weights(positional="rotary", d_head=6, rotary_dim=4)
    with pytest.raises(InvalidRequestError, match="learned"):
        circuits.positional_qk(rot, 0, 0)


def hf_rotary_score(q: torch.Tensor, k: torch.Tensor, qpos: int, kpos: int, cfg: ModelConfig
                    ) -> torch.Tensor:
    """q·k after Hugging Face GPT-NeoX's apply_rotary_pos_emb at positions qpos and kpos."""
    from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb

    r = cfg.rotary_dim or cfg.d_head
    inv_freq = 1.0 / (cfg.rotary_base ** (torch.arange(0, r, 2, dtype=torch.float32) / r))
    freqs = torch.tensor([qpos, kpos], dtype=torch.float32)[:, None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)[None]  # [batch 1, pos 2, r]
    both = torch.stack((q, k))[None, None]  # [1, heads 1, pos 2, d_head]
    rq, rk = apply_rotary_pos_emb(both, both, emb.cos(), emb.sin())
    return (rq[0, 0, 0] * rk[0, 0, 1]).sum()


@pytest.mark.parametrize("n,count,seed", [(40, 10, 3), (50257, 256, 0), (300, 256, 7), (5, 9, 1)])
def test_token_sample_is_torchs_seeded_permutation(n, count, seed):
    expected = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:count]
    np.testing.assert_array_equal(circuits.token_sample(n, count, seed), expected.numpy())
