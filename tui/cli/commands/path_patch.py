"""``headscope path-patch PATH SENDER RECEIVER``: path patching of one edge of the graph
``headscope edges`` scores (tui/cli/patching.py: the inputs, the run and the table)."""

from __future__ import annotations

import argparse
from typing import Any

from headscope.tui.cli.args import head_ref
from headscope.tui.cli.options import command_parser, model_arg
from headscope.tui.cli.patching import emit_result, inputs, run_patching

EXAMPLE = "headscope path-patch sample_models/attn-only-2l L0.H1 L1.H2 --patch k --task first-occurrence"


def register(sub: Any) -> None:
    p = command_parser(sub, "path-patch", "path patching of an edge: the sender's clean output enters "
                       "only the receiver's input (a head's query, key or value, an MLP, the logits); "
                       "every other path stays corrupt (--noising: the reverse, as headscope edges "
                       "--verify checks an edge)", EXAMPLE)
    model_arg(p)
    p.add_argument("sender", type=node_ref, help="the earlier head, e.g. L0.H1 (or a0.h1), or input or m0")
    p.add_argument("receiver", type=node_ref, help="the later head, e.g. L1.H2 (or a1.h2, a1.h2<k>), or m1 or logits")
    p.add_argument("--patch", choices=("q", "k", "v"), default="q",
                   help="the receiving head's input the sender's output enters (default q)")
    inputs(p)
    p.set_defaults(handler=run)


def node_ref(text: str) -> tuple[int, int] | str:
    """A head (``"L0.H1"``, ``"0.1"``: a pair) or a node's name (``a0.h1``, ``a1.h2<k>``,
    ``input``, ``m0``, ``logits``); anything else is a usage error."""
    from headscope.engine.core.errors import InvalidRequestError
    from headscope.engine.core.path_nodes import path_node

    try:
        return head_ref(text)
    except argparse.ArgumentTypeError:
        pass
    try:
        path_node(text)
    except InvalidRequestError as err:
        raise argparse.ArgumentTypeError(err.one_line()) from None
    return text


def run(args: argparse.Namespace) -> int:
    result = run_patching(args, "path-patch", site=args.patch, edge=(args.sender, args.receiver))
    return result if isinstance(result, int) else emit_result(args, result)
