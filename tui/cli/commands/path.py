"""``headscope path PATH SOURCE TARGET``: two heads in different layers read as one (docs/math.md,
"Reading a head"); the work is ``engine.api.report.path_report``. ``--json`` prints the report;
otherwise the path's scores and the K-path block's strongest keys. (The path patching of an
edge is ``path-patch``.)"""

from __future__ import annotations

import argparse
from typing import Any

from headscope.tui.cli.args import head_ref
from headscope.tui.cli.options import command_parser, json_arg, model_arg, raw_arg
from headscope.tui.cli.output import EXIT_OK, emit, parse_token_list

EXAMPLE = "headscope path sample_models/attn-only-2l L0.H1 L1.H2 --json"


def register(sub: Any) -> None:
    p = command_parser(sub, "path", "two heads in different layers read as one: the "
                       "V-composition virtual OV circuit and the K-composition path (does a "
                       "token attend where head A moved it?)", EXAMPLE)
    model_arg(p)
    p.add_argument("source", type=head_ref, help="the earlier head, e.g. L0.H1")
    p.add_argument("target", type=head_ref, help="the later head, e.g. L1.H2")
    p.add_argument("--rows", help="query tokens of the K-path block, as for `headscope circuit`")
    p.add_argument("--cols", help="key-side tokens of the K-path block")
    p.add_argument("--seed", type=int, default=0, help="seed of the diagonal's token sample (default 0)")
    json_arg(p)
    raw_arg(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from headscope.engine.api.model import open_model
    from headscope.engine.api.report import computed, path_dict
    from headscope.engine.core.requests import PathRequest

    model = open_model(args.path, raw=args.raw)
    n = model.cfg.d_vocab
    req = PathRequest.of(model.structure(), args.source, args.target,
                         parse_token_list(model, args.rows, n, "token"),
                         parse_token_list(model, args.cols, n, "token"), seed=args.seed, where=str(model.path))
    report = path_dict(computed(model, req))

    def table() -> tuple[list[str], list[list[Any]]]:
        k, v = report["k_composition"], report["v_composition"]
        rows: list[list[Any]] = [
            ["V-path copying score", v["copying_score"]],
            ["K-path positivity", k["positivity"]],
            ["K-path diagonal rate", k["diagonal"]],
        ]
        rows += [[f"K-path {label} → max key", k["col_labels"][max(range(len(vals)), key=vals.__getitem__)]]
                 for label, vals in zip(k["row_labels"], k["values"], strict=True) if vals]
        return ["", "value"], rows

    emit(report, args.json, table)
    return EXIT_OK
