"""Tiny random checkpoints of the Phi-3, Phi, GPT-J and OPT families (as tests/hf_fixtures.py:
``save_pretrained``, every weight, norm gain and bias randomised by ``randomize_``).

Each builder returns ``(path, hf_model)``; ``PHI_FAMILIES`` maps a name to its builder and the
session-scoped ``<name>_dir`` fixtures build each once per test session.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.hf_fixtures import D_MLP, D_MODEL, N_CTX, N_HEADS, N_LAYERS, VOCAB, _finish


def build_phi3(path: Path, *, seed: int = 21, tokenizer: bool = False, sliding_window: int | None = None,
               partial_rotary_factor: float = 1.0) -> tuple[Path, Any]:
    """Phi3ForCausalLM: fused qkv_proj (GQA: 4 query, 2 K/V heads) and gate_up_proj."""
    from transformers import Phi3Config, Phi3ForCausalLM

    cfg = Phi3Config(
        vocab_size=VOCAB, hidden_size=D_MODEL, intermediate_size=D_MLP, num_hidden_layers=N_LAYERS,
        num_attention_heads=N_HEADS, num_key_value_heads=2, max_position_embeddings=N_CTX,
        original_max_position_embeddings=N_CTX, rms_norm_eps=1e-5, hidden_act="silu",
        tie_word_embeddings=False, sliding_window=sliding_window, resid_pdrop=0.0, embd_pdrop=0.0,
        attention_dropout=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": partial_rotary_factor},
    )
    return _finish(Phi3ForCausalLM(cfg), path, seed=seed, shard=False, dtype=None, tokenizer=tokenizer)


def build_phi(path: Path, *, seed: int = 22, tokenizer: bool = False) -> tuple[Path, Any]:
    """PhiForCausalLM: parallel attention + MLP on one LayerNorm, partial rotary (0.5), biases
    everywhere (dense output bias, lm_head bias)."""
    from transformers import PhiConfig, PhiForCausalLM

    cfg = PhiConfig(
        vocab_size=VOCAB, hidden_size=D_MODEL, intermediate_size=D_MLP, num_hidden_layers=N_LAYERS,
        num_attention_heads=N_HEADS, max_position_embeddings=N_CTX, hidden_act="gelu_new",
        layer_norm_eps=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        tie_word_embeddings=False,
    )
    return _finish(PhiForCausalLM(cfg), path, seed=seed, shard=False, dtype=None, tokenizer=tokenizer)


def build_gptj(path: Path, *, seed: int = 23, tokenizer: bool = False) -> tuple[Path, Any]:
    """GPTJForCausalLM: interleaved rotary on the first rotary_dim = 4 of 8 dims, parallel block."""
    from transformers import GPTJConfig, GPTJForCausalLM

    cfg = GPTJConfig(
        vocab_size=VOCAB, n_positions=N_CTX, n_embd=D_MODEL, n_layer=N_LAYERS, n_head=N_HEADS,
        rotary_dim=4, n_inner=D_MLP, activation_function="gelu_new", resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5, tie_word_embeddings=False,
    )
    return _finish(GPTJForCausalLM(cfg), path, seed=seed, shard=False, dtype=None, tokenizer=tokenizer)


def build_opt(path: Path, *, seed: int = 24, tokenizer: bool = False, pre_ln: bool = True) -> tuple[Path, Any]:
    """OPTForCausalLM: learned positions (offset 2), ReLU, pre-LN (or post-LN like opt-350m)."""
    from transformers import OPTConfig, OPTForCausalLM

    cfg = OPTConfig(
        vocab_size=VOCAB, hidden_size=D_MODEL, num_hidden_layers=N_LAYERS, ffn_dim=D_MLP,
        num_attention_heads=N_HEADS, max_position_embeddings=N_CTX, do_layer_norm_before=pre_ln,
        word_embed_proj_dim=D_MODEL, activation_function="relu", dropout=0.0,
        attention_dropout=0.0, layerdrop=0.0, enable_bias=True, pad_token_id=1,
        bos_token_id=2, eos_token_id=2, tie_word_embeddings=True,
    )
    return _finish(OPTForCausalLM(cfg), path, seed=seed, shard=False, dtype=None, tokenizer=tokenizer)


def build_opt_post_ln(path: Path, *, seed: int = 25, tokenizer: bool = False) -> tuple[Path, Any]:
    return build_opt(path, seed=seed, tokenizer=tokenizer, pre_ln=False)


PHI_FAMILIES: dict[str, Callable[..., tuple[Path, Any]]] = {
    "phi3": build_phi3,
    "phi": build_phi,
    "gptj": build_gptj,
    "opt": build_opt,
    "opt_post_ln": build_opt_post_ln,
}


def _session_builder(name: str) -> Callable[..., tuple[Path, Any]]:
    def fixture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
        return PHI_FAMILIES[name](tmp_path_factory.mktemp(name))

    fixture.__name__ = f"{name}_dir"
    return pytest.fixture(scope="session", name=f"{name}_dir")(fixture)


phi3_dir = _session_builder("phi3")
phi_dir = _session_builder("phi")
gptj_dir = _session_builder("gptj")
opt_dir = _session_builder("opt")
opt_post_ln_dir = _session_builder("opt_post_ln")
