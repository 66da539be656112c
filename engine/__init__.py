"""headscope's engine: checkpoints, weights, circuits and scores, with no UI imports.

``from headscope.engine import open_model`` works in a notebook. Importing this package imports
nothing else: the names below load their modules on first use (PEP 562), so a submodule that
needs neither numpy nor torch (``engine.core.errors``, ``engine.core.validation``) stays cheap to import,
which the explorer's first frame relies on (``read_structure`` never needs torch either).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from headscope.engine.api.model import Model, open_model, read_structure
    from headscope.engine.core.config import ModelConfig
    from headscope.engine.core.errors import HeadscopeError

__all__ = ["HeadscopeError", "Model", "ModelConfig", "open_model", "read_structure"]

_HOMES = {"ModelConfig": ".core.config", "HeadscopeError": ".core.errors",
          "Model": ".api.model", "open_model": ".api.model",
          "read_structure": ".api.model"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
