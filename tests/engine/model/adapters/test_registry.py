"""The family registry (engine/model/adapters/registry.py): the CLI's --help lists the families of the README's table."""

from __future__ import annotations

import re

import pytest

from headscope.tui.cli.main import main
from tests.e2e.test_cli import REPO, readme_families


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
