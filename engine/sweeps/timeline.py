"""Training dynamics: every head's scores across a series of checkpoints, and phase changes.

A *series* is a directory of checkpoint subdirectories (``step-001000/``, ``step1000/``,
``checkpoint-500/``, ``global_step500/``: the step is the last number in the name) or several
checkpoint paths in order (:func:`discover_steps`). Each step is scored on its own
(:func:`score_step`: open, score, fingerprint, close), so steps can run in any order, in a
thread pool here or as tasks on a Dask cluster (engine/sweeps/cluster.py); given a results store,
each step's scores are one record in the step's entry (:func:`save_step`, :func:`load_step`),
written on this side wherever the step was scored; :func:`build_timeline`
assembles the per-step results, finds the phase changes (:func:`find_phase_change`, defined in
docs/math.md "Training dynamics") and warns about steps with identical weights.

Scores per head and step: the five of ``headscope heads`` (``validation.SCORE_NAMES``, same
names, same functions, same seed) and, for each composition kind, the head's strongest edge
above the random baseline (``q_composition_max``, ...; the head at either end of the edge).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headscope.engine.core.errors import (
    HeadscopeError,
    InvalidRequestError,
    ShapeMismatchError,
    UnsupportedFormatError,
)
from headscope.engine.core.progress import Cancelled, check_cancelled
from headscope.engine.core.validation import EDGE_THRESHOLD

if TYPE_CHECKING:
    import numpy as np

    from headscope.engine.model.loading import Checkpoint, LoadedModel
    from headscope.engine.sweeps.cluster import Cluster
    from headscope.engine.sweeps.store import ModelStore, ResultStore

COMPOSITION_KEYS = ("q_composition_max", "k_composition_max", "v_composition_max")
# A composition edge matters when it beats its baseline by this much (`headscope diff`'s).
COMPOSITION_JUMP = EDGE_THRESHOLD
# The five head scores lie in [0, 1] (attention) or [-1, 1] (spectral): a jump of 0.2 is
# far above seed-to-seed noise and well below the 0.6-0.8 swing of a forming circuit.
SCORE_JUMP = 0.2
WINDOW_FRACTION = 0.1  # a phase change happens within 10 % of the series' span of steps

_NUMBER = re.compile(r"\d+")
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
_MODEL_FILES = ("config.json", "headscope.json", "model.safetensors.index.json")
_HASH_CHUNK = 16 << 20


def score_keys() -> tuple[str, ...]:
    """Every series a timeline has per head, in output order."""
    from headscope.engine.core.validation import SCORE_NAMES

    return (*SCORE_NAMES, *COMPOSITION_KEYS)


def min_jumps() -> dict[str, float]:
    """The smallest jump that counts as a phase change, per score (docs/math.md)."""
    return {k: (COMPOSITION_JUMP if k in COMPOSITION_KEYS else SCORE_JUMP) for k in score_keys()}


# ----------------------------------------------------------------------------- discovery


@dataclass(frozen=True)
class StepSource:
    """One checkpoint of a series: its step number and where it lives."""

    step: int
    path: Path


def step_number(name: str) -> int | None:
    """The step in a checkpoint's name: its last number (``global_step500`` → 500)."""
    numbers = _NUMBER.findall(name)
    return int(numbers[-1]) if numbers else None


def _name_of(path: Path) -> str:
    """The name that carries the step: the directory's, or a weights file's parent's."""
    return path.parent.name if path.is_file() else path.name


def _looks_like_checkpoint(directory: Path) -> bool:
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return False
    return any(
        e.is_file() and (e.name.endswith(".safetensors") or e.name in _MODEL_FILES
                         or e.name.lower().endswith(_PICKLE_SUFFIXES))
        for e in entries
    )


def _natural_key(name: str) -> list[Any]:
    return [(0, int(part), "") if part.isdigit() else (1, 0, part)
            for part in re.split(r"(\d+)", name) if part]


def discover_steps(paths: Sequence[str | os.PathLike[str]]) -> tuple[list[StepSource], list[str]]:
    """The checkpoints of a series, in order, and notes about how they were numbered.

    One path: a directory whose checkpoint subdirectories (any with safetensors, a config or
    pickle weights; hidden ones skipped) are the steps, ordered by the number in their names.
    Several paths: the checkpoints in the order given. When some name has no number, or the
    numbers do not increase in that order, the steps are the positions 0, 1, 2, ... (in a
    directory: the numbered names by number, then the others by name). Fewer than two
    checkpoints is an error.
    """
    if not paths:
        raise InvalidRequestError(None, "a timeline needs a directory of checkpoints or several checkpoints")
    given = [Path(p).expanduser() for p in paths]
    for p in given:
        if not p.exists():
            raise UnsupportedFormatError(p, "no such file or directory")
    if len(given) == 1:
        candidates = _subdirectory_checkpoints(given[0])
        candidates.sort(key=lambda p: (step_number(p.name) is None, step_number(p.name) or 0,
                                       _natural_key(p.name)))
    else:
        candidates = given
    numbers = _increasing([step_number(_name_of(p)) for p in candidates])
    notes: list[str] = []
    if numbers is None:
        notes.append("the checkpoint names do not number the steps in increasing order: "
                     "steps are their positions 0, 1, 2, ...")
        numbers = list(range(len(candidates)))
    return [StepSource(n, p) for n, p in zip(numbers, candidates, strict=True)], notes


def _increasing(numbers: Sequence[int | None]) -> list[int] | None:
    """``numbers`` if every one is there and they strictly increase, else ``None``."""
    known = [n for n in numbers if n is not None]
    if len(known) < len(numbers) or any(b <= a for a, b in itertools.pairwise(known)):
        return None
    return known


def _subdirectory_checkpoints(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise InvalidRequestError(
            directory, "a single step: a timeline needs a directory of checkpoints or several checkpoints")
    subdirs = [directory / e.name for e in os.scandir(directory)
               if e.is_dir() and not e.name.startswith(".") and _looks_like_checkpoint(directory / e.name)]
    if not subdirs:
        if _looks_like_checkpoint(directory):
            raise InvalidRequestError(
                directory, "a single checkpoint, not a series: give a directory of checkpoint "
                "subdirectories (step-001000/, checkpoint-500/, ...) or several checkpoints")
        raise UnsupportedFormatError(directory, "no checkpoint subdirectories here")
    if len(subdirs) == 1:
        raise InvalidRequestError(
            directory, f"a single step ({subdirs[0].name}): a timeline needs at least two checkpoints")
    return subdirs


# ----------------------------------------------------------------------------- weights digest


def weights_digest(ckpt: Checkpoint) -> str:
    """BLAKE2b-128 of every tensor: name, dtype, shape and raw bytes, in name order.

    Two steps with the same digest hold the same weights bit for bit, whatever the file
    layout or metadata; the same weights stored in another dtype differ. Reads every tensor
    byte once (hashing runs at disk speed; the scores read most of them anyway).
    """
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(ckpt.files):
        file = ckpt.files[name]
        header = ckpt.headers[file]
        info = header.tensors[name]
        h.update(f"{name}\0{info.dtype}\0{info.shape}\0".encode())
        with open(file, "rb") as f:
            f.seek(header.data_start + info.begin)
            left = info.end - info.begin
            while left > 0:
                chunk = f.read(min(left, _HASH_CHUNK))
                if not chunk:
                    raise UnsupportedFormatError(file, f"tensor {name!r} is truncated")
                h.update(chunk)
                left -= len(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------- one step


@dataclass(frozen=True)
class StepScores:
    """What one step contributes to a timeline: ``scores[key]`` is ``[n_layers, n_heads]``."""

    step: int
    path: Path
    n_layers: int
    n_heads: int
    fingerprint: str
    scores: Mapping[str, np.ndarray] = field(repr=False)


def composition_maxima(model: LoadedModel, seed: int = 0,
                       store: ModelStore | None = None) -> dict[str, np.ndarray]:
    """Per head, its strongest edge of each composition kind above the baseline, either end.

    ``[n_layers, n_heads]`` per kind; NaN for a head with no edge (a one-layer model) or
    non-finite weights. The scores are the ``composition`` command's (``scores.composition``,
    its stored tiles when ``store`` is given).
    """
    import numpy as np

    from headscope.engine.sweeps.scores import composition

    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    earlier = np.arange(n_layers)[:, None] < np.arange(n_layers)[None, :]
    out = {}
    for kind, key in zip("qkv", COMPOSITION_KEYS, strict=True):
        result = composition(model, kind, seed=seed, store=store)
        above = result.scores.astype(np.float64) - result.baseline  # [L, H, L, H]
        edges = np.where(earlier[:, None, :, None], above, np.nan)
        as_source = edges.reshape(n_layers, n_heads, -1)
        as_target = edges.transpose(2, 3, 0, 1).reshape(n_layers, n_heads, -1)
        # fmax skips NaN (no edge) and gives NaN only when a head has no edge at all.
        out[key] = np.fmax.reduce(np.concatenate([as_source, as_target], axis=2), axis=2)
    return out


def _step_name(seed: int) -> str:
    return f"timeline-seed{seed}"


def step_entry(store: ResultStore | None, source: StepSource, raw: bool) -> ModelStore | None:
    """The results-store entry of one step (headers only: no tensor read), or ``None``."""
    if store is None:
        return None
    from headscope.engine.model.loading import inspect_checkpoint

    return store.for_checkpoint(inspect_checkpoint(source.path), raw)


def load_step(entry: ModelStore | None, source: StepSource, seed: int) -> StepScores | None:
    """A step's scores and weights fingerprint as :func:`save_step` stored them, or ``None``.

    The entry is the step's results-store entry (``store.fingerprint``: path, sizes, mtimes
    and headers of its files), so a rewritten checkpoint is scored again."""
    import numpy as np

    if entry is None or not entry.enabled:
        return None
    stacked = entry.load(_step_name(seed), "all", None, np.float64)
    digest = entry.load("timeline-fingerprint", "all", (16,), np.uint8)
    keys = score_keys()
    if stacked is None or digest is None or stacked.ndim != 3 or stacked.shape[0] != len(keys):
        return None
    _, n_layers, n_heads = stacked.shape
    return StepScores(source.step, source.path, n_layers, n_heads, bytes(digest).hex(),
                      {k: np.array(stacked[i]) for i, k in enumerate(keys)})


def save_step(entry: ModelStore | None, result: StepScores, seed: int) -> None:
    """Store what one step contributes to a timeline (every score, ``[keys, L, H]`` float64,
    and the weights fingerprint) in its results-store entry."""
    import numpy as np

    if entry is None or not entry.enabled:
        return
    stacked = np.stack([np.asarray(result.scores[k], dtype=np.float64) for k in score_keys()])
    entry.save(_step_name(seed), stacked)
    entry.save("timeline-fingerprint", np.frombuffer(bytes.fromhex(result.fingerprint), np.uint8))
    entry.finish()


def score_step(source: StepSource, *, seed: int = 0, raw: bool = False,
               store: ResultStore | None = None) -> StepScores:
    """Open one checkpoint, score every head, fingerprint it, close it.

    Independent of every other step (the unit a worker pool or a cluster runs); the scores
    are ``scores.score_table``'s (``heads``' numbers) and :func:`composition_maxima`'s with the same ``seed``.
    ``store``: the results store (``sweeps.store``). A step already scored (by a timeline,
    here or on a cluster) is read back whole (:func:`load_step`), with no model opened;
    otherwise its sweeps read and write the store as ``heads`` and ``composition`` on that
    checkpoint do, and the step's scores are stored (:func:`save_step`).
    """
    entry = step_entry(store, source, raw)
    stored = load_step(entry, source, seed)
    if stored is not None:
        return stored
    result = score_checkpoint(source, seed=seed, raw=raw, store=store)
    save_step(entry, result, seed)
    return result


def score_step_task(path: str, step: int, seed: int, raw: bool, key: str | None = None) -> StepScores:
    """:func:`score_step` as a cluster task, run on a worker (``cluster.run_tasks``): the
    step's fingerprint (``store.fingerprint``: header, sizes, mtimes) is checked against the
    client's ``key`` first, as every other cluster task does, and headscope errors are
    re-typed to travel back."""
    from headscope.engine.model.loading import inspect_checkpoint
    from headscope.engine.sweeps.cluster import ClusterTaskError, fingerprint_mismatch, on_worker
    from headscope.engine.sweeps.store import fingerprint as stored_key

    try:
        if key is not None and stored_key(inspect_checkpoint(path), raw) != key:
            raise fingerprint_mismatch(path)
        return score_step(StepSource(step, Path(path)), seed=seed, raw=raw)
    except ClusterTaskError:
        raise
    except HeadscopeError as err:
        raise on_worker(err) from None


def score_checkpoint(source: StepSource, *, seed: int, raw: bool,
                     store: ResultStore | None) -> StepScores:
    """Open the step's checkpoint, score it (the sweeps read and write ``store``'s entry
    of that checkpoint), fingerprint it, close it: :func:`score_step` without the step's
    own record."""
    import numpy as np

    from headscope.engine.core.validation import SCORE_NAMES
    from headscope.engine.model.loading import load_model
    from headscope.engine.sweeps.scores import score_table

    model = load_model(source.path, raw=raw)
    try:
        entry = None if store is None else store.for_model(model)
        # the `heads` command's sweep and stored parts; z-scores are not tracked per step
        table = score_table(model, seed, store=entry)
        n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
        values = {k: np.asarray(getattr(table, k), dtype=np.float64) for k in SCORE_NAMES}
        values.update(composition_maxima(model, seed, entry))
        digest = weights_digest(model.checkpoint)
    finally:
        model.raw_weights.close()
    return StepScores(source.step, source.path, n_layers, n_heads, digest, values)


def check_layouts(sources: Sequence[StepSource]) -> tuple[int, int]:
    """Every step must have the first step's layers × heads (headers only, no tensor read)."""
    from headscope.engine.model.loading import inspect_checkpoint

    first = inspect_checkpoint(sources[0].path).cfg
    for s in sources[1:]:
        cfg = inspect_checkpoint(s.path).cfg
        if (cfg.n_layers, cfg.n_heads) != (first.n_layers, first.n_heads):
            raise ShapeMismatchError(
                s.path, f"{cfg.n_layers} layers × {cfg.n_heads} heads, but the first step "
                f"({sources[0].path}) has {first.n_layers} × {first.n_heads}: not one series")
    return first.n_layers, first.n_heads


# Called as each step finishes: (steps done, steps in all, that step's scores).
StepProgress = Callable[[int, int, StepScores], None] | None


def score_steps(sources: Sequence[StepSource], *, seed: int = 0, raw: bool = False,
                workers: int = 1, progress: StepProgress = None,
                cancelled: Cancelled = None,
                cluster: Cluster | None = None,
                store: ResultStore | None = None) -> list[StepScores]:
    """:func:`score_step` for every source, in a pool of ``workers`` threads (1: in turn),
    or one task per step on a Dask ``cluster`` (engine/sweeps/cluster.py). ``store``: as for
    :func:`score_step`; the steps it already holds are read back first, and a cluster's
    results are written into it on this side as they arrive, keyed by each step's
    fingerprint, so the series scored again needs no cluster (the workers score each step
    from the file and never see the store).

    ``progress(done, total, result)`` after each step, from the calling thread; results come
    back in the sources' order. ``cancelled()`` is checked between steps.
    """
    total = len(sources)
    results: dict[int, StepScores] = {}

    def finished(i: int, r: StepScores) -> None:
        results[i] = r
        if progress is not None:
            progress(len(results), total, r)

    if cluster is not None:
        from headscope.engine.model.loading import inspect_checkpoint
        from headscope.engine.sweeps.cluster import run_tasks
        from headscope.engine.sweeps.store import fingerprint as stored_key

        entries = [step_entry(store, s, raw) for s in sources]
        for i, s in enumerate(sources):
            stored = load_step(entries[i], s, seed)
            if stored is not None:
                finished(i, stored)
        missing = [i for i in range(total) if i not in results]

        def arrived(j: int, r: StepScores) -> None:
            save_step(entries[missing[j]], r, seed)
            finished(missing[j], r)

        if missing:
            tasks = [(str(sources[i].path), sources[i].step, seed, raw,
                      stored_key(inspect_checkpoint(sources[i].path), raw))  # headers only
                     for i in missing]
            run_tasks(cluster, score_step_task, tasks, finished=arrived, cancelled=cancelled)
    elif workers <= 1:
        for i, s in enumerate(sources):
            check_cancelled(cancelled)
            finished(i, score_step(s, seed=seed, raw=raw, store=store))
    else:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="timeline") as pool:
            futures = {pool.submit(score_step, s, seed=seed, raw=raw, store=store): i
                       for i, s in enumerate(sources)}
            try:
                for future in as_completed(futures):
                    check_cancelled(cancelled)
                    finished(futures[future], future.result())
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
    return [results[i] for i in range(total)]


# ----------------------------------------------------------------------------- phase changes


@dataclass(frozen=True)
class PhaseChange:
    """The largest jump of a smoothed score curve (docs/math.md "Training dynamics")."""

    step: int  # the first step at or past the midpoint of the jump
    before: float  # smoothed value where the jump starts
    after: float  # ... and where it ends
    start_step: int
    end_step: int

    @property
    def size(self) -> float:
        return self.after - self.before


def smooth(values: Sequence[float]) -> list[float]:
    """Running median of three (the end points kept): removes one-step spikes, keeps steps."""
    v = list(values)
    return [v[i] if i in (0, len(v) - 1) else sorted(v[i - 1 : i + 2])[1] for i in range(len(v))]


def window_steps(steps: Sequence[int], fraction: float = WINDOW_FRACTION) -> float:
    """The longest span a phase change may take: ``fraction`` of the series' span, but at
    least the median gap between consecutive steps (so a coarse series still has pairs)."""
    gaps = sorted(b - a for a, b in itertools.pairwise(steps))
    median_gap = gaps[len(gaps) // 2] if gaps else 0
    return max(fraction * (steps[-1] - steps[0]), median_gap)


def find_phase_change(steps: Sequence[int], values: Sequence[float], min_jump: float, *,
                      fraction: float = WINDOW_FRACTION) -> PhaseChange | None:
    """The largest rise or fall of the smoothed curve within a window, if ``≥ min_jump``.

    Non-finite values are dropped first. Among pairs of steps ``i < j`` no further apart than
    :func:`window_steps`, with ``i ≥ 1`` (the first step is where the curve starts, not a
    level it was seen to stay at: most scores move most between the initialisation and the
    next checkpoint), the one with the largest ``|s_j − s_i|`` (ties: the shorter, then the
    earlier); its step is the first step in ``(i, j]`` whose smoothed value has passed the
    midpoint ``(s_i + s_j) / 2``. docs/math.md "Training dynamics".
    """
    kept = [(t, float(v)) for t, v in zip(steps, values, strict=True) if math.isfinite(float(v))]
    if len(kept) < 3:
        return None
    t = [p[0] for p in kept]
    s = smooth([p[1] for p in kept])
    window = window_steps(t, fraction)
    best: tuple[float, int, int, int] | None = None  # (-|jump|, span, i, j)
    for i in range(1, len(t)):
        for j in range(i + 1, len(t)):
            if t[j] - t[i] > window:
                break
            key = (-abs(s[j] - s[i]), t[j] - t[i], i, j)
            if best is None or key < best:
                best = key
    if best is None or -best[0] < min_jump:
        return None
    _, _, i, j = best
    mid = (s[i] + s[j]) / 2
    rising = s[j] > s[i]
    k = next(m for m in range(i + 1, j + 1) if (s[m] >= mid if rising else s[m] <= mid))
    return PhaseChange(step=t[k], before=s[i], after=s[j], start_step=t[i], end_step=t[j])


# ----------------------------------------------------------------------------- the timeline


@dataclass(frozen=True)
class Timeline:
    """Every head's scores across the steps, the phase changes and the warnings."""

    steps: list[int]
    paths: list[str]
    n_layers: int
    n_heads: int
    series: dict[str, np.ndarray]  # key -> [n_steps, n_layers, n_heads]
    phase_changes: list[dict[str, Any]]
    model_phase_change: dict[str, Any] | None
    fingerprints: list[str]
    warnings: list[str]

    def head_series(self, layer: int, head: int, key: str) -> list[float]:
        return [float(v) for v in self.series[key][:, layer, head]]

    def to_dict(self) -> dict[str, Any]:
        """The JSON of ``headscope timeline --json`` (non-finite → ``export.jsonable``)."""
        heads = []
        for layer in range(self.n_layers):
            for head in range(self.n_heads):
                row: dict[str, Any] = {"layer": layer, "head": head}
                row.update({k: self.head_series(layer, head, k) for k in self.series})
                heads.append(row)
        return {
            "steps": list(self.steps),
            "paths": list(self.paths),
            "heads": heads,
            "phase_changes": list(self.phase_changes),
            "model_phase_change": self.model_phase_change,
            "fingerprints": list(self.fingerprints),
            "warnings": list(self.warnings),
        }


def identical_steps(results: Sequence[StepScores]) -> list[list[int]]:
    """Groups (two or more) of steps whose weights are bit-for-bit the same."""
    groups: dict[str, list[int]] = {}
    for r in results:
        groups.setdefault(r.fingerprint, []).append(r.step)
    return [g for g in groups.values() if len(g) > 1]


def phase_changes(steps: Sequence[int], series: Mapping[str, np.ndarray],
                  jumps: Mapping[str, float] | None = None) -> list[dict[str, Any]]:
    """Every (head, score) phase change, ordered by step, layer, head and score."""
    jumps = dict(min_jumps()) | dict(jumps or {})
    found = []
    for key, values in series.items():
        _, n_layers, n_heads = values.shape
        for layer in range(n_layers):
            for head in range(n_heads):
                pc = find_phase_change(steps, values[:, layer, head].tolist(), jumps.get(key, SCORE_JUMP))
                if pc is not None:
                    found.append({"layer": layer, "head": head, "score": key, "step": pc.step,
                                  "before": pc.before, "after": pc.after, "size": pc.size,
                                  "start_step": pc.start_step, "end_step": pc.end_step})
    order = {k: i for i, k in enumerate(series)}
    found.sort(key=lambda c: (c["step"], c["layer"], c["head"], order[c["score"]]))
    return found


def model_phase_change(steps: Sequence[int], changes: Sequence[Mapping[str, Any]]
                       ) -> dict[str, Any] | None:
    """The step at which the most heads are changing; ``None`` when nothing changed.

    A head is *changing at* step ``S`` when one of its phase changes (any score) has
    ``start_step < S ≤ end_step``. Ties: the step inside the most (head, score) changes,
    then the earlier. ``heads`` are the heads changing there, ``scores`` their scores.
    """
    best: tuple[int, int, int] | None = None
    for step in steps:
        inside = [c for c in changes if c["start_step"] < step <= c["end_step"]]
        n_heads = len({(c["layer"], c["head"]) for c in inside})
        key = (-n_heads, -len(inside), step)
        if inside and (best is None or key < best):
            best = key
    if best is None:
        return None
    step = best[2]
    inside = [c for c in changes if c["start_step"] < step <= c["end_step"]]
    heads = sorted({(c["layer"], c["head"]) for c in inside})
    return {"step": step, "n_heads": len(heads), "heads": [list(h) for h in heads],
            "scores": sorted({c["score"] for c in inside}, key=list(score_keys()).index)}


def build_timeline(results: Sequence[StepScores], notes: Sequence[str] = (),
                   jumps: Mapping[str, float] | None = None) -> Timeline:
    """Assemble scored steps (in order) into a :class:`Timeline`."""
    import numpy as np

    if len(results) < 2:
        raise InvalidRequestError(None, "a timeline needs at least two checkpoints")
    steps = [r.step for r in results]
    keys = score_keys()
    series = {k: np.stack([np.asarray(r.scores[k], dtype=np.float64) for r in results]) for k in keys}
    changes = phase_changes(steps, series, jumps)
    warnings = list(notes)
    for group in identical_steps(results):
        names = ", ".join(f"{s} ({results[steps.index(s)].path})" for s in group)
        warnings.append(f"steps {names} have identical weights: a copy or a mislabelled checkpoint?")
    return Timeline(steps=steps, paths=[str(r.path) for r in results], n_layers=results[0].n_layers,
                    n_heads=results[0].n_heads, series=series, phase_changes=changes,
                    model_phase_change=model_phase_change(steps, changes),
                    fingerprints=[r.fingerprint for r in results], warnings=warnings)


def compute_timeline(paths: Sequence[str | os.PathLike[str]], *, seed: int = 0, raw: bool = False,
                     workers: int = 1, progress: StepProgress = None,
                     cancelled: Cancelled = None,
                     cluster: Cluster | None = None,
                     store: ResultStore | None = None) -> Timeline:
    """Discover the steps of ``paths``, check they are one layout, score them, assemble."""
    sources, notes = discover_steps(paths)
    check_layouts(sources)
    results = score_steps(sources, seed=seed, raw=raw, workers=workers, progress=progress,
                          cancelled=cancelled, cluster=cluster, store=store)
    return build_timeline(results, notes)
