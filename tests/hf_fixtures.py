"""Tiny random Hugging Face checkpoints of every supported family, built on the fly.

Each builder returns ``(path, hf_model)``: the directory written with
``save_pretrained(path, safe_serialization=True)`` and the ``transformers`` model it came
from (float32, eval mode), so tests can compare headscope against the real implementation.

Weights are re-initialised with a large std (HF's 0.02 leaves attention patterns near
uniform and hides real bugs) and every norm gain/bias and every bias is randomised, so
weight folding is really exercised. Sizes stay tiny so each builder runs well under a second.

Use from tests either directly (``build_gpt2(tmp_path)``) or through the pytest fixtures at
the bottom (import them into a test module or a conftest: ``from tests.hf_fixtures import
gpt2_dir``). ``FAMILIES`` maps a family name to its builder for parametrised tests.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

VOCAB = 96
N_CTX = 48
D_MODEL = 32
N_LAYERS = 2
N_HEADS = 4
D_MLP = 64

# Words of the tiny WordLevel tokenizer (vocab ids 0..VOCAB-1); id 0 is <unk>.
WORDS = ["<unk>", "the", "cat", "sat", "on", "mat", "a", "dog", "ran", "to"] + [
    f"w{i}" for i in range(10, VOCAB)
]


def randomize_(model: Any, seed: int = 0, std: float = 0.3) -> Any:
    """Re-initialise every parameter: matrices ~ N(0, std), norm gains ~ 1 ± 0.3,
    biases and norm biases ~ N(0, 0.2). In place; returns the model (eval mode, float32)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            shape = p.shape
            if p.ndim == 1:
                leaf = name.rsplit(".", 1)[-1]
                is_gain = leaf == "weight"  # 1-D "weight" = LayerNorm/RMSNorm gain
                noise = torch.randn(shape, generator=gen)
                p.copy_(1.0 + 0.3 * noise if is_gain else 0.2 * noise)
            else:
                # Embeddings ~ N(0, 1); matrices ~ N(0, std): with d_model 32 attention
                # scores have std ~3, far from uniform, yet the residual stays well scaled.
                is_embedding = any(k in name for k in ("embed", "wte", "wpe"))
                p.copy_(torch.randn(shape, generator=gen) * (1.0 if is_embedding else std))
    model.float().eval()
    return model


def write_word_tokenizer(path: Path, words: list[str] = WORDS) -> Path:
    """Write a WordLevel ``tokenizer.json`` (whitespace pre-tokenizer, <unk> = id 0)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    out = Path(path) / "tokenizer.json"
    tok.save(str(out))
    return out


# A BERT-style vocabulary of the same size: special tokens first, then the words.
BERT_WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS[1 : VOCAB - 4]]


def write_bert_tokenizer(path: Path, *, fixed_length: int | None = None) -> Path:
    """A WordLevel ``tokenizer.json`` over ``BERT_WORDS`` with BERT's special tokens and, with
    ``fixed_length``, fixed-length padding and truncation enabled in the file, as
    sentence-transformers checkpoints ship it (all-MiniLM-L6-v2: 128)."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(BERT_WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(t, special=True) for t in BERT_WORDS[:5]])
    if fixed_length is not None:
        tok.enable_padding(length=fixed_length, pad_id=0, pad_token="[PAD]")
        tok.enable_truncation(max_length=fixed_length)
    out = Path(path) / "tokenizer.json"
    tok.save(str(out))
    return out


def _save(model: Any, path: Path, *, shard: bool, dtype: str | None) -> Path:
    import torch

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    to_save = model
    if dtype is not None:
        import copy

        to_save = copy.deepcopy(model).to(getattr(torch, dtype))
    kwargs: dict[str, Any] = {"safe_serialization": True}
    if shard:
        kwargs["max_shard_size"] = "20KB"
    to_save.save_pretrained(str(path), **kwargs)
    return path


def _finish(
    model: Any, path: Path, *, seed: int, shard: bool, dtype: str | None, tokenizer: bool
) -> tuple[Path, Any]:
    randomize_(model, seed=seed)
    _save(model, path, shard=shard, dtype=dtype)
    if tokenizer:
        write_word_tokenizer(path)
    if dtype is not None:
        # Hand back the model with the same (rounded) weights the checkpoint holds.
        import torch

        model = model.to(getattr(torch, dtype)).float().eval()
    return Path(path), model


def build_gpt2(
    path: Path,
    *,
    seed: int = 0,
    shard: bool = False,
    dtype: str | None = None,
    tokenizer: bool = True,
) -> tuple[Path, Any]:
    """GPT2LMHeadModel (Conv1D weights, learned positions, tied lm_head)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        vocab_size=VOCAB,
        n_positions=N_CTX,
        n_embd=D_MODEL,
        n_layer=N_LAYERS,
        n_head=N_HEADS,
        n_inner=D_MLP,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=1e-5,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )
    return _finish(
        GPT2LMHeadModel(cfg), path, seed=seed, shard=shard, dtype=dtype, tokenizer=tokenizer
    )


def build_neox(
    path: Path,
    *,
    seed: int = 1,
    shard: bool = False,
    dtype: str | None = None,
    tokenizer: bool = False,
) -> tuple[Path, Any]:
    """GPTNeoXForCausalLM with partial rotary (rotary_pct 0.25) and parallel residual."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(
        vocab_size=VOCAB,
        hidden_size=D_MODEL,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=N_HEADS,
        intermediate_size=D_MLP,
        max_position_embeddings=N_CTX,
        rotary_pct=0.25,
        rotary_emb_base=10000,
        use_parallel_residual=True,
        hidden_act="gelu",
        layer_norm_eps=1e-5,
        tie_word_embeddings=False,
        attention_dropout=0.0,
        hidden_dropout=0.0,
    )
    return _finish(
        GPTNeoXForCausalLM(cfg), path, seed=seed, shard=shard, dtype=dtype, tokenizer=tokenizer
    )


def build_llama(
    path: Path,
    *,
    seed: int = 2,
    shard: bool = False,
    dtype: str | None = None,
    tokenizer: bool = False,
    tied: bool = False,
) -> tuple[Path, Any]:
    """LlamaForCausalLM with grouped-query attention (4 query heads, 2 K/V heads)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=D_MODEL,
        intermediate_size=D_MLP,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=N_HEADS,
        num_key_value_heads=2,
        max_position_embeddings=N_CTX,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=tied,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
    )
    return _finish(
        LlamaForCausalLM(cfg), path, seed=seed, shard=shard, dtype=dtype, tokenizer=tokenizer
    )


def build_qwen2(
    path: Path,
    *,
    seed: int = 3,
    shard: bool = False,
    dtype: str | None = None,
    tokenizer: bool = False,
    tied: bool = True,
) -> tuple[Path, Any]:
    """Qwen2ForCausalLM: GQA (4 query, 2 K/V heads), QKV biases, tied embeddings."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=D_MODEL,
        intermediate_size=D_MLP,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=N_HEADS,
        num_key_value_heads=2,
        max_position_embeddings=N_CTX,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=tied,
        hidden_act="silu",
        use_sliding_window=False,
    )
    return _finish(
        Qwen2ForCausalLM(cfg), path, seed=seed, shard=shard, dtype=dtype, tokenizer=tokenizer
    )


def _bert_config() -> Any:
    from transformers import BertConfig

    return BertConfig(
        vocab_size=VOCAB,
        hidden_size=D_MODEL,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=N_HEADS,
        intermediate_size=D_MLP,
        max_position_embeddings=N_CTX,
        type_vocab_size=2,
        hidden_act="gelu",
        layer_norm_eps=1e-12,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


def build_bert_mlm(
    path: Path,
    *,
    seed: int = 4,
    shard: bool = False,
    dtype: str | None = None,
    tokenizer: bool = True,
) -> tuple[Path, Any]:
    """BertForMaskedLM: post-LN encoder with the cls.predictions.* masked-LM head."""
    from transformers import BertForMaskedLM

    return _finish(
        BertForMaskedLM(_bert_config()),
        path,
        seed=seed,
        shard=shard,
        dtype=dtype,
        tokenizer=tokenizer,
    )


def build_bert_base(
    path: Path,
    *,
    seed: int = 5,
    shard: bool = False,
    dtype: str | None = None,
    tokenizer: bool = False,
) -> tuple[Path, Any]:
    """BertModel without any head: the unembedding is the tied W_Eᵀ."""
    from transformers import BertModel

    return _finish(
        BertModel(_bert_config(), add_pooling_layer=False),
        path,
        seed=seed,
        shard=shard,
        dtype=dtype,
        tokenizer=tokenizer,
    )


FAMILIES: dict[str, Callable[..., tuple[Path, Any]]] = {
    "gpt2": build_gpt2,
    "neox": build_neox,
    "llama": build_llama,
    "qwen2": build_qwen2,
    "bert_mlm": build_bert_mlm,
    "bert_base": build_bert_base,
}


def read_config(path: Path) -> dict[str, Any]:
    return json.loads((Path(path) / "config.json").read_text())


# --- pytest fixtures (module scope is not possible with tmp_path; use tmp_path_factory) ---


def _session_builder(name: str, **kwargs: Any) -> Callable[..., tuple[Path, Any]]:
    def fixture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
        return FAMILIES[name](tmp_path_factory.mktemp(name), **kwargs)

    fixture.__name__ = f"{name}_dir"
    return pytest.fixture(scope="session", name=f"{name}_dir")(fixture)


# Session-scoped: each family is built once per test session. Tests must not modify them
# (copy with shutil.copytree first if a test needs to break one).
gpt2_dir = _session_builder("gpt2")
neox_dir = _session_builder("neox")
llama_dir = _session_builder("llama")
qwen2_dir = _session_builder("qwen2")
bert_mlm_dir = _session_builder("bert_mlm")
bert_base_dir = _session_builder("bert_base")


def write_native(
    path: Path,
    cfg_fields: dict[str, Any],
    tensors: dict[str, Any],
    *,
    vocab: list[str] | None = None,
    config_in_metadata: bool = True,
) -> Path:
    """Write a headscope-native checkpoint: canonical tensor names in ``model.safetensors``,
    the config as JSON of ``ModelConfig`` fields in metadata ``headscope_config`` (or in
    ``headscope.json`` when ``config_in_metadata`` is false), optional ``vocab.txt``."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    blob = json.dumps(cfg_fields)
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    if config_in_metadata:
        save_file(tensors, str(path / "model.safetensors"), metadata={"headscope_config": blob})
    else:
        save_file(tensors, str(path / "model.safetensors"))
        (path / "headscope.json").write_text(blob)
    if vocab is not None:
        (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return path
