"""``headscope heads PATH``: every head with its weight and behaviour scores."""

from __future__ import annotations

import argparse
from typing import Any

from headscope.engine.core.errors import InvalidRequestError
from headscope.tui.cli import args as args_types
from headscope.tui.cli.cluster import add_cluster_args, cluster_from_args
from headscope.tui.cli.options import (
    command_parser,
    json_arg,
    model_arg,
    quiet_arg,
    raw_arg,
    store_arg,
)
from headscope.tui.cli.output import EXIT_OK, UsageError, emit, open_for_command
from headscope.tui.cli.progress import progress_bar
from headscope.tui.cli.store import results_store


def register(sub: Any) -> None:
    p = command_parser(sub, "heads", "every head with its copying, QK-positivity, previous-token, "
                       "duplicate-token and induction scores", "headscope heads path --sort induction_score")
    model_arg(p)
    json_arg(p)
    raw_arg(p)
    p.add_argument("--sort", metavar="KEY", help="sort descending by a score column, e.g. induction_score")
    p.add_argument("--seed", type=args_types.seed, default=0, help="seed of the random token sequences (default 0)")
    p.add_argument("--ablation", action="store_true",
                   help="add ablation_effect: the loss increase on the repeated half of the random "
                        "sequences when the head is zero-ablated (a forward pass per head; implied "
                        "by --sort ablation_effect)")
    p.add_argument("--no-behaviour", action="store_true",
                   help="only the weight-based scores (copying_score, qk_positivity): no forward "
                        "pass, and no wait for torch")
    store_arg(p)
    add_cluster_args(p)
    quiet_arg(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from headscope.engine.api.report import head_table, sort_rows
    from headscope.engine.core.validation import ABLATION_EFFECT, SCORE_NAMES, Z_NAMES

    if args.no_behaviour:
        return _weight_heads(args)
    ablation = args.ablation or args.sort == ABLATION_EFFECT
    sort_key(args.sort, [*SCORE_NAMES, *Z_NAMES, ABLATION_EFFECT])  # before the model is opened
    model = open_for_command(args)
    with cluster_from_args(args) as cluster, \
            progress_bar(f"heads {model.path.name}", quiet=args.quiet) as progress:
        table = head_table(model, seed=args.seed, ablation=ablation, store=results_store(args),
                           progress=progress, cluster=cluster)
    rows = sort_rows(table, args.sort)
    columns = ["layer", "head", *SCORE_NAMES, *([ABLATION_EFFECT] if ablation else []),
               "nonfinite"]
    emit(rows, args.json, lambda: (columns, [[r[c] for c in columns] for r in rows]))
    return EXIT_OK


def _weight_heads(args: argparse.Namespace) -> int:
    """``heads --no-behaviour``: the weight-only scores (engine/circuits/spectral.py: no torch)."""
    from headscope.engine.api.report import WEIGHT_SCORE_NAMES, sort_rows, weight_table

    if args.ablation:
        raise InvalidRequestError(None, "--ablation runs the model: it cannot go with --no-behaviour")
    sort_key(args.sort, list(WEIGHT_SCORE_NAMES))
    model = open_for_command(args)
    with progress_bar(f"heads {model.path.name}", quiet=args.quiet) as progress:
        rows = sort_rows(weight_table(model, store=results_store(args), progress=progress), args.sort)
    columns = ["layer", "head", *WEIGHT_SCORE_NAMES, "nonfinite"]
    emit(rows, args.json, lambda: (columns, [[r[c] for c in columns] for r in rows]))
    return EXIT_OK


def sort_key(key: str | None, columns: list[str]) -> None:
    """``--sort``: one of ``columns``, or a usage error naming the closest key."""
    from headscope.engine.core.validation import check_sort_key

    try:
        check_sort_key(key, columns)
    except InvalidRequestError as err:
        raise UsageError("--sort", err.reason) from None
