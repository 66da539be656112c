"""The results store, as the UI and the CLI see it (``cache ls|clear``, the explorer"s store).

Part of the engine"s facade: the UI imports ``engine.core``, ``engine.api`` and
``engine.service`` only (docs/internals.md, "Layers").
"""

from headscope.engine.sweeps.store import ResultStore, default_store

__all__ = ["ResultStore", "default_store"]
