"""The ``headscope`` command line.

``headscope [PATH]`` opens the explorer (no PATH: the bundled ``attn-only-2l``); the
subcommands print what the explorer shows, as tables in a terminal, TSV when piped, or JSON
with ``--json``. Every error is one line on stderr naming the file and the problem.

Exit codes: 0 success · 1 the model or request is at fault (the message says how) ·
2 command-line usage error · 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from headscope.engine.core.errors import HeadscopeError, InvalidRequestError, out_of_memory
from headscope.engine.core.validation import EDGE_THRESHOLD
from headscope.tui.base.datatext import printable, tsv_field
from headscope.tui.cli import args as args_types
from headscope.tui.cli import reading as cli_reading
from headscope.tui.cli import timeline as cli_timeline
from headscope.tui.cli.cache import (
    add_cache_parser,
    add_quiet_arg,
    add_store_args,
    cmd_cache,
    results_store,
)
from headscope.tui.cli.cluster import add_cluster_args, cluster_from_args
from headscope.tui.cli.progress import progress_bar

EXIT_OK, EXIT_MODEL_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
COMMANDS = ("open", "info", "heads", "composition", "forward", "circuit", "diff", "export", "serve",
            "timeline", "cache", "svd", "path")

THEME_HELP = ("headscope-dark", "headscope-light", "headscope-contrast", "headscope-colorblind")

EPILOG = """\
examples:
  headscope                                   explore the bundled attn-only-2l model
  headscope --head 1.2                        ...opened on its induction head
  headscope path/to/hf-model --raw            explore a checkpoint without weight processing
  headscope info path/to/model --json         architecture and shapes (reads no tensor data)
  headscope heads sample_models/attn-only-2l --sort induction_score
  headscope heads sample_models/attn-only-2l --sort ablation_effect   (zero-ablates each head)
  headscope composition sample_models/attn-only-2l --kind k --top 5
  headscope circuit sample_models/attn-only-2l 1 2 --kind ov --rows Mary,John --cols Mary,John
  headscope forward sample_models/attn-only-2l --prompt "When Mary and John" --json
  headscope cache ls                          stored sweep results (scores, composition, ablation)
  headscope svd sample_models/attn-only-2l 1 2 --kind ov --k 5 --top 10
  headscope path sample_models/attn-only-2l L0.H1 L1.H2   (the induction mechanism's K-path)

exit codes: 0 ok, 1 bad model file or request (one line on stderr), 2 usage, 130 interrupted
"""


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("headscope")
    except PackageNotFoundError:  # running from a source tree without install
        return "0+unknown"


# ----------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="headscope",
        description="Explore the attention circuits of transformer language models "
        "(safetensors checkpoints only: native, GPT-2, GPT-NeoX/Pythia, Llama/Mistral/Qwen2, BERT).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"headscope {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, help: str, example: str) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            help=help,
            description=help,
            epilog=f"example:\n  {example}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        return p

    def model_arg(p: argparse.ArgumentParser, optional: bool = False) -> None:
        if optional:
            p.add_argument("path", nargs="?", help="model directory, .safetensors or .gguf file "
                           "(default: the bundled attn-only-2l)")
        else:
            p.add_argument("path", help="model directory, .safetensors or .gguf file")

    def processing_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--raw", action="store_true",
                       help="use the weights as stored (no LayerNorm folding or centring)")

    def json_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")

    p = command("open", "open the terminal explorer (the default command)", "headscope open path/to/model")
    model_arg(p, optional=True)
    processing_args(p)
    p.add_argument("--theme", type=theme_arg,
                   help="colour theme: " + ", ".join(THEME_HELP) + " (or dark, light, "
                        "contrast, colorblind)")
    p.add_argument("--colors", choices=("truecolor", "256", "16", "none"), default=None,
                   help="heatmap colours (default: detected from the terminal; 256 uses a "
                        "lightness-ordered palette ramp, 16 and none draw shades ░▒▓█)")
    p.add_argument("--compare", metavar="B", default=None,
                   help="a second checkpoint of the same architecture, explored alongside "
                        "(Changes tab, Δ badges, A|B heatmaps)")
    p.add_argument("--head", metavar="L.H", type=layer_head, default=None,
                   help="open focused on this head, e.g. --head 1.2 (default: L0.H0)")
    p.add_argument("--match-heads", action="store_true",
                   help="with --compare: pair B's heads with A's by circuit similarity "
                        "(Hungarian, per layer), for checkpoints from independent runs")
    p.add_argument("--timeline", metavar="PATH", nargs="+", default=None,
                   help="a directory of training checkpoints (step-*/checkpoint-* "
                        "subdirectories) or several checkpoints in order: open the last step "
                        "with a Timeline tab, { } scrub")

    p = command("info", "architecture, shapes and dtype, from the header alone", "headscope info path/to/model --json")
    model_arg(p)
    json_arg(p)

    p = command("heads", "every head with its copying, QK-positivity, previous-token, "
                "duplicate-token and induction scores", "headscope heads path --sort induction_score")
    model_arg(p)
    json_arg(p)
    processing_args(p)
    p.add_argument("--sort", metavar="KEY", help="sort descending by a score column, e.g. induction_score")
    p.add_argument("--seed", type=args_types.seed, default=0, help="seed of the random token sequences (default 0)")
    p.add_argument("--ablation", action="store_true",
                   help="add ablation_effect: the loss increase on the repeated half of the random "
                        "sequences when the head is zero-ablated (a forward pass per head; implied "
                        "by --sort ablation_effect)")
    p.add_argument("--no-behaviour", action="store_true",
                   help="only the weight-based scores (copying_score, qk_positivity): no forward "
                        "pass, and no wait for torch")
    add_store_args(p)
    add_cluster_args(p)
    add_quiet_arg(p)

    p = command("composition", "Q-, K- or V-composition scores between heads of different layers",
                "headscope composition path --kind k --top 5")
    model_arg(p)
    json_arg(p)
    processing_args(p)
    p.add_argument("--kind", choices=("q", "k", "v"), required=True)
    p.add_argument("--top", type=args_types.count, default=10, help="how many top edges to list (default 10)")
    p.add_argument("--seed", type=args_types.seed, default=0, help="seed of the random baseline (default 0)")
    add_store_args(p)
    add_cluster_args(p)
    add_quiet_arg(p)

    p = command("forward", "logits and attention patterns for a token sequence",
                "headscope forward path --tokens 3,14,15,92 --json")
    model_arg(p)
    json_arg(p)
    processing_args(p)
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--tokens", type=args_types.token_ids, help="comma-separated token ids, e.g. 3,14,15,92")
    group.add_argument("--prompt", help="text, encoded with the model's tokenizer")
    add_quiet_arg(p)

    p = command("circuit", "a block of a head's QK or OV circuit",
                "headscope circuit path 1 4 --kind qk --basis position --rows 0:16 --cols 0:16")
    model_arg(p)
    p.add_argument("layer", type=args_types.index)
    p.add_argument("head", type=args_types.index)
    json_arg(p)
    processing_args(p)
    p.add_argument("--kind", choices=("qk", "ov"), required=True)
    p.add_argument("--basis", choices=("token", "position"), default="token")
    p.add_argument("--rows", type=args_types.token_spec,
                   help="ids (3,14), ranges (0:20) or tokens (Mary,John); default the first 24")
    p.add_argument("--cols", type=args_types.token_spec, help="as --rows")
    p.add_argument("--offset", type=args_types.offset, default=0, help="rotary models: query-key offset Δ")
    add_quiet_arg(p)

    p = command("diff", "compare the circuits of two checkpoints with the same head layout "
                "(after pruning, distillation or more training)",
                "headscope diff original/ pruned/ --json")
    p.add_argument("path", help="checkpoint A (the reference)")
    p.add_argument("other", help="checkpoint B")
    json_arg(p)
    processing_args(p)
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
    add_store_args(p)
    add_cluster_args(p)
    add_quiet_arg(p)

    p = command("export", "write heads, composition or circuit data to JSON or CSV, atomically",
                "headscope export path --what composition --kind k --format csv --out results/")
    model_arg(p)
    processing_args(p)
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
    add_store_args(p)
    add_quiet_arg(p)

    p = command("serve", "serve the explorer to a web browser (textual-serve), on 127.0.0.1 by default",
                "headscope serve path --port 8000")
    model_arg(p, optional=True)
    processing_args(p)
    p.add_argument("--port", type=args_types.port, default=8000)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; others need --allow-remote)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow binding to a non-loopback address: anyone who can reach it can "
                        "use the explorer")
    cli_timeline.add_parser(sub)
    add_cache_parser(sub)
    cli_reading.add_parsers(sub)
    return parser


def normalise_argv(argv: Sequence[str]) -> list[str]:
    """``headscope PATH ...`` and bare ``headscope`` mean ``headscope open ...``."""
    argv = list(argv)
    first = next((a for a in argv if not a.startswith("-")), None)
    if any(a in ("-h", "--help", "--version") for a in argv) and (first is None or first not in COMMANDS):
        return argv if first is None else ["open", *argv]
    if first is None or first not in COMMANDS:
        return ["open", *argv]
    return argv


# ----------------------------------------------------------------------------- output


def emit(data: Any, as_json: bool, table: Callable[[], tuple[list[str], list[list[Any]]]] | None) -> None:
    """JSON when asked (or when there is no tabular form), else a Rich table or TSV."""
    from headscope.engine.core.export import jsonable

    if as_json or table is None:
        json.dump(jsonable(data), sys.stdout, allow_nan=False)
        sys.stdout.write("\n")
        return
    columns, rows = table()
    if sys.stdout.isatty():
        from headscope.tui.cli.table import print_table

        print_table(columns, [[_cell(v) for v in row] for row in rows])
    else:
        print("\t".join(tsv_field(c) for c in columns))
        for row in rows:
            print("\t".join(tsv_field(_cell(v)) for v in row))


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4f}"
    if isinstance(v, list | tuple) and len(v) == 2:  # a head: [layer, head]
        return f"L{v[0]}.H{v[1]}"
    return "" if v is None else str(v)


def parse_token_list(model: Any, spec: str | None, n: int, basis: str) -> list[int] | None:
    """``3,14`` ids, ``0:20`` ranges, or token strings (token basis) — mixed freely."""
    if spec is None:
        return None
    out: list[int] = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        if ":" in item and all(p.strip().lstrip("-").isdigit() for p in item.split(":", 1)):
            a, b = (int(p) for p in item.split(":", 1))
            out.extend(range(a, min(b, n)))
        elif item.lstrip("-").isdigit():
            out.append(int(item))
        elif basis == "token":
            tid = model.tokenizer.token_to_id(item)
            if tid is None:
                raise InvalidRequestError(str(model.path), f"token {item!r} is not in the vocabulary")
            out.append(tid)
        else:
            raise InvalidRequestError(str(model.path), f"position {item!r} is not a number")
    return out


def theme_arg(text: str) -> str:
    """``--theme``: a theme name or alias (argparse type: an unknown one is a usage error)."""
    from headscope.themes import ALIASES, THEME_NAMES

    name = ALIASES.get(text, text)
    if name not in THEME_NAMES:
        raise argparse.ArgumentTypeError(
            f"unknown theme {text!r}; themes: {', '.join(THEME_NAMES)}")
    return name


def unknown_command(argv: Sequence[str]) -> str | None:
    """``headscope head …`` where ``head`` is no file: the closest subcommand, if any."""
    import difflib

    first = argv[0] if argv and not argv[0].startswith("-") else None  # not an option's value
    if first is None or first in COMMANDS or Path(first).exists():
        return None
    close = difflib.get_close_matches(first, COMMANDS, n=1, cutoff=0.6)
    return f"unknown command {first!r}; did you mean {close[0]!r}?" if close else None


def layer_head(text: str) -> tuple[int, int]:
    """``"1.2"`` → ``(1, 2)`` (argparse type: a malformed value is a usage error)."""
    try:
        layer, head = (int(part) for part in text.split("."))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not LAYER.HEAD, e.g. 1.2") from None
    if layer < 0 or head < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: layer and head count from 0")
    return layer, head


# ----------------------------------------------------------------------------- commands


def cmd_open(args: argparse.Namespace) -> int:
    from headscope.sample_models import bundled_model
    from headscope.tui.app import run_app

    path = Path(args.path) if args.path else bundled_model()
    for given in (args.path, args.compare):  # before any screen: a typo is one line, exit 1
        if given and not Path(given).exists():
            raise InvalidRequestError(given, "no such file or directory (commands: "
                                      + ", ".join(COMMANDS) + ")")
    if args.match_heads and not args.compare:
        raise InvalidRequestError(None, "--match-heads needs --compare B")
    if args.compare:
        check_same_layout(path, Path(args.compare))
    options: dict[str, Any] = {"match_heads": True} if args.match_heads else {}
    if args.timeline is not None:
        from headscope.tui.screens.timeline import open_timeline

        options["timeline"] = open_timeline(args.timeline, args.path, args.compare)
    if args.head is not None:
        options["head"] = args.head
    if args.colors:
        options["colors"] = args.colors
    from headscope.tui.base.prompt_words import default_prompt

    options["prompt"] = default_prompt(path)  # the sample models: the README's repeated phrase
    run_app(path, raw=args.raw, theme=args.theme, compare=args.compare, **options)
    args.exit_now = True  # the explorer has closed: see main()
    return EXIT_OK


def check_same_layout(a: Path, b: Path) -> None:
    """Compare mode, like ``diff``: refused before any screen when the head layouts differ
    (headers only, no torch)."""
    from headscope.engine.api.model import read_structure

    sa, sb = read_structure(a), read_structure(b)
    la, lb = (sa["n_layers"], sa["n_heads"]), (sb["n_layers"], sb["n_heads"])
    if la != lb:
        raise InvalidRequestError(
            str(a), f"cannot compare with {b}: different head layouts: {la[0]}×{la[1]} vs "
            f"{lb[0]}×{lb[1]} (layers × heads); only models with the same layout can be "
            "compared head by head")


def cmd_info(args: argparse.Namespace) -> int:
    from headscope.engine.api.model import read_structure

    info = read_structure(args.path)
    emit(info, args.json, lambda: (["field", "value"], [[k, v] for k, v in info.items()]))
    return EXIT_OK


def _open(args: argparse.Namespace) -> Any:
    from headscope.engine.api.model import open_model

    model = open_model(args.path, raw=getattr(args, "raw", False))
    # e.g. an unusable tokenizer (ids are shown instead): said once the command succeeded
    # (a command that fails on it already names the reason in its one error line)
    args.warnings = [*getattr(args, "warnings", []), *model.warnings]
    return model


def cmd_heads(args: argparse.Namespace) -> int:
    from headscope.engine.api.report import head_table, sort_rows
    from headscope.engine.core.validation import (
        ABLATION_EFFECT,
        SCORE_NAMES,
        Z_NAMES,
        check_sort_key,
    )

    if args.no_behaviour:
        return _weight_heads(args)
    ablation = args.ablation or args.sort == ABLATION_EFFECT
    check_sort_key(args.sort, [*SCORE_NAMES, *Z_NAMES, ABLATION_EFFECT])  # before the model is opened
    model = _open(args)
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
    """``heads --no-behaviour``: the weight-only scores (engine/fast.py: no torch import)."""
    from headscope.engine.api.report import WEIGHT_SCORE_NAMES, sort_rows, weight_table
    from headscope.engine.core.validation import check_sort_key

    if args.ablation:
        raise InvalidRequestError(None, "--ablation runs the model: it cannot go with --no-behaviour")
    check_sort_key(args.sort, list(WEIGHT_SCORE_NAMES))
    model = _open(args)
    with progress_bar(f"heads {model.path.name}", quiet=args.quiet) as progress:
        rows = sort_rows(weight_table(model, store=results_store(args), progress=progress), args.sort)
    columns = ["layer", "head", *WEIGHT_SCORE_NAMES, "nonfinite"]
    emit(rows, args.json, lambda: (columns, [[r[c] for c in columns] for r in rows]))
    return EXIT_OK


def cmd_composition(args: argparse.Namespace) -> int:
    from headscope.engine.api.report import composition_report

    model = _open(args)
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

    model = _open(args)
    if args.tokens is not None:
        try:
            tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
        except ValueError:
            raise InvalidRequestError(None, f"--tokens takes comma-separated ids, not {args.tokens!r}") from None
    else:
        check_prompt(args.prompt, str(model.path))
        tokens = model.tokenizer.encode(args.prompt)
        if len(tokens) > model.cfg.n_ctx:
            print(f"headscope: {model.path}: prompt truncated from {len(tokens)} to the context "
                  f"of {model.cfg.n_ctx} tokens", file=sys.stderr)
            tokens = tokens[: model.cfg.n_ctx]
    with progress_bar(f"forward {model.path.name}", quiet=args.quiet, determinate=False):
        report = forward_report(model, tokens)
    if args.prompt is not None:
        from headscope.tui.base.prompt_words import unknown_note

        note = unknown_note(args.prompt, list(report["token_strings"]))
        if note:
            print(f"headscope: {model.path}: {note}", file=sys.stderr)

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

    model = _open(args)
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
    from headscope.engine.core.validation import check_composition_kind

    if args.ablation and args.what != "heads":
        raise InvalidRequestError(None, "--ablation is a column of --what heads")
    if args.what == "circuit" and (args.kind is None or args.layer is None or args.head is None):
        raise InvalidRequestError(None, "--what circuit needs --kind qk|ov, --layer and --head")
    model = _open(args)
    name = Path(args.path).name or "model"
    suffix = "-raw" if args.raw else ""
    store = results_store(args)
    if args.what == "heads":
        with progress_bar(f"heads {name}", quiet=args.quiet) as progress:
            report: Any = head_table(model, seed=args.seed, ablation=args.ablation, store=store,
                                     progress=progress)
        stem = f"{name}-heads{suffix}"
    elif args.what == "composition":
        check_composition_kind(args.kind, str(model.path))
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


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def cmd_serve(args: argparse.Namespace) -> int:
    import shlex

    if args.host not in LOOPBACK and not args.allow_remote:
        raise InvalidRequestError(
            None, f"refusing to bind {args.host}: pass --allow-remote to serve beyond this machine"
        )
    try:
        import textual_serve.server  # noqa: F401
    except ImportError:
        raise InvalidRequestError(
            None, "headscope serve needs textual-serve: pip install 'headscope[serve]'"
        ) from None
    from headscope.sample_models import bundled_model

    path = Path(args.path) if args.path else bundled_model()
    command = [sys.executable, "-m", "headscope.tui.cli.main", "open", str(path.resolve())]
    if args.raw:
        command.append("--raw")
    from headscope.tui.cli.serve import serve

    serve(shlex.join(command), host=args.host, port=args.port, title=f"headscope · {path.name}")
    return EXIT_OK


HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "export": cmd_export,
    "serve": cmd_serve,
    "diff": cmd_diff,
    "open": cmd_open,
    "info": cmd_info,
    "heads": cmd_heads,
    "composition": cmd_composition,
    "forward": cmd_forward,
    "circuit": cmd_circuit,
    "timeline": cli_timeline.run,
    "cache": cmd_cache,
    "svd": cli_reading.run_svd,
    "path": cli_reading.run_path,
}


def exit_now(code: int) -> None:
    """Quit feels instant: after the explorer closed (terminal restored, engines told to
    stop, their threads daemons), skip the interpreter's teardown of torch & co. (~0.6 s of
    a blank terminal)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    from_shell = argv is None  # the console script (not a test, not the Python API)
    argv = list(sys.argv[1:] if argv is None else argv)
    typo = unknown_command(argv)
    if typo:
        print(f"headscope: {typo}", file=sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(normalise_argv(argv))
    try:
        code = HANDLERS[args.command](args)
        for warning in getattr(args, "warnings", []):
            print(f"headscope: warning: {printable(warning)}", file=sys.stderr)
        if getattr(args, "exit_now", False) and from_shell:
            exit_now(code)
        return code
    except HeadscopeError as err:
        print(f"headscope: {err.one_line()}", file=sys.stderr)
        return EXIT_MODEL_ERROR
    except (MemoryError, RuntimeError) as err:  # torch's allocator raises RuntimeError
        oom = out_of_memory(err, getattr(args, "path", None), f"headscope {args.command}")
        if oom is None:
            raise
        print(f"headscope: {oom.one_line()}", file=sys.stderr)
        return EXIT_MODEL_ERROR
    except KeyboardInterrupt:
        print("headscope: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `headscope heads ... | head`
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
