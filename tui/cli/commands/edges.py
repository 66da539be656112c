"""``headscope edges PATH``: EAP or EAP-IG scores of every edge of the model's graph (docs/math.md,
"Edge attribution"), sorted by |score|, with ``--verify K`` the top K also patched exactly.
The prompt options are ``patch``'s (tui/cli/patching.py); the work is
``engine.api.report.edges_request`` (inputs resolved and validated: a problem is exit 2) and
``sweeps.edges.edges`` through the results store."""

from __future__ import annotations

import argparse
from typing import Any

from headscope.engine.core.errors import IndexOutOfRangeError, InvalidRequestError, PromptError
from headscope.tui.cli.cluster import add_cluster_args, cluster_from_args
from headscope.tui.cli.options import (
    command_parser,
    json_arg,
    model_arg,
    quiet_arg,
    raw_arg,
    store_arg,
)
from headscope.tui.cli.output import EXIT_OK, EXIT_USAGE, emit, open_for_command, say
from headscope.tui.cli.patching import command_line_problem, prompt_options, prompts
from headscope.tui.cli.progress import progress_bar
from headscope.tui.cli.store import results_store

EXAMPLES = [
    "headscope edges sample_models/attn-only-2l --task first-occurrence --method eap-ig --top 10 --verify 3",
    "headscope edges sample_models/attn-only-2l --clean \"cake card kite cup hotel mouse cake card kite cup "
    "hotel\" --corrupt \"cake card kite cup hotel mouse Ivy Jack shoe Ryan Lily\" --answer mouse --wrong Ivy "
    "--method eap",
    "headscope edges sample_models/attn-only-2l --prompts pairs.jsonl --method eap-ig --top 20 --workers 2",
]
BAD_INPUT = (InvalidRequestError, PromptError, IndexOutOfRangeError)


def method_options(p: argparse.ArgumentParser) -> None:
    """``--method`` and ``--steps`` (``edges`` and ``faithfulness``)."""
    p.add_argument("--method", choices=("eap", "eap-ig"), default="eap-ig",
                   help="eap: the gradient on the clean run; eap-ig (default): averaged over --steps "
                        "runs between the corrupt and the clean token embeddings")
    p.add_argument("--steps", type=int, default=5, metavar="N",
                   help="eap-ig: interpolation steps (default 5; at least 1)")


def common_options(p: argparse.ArgumentParser) -> None:
    prompt_options(p)
    json_arg(p)
    raw_arg(p)
    store_arg(p)
    quiet_arg(p)


def register(sub: Any) -> None:
    p = command_parser(sub, "edges", "edge attribution: score every edge of the model's graph (input, "
                       "heads' q/k/v, MLPs, logits) by how much corrupting it alone would change the "
                       "metric (EAP or EAP-IG), largest |score| first", EXAMPLES)
    model_arg(p)
    method_options(p)
    p.add_argument("--top", type=int, default=None, metavar="N", help="list the top N edges (default: all)")
    p.add_argument("--verify", type=int, default=0, metavar="K",
                   help="also patch the top K edges exactly (each alone corrupted on the clean run)")
    p.add_argument("--prompts", metavar="FILE",
                   help="score every prompt pair of FILE and average (JSON Lines with clean, corrupt, answer, "
                        "wrong; or those four columns separated by tabs); each pair is stored, and with "
                        "--scheduler/--workers each is one Dask task")
    common_options(p)
    add_cluster_args(p)
    p.set_defaults(handler=run)


def build(args: argparse.Namespace, command: str, make: Any, top: int | None = None, **more: Any) -> Any:
    """Open the model and build the request (``make``: ``edges_request`` or
    ``faithfulness_request``); a problem with the inputs is one line and exit 2."""
    problem = command_line_problem(args, command)
    if problem is not None:
        say(problem)
        return EXIT_USAGE
    from headscope.engine.core.validation import check_patchable

    model = open_for_command(args)
    check_patchable(model.structure(), str(model.path))  # an encoder: the model's fault, exit 1
    clean, corrupt = prompts(args)
    try:
        req = make(model, clean, corrupt, answer=args.answer, wrong=args.wrong, task=args.task,
                   method=args.method, steps=args.steps, seed=args.seed, seq_len=args.seq_len,
                   batch=args.batch, **more)
    except BAD_INPUT as err:
        say(err.one_line())
        return EXIT_USAGE
    if top is not None:
        from headscope.engine.api.report import edge_structure
        from headscope.engine.core.requests import edge_count

        n_edges = edge_count(edge_structure(model))
        if top > n_edges:
            say(f"{model.path}: --top {top} is larger than the graph's {n_edges} edges")
            return EXIT_USAGE
    with progress_bar(f"{command} {model.path.name}", quiet=args.quiet) as progress:
        return model.get(req, store=results_store(args), progress=progress)


def run(args: argparse.Namespace) -> int:
    from headscope.engine.api.report import edges_dict, edges_request

    if args.top is not None and args.top < 1:
        say(f"--top must be at least 1, not {args.top}")
        return EXIT_USAGE
    if args.prompts is not None:
        result = _over_prompts(args)
    elif getattr(args, "scheduler", None) or getattr(args, "workers", None):
        say("--scheduler and --workers send the pairs of --prompts FILE to a cluster: give --prompts")
        return EXIT_USAGE
    else:
        result = build(args, "edges", edges_request, top=args.top, verify=args.verify)
    if isinstance(result, int):
        return result
    report = edges_dict(result, args.top)
    if args.prompts is not None:
        report["prompts"] = result.scores.batch
    if not report["edges"] or all(row["score"] in (None, 0.0) for row in report["edges"]):
        args.warnings = [*getattr(args, "warnings", []),
                         f"the clean and corrupt runs give the same {report['metric']}: every score is 0"]
    if report["nonfinite"]:
        args.warnings = [*getattr(args, "warnings", []),
                         f"{len(report['nonfinite'])} edges had non-finite gradients: no score (null)"]
    emit(report, args.json, lambda: _table(report))
    return EXIT_OK


def _over_prompts(args: argparse.Namespace) -> Any:
    """``--prompts FILE``: the scores averaged over its pairs (``api.report.prompt_edges``), in
    process or on the cluster; a bad file or pair is one line and exit 2."""
    given = [flag for flag, value in (("--clean", args.clean), ("--corrupt", args.corrupt),
                                      ("--clean-tokens", args.clean_tokens), ("--corrupt-tokens", args.corrupt_tokens),
                                      ("--answer", args.answer), ("--wrong", args.wrong), ("--task", args.task))
             if value is not None]
    if args.verify:
        given.append("--verify")
    if given:
        say(f"--prompts FILE gives every pair's inputs: no {', '.join(given)} with it")
        return EXIT_USAGE
    from headscope.engine.api.report import prompt_edges
    from headscope.engine.core.validation import check_patchable

    model = open_for_command(args)
    check_patchable(model.structure(), str(model.path))
    try:
        with cluster_from_args(args) as cluster, \
                progress_bar(f"edges {model.path.name}", quiet=args.quiet) as progress:
            return prompt_edges(model, args.prompts, method=args.method, steps=args.steps,
                                store=results_store(args), progress=progress, cluster=cluster)
    except BAD_INPUT as err:
        say(err.one_line())
        return EXIT_USAGE


def _table(report: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    steps = f", {report['steps']} steps" if report["steps"] else ""
    columns = ["edge", f"{report['method']}{steps} score", "exact"]
    rows: list[list[Any]] = [["clean run", report["clean"], None], ["corrupt run", report["corrupt"], None]]
    rows += [[row["edge"], row["score"], row["exact"]] for row in report["edges"]]
    return columns, rows
