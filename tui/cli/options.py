"""The pieces every command's parser is built from: its subparser (help that starts with what
the command does), and the options several commands share (the model path, ``--raw``,
``--json``, ``--no-cache``, ``--quiet``)."""

from __future__ import annotations

import argparse
from typing import Any


def command_parser(sub: Any, name: str, help: str, examples: str | list[str],
                   description: str | None = None) -> argparse.ArgumentParser:
    """``name``'s subparser: ``headscope NAME --help`` opens with what it does (``help``) and
    ends with its examples (``description``, when given, is the longer text of ``--help``;
    ``help`` is the line in the command list). ``sub`` makes plain ArgumentParsers (main.py):
    the top-level parser's class would replace the description with the general text."""
    lines = [examples] if isinstance(examples, str) else examples
    label = "example" if len(lines) == 1 else "examples"
    return sub.add_parser(
        name, help=help, description=description or help,
        epilog=f"{label}:\n" + "\n".join(f"  {line}" for line in lines),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def model_arg(p: argparse.ArgumentParser, optional: bool = False) -> None:
    if optional:
        p.add_argument("path", nargs="?", help="model directory, .safetensors or .gguf file "
                       "(default: the bundled attn-only-2l)")
    else:
        p.add_argument("path", help="model directory, .safetensors or .gguf file")


def raw_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--raw", action="store_true",
                   help="use the weights as stored (no LayerNorm folding or centring)")


def json_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def store_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-cache", action="store_true",
                   help="neither read nor write the results store (recompute everything)")


def quiet_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", "-q", action="store_true",
                   help="no progress bar on stderr (there is none when stderr is not a terminal)")
