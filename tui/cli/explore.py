"""The commands that open the explorer: ``headscope [open] PATH`` (the terminal app) and
``headscope serve PATH`` (the same app in a browser, through textual-serve)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from headscope.engine.core.errors import InvalidRequestError
from headscope.tui.cli.output import COMMANDS, EXIT_OK


def cmd_open(args: argparse.Namespace) -> int:
    from headscope.sample_models import bundled_model
    from headscope.tui.app import run_app

    path = Path(args.path) if args.path else bundled_model()
    for given in (args.path, args.compare):  # before any screen: a typo is one line, exit 1
        if given and not Path(given).exists():
            raise InvalidRequestError(given, "no such file or directory (commands: "
                                      + ", ".join(COMMANDS) + ")")
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


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def cmd_serve(args: argparse.Namespace) -> int:
    import os
    import shlex

    token = args.token if args.token is not None else os.environ.get("HEADSCOPE_TOKEN")
    remote = args.host not in LOOPBACK
    if remote and not args.allow_remote:
        raise InvalidRequestError(
            None, f"refusing to bind {args.host}: pass --allow-remote to serve beyond this machine"
        )
    if token is not None and (len(token) < MIN_TOKEN or not token.isascii()
                              or not token.isprintable() or " " in token):
        raise InvalidRequestError(None, f"--token / HEADSCOPE_TOKEN must be at least {MIN_TOKEN} "
                                  "printable ASCII characters without spaces")
    if remote and token is None:
        raise InvalidRequestError(None, "--allow-remote needs a token you chose: pass --token or "
                                  "set HEADSCOPE_TOKEN (the key every browser must present)")
    try:
        import textual_serve.server  # noqa: F401
    except ImportError:
        raise InvalidRequestError(None, f"headscope serve needs textual-serve: {serve_hint()}") from None
    from headscope.sample_models import bundled_model

    if args.path and not Path(args.path).exists():  # as `open`: one line, before serving
        raise InvalidRequestError(args.path, "no such file or directory")
    path = Path(args.path) if args.path else bundled_model()
    from headscope.engine.api.model import read_structure

    read_structure(path)  # headers only: a model that cannot open fails here, not in a tab
    command = [sys.executable, "-m", "headscope.tui.cli.main", "open", str(path.resolve())]
    if args.raw:
        command.append("--raw")
    from headscope.tui.cli.serve import serve

    serve(shlex.join(command), host=args.host, port=args.port, title=f"headscope · {path.name}",
          token=token, max_sessions=args.max_sessions)
    return EXIT_OK


MIN_TOKEN = 8


def serve_hint() -> str:
    """How to install the ``serve`` extra: the README's command, in the checkout this
    headscope runs from (editable install), else from the package index."""
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file():
        return f"in the checkout ({root}) run pip install -e '.[serve]'"
    return "pip install 'headscope[serve]'"
