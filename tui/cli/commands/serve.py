"""``headscope serve [PATH]``: the explorer in a web browser (textual-serve, one app process
per tab; the server is tui/cli/serve.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from headscope.engine.core.errors import InvalidRequestError
from headscope.tui.cli import args as args_types
from headscope.tui.cli.options import command_parser, model_arg, raw_arg
from headscope.tui.cli.output import EXIT_OK
from headscope.tui.cli.paths import check_checkpoint

LOOPBACK = ("127.0.0.1", "localhost", "::1")
MIN_TOKEN = 8
DEFAULT_PORT = 8000


def register(sub: Any) -> None:
    p = command_parser(sub, "serve", "serve the explorer to a web browser (textual-serve), on "
                       "127.0.0.1 by default", "headscope serve path --port 8000")
    model_arg(p, optional=True)
    raw_arg(p)
    p.add_argument("--port", type=args_types.port, default=DEFAULT_PORT,
                   help=f"TCP port to listen on (default {DEFAULT_PORT})")
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
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
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
    from headscope.sample_models import bundled_model

    if args.path:  # as `open`: one line, before serving
        check_checkpoint(args.path)
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
