"""``python -m bench.timeline --dir DIR``: ``headscope timeline --json`` on a Pythia-160M-shaped
series of 20 steps, as whole processes, cold and warm, against the commands it replaces.

Writes (once, into ``DIR/pythia-160m-series``, reused afterwards; never by ``make test``)
20 checkpoints ``step-000000`` … ``step-019000`` of the GPT-NeoX shape of Pythia-160M (12
layers × 12 heads, d_model 768, vocab 50304, MLP 3072, fp16, ~0.33 GB each, one shard per
layer as ``bench/checkpoints.py`` writes them): step ``k`` is ``w₀ + (k / 19) δ`` for two
seeded random draws ``w₀`` (the initialisation) and ``δ`` per tensor, so every step differs
(every fingerprint too) and the series moves steadily. Then, each a separate process, in
one run:

- ``timeline cold``: ``headscope timeline DIR --json`` with an empty results store
  (``HEADSCOPE_CACHE_DIR`` a new directory), with ``--workers 1`` and ``--workers 2``;
- ``timeline warm``: the same command again, the store filled by the cold run;
- the baseline, the commands a user runs for the same numbers without ``timeline``: for every
  step ``headscope heads STEP --json`` and ``headscope composition STEP --kind q|k|v --json``
  (``timeline`` reports both: the five head scores and each head's strongest composition
  edges), one process each, all on one empty store (cold), then all again (warm). The
  ``heads`` processes alone are listed as well.

Ratios are baseline / timeline (> 1: the timeline is faster). ``--tiny`` runs the same on a
toy NeoX shape, 2 steps, ``--workers 2`` and K-composition only (the smoke test).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import publish, ratio

STEPS = 20
SERIES_SHAPE = "pythia-160m"
KINDS = ("q", "k", "v")


def series_shape(tiny: bool) -> Any:
    from .checkpoints import SHAPES, Shape

    if tiny:
        return SHAPES["tiny-neox"]
    return Shape(SERIES_SHAPE, "neox", 12, 12, 768, 50304, 2048, 3072, dtype="float16")


def step_name(k: int) -> str:
    return f"step-{1000 * k:06d}"


def write_series(shape: Any, root: Path, n_steps: int) -> Path:
    """``n_steps`` checkpoints of ``shape`` under ``root/<shape>-series`` (once: reused when
    every step's index is there). One layer of one step in memory at a time (plus ``w₀``, ``δ``)."""
    import torch
    from safetensors.torch import save_file

    from .checkpoints import BUILDERS

    series = Path(root) / f"{shape.name}-series"
    steps = [series / step_name(k) for k in range(n_steps)]
    if all((s / "model.safetensors.index.json").exists() for s in steps):
        return series
    config, groups = BUILDERS[shape.family](shape)
    dtype = getattr(torch, shape.dtype)
    weight_map: dict[str, str] = {}
    total = 0
    for s in steps:
        s.mkdir(parents=True, exist_ok=True)
    for n, group in enumerate(groups):
        shard = f"model-{n + 1:05d}-of-{len(groups):05d}.safetensors"
        base = {name: make() for name, make in group}
        g = torch.Generator().manual_seed(10_000 + n)
        delta = {name: torch.randn(t.shape, generator=g) * 0.02 for name, t in base.items()}
        for k, s in enumerate(steps):
            f = k / max(1, n_steps - 1)
            tensors = {name: (t + f * delta[name]).to(dtype).contiguous() for name, t in base.items()}
            save_file(tensors, str(s / shard), metadata={"format": "pt"})
            if k == 0:
                for name, t in tensors.items():
                    weight_map[name] = shard
                    total += t.numel() * t.element_size()
        del base, delta
    index = json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    for s in steps:
        (s / "config.json").write_text(json.dumps(config, indent=1))
        (s / "model.safetensors.index.json").write_text(index)  # last: marks the step complete
    return series


def _headscope(argv: list[str], store: Path) -> float:
    """Seconds for one ``headscope`` process (output discarded; a failure stops the bench)."""
    env = {**os.environ, "HEADSCOPE_CACHE_DIR": str(store)}
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "headscope.tui.cli.main", *argv], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(f"headscope {' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return seconds


def measure(series: Path, workers: tuple[int, ...], scratch: Path,
            kinds: tuple[str, ...] = KINDS, composition_steps: int | None = None
            ) -> dict[str, float]:
    """Seconds of every scenario. ``composition_steps``: run the baseline's ``composition``
    processes on that many steps only and scale their sum to all steps (every step has the
    same shape, so the same work); ``None``: on every step."""
    steps = sorted(p for p in series.iterdir() if p.is_dir())
    sampled = steps[: composition_steps or len(steps)]
    out: dict[str, float] = {}
    for n in workers:
        store = scratch / f"timeline-w{n}"
        argv = ["timeline", str(series), "--json", "--workers", str(n)]
        out[f"timeline cold w{n}"] = _headscope(argv, store)
        out[f"timeline warm w{n}"] = _headscope(argv, store)
        print(f"# timeline --workers {n}: cold {out[f'timeline cold w{n}']:.1f} s, "
              f"warm {out[f'timeline warm w{n}']:.1f} s", file=sys.stderr)
    store = scratch / "baseline"
    for phase in ("cold", "warm"):
        heads = sum(_headscope(["heads", str(s), "--json"], store) for s in steps)
        comp = sum(_headscope(["composition", str(s), "--kind", kind, "--json"], store)
                   for s in sampled for kind in kinds) * len(steps) / len(sampled)
        out[f"heads {phase}"] = heads
        out[f"heads+composition {phase}"] = heads + comp
        print(f"# baseline {phase}: heads {heads:.1f} s, + composition {heads + comp:.1f} s",
              file=sys.stderr)
    return out


def report(name: str, n_steps: int, res: dict[str, float], workers: tuple[int, ...],
           kinds: tuple[str, ...] = KINDS) -> str:
    lines = [f"### {name}, {n_steps} steps", "",
             "| store | `timeline --json` (s) | workers | "
             f"{n_steps} × `heads` (s) | heads / timeline | "
             f"{n_steps} × (`heads` + `composition` {', '.join(kinds)}) (s) | "
             "heads+composition / timeline |",
             "|---|---|---|---|---|---|---|"]
    for phase in ("cold", "warm"):
        base, full = res[f"heads {phase}"], res[f"heads+composition {phase}"]
        for n in workers:
            t = res[f"timeline {phase} w{n}"]
            lines.append(f"| {phase} | {t:.1f} | {n} | {base:.1f} | {ratio(base, t, 1)} | "
                         f"{full:.1f} | {ratio(full, t, 1)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.timeline", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, help="where the series is written (reused if present)")
    ap.add_argument("--tiny", action="store_true", help="a toy shape and 2 steps (smoke test)")
    ap.add_argument("--steps", type=int, default=None, help=f"steps in the series (default {STEPS})")
    ap.add_argument("--workers", default=None,
                    help="comma-separated --workers values for the timeline (default 1,2)")
    ap.add_argument("--composition-steps", type=int, default=None, metavar="N",
                    help="time the baseline's composition processes on the first N steps and "
                         "scale to all (default: every step)")
    ap.add_argument("--out", type=Path, help="also write the markdown table to this file")
    args = ap.parse_args(argv)

    shape = series_shape(args.tiny)
    n_steps = args.steps or (2 if args.tiny else STEPS)
    workers = tuple(int(w) for w in args.workers.split(",")) if args.workers else (
        (2,) if args.tiny else (1, 2))
    kinds = ("k",) if args.tiny else KINDS
    root = args.dir or Path(tempfile.mkdtemp(prefix="headscope-bench-"))
    t = time.perf_counter()
    series = write_series(shape, root, n_steps)
    print(f"# {series} ready in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    scratch = Path(tempfile.mkdtemp(prefix="headscope-bench-timeline-"))
    try:
        res = measure(series, workers, scratch, kinds, args.composition_steps)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    sampled = ("" if not args.composition_steps or args.composition_steps >= n_steps else
               f" The baseline's composition processes ran on the first {args.composition_steps} "
               f"of the {n_steps} steps, their time scaled to all {n_steps}.")
    text = "\n".join([f"Run {time.strftime('%Y-%m-%d %H:%M %Z')}, {os.cpu_count()} cores.{sampled}", "",
                      report(shape.name, n_steps, res, workers, kinds), ""])
    return publish(text, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
