"""What every command shares: exit codes, printing a result (JSON, a Rich table or TSV), the
token lists of ``--rows``/``--cols`` and opening the model a command reads.

Command modules import this, never ``tui/cli/main.py`` (which imports them).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from headscope.engine.core.errors import IndexOutOfRangeError, InvalidRequestError
from headscope.tui.base.datatext import printable, tsv_field
from headscope.tui.cli.table import Items

# 0 success · 1 the model or request is at fault (the message says how) · 2 command-line
# usage error · 130 interrupted.
EXIT_OK, EXIT_MODEL_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
# The subcommands (anything else first on the command line is a path to open).
COMMANDS = ("open", "info", "heads", "composition", "forward", "circuit", "diff", "export", "serve",
            "timeline", "cache", "svd", "path", "patch", "path-patch", "edges", "faithfulness",
            "qk-attribution")


class UsageError(Exception):
    """A command-line mistake found after parsing (a missing option of one ``--what``, an
    unknown ``--sort`` key): ``main`` prints it as argparse prints its own, one line naming
    the argument, and exits 2, before any model is opened."""

    def __init__(self, argument: str, message: str) -> None:
        self.argument = argument
        self.message = " ".join(message.split())
        super().__init__(f"argument {argument}: {self.message}")


class PathUsageError(Exception):
    """A path on the command line that names no checkpoint (tui/cli/paths.py): ``main`` prints
    the one line and exits 2."""


def say(message: str, *, warning: bool = False) -> None:
    """One line on stderr, ``headscope: [warning: ]<message>``: every message of the CLI goes
    through here, so a path or token carrying escape codes never reaches the terminal raw
    (``printable``, the one escaping of data shown to a user)."""
    print(f"headscope: {'warning: ' if warning else ''}{printable(message)}", file=sys.stderr)


def open_for_command(args: argparse.Namespace) -> Any:
    """The model ``args.path`` (raw with ``--raw``); its warnings are said with the
    command's own (``command_warnings``)."""
    from headscope.engine.api.model import open_model

    model = open_model(args.path, raw=getattr(args, "raw", False))
    args.opened = model
    return model


def command_warnings(args: argparse.Namespace) -> list[str]:
    """What to say once the command succeeded: its model's warnings (e.g. an unusable
    tokenizer, ids shown instead: known once the command asked for a token, as the
    tokenizer is read when first used), then the command's own (``args.warnings``). A
    command that fails on them already names the reason in its one error line."""
    opened = getattr(args, "opened", None)
    return [*(opened.warnings if opened is not None else ()), *getattr(args, "warnings", [])]


def emit(data: Any, as_json: bool, table: Callable[[], tuple[list[str], list[list[Any]]]] | None,
         fewer: str | None = None) -> None:
    """JSON when asked (or when there is no tabular form), else a Rich table or TSV.
    ``fewer``: the options choosing fewer columns, named if a terminal cannot show them all."""
    from headscope.engine.core.export import jsonable

    if as_json or table is None:
        # dumps, not dump: json.dump streams through the pure-Python encoder (a [12,12,12,12]
        # composition array: 25 ms against 5 ms)
        sys.stdout.write(json.dumps(jsonable(data), allow_nan=False) + "\n")
        return
    columns, rows = table()
    if sys.stdout.isatty():
        from headscope.tui.cli.table import print_table

        print_table(columns, [[v if isinstance(v, Items) else format_cell(v) for v in row]
                              for row in rows], fewer=fewer)
    else:
        print("\t".join(tsv_field(c) for c in columns))
        for row in rows:
            print("\t".join(tsv_field(format_cell(v)) for v in row))


def format_cell(v: Any) -> str:
    if isinstance(v, Items):  # (TSV) a terminal table packs them on lines
        return " ".join(v)
    if isinstance(v, float):
        return f"{v:.4f}"
    if isinstance(v, list | tuple) and len(v) == 2:  # a head: [layer, head]
        return f"L{v[0]}.H{v[1]}"
    return "" if v is None else str(v)


def parse_token_list(model: Any, spec: str | None, n: int, basis: str) -> list[int] | None:
    """``3,14`` ids, ``0:20`` ranges, or token strings (token basis) — mixed freely."""
    if spec is None:
        return None
    out: list[int] = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        if ":" in item and all(p.strip().lstrip("-").isdigit() for p in item.split(":", 1)):
            a, b = (int(p) for p in item.split(":", 1))
            # checked as ids are (validation's "token 99999 out of range 0..413"), not cut to
            # the vocabulary: 5000:6000 used to print an empty block, 0:99999 414 rows
            if not 0 <= a < b <= n:
                what = "token" if basis == "token" else "position"
                raise IndexOutOfRangeError(
                    str(model.path), f"{what} range {a}:{b} out of range 0..{n - 1} "
                                     f"(START:STOP with STOP at most {n})")
            out.extend(range(a, b))
        elif item.lstrip("-").isdigit():
            out.append(int(item))
        elif basis == "token":
            tid = model.tokenizer.token_to_id(item)
            if tid is None:
                # an unusable tokenizer.json (IdTokenizer) is why nothing is found: say so
                why = getattr(model.tokenizer, "why", None)
                note = f" ({why()})" if callable(why) else ""
                raise InvalidRequestError(str(model.path),
                                          f"token {item!r} is not in the vocabulary{note}")
            out.append(tid)
        else:
            raise InvalidRequestError(str(model.path), f"position {item!r} is not a number")
    return out
