"""``headscope composition PATH --kind q|k|v``: composition scores between heads of different
layers, the strongest edges listed (and filled in on the progress bar while the sweep runs)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from headscope.engine.core.validation import COMPOSITION_KINDS
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
from headscope.tui.cli.output import EXIT_OK, emit, open_for_command
from headscope.tui.cli.progress import progress_bar
from headscope.tui.cli.store import results_store


def register(sub: Any) -> None:
    p = command_parser(sub, "composition", "Q-, K- or V-composition scores between heads of "
                       "different layers", "headscope composition path --kind k --top 5")
    model_arg(p)
    json_arg(p)
    raw_arg(p)
    p.add_argument("--kind", choices=COMPOSITION_KINDS, required=True)
    p.add_argument("--top", type=args_types.count, default=10, help="how many top edges to list (default 10)")
    p.add_argument("--seed", type=args_types.seed, default=0, help="seed of the random baseline (default 0)")
    store_arg(p)
    add_cluster_args(p)
    quiet_arg(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from headscope.engine.api.report import composition_dict, computed
    from headscope.engine.core.requests import CompositionRequest

    model = open_for_command(args)
    with cluster_from_args(args) as cluster, \
            progress_bar(f"{args.kind}-composition {model.path.name}", quiet=args.quiet) as progress:
        note = getattr(progress, "note", None)
        on_tile = None if note is None or args.top == 0 else best_edges_so_far(
            note, model.cfg.d_model, model.cfg.d_head, args.seed, shown=min(2, args.top))
        req = CompositionRequest.of(model.structure(), args.kind, args.seed, args.top, where=str(model.path))
        report = composition_dict(computed(model, req, store=results_store(args), progress=progress,
                                           cluster=cluster, on_tile=on_tile), args.seed)
    columns = ["source", "target", "score", "above_baseline"]
    emit(report, args.json, lambda: (columns, [[e[c] for c in columns] for e in report["top_edges"]]))
    return EXIT_OK


def best_edges_so_far(note: Callable[[str], None], d_model: int, d_head: int, seed: int,
                      shown: int = 2) -> Callable[[int, int, Any], None]:
    """An ``on_tile`` that keeps the ``shown`` strongest edges of the layer pairs done so far
    and puts them on the progress bar (``note``): ``--top`` fills in while the sweep runs."""
    import numpy as np

    from headscope.engine.api.report import composition_baseline

    baseline = composition_baseline(d_model, d_head, seed)
    best: list[tuple[float, int, int, int, int]] = []

    def on_tile(source: int, target: int, scores: Any) -> None:
        values = np.nan_to_num(np.asarray(scores, dtype=np.float64), nan=-np.inf)
        for flat in np.argsort(-values, axis=None)[:shown]:
            h1, h2 = np.unravel_index(flat, values.shape)
            if np.isfinite(values[h1, h2]):
                best.append((float(values[h1, h2]) - baseline, source, int(h1), target, int(h2)))
        best.sort(key=lambda e: -e[0])
        del best[shown:]
        note("best so far " + ", ".join(f"L{l1}.H{h1}→L{l2}.H{h2} {s:+.3f}" for s, l1, h1, l2, h2 in best))

    return on_tile
