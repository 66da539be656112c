"""A path that names no checkpoint (tui/cli/paths.py): one line, exit 2, the nearest checkpoint folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.tui.cli.test_main import run_cli


@pytest.mark.parametrize("given, problem", [
    ("sample_models", "sample_models: no safetensors weights in this directory"),
    ("README.md", "README.md: not a checkpoint"),
])
def test_a_path_that_is_not_a_checkpoint_is_one_line_exit_2(given: str, problem: str) -> None:
    """Before: a full-screen explorer with no model (`?L×?H d?`, the error three times)."""
    out = run_cli(given)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith(f"headscope: {problem}")
    assert "sample_models/attn-only-2l" in lines[0]  # the nearest checkpoint folders
    assert "\x1b[" not in out.stdout  # no screen was drawn


def test_a_local_typo_is_not_called_a_hub_name() -> None:
    for argv in (["sample_models/attn-only-2"], ["serve", "sample_models/attn-only-2"]):
        out = run_cli(*argv)
        assert out.returncode == 2, argv
        assert out.stderr == ("headscope: sample_models/attn-only-2: no such file or directory; "
                              "did you mean 'sample_models/attn-only-2l'?\n")
    info = run_cli("info", "sample_models/attn-only-2")  # the engine's message, every command
    assert info.returncode == 1 and "Hub name" not in info.stderr
    assert "no such file or directory" in info.stderr


def test_a_hub_name_is_still_named_so(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "headscope.tui.cli.main", "info", "EleutherAI/pythia-70m"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "Hub name" in out.stderr
