"""``headscope circuit PATH LAYER HEAD --kind qk|ov``: a block of a head's QK or OV circuit."""

from __future__ import annotations

import argparse
from typing import Any

from headscope.tui.cli import args as args_types
from headscope.tui.cli.options import command_parser, json_arg, model_arg, quiet_arg, raw_arg
from headscope.tui.cli.output import EXIT_OK, emit, open_for_command, parse_token_list
from headscope.tui.cli.progress import progress_bar


def register(sub: Any) -> None:
    p = command_parser(sub, "circuit", "a block of a head's QK or OV circuit",
                       "headscope circuit path 1 4 --kind qk --basis position --rows 0:16 --cols 0:16")
    model_arg(p)
    p.add_argument("layer", type=args_types.index)
    p.add_argument("head", type=args_types.index)
    json_arg(p)
    raw_arg(p)
    p.add_argument("--kind", choices=("qk", "ov"), required=True)
    p.add_argument("--basis", choices=("token", "position"), default="token")
    p.add_argument("--rows", type=args_types.token_spec,
                   help="ids (3,14), ranges (0:20) or tokens (Mary,John); default the first 24")
    p.add_argument("--cols", type=args_types.token_spec, help="as --rows")
    p.add_argument("--offset", type=args_types.offset, default=0, help="rotary models: query-key offset Δ")
    quiet_arg(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from headscope.engine.api.report import circuit_dict, computed
    from headscope.engine.core.requests import CircuitRequest

    model = open_for_command(args)
    n = model.cfg.n_ctx if args.basis == "position" else model.cfg.d_vocab
    rows, cols = (parse_token_list(model, spec, n, args.basis) for spec in (args.rows, args.cols))
    with progress_bar(f"circuit {model.path.name}", quiet=args.quiet, determinate=False):
        req = CircuitRequest.of(model.structure(), args.layer, args.head, args.kind, args.basis, rows, cols,
                                args.offset, where=str(model.path))
        report = circuit_dict(computed(model, req), model)  # no torch import

    def table() -> tuple[list[str], list[list[Any]]]:
        return (["row \\ col", *report["col_labels"]],
                [[label, *vals] for label, vals in zip(report["row_labels"], report["values"], strict=True)])

    emit(report, args.json, table, fewer="--cols")
    return EXIT_OK
