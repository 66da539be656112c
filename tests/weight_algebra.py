"""The weight algebra (``engine.circuits``, numpy) as the tests call it: on any weight source
(``DictWeights``, ``model.weights``; both give read-only float32 arrays), results as tensors
where the tests compare tensors."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from headscope.engine.circuits import composition, spectral


def all_copying_scores(w: Any, progress: Any = None, cancelled: Any = None) -> torch.Tensor:
    """``[L, H]``: the copying scores of ``spectral.spectral_scores``."""
    return torch.from_numpy(spectral.spectral_scores(w, progress, cancelled)["copying_score"])


def all_qk_positivity(w: Any, progress: Any = None, cancelled: Any = None) -> torch.Tensor:
    """``[L, H]``: the QK positivities of ``spectral.spectral_scores``."""
    return torch.from_numpy(spectral.spectral_scores(w, progress, cancelled)["qk_positivity"])


def composition_scores(w: Any, kind: str, seed: int = 0, **kwargs: Any) -> SimpleNamespace:
    """``composition.composition_scores`` with its scores as a tensor."""
    found = composition.composition_scores(w, kind, seed, **kwargs)
    return SimpleNamespace(kind=found.kind, scores=torch.from_numpy(found.scores), baseline=found.baseline)


copying_score = spectral.copying_score
qk_positivity = spectral.qk_positivity
