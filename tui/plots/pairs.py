"""Compare mode's heatmap pairs: model A's circuit block beside model B's, or beside B − A."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np

from headscope.tui.plots.figures import Heatmap


async def pair_figures(a: Any, b: Any, mode: str, title_a: str, title_b: str, *,
                       xlabel: str = "", diagonal: bool = False) -> tuple[Heatmap, Heatmap]:
    """Figures for A's and B's circuit blocks (same rows and columns).

    ``side``: both on one symmetric colour range, so equal colours mean equal values;
    ``diff``: A, and B − A on its own range. The arithmetic runs in a worker thread."""

    def build() -> tuple[Heatmap, Heatmap]:
        va = np.asarray(a.values, dtype=np.float64)
        vb = np.asarray(b.values, dtype=np.float64)
        labels = (tuple(a.row_labels), tuple(a.col_labels))
        if mode == "diff":
            delta = vb - va
            return (Heatmap(va, *labels, title=title_a, xlabel=xlabel, diagonal=diagonal),
                    Heatmap(delta, *labels, title=f"{title_b}  B − A", xlabel=xlabel,
                            diagonal=diagonal))
        with np.errstate(invalid="ignore"):
            vmax = float(np.nanmax(np.abs(np.concatenate([va.ravel(), vb.ravel()]))))
        vmax = vmax if math.isfinite(vmax) and vmax > 0 else 1.0
        return (Heatmap(va, *labels, title=f"A {title_a}", xlabel=xlabel, vmax=vmax,
                        diagonal=diagonal),
                Heatmap(vb, *labels, title=f"B {title_b}", xlabel=xlabel, vmax=vmax,
                        diagonal=diagonal))

    return await asyncio.to_thread(build)
