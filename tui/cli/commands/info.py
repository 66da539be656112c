"""``headscope info PATH``: architecture, shapes and dtype, from the header alone."""

from __future__ import annotations

import argparse
from typing import Any

from headscope.tui.cli.options import command_parser, json_arg, model_arg
from headscope.tui.cli.output import EXIT_OK, emit


def register(sub: Any) -> None:
    p = command_parser(sub, "info", "architecture, shapes and dtype, from the header alone",
                       "headscope info path/to/model --json")
    model_arg(p)
    json_arg(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from headscope.engine.api.model import read_structure

    info = read_structure(args.path)
    # picked here, on its first use (formats.vocabulary.LazyIds): a list, or None for none
    info["default_tokens"] = list(info["default_tokens"] or ()) or None
    # The table leaves out an unset default token set (the first ids: nothing to say).
    rows = [[k, v] for k, v in info.items() if not (k == "default_tokens" and v is None)]
    emit(info, args.json, lambda: (["field", "value"], rows))
    return EXIT_OK
