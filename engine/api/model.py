"""Opening a checkpoint, for notebooks and the UI: ``open_model``, ``read_structure``.

Part of the engine"s facade: the UI imports ``engine.core``, ``engine.api`` and
``engine.service`` only (docs/internals.md, "Layers").
"""

from headscope.engine.model.loading import Model, open_model, read_structure

__all__ = ["Model", "open_model", "read_structure"]
