"""Configs real checkpoints use that headscope used to refuse (issue #16), against transformers.

Each builder makes a tiny random checkpoint (tests/hf_fixtures.py recipe) with the config
feature switched on and set so that it changes the numbers at the 17-token test sequences;
logits and attention patterns through ``load_model`` must match ``transformers`` to 1e-4, raw
and processed, and leaving the feature out must change them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from headscope.engine.forward.transformer import log_probs, run
from headscope.engine.model.loading import load_model
from tests.engine.forward.test_transformer import SEQS, _assert_close, hf_reference
from tests.engine.forward.test_transformer_families import _Without
from tests.hf_fixtures import D_MLP, D_MODEL, N_CTX, N_HEADS, N_LAYERS, VOCAB, _finish


def build_qwen2_window(path: Path) -> tuple[Path, Any]:
    """Qwen2 with ``use_sliding_window``: a window of 5 on the layers from
    ``max_window_layers`` = 1 on (layer 0 attends everywhere)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=D_MODEL, intermediate_size=D_MLP,
                      num_hidden_layers=N_LAYERS, num_attention_heads=N_HEADS, num_key_value_heads=2,
                      max_position_embeddings=N_CTX, use_sliding_window=True, sliding_window=5,
                      max_window_layers=1)
    assert cfg.layer_types == ["full_attention", "sliding_attention"]
    return _finish(Qwen2ForCausalLM(cfg), path, seed=41, shard=False, dtype=None, tokenizer=False)


def build_qwen2_yarn(path: Path) -> tuple[Path, Any]:
    """Qwen2.5-style YaRN (factor 4 over an original context of 8 < the 17 test positions)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 8}
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=D_MODEL, intermediate_size=D_MLP,
                      num_hidden_layers=N_LAYERS, num_attention_heads=N_HEADS, num_key_value_heads=2,
                      max_position_embeddings=N_CTX, use_sliding_window=False, rope_parameters=rope)
    return _finish(Qwen2ForCausalLM(cfg), path, seed=42, shard=False, dtype=None, tokenizer=False)


def build_phi3_longrope(path: Path) -> tuple[Path, Any]:
    """Phi-3-128k-style LongRoPE: per-frequency short and long factors, original context 8
    (the 17-position sequences use the long factors, 8 positions the short ones)."""
    from transformers import Phi3Config, Phi3ForCausalLM

    half = D_MODEL // N_HEADS // 2
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 8,
            "short_factor": [1.0 + 0.5 * i for i in range(half)], "long_factor": [2.0 + 3.0 * i for i in range(half)]}
    cfg = Phi3Config(vocab_size=VOCAB, hidden_size=D_MODEL, intermediate_size=D_MLP,
                     num_hidden_layers=N_LAYERS, num_attention_heads=N_HEADS, num_key_value_heads=2,
                     max_position_embeddings=N_CTX, original_max_position_embeddings=8,
                     rope_parameters=rope, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return _finish(Phi3ForCausalLM(cfg), path, seed=43, shard=False, dtype=None, tokenizer=False)


def build_phi_qk_layernorm(path: Path) -> tuple[Path, Any]:
    """Phi with ``qk_layernorm``: a LayerNorm (random gain and bias) on each head's query and key."""
    from transformers import PhiConfig, PhiForCausalLM

    cfg = PhiConfig(vocab_size=VOCAB, hidden_size=D_MODEL, intermediate_size=D_MLP, num_hidden_layers=N_LAYERS,
                    num_attention_heads=N_HEADS, max_position_embeddings=N_CTX, hidden_act="gelu_new",
                    qk_layernorm=True, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
                    tie_word_embeddings=False)
    return _finish(PhiForCausalLM(cfg), path, seed=44, shard=False, dtype=None, tokenizer=False)


def build_opt_projected(path: Path, pre_ln: bool = False) -> tuple[Path, Any]:
    """OPT-350m's shape: embeddings of width 16 mapped to d_model 32 by ``project_in`` and back
    by ``project_out`` (random, bias-free), post-LN blocks."""
    from transformers import OPTConfig, OPTForCausalLM

    cfg = OPTConfig(vocab_size=VOCAB, hidden_size=D_MODEL, num_hidden_layers=N_LAYERS, ffn_dim=D_MLP,
                    num_attention_heads=N_HEADS, max_position_embeddings=N_CTX, do_layer_norm_before=pre_ln,
                    word_embed_proj_dim=D_MODEL // 2, activation_function="relu", dropout=0.0,
                    attention_dropout=0.0, layerdrop=0.0, pad_token_id=1, bos_token_id=2, eos_token_id=2)
    return _finish(OPTForCausalLM(cfg), path, seed=45 + pre_ln, shard=False, dtype=None, tokenizer=False)


BUILDERS: dict[str, tuple[Callable[[Path], tuple[Path, Any]], dict[str, Any]]] = {
    # name: (builder, the change that leaves the feature out: _Without's arguments)
    "qwen2_window": (build_qwen2_window, {"extra": {"layer_types": None}}),
    "qwen2_yarn": (build_qwen2_yarn, {"extra": {"rope_type": "default"}}),
    "phi3_longrope": (build_phi3_longrope, {"extra": {"rope_type": "default"}}),
    "phi_qk_layernorm": (build_phi_qk_layernorm, {"hide": (".q_norm.", ".k_norm.")}),
    # project_in/out cannot be left out (the widths differ): parity alone
    "opt_projected": (build_opt_projected, {}),
    "opt_projected_pre_ln": (lambda p: build_opt_projected(p, pre_ln=True), {}),
}


@pytest.fixture(scope="module", params=list(BUILDERS))
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Any]:
    name = request.param
    path, model = BUILDERS[name][0](tmp_path_factory.mktemp(name))
    return name, path, model


def test_matches_transformers_and_the_feature_matters(case: tuple[str, Path, Any]) -> None:
    name, path, model = case
    ref_lp, ref_pat = hf_reference(name, model, SEQS)
    for raw in (True, False):
        res = run(load_model(path, raw=raw).weights, SEQS)
        _assert_close(res.patterns, ref_pat, f"{name} patterns (raw={raw})")
        _assert_close(log_probs(res), ref_lp, f"{name} log-probs (raw={raw})")
    change = dict(BUILDERS[name][1])
    if not change:
        return
    w = load_model(path, raw=True).weights
    without = run(_Without(w, change.pop("hide", ()), **change), SEQS)
    diff = max((without.patterns - ref_pat).abs().max().item(), (log_probs(without) - ref_lp).abs().max().item())
    assert diff > 1e-3, f"{name}: leaving the feature out changes nothing ({diff:.1e})"


@pytest.mark.parametrize("name", ["qwen2_yarn", "phi3_longrope"])
def test_circuit_command_on_scaled_rope(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``headscope circuit`` at a rotary offset on YaRN / LongRoPE models: the numpy path steps
    aside (it has neither scaling, nor their cos/sin factor) and the numbers are the engine's."""
    from headscope.engine.core.requests import CircuitRequest
    from headscope.engine.sweeps.dispatch import compute
    from headscope.tui.cli.main import main

    path, _ = BUILDERS[name][0](tmp_path)
    assert main(["circuit", str(path), "1", "0", "--kind", "qk", "--offset", "3", "--rows", "0:5",
                 "--cols", "0:5", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    req = CircuitRequest(layer=1, head_index=0, kind="qk", basis="token", rows=tuple(range(5)),
                         cols=tuple(range(5)), offset=3)
    want = compute(load_model(path), req).values
    assert got["values"] == want.tolist()


def test_qwen2_window_layers_from_older_configs(tmp_path: Path) -> None:
    """Configs written before transformers had ``layer_types`` give the same layers."""
    path, _ = build_qwen2_window(tmp_path)
    config = json.loads((path / "config.json").read_text())
    assert config.pop("layer_types") == ["full_attention", "sliding_attention"]
    (path / "config.json").write_text(json.dumps(config))
    assert load_model(path).cfg.extra["layer_types"] == ["full_attention", "sliding_attention"]


def test_hostile_layer_count_with_window_layers_is_refused_fast(tmp_path: Path) -> None:
    """max_window_layers must not make the loader build a list per claimed layer before the
    layer count is checked against the checkpoint."""
    from headscope.engine.core.errors import ConfigError
    from headscope.engine.model.loading import read_structure

    path, _ = build_qwen2_window(tmp_path)
    config = json.loads((path / "config.json").read_text())
    config.update(num_hidden_layers=10**12, layer_types=None)
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="n_layers"):
        read_structure(path)
