"""The commands that print what the explorer shows: ``info``, ``heads``, ``composition``,
``forward``, ``circuit``, ``diff`` and ``export`` (tables in a terminal, TSV when piped, JSON
with ``--json``; each reads the model through the engine's facade, engine/api/)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from headscope.engine.core.errors import InvalidRequestError
from headscope.tui.cli.cache import results_store
from headscope.tui.cli.cluster import cluster_from_args
from headscope.tui.cli.output import (
    EXIT_OK,
    UsageError,
    emit,
    open_for_command,
    parse_token_list,
    say,
)
from headscope.tui.cli.progress import progress_bar


def cmd_info(args: argparse.Namespace) -> int:
    from headscope.engine.api.model import read_structure

    info = read_structure(args.path)
    emit(info, args.json, lambda: (["field", "value"], [[k, v] for k, v in info.items()]))
    return EXIT_OK


def cmd_heads(args: argparse.Namespace) -> int:
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


def cmd_composition(args: argparse.Namespace) -> int:
    from headscope.engine.api.report import composition_report

    model = open_for_command(args)
    with cluster_from_args(args) as cluster, \
            progress_bar(f"{args.kind}-composition {model.path.name}", quiet=args.quiet) as progress:
        note = getattr(progress, "note", None)
        on_tile = None if note is None or args.top == 0 else best_edges_so_far(
            note, model.cfg.d_model, model.cfg.d_head, args.seed, shown=min(2, args.top))
        report = composition_report(model, args.kind, top=args.top, seed=args.seed,
                                    store=results_store(args), progress=progress, cluster=cluster,
                                    on_tile=on_tile)
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


def cmd_forward(args: argparse.Namespace) -> int:
    from headscope.engine.api.report import forward_report
    from headscope.engine.core.validation import check_prompt

    model = open_for_command(args)
    if args.tokens is not None:
        try:
            tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
        except ValueError:
            raise InvalidRequestError(None, f"--tokens takes comma-separated ids, not {args.tokens!r}") from None
    else:
        check_prompt(args.prompt, str(model.path))
        tokens = model.tokenizer.encode(args.prompt)
        if len(tokens) > model.cfg.n_ctx:
            say(f"{model.path}: prompt truncated from {len(tokens)} to the context "
                f"of {model.cfg.n_ctx} tokens")
            tokens = tokens[: model.cfg.n_ctx]
    with progress_bar(f"forward {model.path.name}", quiet=args.quiet, determinate=False):
        report = forward_report(model, tokens)
    if args.prompt is not None:
        from headscope.tui.base.prompt_words import unknown_note

        note = unknown_note(args.prompt, list(report["token_strings"]))
        if note:
            say(f"{model.path}: {note}")

    def table() -> tuple[list[str], list[list[Any]]]:
        import numpy as np

        logits = np.asarray(report["logits"])
        top = logits.argmax(-1)
        return (
            ["pos", "token", "predicted next", "logit"],
            [[i, s, model.tokenizer.decode_token(int(t)), float(logits[i, t])]
             for i, (s, t) in enumerate(zip(report["token_strings"], top, strict=True))],
        )

    emit(report, args.json, table)
    return EXIT_OK


def cmd_circuit(args: argparse.Namespace) -> int:
    from headscope.engine.api.report import circuit_report

    model = open_for_command(args)
    n = model.cfg.n_ctx if args.basis == "position" else model.cfg.d_vocab
    rows, cols = (parse_token_list(model, spec, n, args.basis) for spec in (args.rows, args.cols))
    with progress_bar(f"circuit {model.path.name}", quiet=args.quiet, determinate=False):
        report = circuit_report(model, args.layer, args.head, args.kind, basis=args.basis,
                                rows=rows, cols=cols, offset=args.offset)

    def table() -> tuple[list[str], list[list[Any]]]:
        return (["row \\ col", *report["col_labels"]],
                [[label, *vals] for label, vals in zip(report["row_labels"], report["values"], strict=True)])

    emit(report, args.json, table)
    return EXIT_OK


def cmd_diff(args: argparse.Namespace) -> int:
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


def cmd_export(args: argparse.Namespace) -> int:
    from headscope.engine.api.report import circuit_report, composition_report, head_table
    from headscope.engine.core.export import export_report
    from headscope.engine.core.requests import CompositionRequest

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
        CompositionRequest.of(model.structure(), args.kind, where=str(model.path))  # before the bar
        with progress_bar(f"{args.kind}-composition {name}", quiet=args.quiet) as progress:
            report = composition_report(model, args.kind, seed=args.seed, store=store,
                                        progress=progress)
        stem = f"{name}-{args.kind}-composition{suffix}"
    else:
        n = model.cfg.n_ctx if args.basis == "position" else model.cfg.d_vocab
        rows, cols = (parse_token_list(model, spec, n, args.basis) for spec in (args.rows, args.cols))
        with progress_bar(f"circuit {name}", quiet=args.quiet, determinate=False):
            report = circuit_report(model, args.layer, args.head, args.kind, basis=args.basis,
                                    rows=rows, cols=cols)
        stem = f"{name}-L{args.layer}H{args.head}-{args.kind}-{args.basis}{suffix}"
    written = export_report(args.what, report, args.out, args.format, stem)
    print(written)
    return EXIT_OK


# The options each ``export --what`` needs, and the --kind values it takes.
EXPORT_NEEDS = {"composition": ("--kind",), "circuit": ("--kind", "--layer", "--head")}
EXPORT_KINDS = {"composition": ("q", "k", "v"), "circuit": ("qk", "ov")}


def check_export_options(args: argparse.Namespace) -> None:
    """A missing or mismatched option of ``--what`` is a usage error naming the flag, found
    before the model is opened (``--what composition`` without ``--kind`` used to exit 1 with
    ``composition kind must be q, k or v, not None``). A ``--kind`` of the wrong family
    (``--what composition --kind qk``) is the engine's validation error, the same one the API
    and the explorer give (tests/test_requests.py)."""
    for flag in EXPORT_NEEDS.get(args.what, ()):
        if getattr(args, flag.lstrip("-")) is None:
            kinds = EXPORT_KINDS[args.what]
            example = f"{flag} {'|'.join(kinds)}" if flag == "--kind" else f"{flag} N"
            raise UsageError(flag, f"--what {args.what} needs {example}")
