"""``headscope qk-attribution PATH L.H (--prompt TEXT | --tokens IDS) --query Q --key K``: why a
head scores key K from query Q on a prompt (docs/math.md, "QK attribution"); the work is
``Model.qk_attribution``. ``--json`` prints the score, every term (query source × key
source, largest |term| first; ``--top`` keeps the first N) and each side's totals (always
all of them); otherwise the same as a table of terms and a table of totals. ``--confirm N``
removes each side's top N sources (by |total| at the key) from that side exactly and prints
the score's drop beside the totals, the norm's scale frozen (equal to the total) and
recomputed (the real intervention); in JSON ``"exact": {"query": {source: {"frozen": drop,
"recomputed": drop}}, "key": {...}}``. A non-finite value is null in JSON and
``non-finite`` in a table, with a warning: never a number."""

from __future__ import annotations

import argparse
import math
from typing import Any

from headscope.tui.base.datatext import printable
from headscope.tui.cli.args import count, head_ref, index, token_ids
from headscope.tui.cli.options import command_parser, json_arg, model_arg, raw_arg
from headscope.tui.cli.output import EXIT_OK, emit, open_for_command

EXAMPLE = ('headscope qk-attribution sample_models/attn-only-2l L1.H2 '
           '--tokens 5,9,2,33,7,5,9,2,33,7 --query 7 --key 3 --top 5')
TOP = 10  # terms in the table unless --top says otherwise (--json: every term)


def register(sub: Any) -> None:
    p = command_parser(sub, "qk-attribution", "why a head attends from one position to another "
                       "on a prompt: its pre-softmax score split into one term per (query-side "
                       "source, key-side source) — embeddings, earlier heads, MLPs, biases — and "
                       "each side's totals (an induction head's key side names the "
                       "previous-token head)", EXAMPLE)
    model_arg(p)
    p.add_argument("head", type=head_ref, help="the head, e.g. L1.H2")
    given = p.add_mutually_exclusive_group(required=True)
    given.add_argument("--prompt", help="the prompt as text (tokenised as the Prompt tab does)")
    given.add_argument("--tokens", type=token_ids, help="the prompt as token ids, e.g. 5,9,2,33")
    p.add_argument("--query", type=index, required=True, help="the query position (0-based)")
    p.add_argument("--key", type=index, required=True,
                   help="the key position, at most the query's (attention is causal)")
    p.add_argument("--confirm", type=count, default=0, metavar="N",
                   help="also remove each side's top N sources (by |total|) from that side's input "
                        "to the head exactly (a path patch of the source, zeroed: one more pass to the "
                        "layer) and print the score's drop beside the totals, the norm's scale frozen "
                        "(equals the total) and recomputed (the real intervention); JSON: \"exact\": "
                        "{\"query\"|\"key\": {source: {\"frozen\": drop, \"recomputed\": drop}}}")
    p.add_argument("--top", type=count, default=None,
                   help=f"terms listed, largest |term| first (default: {TOP} in a table, all in "
                        "JSON); the totals are always all listed")
    json_arg(p)
    raw_arg(p)
    p.set_defaults(handler=run)


def report(found: Any, key: int, top: int | None, confirm: int = 0) -> dict[str, Any]:
    """The JSON of one cell: ``{layer, head, query, key, score, terms, query_totals,
    key_totals}``, the terms largest |value| first, the first ``top`` of them; with
    ``confirm``, ``exact``: each side's top ``confirm`` sources at this key removed exactly."""
    query_totals, key_totals = found.totals(key)
    out = {
        "layer": found.layer, "head": found.head, "query": found.query, "key": key,
        "score": float(found.score[found.column(key)]),
        "terms": [{"query_src": q, "key_src": k, "value": v} for q, k, v in found.ranked_terms(key, top)],
        "query_totals": query_totals, "key_totals": key_totals,
    }
    if confirm:
        out["exact"] = found.exact(key, confirm)
    return out


def value(v: float) -> str:
    """A number of the table: a non-finite one is said, never printed as a number."""
    return f"{v:+.4f}" if math.isfinite(v) else "non-finite"


def run(args: argparse.Namespace) -> int:
    model = open_for_command(args)
    ids = None if args.tokens is None else [int(t) for t in args.tokens.split(",") if t.strip()]
    found = model.qk_attribution(args.head, prompt=args.prompt, tokens=ids, query=args.query, key=args.key,
                                 confirm=args.confirm)
    out = report(found, args.key, args.top, args.confirm)
    if found.nonfinite:
        args.warnings = [*getattr(args, "warnings", []), "non-finite activations reached the score: "
                         "the non-finite terms are null (--json) or 'non-finite', and the sums do not hold"]
    if args.json:
        emit(out, True, None)
        return EXIT_OK
    prompt = _prompt_ids(model, args, ids)

    def token(p: int) -> str:
        return repr(printable(_label(model.tokenizer, prompt[p])))

    print(f"L{found.layer}.H{found.head} q={found.query} {token(found.query)} → k={args.key} "
          f"{token(args.key)}: score {value(out['score'])}")
    if found.note:
        print(found.note)
    shown = out["terms"] if args.top is not None else out["terms"][:TOP]
    rest = len(found.names) ** 2 - len(shown)
    emit(None, False, lambda: (["query source", "key source", "term"],
                               [[t["query_src"], t["key_src"], value(t["value"])] for t in shown]))
    if rest:
        print(f"(+{rest} smaller terms; --top N lists more)")
    print()
    names = sorted(found.names, key=lambda c: -max(_size(out["query_totals"][c]), _size(out["key_totals"][c])))
    if not args.confirm:
        emit(None, False, lambda: (["source", "query-side total", "key-side total"],
                                   [[c, value(out["query_totals"][c]), value(out["key_totals"][c])] for c in names]))
        return EXIT_OK
    exact = out["exact"]

    def removed(side: str, c: str, how: str) -> str:
        return value(exact[side][c][how]) if c in exact[side] else ""

    emit(None, False, lambda: (
        ["source", "query-side total", "removed, frozen", "recomputed",
         "key-side total", "removed, frozen", "recomputed"],
        [[c, value(out["query_totals"][c]), removed("query", c, "frozen"), removed("query", c, "recomputed"),
          value(out["key_totals"][c]), removed("key", c, "frozen"), removed("key", c, "recomputed")]
         for c in names]))
    print(f"removed: the score's drop when the source alone leaves that side's input to the head "
          f"(top {args.confirm} of each side), the norm's scale frozen (= the total) or recomputed")
    return EXIT_OK


def _size(v: float) -> float:
    return abs(v) if math.isfinite(v) else math.inf


def _prompt_ids(model: Any, args: argparse.Namespace, ids: list[int] | None) -> list[int]:
    """The prompt's ids as the request tokenised them (for the header's token strings)."""
    if ids is not None:
        return ids
    encoded = model.tokenizer.encode(args.prompt)
    return [int(i) for i in getattr(encoded, "ids", encoded)][: model.cfg.n_ctx]


def _label(tokenizer: Any, token: int) -> str:
    """The token's string, or its id when the tokenizer cannot decode it."""
    try:
        return str(tokenizer.decode_token(token))
    except Exception:
        return str(token)
