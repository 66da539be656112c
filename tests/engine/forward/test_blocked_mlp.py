"""The MLP applied in column blocks (engine/forward/blocked_mlp.py) equals the whole one.

Tiny checkpoints with a block budget forced to a few columns: the logits of a forward pass,
the gradient estimates of attribution patching (its backward pass re-reads the blocks), and
the processed column blocks themselves; and the reads of a blocked pass never take a whole
MLP matrix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bench.checkpoints import SHAPES, write_checkpoint
from headscope.engine.forward import blocked_mlp, patch_tasks, patching, transformer
from headscope.engine.forward.torch_weights import torch_weights
from headscope.engine.model.loading import load_model

TOKENS = [[1, 5, 9, 2, 33, 7, 5, 9], [3, 4, 8, 8, 1, 0, 2, 6]]
COLUMNS = 7  # of a d_model = 64 matrix: 176 / 7 and 256 / 7 leave a ragged last block
EPS = float(np.finfo(np.float32).eps)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ck")


def _model(root: Path, shape: str, raw: bool = False) -> Any:
    return load_model(write_checkpoint(SHAPES[shape], root), raw=raw)


def _tiny_blocks(monkeypatch: pytest.MonkeyPatch) -> int:
    budget = 4 * 64 * COLUMNS
    monkeypatch.setattr(blocked_mlp, "MLP_BLOCK_BYTES", budget)
    return budget


@pytest.mark.parametrize(("shape", "raw"), [("tiny-llama", False), ("tiny-llama", True),
                                            ("tiny-gpt2", False), ("tiny-neox", False)])
def test_blocked_forward_pass_equals_the_whole(root: Path, monkeypatch: pytest.MonkeyPatch,
                                               shape: str, raw: bool) -> None:
    """Gated (Llama) and not (GPT-2, NeoX's parallel blocks), processed and raw: each logit
    is the same dot products, summed in blocks; float32 rounding of a sum of O(d) terms."""
    w = _model(root, shape, raw).weights
    whole = transformer.run(w, TOKENS).logits
    _tiny_blocks(monkeypatch)
    assert blocked_mlp.uses_blocks(torch_weights(w))
    blocked = transformer.run(w, TOKENS).logits
    scale = float(whole.abs().max())
    torch.testing.assert_close(blocked, whole, rtol=0, atol=64 * EPS * scale)


def test_blocked_attribution_equals_the_whole(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Attribution patching differentiates through every MLP: the blocked backward pass
    (dhidden over W_out's blocks, dx block by block) gives the same estimates."""
    w = _model(root, "tiny-llama").weights
    clean, corrupt, metric = TOKENS[:1], [[1, 5, 9, 2, 40, 7, 11, 9]], patch_tasks.LogitDiff(3, 4)
    whole = np.array([r.estimate for r in patching.attribute_heads(w, clean, corrupt, metric).rows])
    _tiny_blocks(monkeypatch)
    blocked = np.array([r.estimate for r in patching.attribute_heads(w, clean, corrupt, metric).rows])
    assert np.abs(whole).max() > 0
    np.testing.assert_allclose(blocked, whole, rtol=0, atol=64 * EPS * float(np.abs(whole).max()))


@pytest.mark.parametrize("shape", ["tiny-llama", "tiny-gpt2"])
def test_processed_columns_are_the_whole_arrays_columns(root: Path, shape: str) -> None:
    """The RMS gain folded into W_gate/W_in (Llama); the LayerNorm gain and centring of W_in,
    and W_out centred along its columns, cut from the whole (GPT-2)."""
    w = _model(root, shape).weights
    for leaf in ("W_gate", "W_in", "W_out"):
        name = f"blocks.1.mlp.{leaf}"
        if not w.has(name):
            continue
        whole = w.get(name)
        for j, k in blocked_mlp.column_blocks(whole.shape[0], whole.shape[1], 4 * whole.shape[0] * COLUMNS):
            np.testing.assert_allclose(w.get_columns(name, j, k), whole[:, j:k], rtol=4 * EPS, atol=1e-9)


def test_a_blocked_pass_never_reads_a_whole_mlp_matrix(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What bounds the memory: every read of an MLP tensor is at most one block of its rows."""
    model = _model(root, "tiny-llama", raw=True)
    raw = model.weights
    reads: list[tuple[str, int]] = []
    raw.on_read = lambda file, tensor, offset, n: reads.append((tensor, n))
    budget = _tiny_blocks(monkeypatch)
    transformer.run(raw, TOKENS)
    mlp_reads = [(t, n) for t, n in reads if ".mlp." in t]
    assert {t.rsplit(".", 2)[-2] for t, _ in mlp_reads} == {"gate_proj", "up_proj", "down_proj"}
    # bf16 rows: half the float32 block
    assert max(n for _, n in mlp_reads) <= budget // 2
    d, d_mlp = SHAPES["tiny-llama"].d_model, SHAPES["tiny-llama"].d_mlp
    assert sum(n for _, n in mlp_reads) == 2 * 3 * d * d_mlp * SHAPES["tiny-llama"].n_layers


def test_processed_columns_read_alone_and_from_a_kept_raw_array(root: Path) -> None:
    """The blocks read alone (the gain folded into the reader's own memory, in place) equal the
    processed whole's columns; a block cut from a raw array the reader keeps is copied before
    the gain is folded, so the kept array is unchanged."""
    want = _model(root, "tiny-llama").weights
    alone = _model(root, "tiny-llama").weights
    kept = _model(root, "tiny-llama").weights
    for leaf in ("W_gate", "W_in"):
        name = f"blocks.1.mlp.{leaf}"
        whole = want.get(name)
        raw_whole = kept.raw.get(name)  # kept by the raw reader: get_columns cuts from it
        before = raw_whole.copy()
        for j, k in blocked_mlp.column_blocks(whole.shape[0], whole.shape[1], 4 * whole.shape[0] * COLUMNS):
            np.testing.assert_allclose(alone.get_columns(name, j, k), whole[:, j:k], rtol=4 * EPS, atol=1e-9)
            np.testing.assert_allclose(kept.get_columns(name, j, k), whole[:, j:k], rtol=4 * EPS, atol=1e-9)
        np.testing.assert_array_equal(kept.raw.get(name), before)
