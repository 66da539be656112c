"""``headscope path-patch PATH SENDER RECEIVER``: path patching of one composition edge
(tui/cli/patching.py: the inputs, the run and the table)."""

from __future__ import annotations

import argparse
from typing import Any

from headscope.tui.cli.args import head_ref
from headscope.tui.cli.options import command_parser, model_arg
from headscope.tui.cli.patching import emit_result, inputs, run_patching

EXAMPLE = "headscope path-patch sample_models/attn-only-2l L0.H1 L1.H2 --patch k --task first-occurrence"


def register(sub: Any) -> None:
    p = command_parser(sub, "path-patch", "path patching of a composition edge: the sender's clean "
                       "output enters only the receiver's query, key or value input; every other "
                       "path stays corrupt", EXAMPLE)
    model_arg(p)
    p.add_argument("sender", type=head_ref, help="the earlier head, e.g. L0.H1")
    p.add_argument("receiver", type=head_ref, help="the later head, e.g. L1.H2")
    p.add_argument("--patch", choices=("q", "k", "v"), default="q",
                   help="the receiver's input the sender's output enters (default q)")
    inputs(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    result = run_patching(args, "path-patch", site=args.patch, edge=(args.sender, args.receiver))
    return result if isinstance(result, int) else emit_result(args, result)
