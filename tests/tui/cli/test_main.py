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

from headscope.tui.cli import commands
from headscope.tui.cli.main import COMMAND_MODULES, build_parser
from headscope.tui.cli.output import COMMANDS

REPO = Path(__file__).resolve().parents[3]


def subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if a.dest == "command")
    return dict(action.choices)  # type: ignore[arg-type]


def test_every_command_module_registers_its_parser_and_its_run() -> None:
    found = {m.name for m in pkgutil.iter_modules(commands.__path__)}
    assert found == set(COMMAND_MODULES)
    assert list(subparsers()) == list(COMMANDS)  # the list normalise_argv reads
    for name, parser in subparsers().items():
        module = importlib.import_module(f"headscope.tui.cli.commands.{name.replace('-', '_')}")
        assert callable(module.register) and parser.get_default("handler") is module.run, name


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "headscope.tui.cli.main", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_a_command_line_builds_its_own_command_s_parser_only() -> None:
    """``main`` registers only the command the line names (its module imported when it runs;
    tests/test_engine_imports.py checks what `info` imports): the same parser the full one has."""
    full, alone = subparsers()["info"], build_parser("info")
    only = next(a for a in alone._actions if a.dest == "command").choices
    assert list(only) == ["info"] and only["info"].format_help() == full.format_help()
