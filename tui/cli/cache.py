"""``headscope cache ls|clear [PATH]`` and the results store the sweeping commands use.

The store (``engine.api.store``, i.e. ``engine.sweeps.store``) lives under
``$HEADSCOPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/headscope`` (``~/.cache/headscope``),
bounded by the ``cache_disk_mb`` setting. ``--no-cache`` (or ``cache_disk_mb = 0``) computes
without it.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from headscope.engine.api.store import ResultStore


def add_cache_parser(sub: Any) -> None:
    """Register ``cache ls [PATH]`` and ``cache clear [PATH]`` on the CLI's subparsers."""
    p = sub.add_parser(
        "cache",
        help="list or clear the stored sweep results (the results store)",
        description="list or clear the stored sweep results: head scores, composition and "
        "ablation sweeps, kept on disk per checkpoint so a reopened model shows them at once",
        epilog="examples:\n  headscope cache ls\n  headscope cache clear path/to/model\n"
        "  headscope cache clear          (everything)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("action", choices=("ls", "clear"))
    p.add_argument("path", nargs="?", help="only the entries of this checkpoint")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def add_store_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-cache", action="store_true",
                   help="neither read nor write the results store (recompute everything)")


def add_quiet_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", "-q", action="store_true",
                   help="no progress bar on stderr (there is none when stderr is not a terminal)")


def disk_mb() -> int:
    """The ``cache_disk_mb`` setting (a broken settings file is the explorer's to report)."""
    from headscope.engine.core.errors import HeadscopeError
    from headscope.tui.base.settings import Settings, load_settings

    try:
        return load_settings().cache_disk_mb
    except HeadscopeError:
        return Settings().cache_disk_mb


def results_store(args: argparse.Namespace) -> ResultStore | None:
    """The results store for a sweeping command, or None with ``--no-cache`` / a cap of 0."""
    from headscope.engine.api.store import default_store

    if getattr(args, "no_cache", False):
        return None
    from headscope.tui.cli.output import say

    mb = disk_mb()
    return default_store(mb, warn=lambda message: say(message, warning=True)) if mb > 0 else None


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


def cmd_cache(args: argparse.Namespace) -> int:
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
