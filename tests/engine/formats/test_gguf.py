"""llama.cpp GGUF files: the tiny HF checkpoints converted to GGUF (tests/gguf_fixtures.py, with
llama.cpp's tensor names, metadata keys, Q/K permutation and quantisers) must give the same
model as the safetensors original through the engine:

- F32: exactly the same canonical tensors, logits and patterns, raw and processed;
- F16, BF16, Q8_0, Q4_0 (quantised by ``gguf.quants.quantize``): every weight within the
  type's rounding bound of the original (see ``BOUNDS``), and the forward pass equal to that of
  a safetensors checkpoint holding the dequantised weights;
- Q4_K, Q6_K (which ``gguf.quants`` cannot quantise): valid random blocks, whose dequantised
  values go into the HF model, so the GGUF file and the safetensors checkpoint hold the same
  numbers and must agree to float rounding.

Then the tokenizer from the metadata, and hostile files: one typed one-line error naming the file.
"""

from __future__ import annotations

import re
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from headscope.engine.api.model import open_model, read_structure
from headscope.engine.core.errors import ConfigError, CorruptFileError, UnknownArchitectureError
from headscope.engine.forward.transformer import run
from tests.e2e.test_explorer_real_engine import wait_ready
from tests.engine.forward.test_transformer import SEQS
from tests.gguf_fixtures import (
    gguf_bytes,
    k_quant_blocks,
    permute,
    string_value,
    write_gguf,
)
from tests.hf_fixtures import build_llama, build_qwen2, randomize_
from tests.hf_fixtures_phi import build_phi3

EXACT = 1e-5  # same float32 numbers through the same code: only summation order may differ


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return (a - b).abs().max().item()


def _assert_same_model(a: Path, b: Path, tol: float = EXACT) -> None:
    """Logits and patterns of the two checkpoints agree, raw and processed."""
    for raw in (True, False):
        ra = run(open_model(a, raw=raw).weights, SEQS)
        rb = run(open_model(b, raw=raw).weights, SEQS)
        assert _max_diff(ra.patterns, rb.patterns) < tol, f"patterns differ (raw={raw})"
        assert _max_diff(ra.logits, rb.logits) < tol, f"logits differ (raw={raw})"


@pytest.fixture(scope="module")
def llama_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    return build_llama(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def qwen2_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    return build_qwen2(tmp_path_factory.mktemp("qwen2"))


# --- F32: exact ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def phi3_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """Partial rotary and a sliding window (5) shorter than the test prompts."""
    return build_phi3(tmp_path_factory.mktemp("phi3"), partial_rotary_factor=0.5, sliding_window=5)


@pytest.mark.parametrize("family", ["llama", "qwen2", "phi3"])
def test_f32_gguf_is_exactly_the_original(family: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    path, model = request.getfixturevalue(f"{family}_pair")
    gguf = write_gguf(model, tmp_path / "model.gguf")
    a, b = open_model(path, raw=True), open_model(gguf, raw=True)
    assert b.checkpoint.format == "gguf" and b.cfg.family == a.cfg.family
    assert (b.cfg.n_heads, b.cfg.kv_heads, b.cfg.d_head, b.cfg.tied_unembed) == (
        a.cfg.n_heads, a.cfg.kv_heads, a.cfg.d_head, a.cfg.tied_unembed)
    for name in a.checkpoint.specs:
        assert b.weights.has(name), name
        assert np.array_equal(a.weights.get(name), b.weights.get(name)), name
    for layer, head in ((0, 0), (1, 3)):  # per-head reads (row slices of permuted tensors)
        for name in ("W_Q", "W_K", "W_V", "b_Q", "W_O"):
            key = f"blocks.{layer}.attn.{name}"
            assert np.array_equal(a.weights.get_head(key, head), b.weights.get_head(key, head)), key
    assert b.cfg.extra.get("sliding_window") == a.cfg.extra.get("sliding_window")
    _assert_same_model(path, gguf, tol=1e-6)


@pytest.mark.parametrize("family", ["llama", "qwen2", "phi3"])
def test_transformers_own_gguf_reader_agrees_with_the_test_files(family: str, request: pytest.FixtureRequest,
                                                                 tmp_path: Path) -> None:
    """The GGUF files these tests write are what llama.cpp's layout means to an independent
    reader too: transformers' GGUF loader (its own name map and reverse Q/K permutation) gets
    the original weights back. So the comparisons above cannot pass on a permutation that is
    wrong in the same way in the test writer and in headscope."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    _, model = request.getfixturevalue(f"{family}_pair")
    path = write_gguf(model, tmp_path / "m.gguf")
    theirs = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    ours = model.state_dict()
    assert "model.layers.0.self_attn.k_proj.weight" in theirs or family == "phi3"
    for name, t in theirs.items():
        assert torch.equal(torch.as_tensor(t), ours[name]), name
    assert set(ours) - set(theirs) <= {"lm_head.weight"}  # tied: the file has no copy


def test_llama_qk_permutation_is_really_undone(llama_pair, tmp_path: Path) -> None:
    """The stored rows are permuted (so the test means something) and the reader undoes it:
    reading the file without the inverse permutation gives other patterns."""
    from headscope.engine.model import gguf_config, gguf_weights

    _path, model = llama_pair
    gguf = write_gguf(model, tmp_path / "model.gguf")
    q = model.state_dict()["model.layers.0.self_attn.q_proj.weight"].numpy()
    assert not np.array_equal(permute(q, 4), q)
    src = open_model(gguf, raw=True).checkpoint.gguf
    stored = src._dequantised(src.header.tensors["blk.0.attn_q.weight"], "blk.0.attn_q.weight", 0, 32)
    assert np.array_equal(stored, permute(q, 4))
    assert np.array_equal(gguf_weights._unpermute(stored, 4), q)

    good = run(open_model(gguf, raw=True).weights, SEQS).patterns
    m = open_model(gguf, raw=True)
    m.checkpoint.gguf.arch = gguf_config.GGUFArch("LlamaForCausalLM", "llama", "silu", permuted_qk=False)
    assert _max_diff(run(m.weights, SEQS).patterns, good) > 1e-2


def test_gemma_gguf_norm_offset_is_undone(tmp_path: Path) -> None:
    """Gemma files store norm gains as 1 + w (llama.cpp's RMSNorm multiplies by the gain): the
    reader subtracts it again. The whole model is compared where the gemma family is supported."""
    from transformers import GemmaConfig, GemmaForCausalLM

    from headscope.engine.formats.gguf import read_gguf_header
    from headscope.engine.model import gguf_config
    from headscope.engine.model.gguf_weights import GGUFSource

    cfg = GemmaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      max_position_embeddings=48, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh")
    model = randomize_(GemmaForCausalLM(cfg), seed=13)
    model.save_pretrained(tmp_path / "ref", safe_serialization=True)
    path = write_gguf(model, tmp_path / "g.gguf")
    header = read_gguf_header(path)
    name, arch = gguf_config.arch_of(header)
    hf_names = gguf_config.hf_tensor_names(header, arch)
    config = gguf_config.hf_config(header, name, arch, hf_names)
    assert (config["model_type"], config["head_dim"], config["tie_word_embeddings"]) == ("gemma", 16, True)
    src = GGUFSource(header, hf_names, arch, open_model(build_llama(tmp_path / "l")[0]).raw_cfg)
    sd = model.state_dict()
    for hf in ("model.norm.weight", "model.layers.1.input_layernorm.weight", "model.layers.0.self_attn.q_proj.weight"):
        # (w + 1) - 1 in float32 is w up to half an ulp of numbers in [1, 2): 2^-24 each way.
        assert _max_diff(torch.from_numpy(src.read(hf)), sd[hf]) <= 2.0**-23, hf
    _assert_same_model(tmp_path / "ref", path)


def _gemma2(tmp_path: Path) -> tuple[Path, Any]:
    """Gemma 2 as a GGUF file can carry it: query_pre_attn_scalar = head_dim (llama.cpp's rule
    below 27B), soft-caps below the typical scores, a window of 5 on every other layer."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from tests.family_fixtures import WINDOW, _common
    from tests.hf_fixtures import _finish

    cfg = Gemma2Config(head_dim=8, query_pre_attn_scalar=8, sliding_window=WINDOW,
                       attn_logit_softcapping=4.0, final_logit_softcapping=5.0, **_common())
    return _finish(Gemma2ForCausalLM(cfg), tmp_path, seed=31, shard=False, dtype=None, tokenizer=False)


def _gemma3(tmp_path: Path) -> tuple[Path, Any]:
    """Gemma 3 with six layers (five local, one global, llama.cpp's fixed pattern), local base
    10000 (llama.cpp's) and a global base of 100 scaled linearly by 8."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from tests.family_fixtures import WINDOW, _common
    from tests.hf_fixtures import _finish

    rope = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 100.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    common = {**_common(), "num_hidden_layers": 6}
    cfg = Gemma3TextConfig(head_dim=8, query_pre_attn_scalar=8, sliding_window=WINDOW,
                           rope_parameters=rope, **common)
    assert cfg.layer_types == ["sliding_attention"] * 5 + ["full_attention"]
    return _finish(Gemma3ForCausalLM(cfg), tmp_path, seed=32, shard=False, dtype=None, tokenizer=False)


@pytest.mark.parametrize("builder", [_gemma2, _gemma3], ids=["gemma2", "gemma3"])
def test_gemma2_and_gemma3_gguf_are_the_original(builder: Any, tmp_path: Path) -> None:
    """Soft-caps, sliding windows, post-sublayer norms, q/k norms, local/global RoPE come back
    from the metadata and the +1 of every norm gain is undone: the same model as the original."""
    from headscope.engine.forward.transformer import layer_config

    path, model = builder(tmp_path / "hf")
    gguf = write_gguf(model, tmp_path / "m.gguf")
    a, b = open_model(path, raw=True), open_model(gguf, raw=True)
    assert (b.cfg.family, b.cfg.attn_scale) == (a.cfg.family, a.cfg.attn_scale)
    for key in ("attn_softcap", "final_softcap", "sliding_window", "layer_types", "qk_norm"):
        assert b.cfg.extra.get(key) == a.cfg.extra.get(key), key
    for layer in range(a.cfg.n_layers):
        la, lb = layer_config(a.cfg, layer), layer_config(b.cfg, layer)
        assert (la.rotary_base, la.extra.get("rope_type")) == (lb.rotary_base, lb.extra.get("rope_type"))
    for name in a.checkpoint.specs:
        # (w + 1) - 1 in float32: w up to half an ulp of numbers near 1
        torch.testing.assert_close(b.weights.get(name), a.weights.get(name), atol=2.0**-23, rtol=0)
    _assert_same_model(path, gguf)


@pytest.mark.parametrize("family", ["qwen3", "olmo2"])
def test_qwen3_and_olmo2_gguf_are_the_original(family: str, tmp_path: Path) -> None:
    """Per-head (Qwen3) and whole-projection (OLMo2) q/k norms, OLMo2's norms after the
    sublayers: read back from llama.cpp's names, the same model as the original."""
    from tests.family_fixtures import NEW_FAMILIES

    path, model = NEW_FAMILIES[family](tmp_path / "hf")
    gguf = write_gguf(model, tmp_path / "m.gguf")
    a, b = open_model(path, raw=True), open_model(gguf, raw=True)
    assert (b.cfg.family, b.cfg.d_head, b.cfg.extra.get("qk_norm")) == (a.cfg.family, a.cfg.d_head, a.cfg.extra["qk_norm"])
    for name in a.checkpoint.specs:
        assert np.array_equal(a.weights.get(name), b.weights.get(name)), name
    _assert_same_model(path, gguf)


# --- quantised types ---------------------------------------------------------------------------

# Worst-case |dequantised - original| per element, relative to the largest |w| of its block
# (F16/BF16: relative to the element itself):
# F16 rounds to 11 significant bits (2^-11; below 2^-14 it is subnormal, with absolute error
# <= 2^-25, hence the absolute 6e-8 added); BF16 to 8 (2^-8 relative, round to nearest: 2^-9,
# with margin); Q8_0 stores round(w / d) with d = amax/127 in f16: error <= d/2 plus the f16
# rounding of d times 127 (~amax/254 + amax·2^-11·... ) < amax/200; Q4_0 stores 4-bit
# round(w / d) with d = amax/-8: error <= |d|/2 = amax/16, plus the clamp of +amax to 7·|d|
# (error |d| = amax/8): < amax/7.
BOUNDS = {"F16": 2.0**-11, "BF16": 2.0**-8, "Q8_0": 1 / 200, "Q4_0": 1 / 7}


def _block_amax(w: np.ndarray, block: int) -> np.ndarray:
    rows = w.reshape(-1, block)
    return np.repeat(np.abs(rows).max(axis=1, keepdims=True), block, axis=1).reshape(w.shape)


@pytest.mark.parametrize(("family", "qtype"), [("llama", "F16"), ("llama", "BF16"), ("llama", "Q8_0"),
                                               ("llama", "Q4_0"), ("qwen2", "Q8_0"), ("phi3", "Q4_0")])
def test_quantised_gguf_within_quantisation_error(family: str, qtype: str, request: pytest.FixtureRequest,
                                                  tmp_path: Path) -> None:
    import gguf.quants
    from gguf.constants import GGMLQuantizationType

    _path, model = request.getfixturevalue(f"{family}_pair")
    gguf_path = write_gguf(model, tmp_path / f"model-{qtype}.gguf", qtype=qtype)
    m = open_model(gguf_path, raw=True)
    assert m.cfg.dtype == qtype.lower()
    # Every 2-D weight within the bound, through the reader (permutation undone).
    block = 32 if qtype.startswith("Q") else 1
    sd = {k: v.float().numpy() for k, v in model.state_dict().items()}
    src = m.checkpoint.gguf
    for hf in src.hf_names:
        ours, orig = src.read(hf), sd[hf]
        err = np.abs(ours - orig)
        if orig.ndim == 1:
            assert np.array_equal(ours, orig), hf  # 1-D tensors stay F32
        else:
            scale = np.abs(orig) if block == 1 else _block_amax(orig, block)
            assert (err <= BOUNDS[qtype] * scale + 6e-8).all(), f"{hf}: max error {err.max():.3g}"
            assert err.max() > 0, f"{hf} was not quantised"

    # The forward pass equals that of a safetensors checkpoint of the dequantised weights.
    deq = {}
    for hf, t in model.state_dict().items():
        w = t.float().numpy()
        if w.ndim == 2:
            qt = GGMLQuantizationType[qtype]
            w = gguf.quants.dequantize(gguf.quants.quantize(w, qt), qt)
        deq[hf] = torch.from_numpy(np.array(w, dtype=np.float32))
    model_q = _clone_with(model, deq)
    ref_dir = tmp_path / "dequantised"
    model_q.save_pretrained(ref_dir, safe_serialization=True)
    _assert_same_model(ref_dir, gguf_path)


def _clone_with(model: Any, state: dict[str, torch.Tensor]) -> Any:
    import copy

    clone = copy.deepcopy(model)
    clone.load_state_dict(state, strict=False)
    return clone


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_k_quant_gguf_matches_checkpoint_of_its_values(qtype: str, tmp_path: Path) -> None:
    """K-quants need rows of 256: a Llama with d_model = d_mlp = 256 whose 2-D weights are
    valid random blocks (tests/gguf_fixtures.k_quant_blocks); the HF model gets their
    dequantised values, so both files hold the same numbers."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=96, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=48,
                      rms_norm_eps=1e-6, tie_word_embeddings=False)
    model = randomize_(LlamaForCausalLM(cfg), seed=9)
    blocks: dict[str, tuple[np.ndarray, str]] = {}
    state = model.state_dict()
    for i, (hf, t) in enumerate(state.items()):
        if t.ndim == 2:
            data, values = k_quant_blocks(t.shape[0], t.shape[1], qtype, seed=i)
            blocks[hf] = (data, qtype)
            state[hf] = torch.from_numpy(values)
    model.load_state_dict(state)
    ref = tmp_path / "ref"
    model.save_pretrained(ref, safe_serialization=True)
    gguf_path = write_gguf(model, tmp_path / "model.gguf", raw_blocks=blocks)
    m = open_model(gguf_path, raw=True)
    assert m.cfg.dtype == qtype.lower()
    res = run(m.weights, SEQS)
    assert res.patterns.max() > 0.9  # not near-uniform: the comparison means something
    _assert_same_model(ref, gguf_path)


# --- tokenizer -------------------------------------------------------------------------------


# --- CLI ------------------------------------------------------------------------------------


def test_cli_info_and_heads_on_gguf(qwen2_pair, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from headscope.tui.cli.main import main

    _, model = qwen2_pair
    path = write_gguf(model, tmp_path / "q.gguf", qtype="Q8_0")
    assert main(["info", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["format"], info["family"], info["dtype"], info["n_kv_heads"]) == ("gguf", "qwen2", "q8_0", 2)
    assert main(["heads", str(path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 8


# --- hostile files -----------------------------------------------------------------------------


def _u64(n: int) -> bytes:
    return struct.pack("<Q", n)


HOSTILE: dict[str, tuple[bytes, str]] = {
    "wrong_magic": (gguf_bytes(magic=b"GGML"), "wrong magic"),
    "empty": (b"", "wrong magic"),
    "old_version": (gguf_bytes(version=1), "version 1"),
    "big_endian": (gguf_bytes(version=3 << 24), "big-endian"),
    "absurd_tensor_count": (gguf_bytes(n_tensors=1 << 60), "tensor count"),
    "absurd_kv_count": (gguf_bytes(n_kv=10**9), "metadata count"),
    "absurd_string": (gguf_bytes(kv=[("general.architecture", 8, _u64(1 << 62))]), "length of value"),
    "absurd_array": (gguf_bytes(kv=[("x", 9, struct.pack("<I", 4) + _u64(1 << 50))]), "length of array"),
    "absurd_string_in_array": (
        gguf_bytes(kv=[("tokenizer.ggml.tokens", 9, struct.pack("<I", 8) + _u64(2) + _u64(1 << 40) + b"\0" * 64)]),
        "claims"),
    "array_past_end": (
        gguf_bytes(kv=[("tokenizer.ggml.tokens", 9, struct.pack("<I", 8) + _u64(5) + string_value("x" * 20) * 3)],
                   alignment=1),
        "truncated"),
    "unknown_value_type": (gguf_bytes(kv=[("x", 77, b"")]), "unknown type 77"),
    "unknown_tensor_type": (
        gguf_bytes(tensors=[("t", [32], 99, 0)], data=b"\0" * 128), "unknown ggml type 99"),
    "tensor_past_end": (gguf_bytes(tensors=[("t", [1024], 0, 0)], data=b"\0" * 64), "truncated"),
    "too_many_dims": (gguf_bytes(tensors=[("t", [1] * 9, 0, 0)], data=b"\0" * 64), "dimensions"),
    "partial_block": (gguf_bytes(tensors=[("t", [33], 8, 0)], data=b"\0" * 128), "blocks of 32"),
    "unaligned": (gguf_bytes(tensors=[("t", [4], 0, 4)], data=b"\0" * 64), "aligned"),
    "overlap": (gguf_bytes(tensors=[("a", [16], 0, 0), ("b", [16], 0, 32)], data=b"\0" * 128), "overlap"),
    "duplicate_key": (gguf_bytes(kv=[("k", 4, b"\1\0\0\0"), ("k", 4, b"\1\0\0\0")]), "duplicate"),
    "bad_utf8_key": (gguf_bytes(kv=[(b"general.\xff", 8, string_value("llama"))]), "UTF-8"),
    "bad_utf8_tensor_name": (gguf_bytes(tensors=[(b"t\xfe", [4], 0, 0)], data=b"\0" * 64), "UTF-8"),
    "truncated_header": (gguf_bytes(kv=[("general.architecture", 8, string_value("llama"))])[:30], "truncated"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_gguf_is_one_line_typed_error(case: str, tmp_path: Path) -> None:
    blob, words = HOSTILE[case]
    path = tmp_path / f"{case}.gguf"
    path.write_bytes(blob)
    for opener in (read_structure, open_model):
        with pytest.raises(CorruptFileError) as e:
            opener(path)
        msg = str(e.value)
        assert "\n" not in msg and str(path) in msg and words in msg, msg


def test_truncated_real_file_and_unknown_architecture(llama_pair, tmp_path: Path) -> None:
    _, model = llama_pair
    good = write_gguf(model, tmp_path / "good.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CorruptFileError, match="truncated"):
        open_model(cut)
    other = tmp_path / "other.gguf"
    other.write_bytes(gguf_bytes(kv=[("general.architecture", 8, string_value("mamba"))]))
    with pytest.raises(UnknownArchitectureError, match="mamba"):
        read_structure(other)


def test_file_changed_after_opening_is_an_error(llama_pair, tmp_path: Path) -> None:
    _, model = llama_pair
    path = write_gguf(model, tmp_path / "m.gguf")
    m = open_model(path, raw=True)
    with open(path, "ab") as f:
        f.write(b"\0" * 64)
    with pytest.raises(CorruptFileError, match="changed on disk"):
        m.weights.get("blocks.0.attn.W_Q")


# --- the explorer ----------------------------------------------------------------------------


async def test_explorer_opens_a_gguf_file(llama_pair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`headscope model.gguf`: the app opens it on the real engine, shows the token QK view with
    the metadata's token strings, and reports no error."""

    from headscope.tui.app import HeadscopeApp
    from headscope.tui.base.settings import Settings
    from headscope.tui.widgets.chart import Chart

    monkeypatch.setenv("HEADSCOPE_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("HEADSCOPE_OUTPUT_DIR", str(tmp_path / "out"))
    tokens = ["<unk>", "Ġthe", "Ġcat"] + [f"tok{i}" for i in range(3, 96)]
    path = write_gguf(llama_pair[1], tmp_path / "m.gguf", qtype="Q8_0", tokens=tokens, merges=[])
    app = HeadscopeApp(path, settings=Settings(), debounce=0.01, sweep=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot, app)
        assert app.errors == []
        assert "token QK L0.H0" in app.explorer.query_one("#qk-token", Chart).rendered.plain
        await pilot.press("q")


def test_read_structure_of_gguf_imports_no_torch(llama_pair, tmp_path: Path) -> None:
    """`headscope info x.gguf` stays header-only: no torch (as for safetensors)."""
    import subprocess
    import sys

    path = write_gguf(llama_pair[1], tmp_path / "m.gguf", qtype="Q8_0")
    code = (
        "import sys\nfrom headscope.engine.model.loading import read_structure\n"
        f"s = read_structure({str(path)!r})\nassert s['dtype'] == 'q8_0', s\n"
        "assert 'torch' not in sys.modules\nprint('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]


def test_per_head_reads_dequantise_rows_or_reuse_the_whole_tensor(llama_pair, tmp_path: Path) -> None:
    """W_Q of one head dequantises only that head's rows; W_O (cut along columns) is
    dequantised once for all heads; results are private copies (editing one changes nothing)."""
    path = write_gguf(llama_pair[1], tmp_path / "m.gguf", qtype="Q8_0")
    m = open_model(path, raw=True)
    src = m.checkpoint.gguf
    before = src.dequantised
    q = m.weights.get_head("blocks.0.attn.W_Q", 2)
    assert src.dequantised == before + 1 and q.shape == (32, 8)
    for h in range(4):
        m.weights.get_head("blocks.0.attn.W_O", h)
    assert src.dequantised == before + 2
    a = src.read("model.layers.0.self_attn.o_proj.weight")
    a += 1.0
    assert not np.array_equal(src.read("model.layers.0.self_attn.o_proj.weight"), a)


def test_diff_against_the_original(llama_pair, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`headscope diff dir model.gguf`: an F32 file changes no head; Q4_0 changes every head a
    little (circuits stay highly similar)."""
    import json

    from headscope.tui.cli.main import main

    path, model = llama_pair
    for qtype in ("F32", "Q4_0"):
        gguf_path = write_gguf(model, tmp_path / f"m-{qtype}.gguf", qtype=qtype)
        assert main(["diff", str(path), str(gguf_path), "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        rows = out["heads"] if isinstance(out, dict) else out
        changes = [r["change"] for r in rows]
        assert len(changes) == 8
        if qtype == "F32":
            assert max(changes) < 1e-5
        else:
            assert min(changes) > 1e-4 and min(r["qk_similarity"] for r in rows) > 0.9


def test_tensors_headscope_does_not_understand_are_refused(llama_pair, tmp_path: Path) -> None:
    """A tensor outside the architecture (here a per-head query norm) could change the
    computation: refused with its name, never silently ignored."""
    path = write_gguf(llama_pair[1], tmp_path / "m.gguf",
                      extra_tensors={"blk.0.attn_q_norm.weight": np.ones(8, dtype=np.float32)})
    with pytest.raises(ConfigError, match="attn_q_norm"):
        read_structure(path)


@pytest.mark.parametrize("case", ["truncated_header", "absurd_tensor_count", "unknown_tensor_type"])
def test_cli_on_hostile_gguf_prints_one_line(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from headscope.tui.cli.main import EXIT_MODEL_ERROR, main

    path = tmp_path / f"{case}.gguf"
    path.write_bytes(HOSTILE[case][0])
    for command in ("info", "heads"):
        assert main([command, str(path)]) == EXIT_MODEL_ERROR
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and str(path) in err, err


def test_missing_gguf_package_is_a_typed_error(llama_pair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file of headscope's own types opens without the gguf package (``info`` never imports
    it: issue 40); a tensor of another type needs the package's table, and says so."""
    import sys

    from headscope.engine.core.errors import UnsupportedFormatError
    from headscope.engine.formats import gguf as gguf_format

    path = write_gguf(llama_pair[1], tmp_path / "m.gguf", qtype="Q8_0")
    monkeypatch.setitem(sys.modules, "gguf.constants", None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, "gguf.quants", None)
    assert read_structure(path)["dtype"] == "q8_0"
    other = tmp_path / "q4_1.gguf"  # Q4_1 (type 3): 32 values in 20 bytes, not one of KNOWN_TYPES
    other.write_bytes(gguf_bytes(tensors=[("t", [32], 3, 0)], data=b"\0" * 32))
    with pytest.raises(UnsupportedFormatError, match="pip install gguf"):
        gguf_format.read_gguf_header(other)


def test_known_ggml_types_are_the_gguf_package_s() -> None:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    from headscope.engine.formats.dequant import TYPES
    from headscope.engine.formats.gguf import KNOWN_TYPES, quant_sizes

    for ggml_type, (name, block, size) in KNOWN_TYPES.items():
        assert GGMLQuantizationType(ggml_type).name == name
        assert GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)] == (block, size)
    assert set(TYPES) | {"F64"} == {name for name, _, _ in KNOWN_TYPES.values()}
    assert quant_sizes()[3] == ("Q4_1", 32, 20)  # any other type: the package's table


def test_gguf_string_arrays_are_decoded_on_first_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A vocabulary is kept as the bytes read and decoded when asked for (``header.get``),
    to the same strings, across refills of the read window; bad UTF-8 becomes U+FFFD."""
    from headscope.engine.formats import gguf as gguf_format

    tokens = [b"a", b"", b"\xe2\x96\x81the", b"\xff\xfe", b"x" * 300, b"<0x0A>", *(b"t%d" % i for i in range(50))]
    array = struct.pack("<IQ", 8, len(tokens)) + b"".join(struct.pack("<Q", len(t)) + t for t in tokens)
    path = tmp_path / "vocab.gguf"
    path.write_bytes(gguf_bytes(kv=[("general.architecture", 8, string_value("llama")),
                                    ("tokenizer.ggml.tokens", 9, array),
                                    ("general.name", 8, string_value("after"))]))
    expected = [t.decode("utf-8", errors="replace") for t in tokens]
    for chunk in (16, 64, 1 << 20):  # items straddling the window, longer than it, all inside
        monkeypatch.setattr(gguf_format, "READ_CHUNK", chunk)
        header = gguf_format.read_gguf_header(path)
        assert isinstance(header.metadata["tokenizer.ggml.tokens"], gguf_format.StringArray)
        assert header.get("tokenizer.ggml.tokens") == expected and header.get("general.name") == "after"
    short = struct.pack("<IQ", 8, 2) + struct.pack("<Q", 1) + b"a" + struct.pack("<Q", 300) + b"x" * 300
    path.write_bytes(gguf_bytes(kv=[("general.architecture", 8, string_value("llama")),
                                    ("tokenizer.ggml.tokens", 9, short)])[:200])  # cut in item 1
    with pytest.raises(CorruptFileError, match=re.escape("item 1 of 'tokenizer.ggml.tokens' claims 300 bytes")):
        gguf_format.read_gguf_header(path)


# --- metadata llama.cpp reads its own way (issue #29) -----------------------------------------


# --- round 4: a file truncated while its header is read; arrays too large for lists ----------------

_TRUNCATE_WHILE_READING = """
import sys
from headscope.engine.core.errors import CorruptFileError
from headscope.engine.formats import gguf

path = sys.argv[1]
sizes = gguf.quant_sizes()
gguf.READ_CHUNK = 64  # the window holds the metadata, not the tensor infos after it


def truncate_then_sizes():  # called between the metadata and the tensor infos
    with open(path, "r+b") as f:
        f.truncate(100)
    return sizes


gguf.quant_sizes = truncate_then_sizes
try:
    gguf.read_gguf_header(path)
except CorruptFileError as e:
    print(e)
"""


def test_gguf_truncated_while_its_header_is_read_is_one_line_not_sigbus(tmp_path: Path) -> None:
    # An 8 KB string pushes the tensor infos two pages in: a memory-mapped header touched
    # after the truncation is SIGBUS (exit 135 in a shell).
    blob = gguf_bytes(kv=[("general.architecture", 8, string_value("llama")),
                          ("general.description", 8, string_value("x" * 8192))],
                      tensors=[("t", [8], 0, 0)], data=b"\0" * 32)
    path = tmp_path / "cut.gguf"
    path.write_bytes(blob)
    done = subprocess.run([sys.executable, "-c", _TRUNCATE_WHILE_READING, str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    line = done.stdout.strip()
    assert "\n" not in line and line.startswith(f"{path}: truncated GGUF file"), line


def test_large_gguf_metadata_arrays_stay_numpy_and_huge_string_arrays_are_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from headscope.engine.formats import gguf as gguf_format

    n = 3_000_000  # > LIST_ITEMS: as a list ~110 MB of Python ints, as an array the file's 12 MB
    values = np.arange(n, dtype=np.uint32)
    path = tmp_path / "big.gguf"
    path.write_bytes(gguf_bytes(kv=[("general.architecture", 8, string_value("llama")),
                                    ("x.ids", 9, struct.pack("<IQ", 4, n) + values.tobytes()),
                                    ("x.small", 9, struct.pack("<IQ", 6, 2) + struct.pack("<2f", 0.5, 2.0))]))
    tracemalloc.start()
    try:
        header = gguf_format.read_gguf_header(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(header.get("x.ids"), np.ndarray) and np.array_equal(header.get("x.ids"), values)
    assert header.get("x.small") == [0.5, 2.0]  # small arrays stay lists (the model reader's)
    assert peak < 3 * values.nbytes  # the bytes read and the array over them, not a list
    # A string array is a list of str (~60 bytes each): beyond MAX_STRINGS the file is refused.
    monkeypatch.setattr(gguf_format, "MAX_STRINGS", 4)
    path.write_bytes(gguf_bytes(kv=[("tokenizer.ggml.tokens", 9,
                                     struct.pack("<IQ", 8, 5) + b"".join(string_value(t) for t in "abcde"))]))
    with pytest.raises(CorruptFileError) as e:
        gguf_format.read_gguf_header(path)
    assert str(e.value) == (f"{path}: bad GGUF header: array 'tokenizer.ggml.tokens' has 5 strings; headscope "
                            "reads at most 4 (the largest vocabularies have a few hundred thousand)")
