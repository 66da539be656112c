"""The ``headscope`` command line.

``headscope [PATH]`` opens the explorer (no PATH: the bundled ``attn-only-2l``); the
subcommands print what the explorer shows, as tables in a terminal, TSV when piped, or JSON
with ``--json``. Every error is one line on stderr naming the file and the problem.

This module is the top-level parser and ``main`` (errors → exit codes); each command is a
module of tui/cli/commands/ that registers its own parser and handler (``register(sub)``,
``run(args)``); what they share (exit codes, printing, token lists, options) is in
output.py and options.py.

Exit codes: 0 success · 1 the model or request is at fault (the message says how) ·
2 command-line usage error · 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from headscope.engine.core.errors import HeadscopeError, out_of_memory
from headscope.engine.core.memory import keep_freed_memory
from headscope.tui.base.datatext import printable
from headscope.tui.cli.output import (
    COMMANDS,
    EXIT_INTERRUPTED,
    EXIT_MODEL_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    PathUsageError,
    UsageError,
    command_warnings,
    say,
)

# Every command's module of tui/cli/commands/, in the order of ``headscope --help``: each
# registers its parser and its handler (tui/cli/commands/__init__.py). Imported when its
# command runs (or for ``--help``, which lists them all): a command pays for its own imports
# only (``info`` no longer imports the sweeps' progress bars, numpy and the request registry).
COMMAND_MODULES = ("open", "info", "heads", "composition", "forward", "circuit", "diff", "export",
                   "serve", "timeline", "cache", "svd", "path", "patch", "path_patch", "edges",
                   "faithfulness", "qk_attribution")


def command_module(name: str) -> ModuleType:
    """The module of COMMAND_MODULES named ``name`` (imported on first use)."""
    return importlib.import_module(f"headscope.tui.cli.commands.{name}")


EPILOG = """\
examples:
  headscope                                   explore the bundled attn-only-2l model
  headscope --head 1.2                        ...opened on its induction head
  headscope path/to/hf-model --raw            explore a checkpoint without weight processing
  headscope info path/to/model --json         architecture and shapes (reads no tensor data)
  headscope heads sample_models/attn-only-2l --sort induction_score
  headscope heads sample_models/attn-only-2l --sort ablation_effect   (zero-ablates each head)
  headscope composition sample_models/attn-only-2l --kind k --top 5
  headscope circuit sample_models/attn-only-2l 1 2 --kind ov --rows Mary,John --cols Mary,John
  headscope forward sample_models/attn-only-2l --prompt "When Mary and John" --json
  headscope cache ls                          stored sweep results (scores, composition, ablation)
  headscope svd sample_models/attn-only-2l 1 2 --kind ov --k 5 --top 10
  headscope path sample_models/attn-only-2l L0.H1 L1.H2   (the induction mechanism's K-path)
  headscope patch sample_models/attn-only-2l --heads L1.H1,L1.H2   (activation patching, induction task)
  headscope path-patch sample_models/attn-only-2l L0.H1 L1.H2 --patch k --task first-occurrence
                                              (the edge's causal effect)
  headscope qk-attribution sample_models/attn-only-2l L1.H2 --prompt "..." --query 7 --key 3
                                              (why the head attends there: sources of the score)
  headscope edges sample_models/attn-only-2l --task first-occurrence --top 10 --verify 3
                                              (find the circuit: every edge's attribution)
  headscope faithfulness sample_models/attn-only-2l --task first-occurrence --top 5,20 --curve

exit codes: 0 ok, 1 bad model file or request (one line on stderr), 2 usage, 130 interrupted
"""


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("headscope")
    except PackageNotFoundError:  # running from a source tree without install
        return "0+unknown"


# ----------------------------------------------------------------------------- parser


DESCRIPTION = "Explore the attention circuits of transformer language models."


def supported_text() -> str:
    """What ``--help`` says opens, from the engine's family table (the README's table)."""
    from headscope.engine.api.model import supported_checkpoints

    supported = supported_checkpoints()
    return (f"{DESCRIPTION}\n\nCheckpoints: safetensors (a file, a directory or sharded) of the "
            f"families {', '.join(supported['families'])}; llama.cpp GGUF files of the "
            f"{', '.join(supported['gguf'])} architectures. Never pickle, never downloaded.")


class HelpParser(argparse.ArgumentParser):
    """The top-level parser: its description lists the supported families, read from the
    engine only when help is printed (the adapters' import is not paid by every command)."""

    def format_help(self) -> str:
        import shutil
        import textwrap

        # argparse's own width (COLUMNS or the terminal, less 2); it does not wrap a raw text
        width = max(40, min(100, shutil.get_terminal_size().columns - 2))
        self.description = "\n".join(textwrap.fill(p, width) if p else p
                                      for p in supported_text().split("\n"))
        return super().format_help()


class VersionAction(argparse.Action):
    """``--version``, as argparse's own ``action="version"`` prints it, with the version read
    from the installed metadata only when asked (``importlib.metadata``: ~20 ms a command)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str = "show program's version number and exit") -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        parser._print_message(f"headscope {version()}\n", sys.stdout)
        parser.exit()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of ``command`` alone (a name of COMMANDS: what ``main``
    parses when the command line names one, so only that command's module is imported)."""
    parser = HelpParser(
        prog="headscope",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=VersionAction)
    # Plain parsers: HelpParser's general text and family list are the top level's alone
    # (`patch --help` opened with them instead of what patch does).
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=argparse.ArgumentParser)
    for name in COMMAND_MODULES if command is None else (command.replace("-", "_"),):
        command_module(name).register(sub)
    return parser


def chosen_command(argv: Sequence[str]) -> str | None:
    """The command a normalised command line names (None: none, e.g. ``--help`` alone)."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return first if first in COMMANDS else None


def normalise_argv(argv: Sequence[str]) -> list[str]:
    """``headscope PATH ...`` and bare ``headscope`` mean ``headscope open ...``."""
    argv = list(argv)
    first = next((a for a in argv if not a.startswith("-")), None)
    if any(a in ("-h", "--help", "--version") for a in argv) and (first is None or first not in COMMANDS):
        return argv if first is None else ["open", *argv]
    if first is None or first not in COMMANDS:
        return ["open", *argv]
    return argv


def unknown_command(argv: Sequence[str]) -> str | None:
    """``headscope head …`` where ``head`` is no file: the closest subcommand, if any."""
    first = argv[0] if argv and not argv[0].startswith("-") else None  # not an option's value
    if first is None or first in COMMANDS or Path(first).exists():
        return None
    import difflib

    close = difflib.get_close_matches(first, COMMANDS, n=1, cutoff=0.6)
    return f"unknown command {first!r}; did you mean {close[0]!r}?" if close else None


# ----------------------------------------------------------------------------- main


def exit_now(code: int) -> None:
    """Quit feels instant: after the explorer closed (terminal restored, engines told to
    stop, their threads daemons), skip the interpreter's teardown of torch & co. (~0.6 s of
    a blank terminal)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    from_shell = argv is None  # the console script (not a test, not the Python API)
    if from_shell:  # before any thread starts (engine/core/memory.py)
        keep_freed_memory()
    argv = list(sys.argv[1:] if argv is None else argv)
    typo = unknown_command(argv)
    if typo:
        say(typo)
        return EXIT_USAGE
    argv = normalise_argv(argv)
    args = build_parser(chosen_command(argv)).parse_args(argv)
    try:
        code = args.handler(args)
        for warning in command_warnings(args):
            say(warning, warning=True)
        if getattr(args, "exit_now", False) and from_shell:
            exit_now(code)
        return code
    except UsageError as err:
        print(f"headscope {args.command}: error: {printable(str(err))}", file=sys.stderr)
        return EXIT_USAGE
    except PathUsageError as err:
        say(str(err))
        return EXIT_USAGE
    except HeadscopeError as err:
        say(err.one_line())
        return EXIT_MODEL_ERROR
    except (MemoryError, RuntimeError) as err:  # torch's allocator raises RuntimeError
        oom = out_of_memory(err, getattr(args, "path", None), f"headscope {args.command}")
        if oom is None:
            raise
        say(oom.one_line())
        return EXIT_MODEL_ERROR
    except KeyboardInterrupt:
        say("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `headscope heads ... | head`
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
