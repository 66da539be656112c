"""``headscope forward PATH --tokens IDS | --prompt TEXT``: logits and attention patterns."""

from __future__ import annotations

import argparse
from typing import Any

from headscope.engine.core.errors import InvalidRequestError
from headscope.tui.cli import args as args_types
from headscope.tui.cli.options import command_parser, json_arg, model_arg, quiet_arg, raw_arg
from headscope.tui.cli.output import EXIT_OK, emit, open_for_command, say
from headscope.tui.cli.progress import progress_bar


def register(sub: Any) -> None:
    p = command_parser(sub, "forward", "logits and attention patterns for a token sequence",
                       "headscope forward path --tokens 3,14,15,92 --json")
    model_arg(p)
    json_arg(p)
    raw_arg(p)
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--tokens", type=args_types.token_ids, help="comma-separated token ids, e.g. 3,14,15,92")
    group.add_argument("--prompt", help="text, encoded with the model's tokenizer")
    quiet_arg(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
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

    import numpy as np

    logits = np.asarray(report["logits"], dtype=np.float64)
    finite = np.isfinite(logits).all(-1)
    if not finite.all():
        say(f"{model.path}: {nonfinite_note(finite, np.asarray(report['patterns']))}", warning=True)

    def table() -> tuple[list[str], list[list[Any]]]:
        # argmax over a row with a NaN names token 0 (or whichever comes first): no
        # prediction is shown where a logit is not finite
        top = np.where(finite, logits.argmax(-1), -1)
        return (
            ["pos", "token", "predicted next", "logit"],
            [[i, s, model.tokenizer.decode_token(int(t)), float(logits[i, t])] if t >= 0
             else [i, s, "-", "-"]
             for i, (s, t) in enumerate(zip(report["token_strings"], top, strict=True))],
        )

    emit(report, args.json, table)
    return EXIT_OK


def spans(positions: list[int]) -> str:
    """``0–3, 7``: runs of consecutive positions."""
    runs: list[list[int]] = []
    for p in positions:
        if runs and p == runs[-1][1] + 1:
            runs[-1][1] = p
        else:
            runs.append([p, p])
    return ", ".join(f"{a}" if a == b else f"{a}–{b}" for a, b in runs)


def nonfinite_note(finite: Any, patterns: Any) -> str:
    """One line: the positions whose logits are not all finite (``finite[pos]`` False), and
    the first heads whose attention is not (``patterns[layer][head][query][key]``), where the
    NaN/inf comes from."""
    import numpy as np

    bad = [int(p) for p in np.flatnonzero(~finite)]
    heads = [f"L{layer}.H{head}" for layer, head in
             zip(*np.nonzero(~np.isfinite(patterns).all(axis=(2, 3))), strict=True)]
    where = f"; attention not finite in {', '.join(heads[:4])}{' …' if len(heads) > 4 else ''}" \
        if heads else ""
    return (f"logits not finite at position{'s' if len(bad) > 1 else ''} {spans(bad)} of "
            f"{len(finite)} (NaN/inf weights or float32 overflow{where}): no prediction there")
