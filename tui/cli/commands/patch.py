"""``headscope patch PATH``: activation (or attribution) patching of every head, or of the
sets ``--heads`` names (tui/cli/patching.py: the inputs, the run and the table)."""

from __future__ import annotations

import argparse
from typing import Any

from headscope.engine.core.validation import PATCH_SITES
from headscope.tui.cli import args as args_types
from headscope.tui.cli.options import command_parser, model_arg
from headscope.tui.cli.patching import emit_result, inputs, run_patching

EXAMPLES = [
    "headscope patch sample_models/attn-only-2l --clean \"cake card kite cup hotel mouse cake card "
    "kite cup hotel\" --corrupt \"cake card kite cup hotel mouse Ivy Jack shoe Ryan Lily\" "
    "--answer mouse --wrong Ivy",
    "headscope patch sample_models/attn-only-2l --heads L1.H1,L1.H2",
    "headscope patch sample_models/attn-only-2l --method attribution --verify 3",
]


def register(sub: Any) -> None:
    p = command_parser(sub, "patch", "activation patching of every head: run the corrupt input "
                       "with one head's clean activation (denoising; --noising the reverse) and "
                       "report how much of the clean metric it recovers", EXAMPLES)
    model_arg(p)
    p.add_argument("--site", choices=PATCH_SITES, default="out",
                   help="what is patched: the head's output z (out, default), its queries, keys, "
                        "values or attention pattern")
    p.add_argument("--method", choices=("exact", "attribution"), default="exact",
                   help="exact patching (default), or attribution patching: a first-order "
                        "estimate of every head from one backward pass")
    p.add_argument("--verify", type=args_types.count, default=0, metavar="K",
                   help="with --method attribution: patch the top K heads by |estimate| exactly too")
    p.add_argument("--heads", action="append", metavar="L.H,...",
                   help="patch these heads together, e.g. L1.H1,L1.H2 (repeat for more sets; "
                        "default: every head alone)")
    p.add_argument("--by-position", action="store_true",
                   help="also patch each position alone and report each")
    inputs(p)
    p.add_argument("--top", type=args_types.count, default=None,
                   help="rows of the table (default: all; --json has every row)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    result = run_patching(args, "patch", site=args.site, method=args.method, verify=args.verify,
                          heads=args.heads, by_position=args.by_position)
    return result if isinstance(result, int) else emit_result(args, result)
