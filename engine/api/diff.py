"""Comparing two checkpoints (``headscope diff``, compare mode).

Part of the engine"s facade: the UI imports ``engine.core``, ``engine.api`` and
``engine.service`` only (docs/internals.md, "Layers").
"""

from headscope.engine.sweeps.diff import ModelDiff, diff_models

__all__ = ["ModelDiff", "diff_models"]
