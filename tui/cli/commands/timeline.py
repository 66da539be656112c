"""``headscope timeline PATH [PATH ...]``: every head's scores across training checkpoints.

The work is
``engine.api.timeline.compute_timeline``. ``--json`` prints ``Timeline.to_dict()``; otherwise one
row per head (a sparkline and the last value of each score, and the head's largest phase
change), the phase changes, and the step where the most heads changed. Warnings (identical
checkpoints, unnumbered steps) go to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from headscope.tui.cli import args as args_types
from headscope.tui.cli.options import command_parser, json_arg, quiet_arg, raw_arg, store_arg
from headscope.tui.cli.output import say
from headscope.tui.cli.progress import progress_bar
from headscope.tui.cli.store import results_store

if TYPE_CHECKING:
    from collections.abc import Callable

    from headscope.engine.api.timeline import StepScores, Timeline
    from headscope.tui.cli.progress import Progress

EXAMPLE = "headscope timeline sample_models/attn-only-2l-training"
SPARK = "▁▂▃▄▅▆▇█"
MAX_SPARK = 24  # longer series are sampled at evenly spaced steps
TEXT_SCORES = (  # column title, score key (the JSON has the composition maxima as well)
    ("copying", "copying_score"),
    ("qk_positivity", "qk_positivity"),
    ("prev_token", "prev_token_score"),
    ("duplicate", "duplicate_token_score"),
    ("induction", "induction_score"),
    ("k_comp", "k_composition_max"),
)

# Which score columns a narrow terminal keeps first; head and phase-change columns take ~42.
PRIORITY = ("induction_score", "prev_token_score", "copying_score", "k_composition_max",
            "qk_positivity", "duplicate_token_score")
FIXED_WIDTH = 42


def register(sub: Any) -> None:
    """The ``timeline`` subcommand."""
    p = command_parser(sub, "timeline", "every head's scores across training checkpoints, with the "
                       "phase changes (a directory of step-*/checkpoint-* subdirectories, or "
                       "several checkpoints in order)",
                       [EXAMPLE, "headscope timeline ckpt/step1000 ckpt/step2000 ckpt/step4000 --json"])
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="a directory of checkpoint subdirectories, or two or more checkpoints in order")
    json_arg(p)
    raw_arg(p)
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the random token sequences and baselines (default 0, as `heads`)")
    p.add_argument("--workers", type=args_types.workers, default=1,
                   help="score this many steps at once, in threads (default 1)")
    p.add_argument("--scheduler", metavar="tcp://HOST:PORT",
                   help="score the steps on this Dask scheduler, one task per step (workers "
                        "read the checkpoints from the same paths); needs headscope[cluster]")
    store_arg(p)
    quiet_arg(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from headscope.engine.api.cluster import worker_bound
    from headscope.engine.api.timeline import compute_timeline
    from headscope.tui.cli.cluster import cluster_from_args, model_bytes

    workers = args.workers
    if workers > 1 and not args.scheduler:  # threads, each holding one step's model
        bound, why = worker_bound(max(model_bytes(p) for p in args.paths), base=0)
        if workers > bound:
            say(f"--workers {workers}: scoring {bound} steps at once ({why})", warning=True)
            workers = bound
    with (cluster_from_args(argparse.Namespace(scheduler=args.scheduler)) as cluster,
          progress_bar("timeline", quiet=args.quiet) as bar):
        timeline = compute_timeline(args.paths, seed=args.seed, raw=args.raw,
                                    workers=workers, cluster=cluster,
                                    store=results_store(args),  # unused by cluster steps
                                    progress=None if bar is None else step_progress(bar))
    for warning in timeline.warnings:
        say(warning, warning=True)
    if args.json:
        from headscope.engine.core.export import jsonable

        json.dump(jsonable(timeline.to_dict()), sys.stdout, allow_nan=False)
        sys.stdout.write("\n")
    else:
        print_text(timeline)
    return 0


def step_progress(bar: Progress) -> Callable[[int, int, StepScores], None]:
    """``compute_timeline``'s report of each scored step, on the bar: the fraction of the steps
    scored (the ETA follows from it) and the last step's number."""

    def report(done: int, total: int, result: StepScores) -> None:
        bar(done / total)
        bar.note(f"scored step {result.step} ({done}/{total})")  # type: ignore[attr-defined]

    return report


# ----------------------------------------------------------------------------- text


def sparkline(values: list[float], low: float, high: float, width: int = MAX_SPARK) -> str:
    """One block character per step (evenly sampled beyond ``width``); ``·`` for NaN."""
    import math

    if len(values) > width:
        values = [values[round(i * (len(values) - 1) / (width - 1))] for i in range(width)]
    span = high - low
    out = []
    for v in values:
        if not math.isfinite(v):
            out.append("·")
        else:
            level = 0 if span <= 0 else round((v - low) / span * (len(SPARK) - 1))
            out.append(SPARK[max(0, min(len(SPARK) - 1, level))])
    return "".join(out)


def _fmt(v: float) -> str:
    import math

    return f"{v:.2f}" if math.isfinite(v) else "nan"


def describe_change(c: dict[str, Any]) -> str:
    return (f"{c['score']} {_fmt(c['before'])}→{_fmt(c['after'])} at step {c['step']} "
            f"({c['start_step']}–{c['end_step']})")


def _short_change(c: dict[str, Any]) -> str:
    return f"{c['score']} {_fmt(c['before'])}→{_fmt(c['after'])} @{c['step']}"


def head_rows(t: Timeline, shown: tuple[tuple[str, str], ...] = TEXT_SCORES
              ) -> tuple[list[str], list[list[str]]]:
    """The text table: a row per head, a sparkline + last value per score, its largest change."""
    import numpy as np

    columns = ["head", *(title for title, _ in shown), "largest phase change"]
    ranges = {}
    for _, key in shown:
        finite = t.series[key][np.isfinite(t.series[key])]
        ranges[key] = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
    rows = []
    for layer in range(t.n_layers):
        for head in range(t.n_heads):
            cells = [f"L{layer}.H{head}"]
            for _, key in shown:
                values = t.head_series(layer, head, key)
                cells.append(f"{sparkline(values, *ranges[key])} {_fmt(values[-1])}")
            mine = [c for c in t.phase_changes if (c["layer"], c["head"]) == (layer, head)]
            biggest = max(mine, key=lambda c: abs(c["size"]), default=None)
            cells.append(_short_change(biggest) if biggest else "")
            rows.append(cells)
    return columns, rows


def fitting_scores(n_steps: int, width: int) -> tuple[tuple[str, str], ...]:
    """The score columns a terminal ``width`` holds, by ``PRIORITY``, in table order."""
    per_column = min(n_steps, MAX_SPARK) + 6 + 3  # sparkline, value, padding
    room = max(1, (width - FIXED_WIDTH) // per_column)
    keep = set(PRIORITY[:room])
    return tuple((title, key) for title, key in TEXT_SCORES if key in keep)


def print_text(t: Timeline) -> None:
    steps = f"{len(t.steps)} steps ({t.steps[0]} … {t.steps[-1]})"
    if sys.stdout.isatty():
        from rich import box
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        console = Console()
        shown = fitting_scores(len(t.steps), console.width)
        columns, rows = head_rows(t, shown)
        hidden = [title for title, _ in TEXT_SCORES if (title, _) not in shown]
        more = f" ({', '.join(hidden)}: a wider terminal or --json)" if hidden else ""
        console.print(Text(f"{steps}, {t.n_layers} layers × {t.n_heads} heads; sparklines per "
                           "score over the steps, scaled to that score's range, then the last "
                           f"value{more}"))
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        for i, title in enumerate(columns):
            table.add_column(title, no_wrap=i < len(columns) - 1)
        for row in rows:
            table.add_row(*(Text(c) for c in row))
        console.print(table)
    else:
        columns, rows = head_rows(t)
        print("\t".join(columns))
        for row in rows:
            print("\t".join(row))
    print()
    print(f"phase changes ({len(t.phase_changes)}):")
    for c in t.phase_changes:
        print(f"  L{c['layer']}.H{c['head']} {describe_change(c)}")
    m = t.model_phase_change
    if m is None:
        print("no phase change: no score jumped within a short window of steps")
    else:
        heads = ", ".join(f"L{layer}.H{head}" for layer, head in m["heads"])
        print(f"model: most heads changing at step {m['step']} ({m['n_heads']}: {heads})")
