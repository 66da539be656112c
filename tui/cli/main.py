"""The ``headscope`` command line.

``headscope [PATH]`` opens the explorer (no PATH: the bundled ``attn-only-2l``); the
subcommands print what the explorer shows, as tables in a terminal, TSV when piped, or JSON
with ``--json``. Every error is one line on stderr naming the file and the problem.

This module is the argument parser and ``main`` (errors → exit codes); the commands live in
explore.py (open, serve), reports.py (info, heads, composition, forward, circuit, diff,
export), reading.py (svd, path), timeline.py and cache.py; what they share (exit codes,
printing, token lists) in output.py.

Exit codes: 0 success · 1 the model or request is at fault (the message says how) ·
2 command-line usage error · 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from headscope.engine.core.errors import HeadscopeError, out_of_memory
from headscope.engine.core.validation import EDGE_THRESHOLD
from headscope.tui.base.datatext import printable
from headscope.tui.cli import args as args_types
from headscope.tui.cli import explore, reports
from headscope.tui.cli import patch as cli_patch
from headscope.tui.cli import reading as cli_reading
from headscope.tui.cli import timeline as cli_timeline
from headscope.tui.cli.cache import add_cache_parser, add_quiet_arg, add_store_args, cmd_cache
from headscope.tui.cli.cluster import add_cluster_args
from headscope.tui.cli.output import (
    COMMANDS,
    EXIT_INTERRUPTED,
    EXIT_MODEL_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    say,
)

THEME_HELP = ("headscope-dark", "headscope-light", "headscope-contrast", "headscope-colorblind")

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


def build_parser() -> argparse.ArgumentParser:
    parser = HelpParser(
        prog="headscope",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"headscope {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, help: str, example: str) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            help=help,
            description=help,
            epilog=f"example:\n  {example}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        return p

    def model_arg(p: argparse.ArgumentParser, optional: bool = False) -> None:
        if optional:
            p.add_argument("path", nargs="?", help="model directory, .safetensors or .gguf file "
                           "(default: the bundled attn-only-2l)")
        else:
            p.add_argument("path", help="model directory, .safetensors or .gguf file")

    def processing_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--raw", action="store_true",
                       help="use the weights as stored (no LayerNorm folding or centring)")

    def json_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")

    p = command("open", "open the terminal explorer (the default command)", "headscope open path/to/model")
    model_arg(p, optional=True)
    processing_args(p)
    p.add_argument("--theme", type=theme_arg,
                   help="colour theme: " + ", ".join(THEME_HELP) + " (or dark, light, "
                        "contrast, colorblind)")
    p.add_argument("--colors", choices=("truecolor", "256", "16", "none"), default=None,
                   help="heatmap colours (default: detected from the terminal; 256 uses a "
                        "lightness-ordered palette ramp, 16 and none draw shades ░▒▓█)")
    p.add_argument("--compare", metavar="B", default=None,
                   help="a second checkpoint of the same architecture, explored alongside "
                        "(Changes tab, Δ badges, A|B heatmaps)")
    p.add_argument("--head", metavar="L.H", type=layer_head, default=None,
                   help="open focused on this head, e.g. --head 1.2 (default: L0.H0)")
    p.add_argument("--match-heads", action="store_true",
                   help="with --compare: pair B's heads with A's by circuit similarity "
                        "(Hungarian, per layer), for checkpoints from independent runs")
    p.add_argument("--timeline", metavar="PATH", nargs="+", default=None,
                   help="a directory of training checkpoints (step-*/checkpoint-* "
                        "subdirectories) or several checkpoints in order: open the last step "
                        "with a Timeline tab, { } scrub")

    p = command("info", "architecture, shapes and dtype, from the header alone", "headscope info path/to/model --json")
    model_arg(p)
    json_arg(p)

    p = command("heads", "every head with its copying, QK-positivity, previous-token, "
                "duplicate-token and induction scores", "headscope heads path --sort induction_score")
    model_arg(p)
    json_arg(p)
    processing_args(p)
    p.add_argument("--sort", metavar="KEY", help="sort descending by a score column, e.g. induction_score")
    p.add_argument("--seed", type=args_types.seed, default=0, help="seed of the random token sequences (default 0)")
    p.add_argument("--ablation", action="store_true",
                   help="add ablation_effect: the loss increase on the repeated half of the random "
                        "sequences when the head is zero-ablated (a forward pass per head; implied "
                        "by --sort ablation_effect)")
    p.add_argument("--no-behaviour", action="store_true",
                   help="only the weight-based scores (copying_score, qk_positivity): no forward "
                        "pass, and no wait for torch")
    add_store_args(p)
    add_cluster_args(p)
    add_quiet_arg(p)

    p = command("composition", "Q-, K- or V-composition scores between heads of different layers",
                "headscope composition path --kind k --top 5")
    model_arg(p)
    json_arg(p)
    processing_args(p)
    p.add_argument("--kind", choices=("q", "k", "v"), required=True)
    p.add_argument("--top", type=args_types.count, default=10, help="how many top edges to list (default 10)")
    p.add_argument("--seed", type=args_types.seed, default=0, help="seed of the random baseline (default 0)")
    add_store_args(p)
    add_cluster_args(p)
    add_quiet_arg(p)

    p = command("forward", "logits and attention patterns for a token sequence",
                "headscope forward path --tokens 3,14,15,92 --json")
    model_arg(p)
    json_arg(p)
    processing_args(p)
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--tokens", type=args_types.token_ids, help="comma-separated token ids, e.g. 3,14,15,92")
    group.add_argument("--prompt", help="text, encoded with the model's tokenizer")
    add_quiet_arg(p)

    p = command("circuit", "a block of a head's QK or OV circuit",
                "headscope circuit path 1 4 --kind qk --basis position --rows 0:16 --cols 0:16")
    model_arg(p)
    p.add_argument("layer", type=args_types.index)
    p.add_argument("head", type=args_types.index)
    json_arg(p)
    processing_args(p)
    p.add_argument("--kind", choices=("qk", "ov"), required=True)
    p.add_argument("--basis", choices=("token", "position"), default="token")
    p.add_argument("--rows", type=args_types.token_spec,
                   help="ids (3,14), ranges (0:20) or tokens (Mary,John); default the first 24")
    p.add_argument("--cols", type=args_types.token_spec, help="as --rows")
    p.add_argument("--offset", type=args_types.offset, default=0, help="rotary models: query-key offset Δ")
    add_quiet_arg(p)

    p = command("diff", "compare the circuits of two checkpoints with the same head layout "
                "(after pruning, distillation or more training)",
                "headscope diff original/ pruned/ --json")
    p.add_argument("path", help="checkpoint A (the reference)")
    p.add_argument("other", help="checkpoint B")
    json_arg(p)
    processing_args(p)
    p.add_argument("--match-heads", action="store_true",
                   help="match B's heads to A's within each layer by circuit similarity "
                        "(Hungarian assignment), for checkpoints from independent runs")
    p.add_argument("--threshold", type=args_types.finite_float, default=EDGE_THRESHOLD,
                   help="composition edges count when this far above their baseline "
                        f"(default {EDGE_THRESHOLD})")
    p.add_argument("--seed", type=args_types.seed, default=0)
    p.add_argument("--no-behaviour", action="store_true",
                   help="compare only the weights: circuit similarities, subspaces, copying and "
                        "QK-positivity deltas, composition edges (no forward pass, no wait for torch)")
    add_store_args(p)
    add_cluster_args(p)
    add_quiet_arg(p)

    p = command("export", "write heads, composition or circuit data to JSON or CSV, atomically",
                "headscope export path --what composition --kind k --format csv --out results/")
    model_arg(p)
    processing_args(p)
    p.add_argument("--what", choices=("heads", "composition", "circuit"), required=True)
    p.add_argument("--format", choices=("json", "csv"), default="json")
    p.add_argument("--out", default=".", type=args_types.output_dir, help="directory to write into (default: the current "
                   "directory; never the checkpoint's unless you name it)")
    p.add_argument("--kind", choices=("q", "k", "v", "qk", "ov"),
                   help="composition: q|k|v; circuit: qk|ov")
    p.add_argument("--layer", type=args_types.index, help="circuit: layer")
    p.add_argument("--head", type=args_types.index, help="circuit: head")
    p.add_argument("--basis", choices=("token", "position"), default="token")
    p.add_argument("--rows", type=args_types.token_spec, help="circuit rows, as for `headscope circuit`")
    p.add_argument("--cols", type=args_types.token_spec, help="circuit columns")
    p.add_argument("--seed", type=args_types.seed, default=0)
    p.add_argument("--ablation", action="store_true",
                   help="heads: add the zero-ablation effect column (a forward pass per head)")
    add_store_args(p)
    add_quiet_arg(p)

    p = command("serve", "serve the explorer to a web browser (textual-serve), on 127.0.0.1 by default",
                "headscope serve path --port 8000")
    model_arg(p, optional=True)
    processing_args(p)
    p.add_argument("--port", type=args_types.port, default=8000)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; others need --allow-remote)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow binding to a non-loopback address (needs --token or "
                        "HEADSCOPE_TOKEN): anyone who can reach it and has the token can use "
                        "the explorer")
    p.add_argument("--token", help="the key every request needs, in the printed URL "
                   "(default: $HEADSCOPE_TOKEN, else a random one per start)")
    p.add_argument("--max-sessions", type=args_types.sessions, default=4, metavar="N",
                   help="explorer sessions (browser tabs, ~250 MB each) at once (default 4)")
    cli_timeline.add_parser(sub)
    add_cache_parser(sub)
    cli_reading.add_parsers(sub)
    cli_patch.add_parsers(sub)
    return parser


def normalise_argv(argv: Sequence[str]) -> list[str]:
    """``headscope PATH ...`` and bare ``headscope`` mean ``headscope open ...``."""
    argv = list(argv)
    first = next((a for a in argv if not a.startswith("-")), None)
    if any(a in ("-h", "--help", "--version") for a in argv) and (first is None or first not in COMMANDS):
        return argv if first is None else ["open", *argv]
    if first is None or first not in COMMANDS:
        return ["open", *argv]
    return argv


def theme_arg(text: str) -> str:
    """``--theme``: a theme name or alias (argparse type: an unknown one is a usage error)."""
    from headscope.themes import ALIASES, THEME_NAMES

    name = ALIASES.get(text, text)
    if name not in THEME_NAMES:
        raise argparse.ArgumentTypeError(
            f"unknown theme {text!r}; themes: {', '.join(THEME_NAMES)}")
    return name


def unknown_command(argv: Sequence[str]) -> str | None:
    """``headscope head …`` where ``head`` is no file: the closest subcommand, if any."""
    import difflib

    first = argv[0] if argv and not argv[0].startswith("-") else None  # not an option's value
    if first is None or first in COMMANDS or Path(first).exists():
        return None
    close = difflib.get_close_matches(first, COMMANDS, n=1, cutoff=0.6)
    return f"unknown command {first!r}; did you mean {close[0]!r}?" if close else None


def layer_head(text: str) -> tuple[int, int]:
    """``"1.2"`` → ``(1, 2)`` (argparse type: a malformed value is a usage error)."""
    try:
        layer, head = (int(part) for part in text.split("."))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not LAYER.HEAD, e.g. 1.2") from None
    if layer < 0 or head < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: layer and head count from 0")
    return layer, head


# ----------------------------------------------------------------------------- commands


HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "export": reports.cmd_export,
    "serve": explore.cmd_serve,
    "diff": reports.cmd_diff,
    "open": explore.cmd_open,
    "info": reports.cmd_info,
    "heads": reports.cmd_heads,
    "composition": reports.cmd_composition,
    "forward": reports.cmd_forward,
    "circuit": reports.cmd_circuit,
    "timeline": cli_timeline.run,
    "cache": cmd_cache,
    "svd": cli_reading.run_svd,
    "path": cli_reading.run_path,
    "patch": cli_patch.cmd_patch,
    "path-patch": cli_patch.cmd_path_patch,
}


def exit_now(code: int) -> None:
    """Quit feels instant: after the explorer closed (terminal restored, engines told to
    stop, their threads daemons), skip the interpreter's teardown of torch & co. (~0.6 s of
    a blank terminal)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    from_shell = argv is None  # the console script (not a test, not the Python API)
    argv = list(sys.argv[1:] if argv is None else argv)
    typo = unknown_command(argv)
    if typo:
        say(typo)
        return EXIT_USAGE
    args = parser.parse_args(normalise_argv(argv))
    try:
        code = HANDLERS[args.command](args)
        for warning in getattr(args, "warnings", []):
            say(warning, warning=True)
        if getattr(args, "exit_now", False) and from_shell:
            exit_now(code)
        return code
    except UsageError as err:
        print(f"headscope {args.command}: error: {printable(str(err))}", file=sys.stderr)
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
