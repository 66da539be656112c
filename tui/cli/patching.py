"""``headscope patch`` and ``headscope path-patch``: activation, attribution and path patching
(docs/math.md, "Patching"): what the two commands (``patch`` and ``path-patch``)
share, their inputs, the run and the table. The work is
``engine.api.report.patch_request`` (inputs resolved and validated into one ``PatchRequest``) and
``computed`` (``sweeps.patch_runs.patch``, through the results store, under the request's key). ``--json`` prints
``api.report.patch_dict``; otherwise a table: the clean and corrupt runs' metric, then one
row per head (or set, or edge), most recovered first.

Exit codes: 2 for what is wrong with the command line, including inputs this model cannot
take (prompts of different lengths, an empty prompt, an answer of several tokens, an id out
of range, text for a model without a tokenizer); 1 for the model itself (an encoder, whose
positions all see the whole input, has no next-token metric to patch; non-finite
activations).
"""

from __future__ import annotations

import argparse
from typing import Any

from headscope.engine.core.errors import IndexOutOfRangeError, InvalidRequestError, PromptError
from headscope.engine.core.validation import BUILTIN_TASKS
from headscope.tui.cli import args as args_types
from headscope.tui.cli.options import json_arg, quiet_arg, raw_arg, store_arg
from headscope.tui.cli.output import EXIT_OK, EXIT_USAGE, emit, open_for_command, say
from headscope.tui.cli.progress import progress_bar
from headscope.tui.cli.store import results_store


def inputs(p: argparse.ArgumentParser) -> None:
    """The prompt, metric and run options both commands share."""
    prompt_options(p)
    p.add_argument("--noising", action="store_true",
                   help="run the clean input and patch in corrupt activations instead")
    json_arg(p)
    raw_arg(p)
    store_arg(p)
    quiet_arg(p)


def prompt_options(p: argparse.ArgumentParser) -> None:
    """The prompts, the metric's tokens and the built-in task (``patch``, ``path-patch``,
    ``edges``, ``faithfulness``)."""
    p.add_argument("--clean", metavar="TEXT", help="the clean prompt (with --corrupt, --answer, --wrong)")
    p.add_argument("--corrupt", metavar="TEXT", help="the corrupt prompt, the same number of tokens")
    p.add_argument("--clean-tokens", type=args_types.token_ids, metavar="IDS",
                   help="the clean input as token ids, e.g. 3,14,15")
    p.add_argument("--corrupt-tokens", type=args_types.token_ids, metavar="IDS",
                   help="the corrupt input as token ids")
    p.add_argument("--answer", metavar="TOK",
                   help="the metric is logit[answer] - logit[wrong] at the last position: a token "
                        "string or id, as --rows takes them; with --clean/--corrupt TEXT, digits "
                        "that are a vocabulary token are that token (said on stderr), and id:7 is "
                        "the id 7; with --clean-tokens IDS, digits are an id")
    p.add_argument("--wrong", metavar="TOK", help="the other token of the logit difference")
    p.add_argument("--task", choices=BUILTIN_TASKS, default=None,
                   help="a built-in task on seeded random tokens written twice (clean), without "
                        "prompts. induction (the default): corrupt keeps the first half and "
                        "redraws the second; the metric is the mean log-probability of the clean "
                        "next token over the second half. first-occurrence: corrupt redraws every "
                        "other token of the first half instead (so the path through an induction "
                        "head's keys carries the answer); the metric reads the second-half "
                        "positions whose answer it kept")
    p.add_argument("--seed", type=args_types.seed, default=0, help="seed of the task (default 0)")
    p.add_argument("--seq-len", type=args_types.count, default=None,
                   help="task: length of the repeated half (default min(32, n_ctx/2))")
    p.add_argument("--batch", type=args_types.count, default=4,
                   help="task: sequences averaged over (default 4)")


def _usage(message: str) -> int:
    say(message)  # escaped: the message may quote a token or a path
    return EXIT_USAGE


def _command_line_problem(args: argparse.Namespace, command: str) -> str | None:
    """What is wrong with the options themselves, before the model is opened."""
    if args.clean is not None and args.clean_tokens is not None:
        return "give the clean input as --clean TEXT or --clean-tokens IDS, not both"
    if args.corrupt is not None and args.corrupt_tokens is not None:
        return "give the corrupt input as --corrupt TEXT or --corrupt-tokens IDS, not both"
    clean = args.clean if args.clean is not None else args.clean_tokens
    corrupt = args.corrupt if args.corrupt is not None else args.corrupt_tokens
    if (clean is None) != (corrupt is None):
        return "give both a clean and a corrupt input (or neither, for the induction task)"
    if clean is not None and args.task is not None:
        return f"--task {args.task} makes its own inputs: no --clean/--corrupt with it"
    if clean is not None and (args.answer is None or args.wrong is None):
        return "with --clean and --corrupt, give the metric's --answer and --wrong tokens"
    if clean is None and (args.answer is not None or args.wrong is not None):
        return "--answer and --wrong go with --clean and --corrupt prompts"
    if command == "patch":
        if args.verify and args.method != "attribution":
            return "--verify checks attribution's estimates: add --method attribution"
        if args.method == "attribution" and (args.heads or args.by_position):
            return "attribution estimates every head alone: no --heads or --by-position with it"
    return None


def prompts(args: argparse.Namespace) -> tuple[Any, Any]:
    """The clean and corrupt inputs as given: text, id lists, or None (a task)."""
    clean = args.clean if args.clean is not None else _id_list(args.clean_tokens)
    corrupt = args.corrupt if args.corrupt is not None else _id_list(args.corrupt_tokens)
    return clean, corrupt


def command_line_problem(args: argparse.Namespace, command: str) -> str | None:
    """What is wrong with the prompt options themselves, before the model is opened."""
    return _command_line_problem(args, command)


def _request(model: Any, args: argparse.Namespace, **more: Any) -> Any:
    from headscope.engine.api.report import patch_request

    clean, corrupt = prompts(args)
    return patch_request(model, clean, corrupt, answer=args.answer, wrong=args.wrong, noising=args.noising,
                         task=args.task, seed=args.seed, seq_len=args.seq_len, batch=args.batch, **more)


def _id_list(text: str | None) -> list[int] | None:
    return None if text is None else [int(t) for t in text.split(",") if t.strip()]


def run_patching(args: argparse.Namespace, command: str, **more: Any) -> Any:
    """Open the model, resolve and validate the inputs (a problem with them: exit 2), patch."""
    from headscope.engine.api.report import computed
    from headscope.engine.core.validation import check_patchable

    problem = _command_line_problem(args, command)
    if problem is not None:
        return _usage(problem)
    model = open_for_command(args)
    check_patchable(model.structure(), str(model.path))  # an encoder: the model's fault, exit 1
    notes: list[str] = []
    try:
        req = _request(model, args, notes=notes, **more)
    except (InvalidRequestError, PromptError, IndexOutOfRangeError) as err:
        return _usage(err.one_line())
    for note in notes:  # words that became <unk>, digits read as a token: said once, before the run
        say(f"{model.path}: {note}", warning=True)
    with progress_bar(f"{command} {model.path.name}", quiet=args.quiet) as progress:
        return computed(model, req, store=results_store(args), progress=progress)


def emit_result(args: argparse.Namespace, result: Any) -> int:
    """Print ``result`` (JSON or the table); its note joins the warnings said at the end."""
    from headscope.engine.api.report import patch_dict

    report = patch_dict(result)
    if result.note:
        args.warnings = [*getattr(args, "warnings", []), result.note]
    emit(report, args.json, lambda: _table(result, getattr(args, "top", None)))
    return EXIT_OK


def _recovered_key(row: Any) -> float:
    return -row.recovered if row.recovered is not None else float("inf")


def _table(result: Any, top: int | None) -> tuple[list[str], list[list[Any]]]:
    """The clean and corrupt runs, then each row, most recovered first."""
    attribution = result.method == "attribution"
    what = {"path": "path", "attribution": "estimated"}.get(result.method, "patched")
    columns = ["heads", f"{result.metric} ({what})", "recovered"]
    if attribution:
        columns += ["exact", "exact recovered"]
    if any(r.positions is not None for r in result.rows):
        columns += ["recovered by position"]
    width = len(columns)
    rows: list[list[Any]] = [
        ["clean run", result.clean, 1.0 if result.recovered_defined else None],
        ["corrupt run", result.corrupt, 0.0 if result.recovered_defined else None],
    ]
    rows = [row + [None] * (width - len(row)) for row in rows]
    found = sorted(result.rows, key=_recovered_key)
    for row in found[:top] if top is not None else found:
        label = (f"{_node(row.heads[0])} → {_node(row.heads[1])} ({result.site})"
                 if result.method == "path" else row.label)
        line: list[Any] = [label, row.patched, row.recovered]
        if attribution:
            line += [row.exact, row.exact_recovered]
        if row.positions_recovered is not None:
            line += [" ".join("—" if v is None else f"{v:+.2f}" for v in row.positions_recovered)]
        rows.append(line + [None] * (width - len(line)))
    return columns, rows


def _node(key: tuple[int, int]) -> str:
    """A path's end: a head as ``L0.H1``, another node by its name (``core.path_nodes``)."""
    from headscope.engine.core.path_nodes import key_name

    return f"L{key[0]}.H{key[1]}" if key[1] >= 0 else key_name(key)
