"""Random checkpoints in Hugging Face layouts, written shard by shard (memory stays low).

Random weights are fine for timing. Each shape is written as the real family stores it
(tensor names, Conv1D/Linear orientation, dtype), so the loaders do their real work.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

Tensors = Iterator[tuple[str, Callable[[], torch.Tensor]]]


@dataclass(frozen=True)
class Shape:
    name: str
    family: str  # gpt2 | neox | llama
    n_layers: int
    n_heads: int
    d_model: int
    d_vocab: int
    n_ctx: int
    d_mlp: int
    n_kv_heads: int | None = None
    dtype: str = "float32"

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


SHAPES = {
    "gpt2-small": Shape("gpt2-small", "gpt2", 12, 12, 768, 50257, 1024, 3072),
    "pythia-1b": Shape("pythia-1b", "neox", 16, 8, 2048, 50304, 2048, 8192, dtype="float16"),
    "llama-1b-gqa": Shape(
        "llama-1b-gqa", "llama", 22, 32, 2048, 32000, 2048, 5632, n_kv_heads=4, dtype="bfloat16"
    ),
    # Llama-2-7B: 32 × 32 heads, d_head 128, ~13 GB of bf16 in per-layer shards. Written once
    # into a reusable directory (`python -m bench.big --dir DIR`), never by `make test`.
    "llama-7b": Shape("llama-7b", "llama", 32, 32, 4096, 32000, 4096, 11008, dtype="bfloat16"),
    # Llama-2-13B: 40 × 40 heads, d_head 128, d_mlp 13824, ~26 GB of bf16: larger than the
    # page cache of the 24 GB box (`python -m bench.big --13b --dir DIR`, never `make test`).
    "llama-13b": Shape("llama-13b", "llama", 40, 40, 5120, 32000, 4096, 13824, dtype="bfloat16"),
    # four layers of a 1B-wide Llama, 0.64 GB of bf16 (under the 1 GB of the shared lock): with
    # `bench.edges --cache-bytes` small, its layers stream through the weight cache as a 7B's do
    "llama-w2048-4l": Shape("llama-w2048-4l", "llama", 4, 16, 2048, 32000, 2048, 5504, dtype="bfloat16"),
    # Llama-2-70B cut to 4 layers: d 8192, 64 heads, 8 KV heads, d_mlp 28672, ~7.9 GB of bf16.
    # One layer's MLP in float32 is 2.8 GB: what `python -m bench.wide` checks the 3 GB peak on.
    "llama-70b-slice": Shape(
        "llama-70b-slice", "llama", 4, 64, 8192, 32000, 4096, 28672, n_kv_heads=8, dtype="bfloat16"
    ),
    # tiny shapes for the smoke test
    "tiny-gpt2": Shape("tiny-gpt2", "gpt2", 2, 4, 64, 500, 64, 256),
    "tiny-neox": Shape("tiny-neox", "neox", 2, 4, 64, 500, 64, 256, dtype="float16"),
    "tiny-llama": Shape("tiny-llama", "llama", 2, 4, 64, 500, 64, 176, n_kv_heads=2, dtype="bfloat16"),
    "tiny-llama-mha": Shape("tiny-llama-mha", "llama", 3, 4, 64, 500, 128, 176, dtype="bfloat16"),
    # rows of 256: the smallest shape K-quant GGUF files can have (`bench.big --gguf --tiny`)
    "tiny-llama-256": Shape("tiny-llama-256", "llama", 2, 4, 256, 500, 128, 512, dtype="bfloat16"),
}


def _rand(*shape: int, std: float = 0.02, seed: int = 0) -> Callable[[], torch.Tensor]:
    def make() -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        return torch.randn(*shape, generator=g) * std

    return make


def _ones(n: int, seed: int) -> Callable[[], torch.Tensor]:
    return lambda: 1.0 + _rand(n, std=0.05, seed=seed)()


def _gpt2(s: Shape) -> tuple[dict, list[Tensors]]:
    d, v = s.d_model, s.d_vocab
    config = {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": s.n_layers,
        "n_head": s.n_heads, "n_embd": d, "vocab_size": v, "n_positions": s.n_ctx,
        "n_ctx": s.n_ctx, "n_inner": s.d_mlp, "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True, "torch_dtype": s.dtype,
    }

    def head() -> Tensors:
        yield "transformer.wte.weight", _rand(v, d, seed=1)
        yield "transformer.wpe.weight", _rand(s.n_ctx, d, std=0.01, seed=2)
        yield "transformer.ln_f.weight", _ones(d, 3)
        yield "transformer.ln_f.bias", _rand(d, seed=4)

    def layer(i: int) -> Tensors:
        p, k = f"transformer.h.{i}.", 100 * (i + 1)
        yield p + "ln_1.weight", _ones(d, k)
        yield p + "ln_1.bias", _rand(d, seed=k + 1)
        yield p + "attn.c_attn.weight", _rand(d, 3 * d, seed=k + 2)
        yield p + "attn.c_attn.bias", _rand(3 * d, seed=k + 3)
        yield p + "attn.c_proj.weight", _rand(d, d, seed=k + 4)
        yield p + "attn.c_proj.bias", _rand(d, seed=k + 5)
        yield p + "ln_2.weight", _ones(d, k + 6)
        yield p + "ln_2.bias", _rand(d, seed=k + 7)
        yield p + "mlp.c_fc.weight", _rand(d, s.d_mlp, seed=k + 8)
        yield p + "mlp.c_fc.bias", _rand(s.d_mlp, seed=k + 9)
        yield p + "mlp.c_proj.weight", _rand(s.d_mlp, d, seed=k + 10)
        yield p + "mlp.c_proj.bias", _rand(d, seed=k + 11)

    return config, [head(), *(layer(i) for i in range(s.n_layers))]


def _neox(s: Shape) -> tuple[dict, list[Tensors]]:
    d, v = s.d_model, s.d_vocab
    config = {
        "architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
        "num_hidden_layers": s.n_layers, "num_attention_heads": s.n_heads, "hidden_size": d,
        "intermediate_size": s.d_mlp, "vocab_size": v, "max_position_embeddings": s.n_ctx,
        "rotary_pct": 0.25, "rotary_emb_base": 10000, "use_parallel_residual": True,
        "hidden_act": "gelu", "layer_norm_eps": 1e-5, "tie_word_embeddings": False,
        "torch_dtype": s.dtype,
    }

    def head() -> Tensors:
        yield "gpt_neox.embed_in.weight", _rand(v, d, seed=1)
        yield "gpt_neox.final_layer_norm.weight", _ones(d, 3)
        yield "gpt_neox.final_layer_norm.bias", _rand(d, seed=4)
        yield "embed_out.weight", _rand(v, d, seed=5)

    def layer(i: int) -> Tensors:
        p, k = f"gpt_neox.layers.{i}.", 100 * (i + 1)
        yield p + "input_layernorm.weight", _ones(d, k)
        yield p + "input_layernorm.bias", _rand(d, seed=k + 1)
        yield p + "post_attention_layernorm.weight", _ones(d, k + 2)
        yield p + "post_attention_layernorm.bias", _rand(d, seed=k + 3)
        yield p + "attention.query_key_value.weight", _rand(3 * d, d, seed=k + 4)
        yield p + "attention.query_key_value.bias", _rand(3 * d, seed=k + 5)
        yield p + "attention.dense.weight", _rand(d, d, seed=k + 6)
        yield p + "attention.dense.bias", _rand(d, seed=k + 7)
        yield p + "mlp.dense_h_to_4h.weight", _rand(s.d_mlp, d, seed=k + 8)
        yield p + "mlp.dense_h_to_4h.bias", _rand(s.d_mlp, seed=k + 9)
        yield p + "mlp.dense_4h_to_h.weight", _rand(d, s.d_mlp, seed=k + 10)
        yield p + "mlp.dense_4h_to_h.bias", _rand(d, seed=k + 11)

    return config, [head(), *(layer(i) for i in range(s.n_layers))]


def _llama(s: Shape) -> tuple[dict, list[Tensors]]:
    d, v = s.d_model, s.d_vocab
    kv = (s.n_kv_heads or s.n_heads) * s.d_head
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "num_hidden_layers": s.n_layers, "num_attention_heads": s.n_heads,
        "num_key_value_heads": s.n_kv_heads or s.n_heads, "hidden_size": d,
        "intermediate_size": s.d_mlp, "vocab_size": v, "max_position_embeddings": s.n_ctx,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
        "tie_word_embeddings": False, "torch_dtype": s.dtype,
    }

    def head() -> Tensors:
        yield "model.embed_tokens.weight", _rand(v, d, seed=1)
        yield "model.norm.weight", _ones(d, 3)
        yield "lm_head.weight", _rand(v, d, seed=5)

    def layer(i: int) -> Tensors:
        p, k = f"model.layers.{i}.", 100 * (i + 1)
        yield p + "input_layernorm.weight", _ones(d, k)
        yield p + "post_attention_layernorm.weight", _ones(d, k + 1)
        yield p + "self_attn.q_proj.weight", _rand(d, d, seed=k + 2)
        yield p + "self_attn.k_proj.weight", _rand(kv, d, seed=k + 3)
        yield p + "self_attn.v_proj.weight", _rand(kv, d, seed=k + 4)
        yield p + "self_attn.o_proj.weight", _rand(d, d, seed=k + 5)
        yield p + "mlp.gate_proj.weight", _rand(s.d_mlp, d, seed=k + 6)
        yield p + "mlp.up_proj.weight", _rand(s.d_mlp, d, seed=k + 7)
        yield p + "mlp.down_proj.weight", _rand(d, s.d_mlp, seed=k + 8)

    return config, [head(), *(layer(i) for i in range(s.n_layers))]


BUILDERS = {"gpt2": _gpt2, "neox": _neox, "llama": _llama}


def write_tokenizer(path: Path, d_vocab: int) -> Path:
    """A word-level ``tokenizer.json`` of ``d_vocab`` entries that knows every word and
    punctuation mark of ``reading.NATURAL_PROMPTS``: a checkpoint with a tokenizer scores its
    attention sinks on those sentences (four more batches in the forward pass of ``heads``),
    as a real one does."""
    import re

    from tokenizers import Tokenizer, models, pre_tokenizers

    from headscope.engine.forward.sinks import NATURAL_PROMPTS

    words = ["<unk>", *dict.fromkeys(w for text in NATURAL_PROMPTS for w in re.findall(r"\S+", text))]
    words += [f"w{i}" for i in range(len(words), d_vocab)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words[:d_vocab])}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    out = Path(path) / "tokenizer.json"
    tok.save(str(out))
    return out


def write_checkpoint(shape: Shape, root: Path) -> Path:
    """Write ``shape`` under ``root/shape.name`` (once; reused if complete) and return the dir.
    A directory written before tokenizers were part of it gets its ``tokenizer.json`` now."""
    path = Path(root) / shape.name
    index_file = path / "model.safetensors.index.json"
    if index_file.exists():
        if not (path / "tokenizer.json").exists():
            write_tokenizer(path, shape.d_vocab)
        return path
    path.mkdir(parents=True, exist_ok=True)
    config, groups = BUILDERS[shape.family](shape)
    dtype = getattr(torch, shape.dtype)
    weight_map, total = {}, 0
    for n, group in enumerate(groups):
        # one shard per layer: only one layer's tensors are ever in memory
        shard = f"model-{n + 1:05d}-of-{len(groups):05d}.safetensors"
        tensors = {name: make().to(dtype).contiguous() for name, make in group}
        save_file(tensors, str(path / shard), metadata={"format": "pt"})
        for name, t in tensors.items():
            weight_map[name] = shard
            total += t.numel() * t.element_size()
        del tensors
    (path / "config.json").write_text(json.dumps(config, indent=1))
    write_tokenizer(path, shape.d_vocab)
    index_file.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return path


def checkpoint_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).glob("*.safetensors"))
