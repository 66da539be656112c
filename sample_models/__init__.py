"""The trained sample models bundled with headscope (sample_models/README.md)."""

from __future__ import annotations

from pathlib import Path

BUNDLED_MODEL = "attn-only-2l"  # what `headscope` opens when given no path


def bundled_model(name: str = BUNDLED_MODEL) -> Path:
    """The directory of a bundled sample model, inside the installed package."""
    return Path(__file__).resolve().parent / name
