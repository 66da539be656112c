"""GGUF weights read through headscope's own dequantisation kernels (engine/formats/dequant.py):
every type they implement gives, through the reader (whole tensors and per-head reads, the
Q/K permutation undone), exactly llama.cpp's ``gguf.quants.dequantize`` of the file's bytes,
without calling it; a type nothing can dequantise, or bytes that do not fit a tensor's type
and shape, is one line naming the tensor and the type."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.dequant import random_blocks
from headscope.engine.api.model import open_model
from headscope.engine.core.errors import CorruptFileError
from headscope.engine.formats.dequant import TYPES
from headscope.engine.model import gguf_weights
from tests.engine.formats.test_dequant import reference, same_bits
from tests.gguf_fixtures import write_gguf
from tests.hf_fixtures import randomize_


def _llama(seed: int = 4) -> Any:
    """Rows of 256 (K-quant blocks); 4 query heads of 64 over 2 KV heads (GQA)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=256, intermediate_size=256, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                      rms_norm_eps=1e-6, tie_word_embeddings=False)
    return randomize_(LlamaForCausalLM(cfg), seed=seed)


def _write(model: Any, path: Path, type_name: str) -> dict[str, np.ndarray]:
    """``model`` as a GGUF file whose 2-D weights are random valid ``type_name`` blocks;
    returns what each HF tensor must read as (llama.cpp's dequantisation, HF row order)."""
    blocks, want = {}, {}
    for i, (hf, t) in enumerate(model.state_dict().items()):
        if t.ndim == 2:
            raw = random_blocks(type_name, t.shape[0], t.shape[1], seed=i, extremes=True)
            blocks[hf] = (raw, type_name)
            want[hf] = reference(raw, type_name).reshape(t.shape)
    write_gguf(model, path, raw_blocks=blocks)
    return want


@pytest.mark.parametrize("type_name", [t for t in TYPES if t != "F32"])
def test_reader_gives_llama_cpp_values_without_calling_it(type_name: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import gguf.quants

    model = _llama()
    want = _write(model, tmp_path / "m.gguf", type_name)

    def refuse(*_: Any) -> None:
        raise AssertionError("gguf.quants.dequantize called on the hot path")

    monkeypatch.setattr(gguf.quants, "dequantize", refuse)
    m = open_model(tmp_path / "m.gguf", raw=True)
    assert m.cfg.dtype == type_name.lower()
    src = m.checkpoint.gguf
    for hf, values in want.items():
        assert same_bits(src.read(hf), values), hf
        assert same_bits(src.read(hf, slice(64, 128)), values[64:128]), hf  # rows of head 1
    # Per-head reads (only the head's rows for W_Q/W_K/W_V) agree with the whole tensor.
    for name in ("W_Q", "W_K", "W_V", "W_O"):
        whole = m.weights.get(f"blocks.0.attn.{name}")
        for h in range(4):
            assert same_bits(m.weights.get_head(f"blocks.0.attn.{name}", h), whole[h]), (name, h)


def test_types_without_a_kernel_still_read_through_gguf(tmp_path: Path) -> None:
    """Q5_0 (no kernel here): llama.cpp's numpy code, same values."""
    import gguf.quants
    from gguf.constants import GGMLQuantizationType

    model = _llama()
    path = write_gguf(model, tmp_path / "m.gguf", qtype="Q5_0")
    src = open_model(path, raw=True).checkpoint.gguf
    w = model.state_dict()["model.layers.0.mlp.down_proj.weight"].numpy()
    q = GGMLQuantizationType.Q5_0
    assert same_bits(src.read("model.layers.0.mlp.down_proj.weight"),
                     gguf.quants.dequantize(gguf.quants.quantize(w, q), q).astype(np.float32))


def test_a_type_nothing_can_dequantise_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    from headscope.tui.cli.main import EXIT_MODEL_ERROR, main

    model = _llama()
    t = model.state_dict()["model.layers.0.mlp.up_proj.weight"]
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType.Q8_1]
    raw = np.zeros((t.shape[0], t.shape[1] // block * size), np.uint8)
    path = write_gguf(model, tmp_path / "m.gguf", raw_blocks={"model.layers.0.mlp.up_proj.weight": (raw, "Q8_1")})
    with pytest.raises(CorruptFileError) as e:
        open_model(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and "'blk.0.ffn_up.weight'" in msg and "Q8_1" in msg, msg
    assert main(["heads", str(path)]) == EXIT_MODEL_ERROR
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Q8_1" in err, err


def test_bytes_that_do_not_fit_type_and_shape_are_one_line(tmp_path: Path) -> None:
    """The header computes each tensor's size from gguf's table of block sizes; if that table
    and headscope's kernels ever disagree, opening (and reading) says so, naming the tensor."""
    model = _llama()
    _write(model, tmp_path / "m.gguf", "Q4_K")
    m = open_model(tmp_path / "m.gguf", raw=True)
    src = m.checkpoint.gguf
    header = src.header
    name = "blk.0.attn_v.weight"
    bad = dataclasses.replace(header.tensors[name], nbytes=header.tensors[name].nbytes - 144)
    bad_header = dataclasses.replace(header, tensors={**header.tensors, name: bad})
    for check in (lambda: gguf_weights.check_types(bad_header, src.hf_names),
                  lambda: src._dequantised(bad, name, 0, 64)):
        with pytest.raises(CorruptFileError) as e:
            check()
        msg = str(e.value)
        assert "\n" not in msg and f"'{name}'" in msg and "Q4_K" in msg and "bytes" in msg, msg
    partial = dataclasses.replace(header.tensors[name], shape=(128, 200))
    assert "not a whole number of Q4_K blocks" in (gguf_weights.size_problem(partial) or "")


def test_whole_reads_are_not_cached_column_cuts_are(tmp_path: Path) -> None:
    """A sweep's whole-tensor reads leave nothing in the reader's cache (no copy for it); one
    head's columns of o_proj dequantise the tensor once for every head, and each cut is a
    small array of its own."""
    model = _llama()
    _write(model, tmp_path / "m.gguf", "Q8_0")
    m = open_model(tmp_path / "m.gguf", raw=True)
    src = m.checkpoint.gguf
    o = "model.layers.0.self_attn.o_proj.weight"
    before = src.dequantised
    whole = src.read(o)
    assert same_bits(src.read(o), whole) and src.dequantised == before + 2 and src._cached_bytes == 0
    cuts = [src.read(o, None, (slice(64 * h, 64 * (h + 1)),)) for h in range(4)]
    assert src.dequantised == before + 3 and src._cached_bytes == whole.nbytes
    for h, cut in enumerate(cuts):
        assert cut.flags.c_contiguous and cut.base is None and same_bits(cut, whole[:, 64 * h : 64 * (h + 1)])
    again = src.read(o)
    assert same_bits(again, whole) and again.base is None and src.dequantised == before + 3


def test_reads_reuse_a_staging_buffer_and_hand_out_none_of_it(tmp_path: Path) -> None:
    """The stored bytes of each read go through a reused buffer (no fresh allocation per
    read), and every array a read returns is still right after all the others were read:
    none of them shares the buffer."""
    model = _llama()
    want = _write(model, tmp_path / "m.gguf", "Q8_0")
    src = open_model(tmp_path / "m.gguf", raw=True).checkpoint.gguf
    got = {hf: src.read(hf) for hf in want}
    assert src.staging.reused > 0
    for hf, values in want.items():
        assert same_bits(got[hf], values), hf
