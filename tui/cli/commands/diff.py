"""``headscope diff A B``: compare the circuits of two checkpoints with the same head layout."""

from __future__ import annotations

import argparse
from typing import Any

from headscope.engine.core.validation import EDGE_THRESHOLD
from headscope.tui.cli import args as args_types
from headscope.tui.cli.cluster import add_cluster_args, cluster_from_args
from headscope.tui.cli.options import command_parser, json_arg, quiet_arg, raw_arg, store_arg
from headscope.tui.cli.output import EXIT_OK, emit
from headscope.tui.cli.progress import progress_bar
from headscope.tui.cli.store import results_store


def register(sub: Any) -> None:
    p = command_parser(sub, "diff", "compare the circuits of two checkpoints with the same head "
                       "layout (after pruning, distillation or more training)",
                       "headscope diff original/ pruned/ --json")
    p.add_argument("path", help="checkpoint A (the reference)")
    p.add_argument("other", help="checkpoint B")
    json_arg(p)
    raw_arg(p)
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
    store_arg(p)
    add_cluster_args(p)
    quiet_arg(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from headscope.engine.api.diff import diff_models
    from headscope.engine.api.model import open_model

    a = open_model(args.path, raw=args.raw)
    b = open_model(args.other, raw=args.raw)
    with cluster_from_args(args) as cluster, \
            progress_bar(f"diff {a.path.name} {b.path.name}", quiet=args.quiet) as progress:
        result = diff_models(a, b, match_heads=args.match_heads, threshold=args.threshold,
                             seed=args.seed, store=results_store(args), progress=progress,
                             cluster=cluster, behaviour=not args.no_behaviour)
    report = result.to_dict()

    def table() -> tuple[list[str], list[list[Any]]]:
        # "B head": the head of B compared with A's (itself unless --match-heads paired them).
        matched = {(h["layer"], h["head"]): h.get("matched_head", h["head"])
                   for h in report["heads"]}
        keys = ["change", "ov_similarity", "qk_similarity", "copying_score_delta",
                "prev_token_score_delta", "induction_score_delta"]
        columns = ["layer", "head", "B head", "change", "ov_sim", "qk_sim", "Δcopying",
                   "Δprev_token", "Δinduction"]
        rows = [[r["layer"], r["head"], matched.get((r["layer"], r["head"]), r["head"]),
                 *(r.get(k) for k in keys)] for r in report["biggest_changes"]]
        # Every composition edge lost or gained (A's score → B's in the ov_sim/qk_sim columns).
        for kind, d in report["composition"].items():
            for status in ("lost", "gained"):
                for e in d[status]:
                    rows.append([f"{kind.upper()}-edge {status}",
                                 f"{e['source'][0]}.{e['source'][1]}→"
                                 f"{e['target'][0]}.{e['target'][1]}", "",
                                 abs(e["delta"]), e["a"], e["b"], None, None, None])
        return columns, rows

    emit(report, args.json, table)
    return EXIT_OK
