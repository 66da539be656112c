"""The configuration read from GGUF metadata (engine/model/gguf_config.py): rope scaling, long rope, windows, attention scale; each against the original checkpoint or llama.cpp."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from headscope.engine.api.model import open_model, read_structure
from headscope.engine.core.errors import ConfigError
from headscope.engine.forward.transformer import run
from tests.engine.formats import test_gguf
from tests.engine.formats.test_gguf import EXACT, _assert_same_model, _max_diff
from tests.engine.forward.test_transformer import SEQS
from tests.gguf_fixtures import (
    llama3_rope_freqs,
    write_gguf,
)
from tests.hf_fixtures import randomize_
from tests.hf_fixtures_phi import build_phi3

llama_pair = test_gguf.llama_pair  # test_gguf's pytest fixture


def test_yarn_rope_from_metadata(tmp_path: Path) -> None:
    """Qwen2 with YaRN: factor and original context from the metadata give the original model;
    llama.cpp's own attention factor is refused, not guessed."""
    import gguf as gguf_pkg

    from tests.engine.model.test_adapters import build_qwen2_yarn

    path, model = build_qwen2_yarn(tmp_path / "hf")
    file = write_gguf(model, tmp_path / "m.gguf")
    assert open_model(file).cfg.extra["rope_type"] == "yarn"
    _assert_same_model(path, file)
    odd = write_gguf(model, tmp_path / "odd.gguf", metadata=lambda w: w.add_float32(
        gguf_pkg.Keys.Rope.SCALING_ATTN_FACTOR.format(arch="qwen2"), 1.5))
    with pytest.raises(ConfigError, match="attn_factor"):
        read_structure(odd)


def test_phi3_longrope_from_factor_tensors(tmp_path: Path) -> None:
    """Phi-3-128k files carry LongRoPE as rope_factors_long/short tensors, the original context
    and the attention factor: the same model as the original, on sequences within and beyond
    the original context (short and long factors)."""
    from tests.engine.model.test_adapters import build_phi3_longrope

    path, model = build_phi3_longrope(tmp_path / "hf")
    file = write_gguf(model, tmp_path / "m.gguf")
    rope = open_model(file).cfg.extra["rope_scaling"]
    assert rope["rope_type"] == "longrope" and rope["original_max_position_embeddings"] == 8
    _assert_same_model(path, file)  # 17 positions: long factors
    for raw in (True, False):
        a = run(open_model(path, raw=raw).weights, SEQS[:, :8])
        b = run(open_model(file, raw=raw).weights, SEQS[:, :8])
        assert _max_diff(a.patterns, b.patterns) < EXACT and _max_diff(a.logits, b.logits) < EXACT


def test_gemma_gguf_attention_scale_follows_llama_cpp() -> None:
    """llama.cpp stores no query_pre_attn_scalar: head_dim, except the 27B models (46 / 62
    layers), scaled by d_model / n_heads; an explicit attention.scale wins."""
    from types import SimpleNamespace

    from headscope.engine.model.gguf_config import gemma_config

    def scalar(name: str, n_layers: int, **meta: Any) -> Any:
        header = SimpleNamespace(metadata={f"{name}.{k}": v for k, v in meta.items()},
                                 tensors=dict.fromkeys(range(1000)))
        config = {"num_hidden_layers": n_layers, "hidden_size": 4608, "num_attention_heads": 32, "head_dim": 128}
        return gemma_config(header, name, config)

    assert scalar("gemma2", 46)["query_pre_attn_scalar"] == 144  # gemma-2-27b
    assert scalar("gemma2", 26)["query_pre_attn_scalar"] == 128
    assert scalar("gemma3", 62)["query_pre_attn_scalar"] == 144
    assert scalar("gemma3", 62, **{"attention.scale": 0.125})["query_pre_attn_scalar"] == 64
    assert scalar("gemma2", 26)["sliding_window"] == 4096  # llama.cpp's default for Gemma 2
    no_window = scalar("gemma3", 6)
    assert no_window["layer_types"] == ["full_attention"] * 6 and "sliding_window" not in no_window
    huge = SimpleNamespace(metadata={}, tensors={})  # a hostile block_count builds nothing per layer
    assert "layer_types" not in gemma_config(huge, "gemma3", {"num_hidden_layers": 10**12, "hidden_size": 8,
                                                               "num_attention_heads": 2})
    flags = scalar("gemma3", 3, **{"attention.sliding_window": 5, "attention.sliding_window_pattern": [True, False, True]})
    assert flags["layer_types"] == ["sliding_attention", "full_attention", "sliding_attention"]


def test_llama3_rope_freqs_give_the_original_model(tmp_path: Path) -> None:
    """Llama 3.1+ files store RoPE scaling as rope_freqs divisors: the model must equal the
    safetensors original with its llama3 rope_parameters (and differ from no scaling)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=48,
                      rms_norm_eps=1e-6, rope_parameters=rope)
    model = randomize_(LlamaForCausalLM(cfg), seed=12)
    model.save_pretrained(tmp_path / "ref", safe_serialization=True)
    freqs = llama3_rope_freqs(model.config)
    assert freqs.min() == 1.0 and 1.0 < freqs[1] < 8.0 and freqs.max() == 8.0  # all three regimes
    path = write_gguf(model, tmp_path / "m.gguf", extra_tensors={"rope_freqs.weight": freqs})
    m = open_model(path, raw=True)
    assert m.cfg.extra["rope_type"] == "llama3"
    assert m.cfg.extra["rope_scaling"]["original_max_position_embeddings"] == 64
    _assert_same_model(tmp_path / "ref", path)
    plain = write_gguf(model, tmp_path / "plain.gguf")
    assert _max_diff(run(open_model(plain).weights, SEQS).patterns, run(open_model(path).weights, SEQS).patterns) > 1e-3


@pytest.mark.parametrize("name", ["rope_freqs.weight", "rope_factors_long.weight"])
def test_unknown_rope_factors_are_refused_not_ignored(name: str, llama_pair, tmp_path: Path) -> None:
    """Divisors that match no llama3 scaling, and LongRoPE factors, are refused rather than run
    with the wrong rotary frequencies."""
    path = write_gguf(llama_pair[1], tmp_path / "r.gguf",
                      extra_tensors={name: np.array([1.0, 3.0, 1.5, 7.0], dtype=np.float32)})
    with pytest.raises(ConfigError, match=name.split(".")[0]):
        read_structure(path)


def test_linear_rope_scaling_from_metadata(tmp_path: Path) -> None:
    """`llama.rope.scaling.type = linear` and its factor reach the forward pass."""
    import gguf

    from tests.engine.forward.test_transformer import _rope_variant

    model = _rope_variant("llama_linear")  # factor 4
    model.save_pretrained(tmp_path / "ref", safe_serialization=True)
    path = write_gguf(model, tmp_path / "m.gguf",
                      metadata=lambda w: (w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR),
                                          w.add_rope_scaling_factor(4.0)))
    assert open_model(path, raw=True).cfg.extra["rope_type"] == "linear"
    _assert_same_model(tmp_path / "ref", path)


def test_phi4_style_sliding_window_zero_means_no_window(tmp_path: Path) -> None:
    """convert_hf_to_gguf writes phi3.attention.sliding_window = 0 for Phi-4 (no window);
    llama.cpp reads 0 as no sliding window. The file is the windowless original."""
    ref, model = build_phi3(tmp_path / "hf", partial_rotary_factor=0.5)

    def zero_window(w: Any) -> None:
        w.add_sliding_window(0)

    path = write_gguf(model, tmp_path / "phi4.gguf", metadata=zero_window)
    m = open_model(path, raw=True)
    assert m.cfg.extra.get("sliding_window") is None
    _assert_same_model(ref, path, tol=1e-6)


def test_odd_rope_dimension_count_with_rope_freqs_names_the_mismatch(
    llama_pair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gguf

    real = gguf.GGUFWriter.add_rope_dimension_count
    monkeypatch.setattr(gguf.GGUFWriter, "add_rope_dimension_count", lambda w, n: real(w, 7))
    path = write_gguf(llama_pair[1], tmp_path / "odd.gguf",
                      extra_tensors={"rope_freqs.weight": np.ones(3, dtype=np.float32)})
    with pytest.raises(ConfigError, match=r"RoPE dimension count 7 is odd.*'rope_freqs\.weight'"):
        read_structure(path)
