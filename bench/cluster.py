"""``python -m bench.cluster``: sweeps on 1, 2 and 4 local Dask workers against the
in-process sweep, measured in the same run (issue #19; README, "Sweeps on a cluster").

Per shape (GPT-2-small and the Pythia-1B shape; ``--tiny`` for the smoke test) and per
sweep (``heads``: the copying and QK-positivity layer sweeps plus the in-process behavioural
pass, as ``headscope heads`` runs them; ``composition-k``: the target-layer tiles), it times

- the in-process sweep (``scores.score_table`` / ``scores.composition`` with a fresh
  results store, so nothing is read back from an earlier run),
- for each worker count N: starting ``LocalCluster(N)`` (one thread per worker, processes),
  then the same call with ``cluster=`` and another fresh store. The first sweep on a new
  cluster includes every worker opening the checkpoint; a second sweep on the same cluster
  (fresh store again) shows the steady state.

Parts are the results store's: a layer of a spectral sweep, a target-layer tile of a
composition sweep (``engine.sweeps.cluster.part_shapes``), one task each; they are not resized to a
worker's memory. Ratios are in-process seconds / cluster seconds (> 1: the cluster is faster).
On a 2-core box expect < 1: four workers share two cores with the client, and each opens the
checkpoint once.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import publish, ratio

WORKERS = (1, 2, 4)
SWEEPS = ("heads", "composition-k")


def _sweep(name: str) -> Callable[[Any, Any, Any], object]:
    from headscope.engine.sweeps import scores

    if name == "heads":
        return lambda model, store, cluster: scores.score_table(model, store=store, cluster=cluster)
    kind = name.rsplit("-", 1)[1]
    return lambda model, store, cluster: scores.composition(model, kind, store=store, cluster=cluster)


def _timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def measure(path: Path, workers: tuple[int, ...], sweeps: tuple[str, ...]) -> dict[str, Any]:
    """Seconds for every (sweep, in-process | N workers) on the checkpoint at ``path``."""
    from headscope.engine.model.loading import load_model
    from headscope.engine.sweeps.cluster import local_cluster
    from headscope.engine.sweeps.store import ResultStore

    model = load_model(path)
    scratch = Path(tempfile.mkdtemp(prefix="headscope-bench-cluster-"))
    fresh = iter(range(10**6))

    def store() -> Any:  # a new, empty results store each time: every part is computed
        return ResultStore(scratch / f"s{next(fresh)}").for_model(model)

    out: dict[str, Any] = {"local": {}, "workers": {}}
    for sweep in sweeps:
        run = _sweep(sweep)
        run(model, None, None)  # warm-up: torch/numpy kernels, the model's lazy reads
        out["local"][sweep] = _timed(lambda: run(model, store(), None))  # noqa: B023
    for n in workers:
        row: dict[str, Any] = {}
        t = time.perf_counter()
        cluster = local_cluster(n)
        cluster.client.wait_for_workers(n, timeout=120)
        row["start"] = time.perf_counter() - t
        try:
            for sweep in sweeps:
                run = _sweep(sweep)
                row[f"{sweep} first"] = _timed(lambda: run(model, store(), cluster))  # noqa: B023
                row[f"{sweep} again"] = _timed(lambda: run(model, store(), cluster))  # noqa: B023
        finally:
            cluster.close()
        out["workers"][n] = row
        print(f"#   {n} workers: {row}", file=sys.stderr)
    return out


def report(shape: str, res: dict[str, Any]) -> str:
    lines = [f"### {shape}", "",
             "| sweep | in-process (s) | workers | cluster start (s) | first sweep (s) | "
             "in-process / first | again (s) | in-process / again |",
             "|---|---|---|---|---|---|---|---|"]
    for sweep, local in res["local"].items():
        for n, row in res["workers"].items():
            first, again = row[f"{sweep} first"], row[f"{sweep} again"]
            lines.append(f"| {sweep} | {local:.2f} | {n} | {row['start']:.2f} | {first:.2f} | "
                         f"{ratio(local, first)} | {again:.2f} | {ratio(local, again)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, help="where checkpoints are written (reused if present)")
    ap.add_argument("--tiny", action="store_true", help="a toy shape and 1-2 workers (smoke test)")
    ap.add_argument("--shapes", default="gpt2-small,pythia-1b", help="comma-separated bench shapes")
    ap.add_argument("--out", type=Path, help="also write the markdown table to this file")
    args = ap.parse_args(argv)

    from .checkpoints import SHAPES, write_checkpoint

    shapes = ["tiny-llama-mha"] if args.tiny else [s for s in args.shapes.split(",") if s]
    workers = (1, 2) if args.tiny else WORKERS
    root = args.dir or Path(tempfile.mkdtemp(prefix="headscope-bench-"))
    parts = [f"Run {time.strftime('%Y-%m-%d %H:%M %Z')}, {os.cpu_count()} cores.", ""]
    for shape in shapes:
        path = write_checkpoint(SHAPES[shape], root)
        print(f"# {shape} at {path}", file=sys.stderr)
        parts += [report(shape, measure(path, workers, SWEEPS)), ""]
    text = "\n".join(parts)
    return publish(text, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
