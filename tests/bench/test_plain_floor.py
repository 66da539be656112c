"""The independent floor's hand-written Llama forward (``bench/plain_floor.py``) is a Llama:
its layers, run the way ``floor`` runs them (several sequences side by side, attention per
sequence), give ``transformers``' logits; and ``floor`` runs on the toy checkpoint."""

from __future__ import annotations

import json

import pytest
import torch

from bench import plain_floor
from bench.checkpoints import SHAPES, write_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_checkpoint(SHAPES["tiny-llama"], tmp_path_factory.mktemp("ck"))  # GQA: 4 heads, 2 KV


def _logits(path, tokens, lengths):
    cfg = json.loads((path / "config.json").read_text())
    files, eps = plain_floor.SafetensorsFiles(path), cfg["rms_norm_eps"]
    x = files.get("model.embed_tokens.weight")[tokens]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        a = {n: files.get(f"{p}self_attn.{n}_proj.weight") for n in "qkvo"}
        h = plain_floor._rms_norm(x, files.get(p + "input_layernorm.weight"), eps)
        x = x + plain_floor._attention(h @ a["q"].T, h @ a["k"].T, h @ a["v"].T, lengths, cfg) @ a["o"].T
        h = plain_floor._rms_norm(x, files.get(p + "post_attention_layernorm.weight"), eps)
        gate, up, down = (files.get(f"{p}mlp.{n}_proj.weight") for n in ("gate", "up", "down"))
        x = x + (torch.nn.functional.silu(h @ gate.T) * (h @ up.T)) @ down.T
    return plain_floor._rms_norm(x, files.get("model.norm.weight"), eps) @ files.get("lm_head.weight").T


def test_the_hand_written_forward_is_transformers_llama(tiny):
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    first, second = torch.arange(7, 27), torch.arange(100, 109)
    with torch.inference_mode():
        ours = _logits(tiny, torch.cat((first, second)), [20, 9])
        ref = torch.cat([model(seq[None]).logits[0] for seq in (first, second)])
    # float32 throughout on both sides, logits of size ~1: a few ulps of accumulated rounding
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_the_floor_runs_on_the_behaviour_batch(tiny):
    out = plain_floor.floor(tiny, "heads")
    assert out["sequences"] == 4 + len(plain_floor.SENTENCES)  # the checkpoint has a tokenizer
    assert out["tokens"] == 4 * 64 + sum(1 + len(s.split()) for s in plain_floor.SENTENCES)
    assert plain_floor.floor(tiny, "64")["tokens"] == 64
