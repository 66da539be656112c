"""Every command's parser (tui/cli/options.py): its help opens with what it does."""

from __future__ import annotations

import pytest

from headscope.tui.cli.main import DESCRIPTION, main
from headscope.tui.cli.output import COMMANDS
from tests.tui.cli.test_main import subparsers


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_s_help_opens_with_what_it_does(command: str, capsys) -> None:
    """`patch --help`, `path-patch --help`, `serve --help` opened with the general text and
    the family list (the top-level parser's class)."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    description = out.split("\n\n", 2)[1]  # after the usage block
    assert description.strip() and DESCRIPTION not in out and "Checkpoints:" not in out
    assert " ".join(description.split()) in " ".join(subparsers()[command].description.split())
