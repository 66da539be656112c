"""``headscope export PATH --what heads|composition|circuit``: write a report to JSON or CSV,
atomically."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from headscope.engine.core.errors import InvalidRequestError
from headscope.tui.cli import args as args_types
from headscope.tui.cli.options import command_parser, model_arg, quiet_arg, raw_arg, store_arg
from headscope.tui.cli.output import EXIT_OK, UsageError, open_for_command, parse_token_list
from headscope.tui.cli.progress import progress_bar
from headscope.tui.cli.store import results_store

# The options each ``export --what`` needs, and the --kind values it takes.
EXPORT_NEEDS = {"composition": ("--kind",), "circuit": ("--kind", "--layer", "--head")}
EXPORT_KINDS = {"composition": ("q", "k", "v"), "circuit": ("qk", "ov")}


def register(sub: Any) -> None:
    p = command_parser(sub, "export", "write heads, composition or circuit data to JSON or CSV, atomically",
                       "headscope export path --what composition --kind k --format csv --out results/")
    model_arg(p)
    raw_arg(p)
    p.add_argument("--what", choices=("heads", "composition", "circuit"), required=True)
    p.add_argument("--format", choices=("json", "csv"), default="json")
    p.add_argument("--out", default=".", type=args_types.output_dir, help="directory to write into (default: the current "
                   "directory; never the checkpoint's unless you name it)")
    p.add_argument("--kind", choices=("q", "k", "v", "qk", "ov"),
                   help="composition: q|k|v; circuit: qk|ov")
    p.add_argument("--layer", type=args_types.index, help="circuit: layer")
    p.add_argument("--head", type=args_types.index, help="circuit: head")
    p.add_argument("--basis", choices=("token", "position"), default="token")
    p.add_argument("--rows", type=args_types.token_spec, help="circuit rows, as for `headscope circuit`")
    p.add_argument("--cols", type=args_types.token_spec, help="circuit columns")
    p.add_argument("--seed", type=args_types.seed, default=0)
    p.add_argument("--ablation", action="store_true",
                   help="heads: add the zero-ablation effect column (a forward pass per head)")
    store_arg(p)
    quiet_arg(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from headscope.engine.api.report import circuit_dict, composition_dict, computed, head_table
    from headscope.engine.core.export import export_report
    from headscope.engine.core.requests import CircuitRequest, CompositionRequest

    if args.ablation and args.what != "heads":
        raise InvalidRequestError(None, "--ablation is a column of --what heads")
    check_export_options(args)
    model = open_for_command(args)
    name = Path(args.path).name or "model"
    suffix = "-raw" if args.raw else ""
    store = results_store(args)
    if args.what == "heads":
        with progress_bar(f"heads {name}", quiet=args.quiet) as progress:
            report: Any = head_table(model, seed=args.seed, ablation=args.ablation, store=store,
                                     progress=progress)
        stem = f"{name}-heads{suffix}"
    elif args.what == "composition":
        # before the bar; the ten strongest edges, as ``composition_report`` lists them
        req = CompositionRequest.of(model.structure(), args.kind, args.seed, 10, where=str(model.path))
        with progress_bar(f"{args.kind}-composition {name}", quiet=args.quiet) as progress:
            report = composition_dict(computed(model, req, store=store, progress=progress), args.seed)
        stem = f"{name}-{args.kind}-composition{suffix}"
    else:
        n = model.cfg.n_ctx if args.basis == "position" else model.cfg.d_vocab
        rows, cols = (parse_token_list(model, spec, n, args.basis) for spec in (args.rows, args.cols))
        with progress_bar(f"circuit {name}", quiet=args.quiet, determinate=False):
            circuit = CircuitRequest.of(model.structure(), args.layer, args.head, args.kind, args.basis,
                                        rows, cols, where=str(model.path))
            report = circuit_dict(computed(model, circuit), model)
        stem = f"{name}-L{args.layer}H{args.head}-{args.kind}-{args.basis}{suffix}"
    written = export_report(args.what, report, args.out, args.format, stem)
    print(written)
    return EXIT_OK


def check_export_options(args: argparse.Namespace) -> None:
    """A missing or mismatched option of ``--what`` is a usage error naming the flag, found
    before the model is opened (``--what composition`` without ``--kind`` used to exit 1 with
    ``composition kind must be q, k or v, not None``). A ``--kind`` of the wrong family
    (``--what composition --kind qk``) is the engine's validation error, the same one the API
    and the explorer give (tests/e2e/test_request_paths_agree.py)."""
    for flag in EXPORT_NEEDS.get(args.what, ()):
        if getattr(args, flag.lstrip("-")) is None:
            kinds = EXPORT_KINDS[args.what]
            example = f"{flag} {'|'.join(kinds)}" if flag == "--kind" else f"{flag} N"
            raise UsageError(flag, f"--what {args.what} needs {example}")
