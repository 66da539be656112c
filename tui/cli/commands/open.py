"""``headscope [open] [PATH]``: the terminal explorer (the default command)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from headscope.engine.core.errors import InvalidRequestError
from headscope.tui.cli.options import command_parser, model_arg, raw_arg
from headscope.tui.cli.output import EXIT_OK
from headscope.tui.cli.paths import check_checkpoint

THEME_HELP = ("headscope-dark", "headscope-light", "headscope-contrast", "headscope-colorblind")


def register(sub: Any) -> None:
    p = command_parser(sub, "open", "open the terminal explorer (the default command)",
                       "headscope open path/to/model")
    model_arg(p, optional=True)
    raw_arg(p)
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
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from headscope.sample_models import bundled_model
    from headscope.tui.app import run_app

    path = Path(args.path) if args.path else bundled_model()
    if args.timeline is None:  # before any screen: not a checkpoint is one line, exit 2
        for given in (args.path, args.compare):
            if given:
                check_checkpoint(given)
    if args.match_heads and not args.compare:
        raise InvalidRequestError(None, "--match-heads needs --compare B")
    if args.compare:
        check_same_layout(path, Path(args.compare))
    options: dict[str, Any] = {"match_heads": True} if args.match_heads else {}
    if args.timeline is not None:
        from headscope.tui.screens.timeline import open_timeline

        options["timeline"] = open_timeline(args.timeline, args.path, args.compare)
    if args.head is not None:
        options["head"] = args.head
    if args.colors:
        options["colors"] = args.colors
    from headscope.tui.base.prompt_words import default_prompt

    options["prompt"] = default_prompt(path)  # the sample models: the README's repeated phrase
    run_app(path, raw=args.raw, theme=args.theme, compare=args.compare, **options)
    args.exit_now = True  # the explorer has closed: see main()
    return EXIT_OK


def check_same_layout(a: Path, b: Path) -> None:
    """Compare mode, like ``diff``: refused before any screen when the head layouts differ
    (headers only, no torch)."""
    from headscope.engine.api.model import read_structure

    sa, sb = read_structure(a), read_structure(b)
    la, lb = (sa["n_layers"], sa["n_heads"]), (sb["n_layers"], sb["n_heads"])
    if la != lb:
        raise InvalidRequestError(
            str(a), f"cannot compare with {b}: different head layouts: {la[0]}×{la[1]} vs "
            f"{lb[0]}×{lb[1]} (layers × heads); only models with the same layout can be "
            "compared head by head")


def theme_arg(text: str) -> str:
    """``--theme``: a theme name or alias (argparse type: an unknown one is a usage error)."""
    from headscope.themes import ALIASES, THEME_NAMES

    name = ALIASES.get(text, text)
    if name not in THEME_NAMES:
        raise argparse.ArgumentTypeError(
            f"unknown theme {text!r}; themes: {', '.join(THEME_NAMES)}")
    return name


def layer_head(text: str) -> tuple[int, int]:
    """``"1.2"`` → ``(1, 2)`` (argparse type: a malformed value is a usage error)."""
    try:
        layer, head = (int(part) for part in text.split("."))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not LAYER.HEAD, e.g. 1.2") from None
    if layer < 0 or head < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: layer and head count from 0")
    return layer, head
