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
