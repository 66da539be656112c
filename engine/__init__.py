"""headscope's engine: checkpoints, weights, circuits and scores, with no UI imports.

``from headscope.engine import open_model`` works in a notebook. Importing this package does not
import torch (``read_structure`` never needs it; tensors import it on first use).
"""

from .config import ModelConfig
from .errors import HeadscopeError
from .loading import Model, open_model, read_structure

__all__ = ["HeadscopeError", "Model", "ModelConfig", "open_model", "read_structure"]
