"""``--scheduler tcp://HOST:PORT`` and ``--workers N``: the sweeping commands on a Dask
cluster (engine/sweeps/cluster.py; README, "Sweeps on a cluster").

Without either flag the ``cluster`` setting (a scheduler address) is used; without that,
the sweep runs in-process as always. Needs the optional extra ``headscope[cluster]``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from headscope.tui.cli import args as args_types
from headscope.tui.cli.output import say

if TYPE_CHECKING:
    from headscope.engine.api.cluster import Cluster


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--scheduler", metavar="tcp://HOST:PORT",
                   help="send the sweep's parts to this Dask scheduler (workers read the "
                        "checkpoint from the same path); needs headscope[cluster]")
    g.add_argument("--workers", metavar="N", type=args_types.workers,
                   help="start a local Dask cluster of N worker processes for the sweep "
                        "(at most one per core, and as many as the memory holds)")


def _setting() -> str | None:
    from headscope.engine.core.errors import HeadscopeError
    from headscope.tui.base.settings import load_settings

    try:
        return load_settings().cluster
    except HeadscopeError:
        return None


@contextlib.contextmanager
def cluster_from_args(args: argparse.Namespace) -> Iterator[Cluster | None]:
    """The cluster a sweeping command uses (closed afterwards), or None: in-process."""
    from headscope.engine.api.cluster import connect, local_cluster

    workers = getattr(args, "workers", None)
    address = getattr(args, "scheduler", None) or (None if workers else _setting())
    if workers is None and not address:
        yield None
        return
    # A lost scheduler is our one-line ClusterError: not also the client's logged tracebacks.
    logging.getLogger("distributed.client").setLevel(logging.CRITICAL)
    if workers is not None:
        cluster = local_cluster(workers, _model_bytes(getattr(args, "path", None)),
                                warn=lambda message: say(message, warning=True))
    else:
        cluster = connect(str(address))
    try:
        yield cluster
    finally:
        cluster.close()


def _model_bytes(path: str | None) -> int:
    """The size of the weights at ``path`` (a file, or a directory's weight files): what
    one worker may read of the model."""
    if not path:
        return 0
    try:
        p = Path(path)
        if p.is_file():
            return p.stat().st_size
        return sum(f.stat().st_size for f in p.iterdir()
                   if f.suffix in (".safetensors", ".gguf") and f.is_file())
    except OSError:
        return 0
