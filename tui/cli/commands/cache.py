"""``headscope cache ls|clear [PATH]``: list or clear the results store (tui/cli/store.py)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from headscope.tui.cli.options import command_parser, json_arg
from headscope.tui.cli.store import disk_mb


def register(sub: Any) -> None:
    """``cache ls [PATH]`` and ``cache clear [PATH]``."""
    p = command_parser(sub, "cache", "list or clear the stored sweep results (the results store)",
                       ["headscope cache ls", "headscope cache clear path/to/model",
                        "headscope cache clear          (everything)"],
                       description="list or clear the stored sweep results: head scores, "
                       "composition and ablation sweeps, kept on disk per checkpoint so a "
                       "reopened model shows them at once")
    p.add_argument("action", choices=("ls", "clear"))
    p.add_argument("path", nargs="?", help="only the entries of this checkpoint")
    json_arg(p)
    p.set_defaults(handler=run)


def _age(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 86400:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MB" if n >= 1 << 20 else f"{n / 1024:.0f} kB"


def run(args: argparse.Namespace) -> int:
    from headscope.engine.api.store import ResultStore
    from headscope.tui.cli.output import emit

    store = ResultStore(max_bytes=disk_mb() << 20)
    if args.action == "clear":
        removed = store.clear(args.path)
        data: Any = {"root": str(store.root), "removed": [e.as_dict() for e in removed]}
        emit(data, args.json, lambda: (["removed", "size", "raw"],
                                       [[e.path, _size(e.bytes), e.raw] for e in removed]))
        return 0
    entries = store.entries()
    if args.path is not None:
        from pathlib import Path

        target = str(Path(args.path).expanduser().resolve())
        entries = [e for e in entries if str(Path(e.path).resolve()) == target]
    now = time.time()
    data = {"root": str(store.root), "max_bytes": store.max_bytes,
            "entries": [e.as_dict() for e in entries]}

    def table() -> tuple[list[str], list[list[Any]]]:
        rows = [[e.path, "raw" if e.raw else "processed", _size(e.bytes),
                 ", ".join(f"{name} ({n})" for name, n in sorted(e.parts.items())),
                 _age(now - e.last_used)] for e in entries]
        return ["model", "mode", "size", "stored (parts)", "last used"], rows

    emit(data, args.json, table)
    return 0
