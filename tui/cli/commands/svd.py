"""``headscope svd PATH LAYER HEAD``: a head's top singular directions as tokens (docs/math.md,
"Reading a head"); the work is ``engine.api.report.svd_report``. ``--json`` prints the report;
otherwise one row per singular direction, its tokens each side (wrapped in a terminal), then the
head's overlap."""

from __future__ import annotations

import argparse
from typing import Any

from headscope.tui.cli.options import command_parser, json_arg, model_arg, raw_arg
from headscope.tui.cli.output import EXIT_OK, emit
from headscope.tui.cli.table import Items

EXAMPLE = "headscope svd sample_models/attn-only-2l 1 2 --kind ov --k 5 --top 10 --json"


def register(sub: Any) -> None:
    p = command_parser(sub, "svd", "a head's top singular directions as tokens: what each "
                       "direction reads (OV: source tokens, QK: query tokens) and writes "
                       "(OV: predicted tokens, QK: key tokens)", EXAMPLE)
    model_arg(p)
    p.add_argument("layer", type=int)
    p.add_argument("head", type=int)
    p.add_argument("--kind", choices=("ov", "qk"), default="ov")
    p.add_argument("--k", type=int, default=5, help="how many directions (default 5)")
    p.add_argument("--top", type=int, default=10, help="tokens listed each side (default 10)")
    json_arg(p)
    raw_arg(p)
    p.set_defaults(handler=run)


def token_items(tokens: list[dict[str, Any]]) -> Items:
    """``'Mary'(+0.14)`` per token: a cell a terminal table wraps between tokens."""
    return Items(f"{t['token']!r}({t['value']:+.2f})" for t in tokens)


def overlap_line(report: dict[str, Any]) -> str:
    """The head's overlap (the README's 0.6), which the table's per-direction column is not."""
    import math

    v = report["overlap"]
    shown = f"{v:.2f}" if isinstance(v, float) and math.isfinite(v) else "undefined"
    return f"overlap {shown} (the head's: the mean of its {len(report['directions'])} directions')"


def run(args: argparse.Namespace) -> int:
    from headscope.engine.api.model import open_model
    from headscope.engine.api.report import computed, svd_dict
    from headscope.engine.core.requests import DirectionsRequest

    model = open_model(args.path, raw=args.raw)
    req = DirectionsRequest.of(model.structure(), args.layer, args.head, args.kind, args.k, args.top,
                               where=str(model.path))
    report = svd_dict(computed(model, req))

    def table() -> tuple[list[str], list[list[Any]]]:
        rows = [[d["direction"], d["sigma"], d["overlap"], token_items(d["in_tokens"]),
                 token_items(d["out_tokens"])] for d in report["directions"]]
        return ["direction", "sigma", "overlap", "reads (in)", "writes (out)"], rows

    emit(report, args.json, table)
    if not args.json:
        print()
        print(overlap_line(report))
    return EXIT_OK
