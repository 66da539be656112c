"""Checkpoint series, as the UI and the CLI see them (docs/internals.md, "Training dynamics").

Part of the engine"s facade: the UI imports ``engine.core``, ``engine.api`` and
``engine.service`` only (docs/internals.md, "Layers").
"""

from headscope.engine.sweeps.timeline import (
    StepScores,
    StepSource,
    Timeline,
    build_timeline,
    check_layouts,
    compute_timeline,
    discover_steps,
    score_steps,
)

__all__ = ["StepScores", "StepSource", "Timeline", "build_timeline", "check_layouts", "compute_timeline", "discover_steps", "score_steps"]
