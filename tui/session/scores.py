"""The explorer's score state: every head's scores, the ablation sweep, the random-head null
and the Summary tab's order, for the weights of one generation.

No Textual here: the explorer's workers fill this object (their results are dropped when
``gen`` moved on: raw/processed toggled, a timeline step opened) and the head tree, the focus
line and the Summary tab are drawn from it. The null and z-scores are docs/math.md
("Calibrated scores"); the ablation effect is the loss a head's zeroing costs
(``AblationSweepRequest``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from headscope.engine.core.results import HeadScores, ScoreNull
from headscope.tui.base.labels import ABLATION, SCORES, score, z_score

Head = tuple[int, int]


class ScoreBoard:
    """Scores, ablation effects, the null and the Summary's sort of the weights shown."""

    def __init__(self) -> None:
        self.gen = 0  # the weights' generation: bumped when they change
        self.rows: dict[Head, HeadScores] = {}
        # Zero-ablation effect of every head [L, H] (the opt-in sweep, key a), this gen's.
        self.ablation: np.ndarray | None = None
        self.null: ScoreNull | None = None
        self.null_failed = -1  # the generation whose null the engine could not compute
        self.summary_sort: str | None = None  # None: layer order
        # A sweep's progress (0..1) while one runs: set from engine threads, read by the
        # status bar's tick (a plain assignment).
        self.progress: float | None = None

    # -- the weights --------------------------------------------------------------------------
    def new_weights(self) -> int:
        """The weights changed: forget what was computed on the old ones; the new generation."""
        self.gen += 1
        self.rows.clear()
        self.ablation = None
        self.null = None
        return self.gen

    def current(self, gen: int) -> bool:
        """Whether a result computed for generation ``gen`` is for the weights shown."""
        return gen == self.gen

    # -- scores -----------------------------------------------------------------------------
    def add(self, rows: Iterable[HeadScores]) -> None:
        for r in rows:
            self.rows[(r.layer, r.head)] = r

    def row(self, head: Head | None) -> HeadScores | None:
        return None if head is None else self.rows.get(head)

    # -- the null -----------------------------------------------------------------------------
    def wants_null(self) -> bool:
        """The null is still to be asked for (not there, and not failed for these weights)."""
        return self.null is None and self.null_failed != self.gen

    def null_failed_for(self, gen: int) -> None:
        """The engine could not compute the null for generation ``gen``: not asked again
        for those weights."""
        self.null_failed = gen

    # -- ablation -----------------------------------------------------------------------------
    def set_ablation(self, effects: np.ndarray) -> Head | None:
        """Keep the sweep's effects and sort the Summary by them; the head whose zeroing
        costs the most (``None`` if no effect is finite: the model's own loss is not)."""
        self.ablation = effects
        self.summary_sort = ABLATION
        if not np.isfinite(effects).any():
            return None
        layer, head = np.unravel_index(np.nanargmax(effects), effects.shape)
        return int(layer), int(head)

    def ablation_of(self, head: Head) -> float:
        """The head's zero-ablation effect, NaN until the sweep (``a``) has run."""
        return math.nan if self.ablation is None else float(self.ablation[head])

    # -- the Summary tab ----------------------------------------------------------------------
    def value(self, row: HeadScores, key: str) -> float:
        """The Summary's column ``key`` of a head: a score or the ablation effect."""
        return self.ablation_of((row.layer, row.head)) if key == ABLATION else score(row, key)

    def sort_keys(self) -> list[str]:
        """The columns ``o`` cycles through: every score, and the ablation once swept."""
        return [k for k, _ in SCORES] + ([ABLATION] if self.ablation is not None else [])

    def next_sort(self) -> str:
        keys = self.sort_keys()
        i = keys.index(self.summary_sort) if self.summary_sort in keys else -1
        self.summary_sort = keys[(i + 1) % len(keys)]
        return self.summary_sort

    def summary(self) -> tuple[list[HeadScores], list[float]]:
        """The Summary's rows (layer order, or by ``summary_sort``, highest first, NaN last)
        and each row's ablation effect (NaN before the sweep)."""
        rows = sorted(self.rows.values(), key=lambda r: (r.layer, r.head))
        if self.summary_sort is not None:
            key = self.summary_sort

            def order(r: HeadScores) -> tuple[bool, float]:
                v = self.value(r, key)
                return (math.isnan(v), -v if not math.isnan(v) else 0.0)

            rows.sort(key=order)
        return rows, [self.ablation_of((r.layer, r.head)) for r in rows]

    def summary_records(self, rows: list[HeadScores], ablation: list[float]
                        ) -> list[dict[str, Any]]:
        """The Summary as exported: each head's scores, their z's and its ablation effect."""
        return [{**dataclasses.asdict(r),
                 **{f"{k}_z": z_score(self.null, r, k) for k, _ in SCORES},
                 "ablation_effect": a} for r, a in zip(rows, ablation, strict=True)]
