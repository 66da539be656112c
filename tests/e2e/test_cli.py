"""The headscope CLI: every command's output checked against the engine's own functions."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from headscope.engine.circuits import head_circuits as circuits
from headscope.engine.forward import behaviour
from headscope.engine.forward import transformer as forward
from headscope.engine.model.loading import load_model
from headscope.tui.cli.main import main
from tests import weight_algebra as algebra

REPO = Path(__file__).resolve().parents[2]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> object:
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_info_reports_the_structure(capsys, gpt2_dir) -> None:
    path, hf = gpt2_dir
    info = run_json(capsys, "info", str(path))
    assert (info["family"], info["n_layers"], info["n_heads"], info["d_model"], info["d_vocab"]) == (
        "gpt2", hf.config.n_layer, hf.config.n_head, hf.config.n_embd, hf.config.vocab_size)
    assert info["n_params"] == sum(p.numel() for p in hf.parameters())
    assert info["positional"] == "learned"
    assert info["tied_unembed"] is True  # GPT-2 stores no lm_head: W_U is W_Eᵀ


def test_heads_equal_the_score_functions(capsys, gpt2_dir) -> None:
    path, _ = gpt2_dir
    rows = run_json(capsys, "heads", str(path))
    w = load_model(path).weights
    copying = algebra.all_copying_scores(w)
    behaviours = behaviour.behaviour_scores(w, seed=0)
    assert len(rows) == w.cfg.n_layers * w.cfg.n_heads
    for r in rows:
        layer, head = r["layer"], r["head"]
        assert r["copying_score"] == pytest.approx(float(copying[layer, head]), abs=1e-6)
        assert r["induction_score"] == pytest.approx(float(behaviours["induction"][layer, head]), abs=1e-6)
        assert -1 <= r["copying_score"] <= 1


def test_heads_sort_and_unknown_key(capsys, gpt2_dir) -> None:
    path, _ = gpt2_dir
    rows = run_json(capsys, "heads", str(path), "--sort", "prev_token_score")
    values = [r["prev_token_score"] for r in rows]
    assert values == sorted(values, reverse=True)
    code, _, err = run_cli(capsys, "heads", str(path), "--sort", "nonsense")
    assert code == 2 and "unknown sort key" in err and err.count("\n") == 1


def test_heads_ablation_column_equals_single_head_forward_passes(capsys, gpt2_dir) -> None:
    path, _ = gpt2_dir
    plain_rows = run_json(capsys, "heads", str(path))
    assert "ablation_effect" not in plain_rows[0], "a forward pass per head is opt-in"
    rows = run_json(capsys, "heads", str(path), "--sort", "ablation_effect")  # implies --ablation
    values = [r["ablation_effect"] for r in rows]
    assert values == sorted(values, reverse=True)
    # Each value is the loss of a full forward pass with that one head zeroed, minus the
    # clean loss, on the second copy of the seed-0 repeated tokens.
    w = load_model(path).weights
    tokens = behaviour.repeated_tokens(w.cfg.d_vocab, w.cfg.n_ctx, seed=0)
    half = tokens.shape[1] // 2

    def loss(ablate: list[tuple[int, int]]) -> float:
        logits = forward.run(w, tokens, ablate=ablate).logits[:, half:-1]
        return float(torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), tokens[:, half + 1 :].reshape(-1)))

    clean = loss([])
    for r in rows[:2] + rows[-1:]:
        assert r["ablation_effect"] == pytest.approx(loss([(r["layer"], r["head"])]) - clean, abs=1e-4)
    code, out, _ = run_cli(capsys, "heads", str(path), "--ablation")
    assert code == 0 and "ablation_effect" in out.splitlines()[0]


def test_composition_json_shape_and_top_edges(capsys, gpt2_dir) -> None:
    path, _ = gpt2_dir
    report = run_json(capsys, "composition", str(path), "--kind", "k", "--top", "3")
    w = load_model(path).weights
    expected = algebra.composition_scores(w, "k", seed=0)
    s = torch.tensor(report["scores"])
    L, H = w.cfg.n_layers, w.cfg.n_heads
    assert s.shape == (L, H, L, H)
    assert torch.allclose(s, expected.scores.float(), atol=1e-6)
    assert report["baseline"] == pytest.approx(float(expected.baseline))
    for l1 in range(L):  # zero where the source layer is not earlier
        assert torch.all(s[l1, :, : l1 + 1] == 0)
    tops = report["top_edges"]
    assert len(tops) == 3
    assert [e["above_baseline"] for e in tops] == sorted((e["above_baseline"] for e in tops), reverse=True)
    best = max(float(s[a, b, c, d]) for a in range(L) for b in range(H) for c in range(a + 1, L) for d in range(H))
    assert tops[0]["score"] == pytest.approx(best)


def test_forward_matches_the_engine(capsys, gpt2_dir) -> None:
    path, _ = gpt2_dir
    report = run_json(capsys, "forward", str(path), "--tokens", "3,14,15,92")
    ref = forward.run(load_model(path).weights, [3, 14, 15, 92])
    assert torch.allclose(torch.tensor(report["logits"]), ref.logits[0], atol=1e-5)
    assert torch.tensor(report["patterns"]).shape == ref.patterns[0].shape


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


def test_position_basis(capsys, gpt2_dir) -> None:
    path, _ = gpt2_dir
    report = run_json(capsys, "circuit", str(path), "0", "0", "--kind", "qk", "--basis", "position",
                      "--rows", "0:4", "--cols", "0:4")
    w = load_model(path).weights
    p = w.get("pos_embed.W_pos")[:4]
    dense = p @ w.get_head("blocks.0.attn.W_Q", 0) @ w.get_head("blocks.0.attn.W_K", 0).T @ p.T
    assert torch.allclose(torch.tensor(report["values"]), torch.from_numpy(dense), atol=1e-4)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["info", "/nonexistent/model"], "/nonexistent/model"),
        (["circuit", "{path}", "9", "0", "--kind", "qk"], "layer 9 out of range"),
        (["circuit", "{path}", "0", "0", "--kind", "ov", "--basis", "position"], "position basis"),
        (["forward", "{path}", "--tokens", "1,100000"], "out of range"),
        (["forward", "{path}", "--prompt", "   "], "empty prompt"),
        # ranges are checked as ids are, never cut to the vocabulary (nor emptied by it)
        (["circuit", "sample_models/attn-only-2l", "1", "2", "--kind", "ov", "--rows", "5000:6000"],
         "token range 5000:6000 out of range 0..413"),
        (["circuit", "sample_models/attn-only-2l", "1", "2", "--kind", "ov", "--rows", "0:99999"],
         "token range 0:99999 out of range 0..413"),
        (["circuit", "sample_models/attn-only-2l", "1", "2", "--kind", "ov", "--cols", "3,99999"],
         "token 99999 out of range 0..413"),
        (["circuit", "sample_models/attn-only-2l", "1", "2", "--kind", "qk", "--basis", "position",
          "--rows", "0:9999"], "position range 0:9999 out of range"),
    ],
)
def test_errors_are_one_line_with_exit_code_1(capsys, gpt2_dir, argv, fragment) -> None:
    path, _ = gpt2_dir
    code, out, err = run_cli(capsys, *(a.format(path=path) for a in argv))
    assert code == 1 and out == ""
    assert fragment in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_range_up_to_the_vocabulary_is_whole(capsys) -> None:
    report = run_json(capsys, "circuit", "sample_models/attn-only-2l", "1", "2", "--kind", "ov",
                      "--rows", "410:414", "--cols", "0:2")
    assert report["rows"] == [410, 411, 412, 413]


def test_pickle_checkpoint_is_refused(capsys, tmp_path) -> None:
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    code, _, err = run_cli(capsys, "info", str(tmp_path))
    assert code == 1 and "safetensors" in err


def test_usage_errors_exit_2(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["composition", "x", "--kind", "z"])
    assert info.value.code == 2


def test_help_and_version() -> None:
    env = {**os.environ, "COLUMNS": "100"}
    out = subprocess.run([sys.executable, "-m", "headscope.tui.cli.main", "--help"], capture_output=True, text=True,
                         cwd=REPO, env=env, check=True).stdout
    for command in ("info", "heads", "composition", "forward", "circuit", "diff", "export", "serve"):
        assert command in out
    assert "exit codes" in out
    sub = subprocess.run([sys.executable, "-m", "headscope.tui.cli.main", "circuit", "--help"], capture_output=True,
                         text=True, cwd=REPO, env=env, check=True).stdout
    assert "--basis" in sub and "example" in sub
    version = subprocess.run([sys.executable, "-m", "headscope.tui.cli.main", "--version"], capture_output=True,
                             text=True, cwd=REPO, check=True).stdout
    assert version.startswith("headscope ")


def readme_families() -> list[str]:
    """The family column of README.md's "Supported checkpoints" table."""
    text = (REPO / "README.md").read_text().split("## Supported checkpoints", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    return [row.split("|")[1].strip() for row in rows[1:] if not set(row) <= set("|- ")]


def test_help_lists_the_families_of_the_readme_table(capsys) -> None:
    """`--help` used to say "safetensors checkpoints only: native, GPT-2, GPT-NeoX/Pythia,
    Llama/Mistral/Qwen2, BERT". It reads the engine's family table, and the README's table
    has exactly those rows, so neither can fall behind the adapters."""
    from headscope.engine.api.model import supported_checkpoints
    from headscope.engine.model.adapters import registry

    supported = supported_checkpoints()
    assert readme_families() == supported["families"]
    covered = [arch for _, archs in registry.FAMILY_TABLE for arch in archs]
    assert sorted(covered) == supported["architectures"]  # each adapter's, in one row each
    readme = (REPO / "README.md").read_text()
    gguf_line = readme.split("**GGUF**", 1)[1].split("architectures.", 1)[0]
    assert sorted(re.findall(r"`([a-z0-9]+)`", gguf_line)) == supported["gguf"]
    with pytest.raises(SystemExit):
        main(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for name in [*supported["families"], *supported["gguf"]]:
        assert name in shown


def test_tables_are_tsv_when_piped(gpt2_dir) -> None:
    path, _ = gpt2_dir
    out = subprocess.run([sys.executable, "-m", "headscope.tui.cli.main", "heads", str(path), "--sort", "copying_score"],
                         capture_output=True, text=True, cwd=REPO, check=True).stdout
    lines = out.splitlines()
    assert lines[0].split("\t")[:3] == ["layer", "head", "copying_score"]
    assert all(len(line.split("\t")) == len(lines[0].split("\t")) for line in lines[1:])


def test_info_does_not_import_torch(gpt2_dir) -> None:
    path, _ = gpt2_dir
    code = (
        f"import sys; from headscope.tui.cli.main import main; rc = main(['info', {str(path)!r}, '--json']);"
        "sys.stdout.flush(); assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, capture_output=True)


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
