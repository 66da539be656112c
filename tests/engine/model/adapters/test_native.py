"""headscope's native format (engine/model/adapters/native.py): a round trip, grouped-query weights expanded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from headscope.engine.formats.tokenizer import IdTokenizer, VocabTokenizer
from headscope.engine.forward.torch_weights import torch_weights
from headscope.engine.forward.transformer import log_probs, run
from headscope.engine.model.loading import load_model
from tests import hf_fixtures as hf
from tests.engine.model.test_loading import TOKENS, _canonical


@pytest.mark.parametrize("in_metadata", [True, False], ids=["metadata", "headscope.json"])
def test_native_round_trip(tmp_path: Path, gpt2_dir: tuple[Path, Any], in_metadata: bool) -> None:
    fields, tensors = _canonical(gpt2_dir[0])
    tensors.pop("unembed.W_U")  # tied: the native file stores W_E once
    words = [f"t{i}" for i in range(96)]
    out = hf.write_native(
        tmp_path / "n", fields, tensors, vocab=words, config_in_metadata=in_metadata
    )
    m = load_model(out, raw=True)
    assert m.structure()["format"] == "native" and m.raw_cfg.tied_unembed
    for name, t in tensors.items():
        torch.testing.assert_close(torch_weights(m.weights).get(name), t, atol=0, rtol=0)
    ref = log_probs(run(load_model(gpt2_dir[0]).weights, TOKENS))
    torch.testing.assert_close(
        log_probs(run(load_model(out).weights, TOKENS)), ref, atol=1e-5, rtol=0
    )
    assert isinstance(m.tokenizer, VocabTokenizer) and m.tokenizer.encode("t3 t95") == [3, 95]


def test_native_grouped_query_weights_are_expanded(
    tmp_path: Path, llama_dir: tuple[Path, Any]
) -> None:
    fields, tensors = _canonical(llama_dir[0])
    cfg = load_model(llama_dir[0], raw=True).raw_cfg
    for layer in range(cfg.n_layers):
        for x in ("W_K", "W_V", "b_K", "b_V"):
            full = tensors.pop(f"blocks.{layer}.attn.{x}")
            tensors[f"blocks.{layer}.attn._{x}"] = full[:: cfg.n_heads // cfg.kv_heads].clone()
    out = hf.write_native(tmp_path / "gqa", fields, tensors)
    m = load_model(out, raw=True)
    assert m.structure()["n_kv_heads"] == 2
    ref = load_model(llama_dir[0], raw=True).weights
    for h in range(cfg.n_heads):
        torch.testing.assert_close(
            m.weights.get_head("blocks.1.attn.W_K", h), ref.get_head("blocks.1.attn.W_K", h)
        )
    torch.testing.assert_close(m.weights.get("blocks.0.attn.W_V"), ref.get("blocks.0.attn.W_V"))
    assert isinstance(m.tokenizer, IdTokenizer)
