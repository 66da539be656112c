"""``headscope svd`` and ``headscope path``: reading a head (docs/math.md, "Reading a head").

Registered by ``tui/cli/main.py`` (``add_parsers`` and ``HANDLERS``); the work is
``engine.api.report.svd_report`` / ``path_report``. ``--json`` prints the report; otherwise a
table: one row per singular direction (its tokens each side), or the path's scores and the
K-path block.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

SVD_EXAMPLE = "headscope svd sample_models/attn-only-2l 1 2 --kind ov --k 5 --top 10 --json"
PATH_EXAMPLE = "headscope path sample_models/attn-only-2l L0.H1 L1.H2 --json"
_HEAD = re.compile(r"^[Ll]?(\d+)\.[Hh]?(\d+)$")


def head_ref(text: str) -> tuple[int, int]:
    """``"L0.H1"`` or ``"0.1"`` → ``(0, 1)`` (argparse type: a malformed value is a usage error)."""
    match = _HEAD.match(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a head: write L1.H2 or 1.2")
    return int(match.group(1)), int(match.group(2))


def add_parsers(subparsers: Any) -> None:
    """The ``svd`` and ``path`` subcommands on ``headscope``'s subparsers."""
    help_text = ("a head's top singular directions as tokens: what each direction reads "
                 "(OV: source tokens, QK: query tokens) and writes (OV: predicted tokens, QK: key tokens)")
    p = subparsers.add_parser("svd", help=help_text, description=help_text,
                              epilog=f"example:\n  {SVD_EXAMPLE}",
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", help="model directory, .safetensors or .gguf file")
    p.add_argument("layer", type=int)
    p.add_argument("head", type=int)
    p.add_argument("--kind", choices=("ov", "qk"), default="ov")
    p.add_argument("--k", type=int, default=5, help="how many directions (default 5)")
    p.add_argument("--top", type=int, default=10, help="tokens listed each side (default 10)")
    _common(p)

    help_text = ("two heads in different layers read as one: the V-composition virtual OV "
                 "circuit and the K-composition path (does a token attend where head A moved it?)")
    p = subparsers.add_parser("path", help=help_text, description=help_text,
                              epilog=f"example:\n  {PATH_EXAMPLE}",
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", help="model directory, .safetensors or .gguf file")
    p.add_argument("source", type=head_ref, help="the earlier head, e.g. L0.H1")
    p.add_argument("target", type=head_ref, help="the later head, e.g. L1.H2")
    p.add_argument("--rows", help="query tokens of the K-path block, as for `headscope circuit`")
    p.add_argument("--cols", help="key-side tokens of the K-path block")
    p.add_argument("--seed", type=int, default=0, help="seed of the diagonal's token sample (default 0)")
    _common(p)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--raw", action="store_true",
                   help="use the weights as stored (no LayerNorm folding or centring)")


def _open(args: argparse.Namespace) -> Any:
    from headscope.engine.api.model import open_model

    return open_model(args.path, raw=args.raw)


def _tokens(tokens: list[dict[str, Any]]) -> str:
    return " ".join(f"{t['token']!r}({t['value']:+.2f})" for t in tokens)


def run_svd(args: argparse.Namespace) -> int:
    from headscope.engine.api.report import svd_report
    from headscope.tui.cli.output import emit

    report = svd_report(_open(args), args.layer, args.head, args.kind, k=args.k, top=args.top)

    def table() -> tuple[list[str], list[list[Any]]]:
        rows = [[d["direction"], d["sigma"], d["overlap"], _tokens(d["in_tokens"]), _tokens(d["out_tokens"])]
                for d in report["directions"]]
        return ["direction", "sigma", "overlap", "reads (in)", "writes (out)"], rows

    emit(report, args.json, table)
    return 0


def run_path(args: argparse.Namespace) -> int:
    from headscope.engine.api.report import path_report
    from headscope.tui.cli.output import emit, parse_token_list

    model = _open(args)
    n = model.cfg.d_vocab
    report = path_report(model, args.source, args.target,
                         rows=parse_token_list(model, args.rows, n, "token"),
                         cols=parse_token_list(model, args.cols, n, "token"), seed=args.seed)

    def table() -> tuple[list[str], list[list[Any]]]:
        k, v = report["k_composition"], report["v_composition"]
        rows: list[list[Any]] = [
            ["V-path copying score", v["copying_score"]],
            ["K-path positivity", k["positivity"]],
            ["K-path diagonal rate", k["diagonal"]],
        ]
        rows += [[f"K-path {label} → max key", k["col_labels"][max(range(len(vals)), key=vals.__getitem__)]]
                 for label, vals in zip(k["row_labels"], k["values"], strict=True) if vals]
        return ["", "value"], rows

    emit(report, args.json, table)
    return 0
