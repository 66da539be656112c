"""Sweeps on a Dask cluster, as the CLI starts them (``--scheduler``, ``--workers``).

Part of the engine"s facade: the UI imports ``engine.core``, ``engine.api`` and
``engine.service`` only (docs/internals.md, "Layers").
"""

from headscope.engine.sweeps.cluster import Cluster, connect, local_cluster, worker_bound

__all__ = ["Cluster", "connect", "local_cluster", "worker_bound"]
