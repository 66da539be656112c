"""Tiny random checkpoints of the families added on top of tests/hf_fixtures.py: Mistral,
Qwen3, Gemma 1/2/3, OLMo2, GPT-Neo, Mixtral (and a Llama with llama3 RoPE scaling).

Same recipe as tests/hf_fixtures.py (``_finish``: every parameter re-drawn large, every
norm gain and bias random, ``save_pretrained`` with safetensors). Each feature the family
adds is set so that it changes the numbers at the 17-token test sequences: sliding windows
of 5, soft-caps below the typical score, a ``query_pre_attn_scalar`` different from
``d_head``, local and global RoPE bases far apart.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.hf_fixtures import D_MLP, D_MODEL, N_CTX, N_HEADS, N_LAYERS, VOCAB, _finish

WINDOW = 5


def _common(**extra: Any) -> dict[str, Any]:
    return dict(vocab_size=VOCAB, hidden_size=D_MODEL, intermediate_size=D_MLP,
                num_hidden_layers=N_LAYERS, num_attention_heads=N_HEADS, num_key_value_heads=2,
                max_position_embeddings=N_CTX, rms_norm_eps=1e-6, **extra)


def build_mistral(path: Path, *, seed: int = 20, **kw: Any) -> tuple[Path, Any]:
    """MistralForCausalLM: GQA (4 query, 2 K/V heads) and a sliding window of 5."""
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(sliding_window=WINDOW, tie_word_embeddings=False, **_common())
    return _finish(MistralForCausalLM(cfg), path, seed=seed, shard=False, dtype=None, tokenizer=False)


def build_llama3_rope(path: Path, *, seed: int = 21, **kw: Any) -> tuple[Path, Any]:
    """LlamaForCausalLM with Llama 3.1's ``llama3`` RoPE scaling (tiny original context)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    cfg = LlamaConfig(rope_parameters=rope, **_common())
    return _finish(LlamaForCausalLM(cfg), path, seed=seed, shard=False, dtype=None, tokenizer=False)


def build_qwen3(path: Path, *, seed: int = 22, **kw: Any) -> tuple[Path, Any]:
    """Qwen3ForCausalLM: per-head q/k RMSNorm, head_dim 12 (not d_model / n_heads), tied."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(head_dim=12, tie_word_embeddings=True, use_sliding_window=False,
                      attention_bias=False, **_common())
    return _finish(Qwen3ForCausalLM(cfg), path, seed=seed, shard=False, dtype=None, tokenizer=False)


def build_gemma(path: Path, *, seed: int = 23, **kw: Any) -> tuple[Path, Any]:
    """GemmaForCausalLM: (1 + w) RMSNorm gains, √d_model embedding scale, GeGLU, tied."""
    from transformers import GemmaConfig, GemmaForCausalLM

    cfg = GemmaConfig(head_dim=8, hidden_act="gelu_pytorch_tanh", **_common())
    return _finish(GemmaForCausalLM(cfg), path, seed=seed, shard=False, dtype=None, tokenizer=False)


def build_gemma2(path: Path, *, seed: int = 24, **kw: Any) -> tuple[Path, Any]:
    """Gemma2ForCausalLM: + soft-capped scores and logits, pre/post norms, alternating
    sliding-window layers, query_pre_attn_scalar 12 != d_head 8."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    cfg = Gemma2Config(head_dim=8, query_pre_attn_scalar=12, sliding_window=WINDOW,
                       attn_logit_softcapping=4.0, final_logit_softcapping=5.0, **_common())
    return _finish(Gemma2ForCausalLM(cfg), path, seed=seed, shard=False, dtype=None, tokenizer=False)


def build_gemma3(path: Path, *, seed: int = 25, **kw: Any) -> tuple[Path, Any]:
    """Gemma3ForCausalLM (gemma3_text): + per-head q/k norm, local/global RoPE bases."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    rope = {"full_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10.0}}
    cfg = Gemma3TextConfig(head_dim=8, query_pre_attn_scalar=8, sliding_window=WINDOW,
                           layer_types=["sliding_attention", "full_attention"],
                           rope_parameters=rope, **_common())
    return _finish(Gemma3ForCausalLM(cfg), path, seed=seed, shard=False, dtype=None, tokenizer=False)


def build_olmo2(path: Path, *, seed: int = 26, **kw: Any) -> tuple[Path, Any]:
    """Olmo2ForCausalLM: q/k norm over the whole projection, norms after the sublayers."""
    from transformers import Olmo2Config, Olmo2ForCausalLM

    cfg = Olmo2Config(tie_word_embeddings=False, **_common())
    return _finish(Olmo2ForCausalLM(cfg), path, seed=seed, shard=False, dtype=None, tokenizer=False)


def build_gpt_neo(path: Path, *, seed: int = 27, **kw: Any) -> tuple[Path, Any]:
    """GPTNeoForCausalLM: global then local (window 5) layers, unscaled scores, tied."""
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    cfg = GPTNeoConfig(vocab_size=VOCAB, hidden_size=D_MODEL, num_layers=N_LAYERS,
                       num_heads=N_HEADS, intermediate_size=D_MLP, max_position_embeddings=N_CTX,
                       attention_types=[[["global", "local"], N_LAYERS // 2]], window_size=WINDOW,
                       activation_function="gelu_new", layer_norm_epsilon=1e-5,
                       embed_dropout=0.0, attention_dropout=0.0, resid_dropout=0.0)
    return _finish(GPTNeoForCausalLM(cfg), path, seed=seed, shard=False, dtype=None, tokenizer=False)


def build_mixtral(path: Path, *, seed: int = 28, **kw: Any) -> tuple[Path, Any]:
    """MixtralForCausalLM: Mistral attention, 4 experts with 2 chosen per token."""
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(num_local_experts=4, num_experts_per_tok=2, router_jitter_noise=0.0,
                        tie_word_embeddings=False, **_common())
    return _finish(MixtralForCausalLM(cfg), path, seed=seed, shard=False, dtype=None, tokenizer=False)


NEW_FAMILIES: dict[str, Callable[..., tuple[Path, Any]]] = {
    "mistral": build_mistral,
    "llama3_rope": build_llama3_rope,
    "qwen3": build_qwen3,
    "gemma": build_gemma,
    "gemma2": build_gemma2,
    "gemma3": build_gemma3,
    "olmo2": build_olmo2,
    "gpt_neo": build_gpt_neo,
    "mixtral": build_mixtral,
}


@pytest.fixture(scope="session", params=list(NEW_FAMILIES))
def new_family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Any]:
    """(name, checkpoint dir, transformers model), each built once per session."""
    name = request.param
    path, model = NEW_FAMILIES[name](tmp_path_factory.mktemp(name))
    return name, path, model
