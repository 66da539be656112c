"""The results store a sweeping command uses (``engine.api.store``, i.e.
``engine.sweeps.store``): under ``$HEADSCOPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/headscope``
(``~/.cache/headscope``), bounded by the ``cache_disk_mb`` setting. ``--no-cache`` (or
``cache_disk_mb = 0``) computes without it; ``headscope cache`` lists and clears it.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from headscope.engine.api.store import ResultStore


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
