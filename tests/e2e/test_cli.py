"""The headscope CLI: every command's output checked against the engine's own functions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from headscope.engine.model.loading import load_model
from headscope.tui.cli.main import main

REPO = Path(__file__).resolve().parents[2]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> object:
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


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


def test_tables_are_tsv_when_piped(gpt2_dir) -> None:
    path, _ = gpt2_dir
    out = subprocess.run([sys.executable, "-m", "headscope.tui.cli.main", "heads", str(path), "--sort", "copying_score"],
                         capture_output=True, text=True, cwd=REPO, check=True).stdout
    lines = out.splitlines()
    assert lines[0].split("\t")[:3] == ["layer", "head", "copying_score"]
    assert all(len(line.split("\t")) == len(lines[0].split("\t")) for line in lines[1:])
