"""`headscope circuit`: a block of a head's circuit equals the dense product; rotary models at an offset."""

from __future__ import annotations

import torch

from headscope.engine.circuits import head_circuits as circuits
from headscope.engine.model.loading import load_model
from tests.e2e.test_cli import run_cli, run_json


def test_circuit_block_equals_the_dense_product(capsys, gpt2_dir) -> None:
    path, _ = gpt2_dir
    report = run_json(capsys, "circuit", str(path), "1", "2", "--kind", "qk", "--rows", "0:5,7", "--cols", "3,4")
    w = load_model(path).weights
    e = w.get("embed.W_E")
    dense = e @ w.get_head("blocks.1.attn.W_Q", 2) @ w.get_head("blocks.1.attn.W_K", 2).T @ e.T
    assert report["rows"] == [0, 1, 2, 3, 4, 7] and report["cols"] == [3, 4]
    assert torch.allclose(torch.tensor(report["values"]), torch.from_numpy(dense[[0, 1, 2, 3, 4, 7]][:, [3, 4]]), atol=1e-4)
    ov = run_json(capsys, "circuit", str(path), "0", "1", "--kind", "ov", "--rows", "2,5", "--cols", "2,5")
    full = torch.from_numpy(circuits.full_ov(w, 0, 1).block([2, 5], [2, 5]))
    assert torch.allclose(torch.tensor(ov["values"]), full, atol=1e-5)


def test_rotary_models_show_token_qk_at_an_offset(capsys, llama_dir) -> None:
    path, _ = llama_dir
    report = run_json(capsys, "circuit", str(path), "1", "3", "--kind", "qk", "--offset", "3",
                      "--rows", "0:4", "--cols", "5,6")
    w = load_model(path).weights
    e = w.get("embed.W_E")
    dense = e[:4] @ circuits.rotary_qk(w, 1, 3, 3).AB @ e[[5, 6]].T
    assert report["offset"] == 3
    assert torch.allclose(torch.tensor(report["values"]), torch.from_numpy(dense), atol=1e-4)
    code, _, err = run_cli(capsys, "circuit", str(path), "0", "0", "--kind", "qk", "--basis", "position")
    assert code == 1 and "rotary" in err
