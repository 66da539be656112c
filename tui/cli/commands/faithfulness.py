"""``headscope faithfulness PATH``: how much of the clean-vs-corrupt metric difference the
circuit of the top N edges of an edge attribution keeps when every other edge is corrupted
(docs/math.md, "Edge attribution"); several N from one attribution, and ``--curve`` over 1 … 100 %
of the edges with its area. Inputs as ``edges`` (tui/cli/commands/edges.py)."""

from __future__ import annotations

import argparse
from typing import Any

from headscope.tui.cli.commands.edges import build, common_options, method_options
from headscope.tui.cli.options import command_parser, model_arg
from headscope.tui.cli.output import EXIT_OK, EXIT_USAGE, emit, say

EXAMPLES = [
    "headscope faithfulness sample_models/attn-only-2l --task first-occurrence --method eap-ig --top 3,5,10",
    "headscope faithfulness sample_models/attn-only-2l --task first-occurrence --top 5 --curve",
]


def tops(text: str) -> list[int]:
    """``--top 5,20,50``: the circuit sizes (argparse refuses what is not a list of numbers)."""
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of numbers such as 5,20,50") from None


def register(sub: Any) -> None:
    p = command_parser(sub, "faithfulness", "circuit faithfulness: the metric of the top-N edges' circuit "
                       "(pruned) with every other edge corrupted, as a fraction of clean minus corrupt "
                       "(1: the circuit does it all, 0: nothing)", EXAMPLES)
    model_arg(p)
    method_options(p)
    p.add_argument("--top", type=tops, default=None, metavar="N[,N...]",
                   help="the circuit of the top N edges by |score| (several: 5,20,50, from one attribution)")
    p.add_argument("--curve", action="store_true",
                   help="also the faithfulness at 1, 2, 5, 10, 20, 50 and 100 %% of the edges, and its area")
    common_options(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from headscope.engine.api.report import faithfulness_dict, faithfulness_request

    if not args.top and not args.curve:
        say("give --top N (the circuit of the top N edges, e.g. --top 5,20) or --curve")
        return EXIT_USAGE
    result = build(args, "faithfulness", faithfulness_request, tops=args.top or (), curve=args.curve)
    if isinstance(result, int):
        return result
    report = faithfulness_dict(result)
    emit(report, args.json, lambda: _table(result))
    return EXIT_OK


def _table(result: Any) -> tuple[list[str], list[list[Any]]]:
    columns = ["circuit", "edges left", "metric", "faithfulness"]
    rows: list[list[Any]] = [["clean run", None, result.scores.clean, 1.0],
                             ["corrupt run", None, result.scores.corrupt, 0.0]]
    rows += [[f"top {p.top}", p.edges, p.circuit, p.faithfulness] for p in result.points]
    if result.curve is not None:
        rows += [[f"{f:.0%} (top {p.top})", p.edges, p.circuit, p.faithfulness]
                 for f, p in zip(result.curve.fractions, result.curve.points, strict=True)]
        rows.append([f"curve area {result.curve.area:.3f}", None, None, None])
    return columns, rows
