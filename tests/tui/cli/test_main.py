"""One CLI registration style (issue 36): every command is a module of tui/cli/commands/ with
``register(sub)`` (its parser, ``handler=run``) and ``run(args) -> int``; and what a new user
trips on there (issue 39 §3): each command's help opens with what it does, and a path that is
not a checkpoint is one line, exit 2, with the nearest checkpoint folder, before any screen."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

from headscope.tui.cli import commands
from headscope.tui.cli.main import COMMAND_MODULES, DESCRIPTION, build_parser, main
from headscope.tui.cli.output import COMMANDS

REPO = Path(__file__).resolve().parents[3]


def subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if a.dest == "command")
    return dict(action.choices)  # type: ignore[arg-type]


def test_every_command_module_registers_its_parser_and_its_run() -> None:
    found = {m.name for m in pkgutil.iter_modules(commands.__path__)}
    assert found == {m.__name__.rsplit(".", 1)[1] for m in COMMAND_MODULES}
    assert list(subparsers()) == list(COMMANDS)  # the list normalise_argv reads
    for name, parser in subparsers().items():
        module = importlib.import_module(f"headscope.tui.cli.commands.{name.replace('-', '_')}")
        assert callable(module.register) and parser.get_default("handler") is module.run, name


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


def test_serve_port_has_help_and_its_default(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--port PORT TCP port to listen on (default 8000)" in out


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "headscope.tui.cli.main", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


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


def test_serve_is_installed_with_the_app() -> None:
    """`make run` installs the main dependencies: serve must not need an extra."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert any(d.startswith("textual-serve") for d in project["dependencies"])
    assert "serve" not in project.get("optional-dependencies", {})
