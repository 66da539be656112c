"""The sample-model writers: native layout and Hugging Face GPT-2 directories compute exactly
what the training model computes (checked against engine.forward and against transformers)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from headscope.engine.forward.transformer import run
from headscope.engine.model.weights import DictWeights
from headscope.sample_models import corpus
from headscope.sample_models.export import native_config, write_hf_gpt2, write_tokenizer_json
from headscope.sample_models.model import ModelShape, TinyTransformer

V = len(corpus.VOCAB)


def _random_model(shape: ModelShape, seed: int = 0) -> TinyTransformer:
    """Every parameter random and large enough that attention is far from uniform and
    LayerNorm gains/biases matter (a trained model would hide layout bugs less well)."""
    model = TinyTransformer(shape)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".w"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return model.eval()


def _tokens(n_ctx: int, seed: int = 1) -> torch.Tensor:
    return torch.from_numpy(corpus.Corpus(seed).batch(3, n_ctx))


def test_native_tensors_run_through_engine_forward_like_the_training_model() -> None:
    shape = ModelShape(n_layers=2, n_heads=3, d_model=24, d_head=8, d_vocab=V, n_ctx=20)
    model = _random_model(shape)
    tensors = model.canonical_tensors()
    w = DictWeights(native_config(shape, sum(t.numel() for t in tensors.values())), tensors)
    tokens = _tokens(shape.n_ctx)
    logits, patterns = model(tokens)
    result = run(w, tokens)
    torch.testing.assert_close(result.logits, logits, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(result.patterns, torch.stack(patterns, 1), rtol=1e-5, atol=1e-6)
    # Zero-ablation means the same thing in both: the head's output is dropped, b_O stays.
    ablated, _ = model(tokens, ablate={1: [2]})
    torch.testing.assert_close(run(w, tokens, ablate=[(1, 2)]).logits, ablated,
                               rtol=1e-5, atol=1e-4)


def test_gpt2_directory_loads_in_transformers_with_identical_logits(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    shape = ModelShape(n_layers=2, n_heads=4, d_model=32, d_head=8, d_vocab=V, n_ctx=24,
                       d_mlp=64, layer_norm=True, tied_unembed=True)
    model = _random_model(shape, seed=3)
    write_hf_gpt2(model, corpus.VOCAB, tmp_path, unk=corpus.UNK, bos=corpus.BOS)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, attn_implementation="eager").eval()
    tokens = _tokens(shape.n_ctx, seed=2)
    with torch.no_grad():
        out = hf(tokens, output_attentions=True)
        logits, patterns = model(tokens)
    torch.testing.assert_close(out.logits, logits, rtol=1e-4, atol=1e-4)
    for layer in range(shape.n_layers):
        torch.testing.assert_close(out.attentions[layer], patterns[layer], rtol=1e-4, atol=1e-5)
    # The unembedding really is tied: transformers' lm_head is the embedding matrix.
    torch.testing.assert_close(hf.lm_head.weight, model.embed.W_E)


def test_tokenizer_json_encodes_like_the_corpus(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    write_tokenizer_json(corpus.VOCAB, corpus.UNK, tmp_path / "tokenizer.json")
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    text = "When Mary and John went to the store , John gave a drink to Mary ."
    assert tok.encode(text).ids == corpus.encode(text)
    assert tok.encode("Mary  plugh\tJohn").ids == corpus.encode("Mary plugh John")
    assert tok.get_vocab_size() == V
