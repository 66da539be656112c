"""``python -m bench.patching_gqa``: exact activation patching on a grouped-query shape,
two versions of headscope in the same run, round robin: ``--before DIR`` and ``--after DIR``
(default: the installed one), each a directory holding a ``headscope`` package put first on
``PYTHONPATH`` (``mkdir -p DIR/headscope && git archive COMMIT engine tui themes sample_models |
tar -x -C DIR/headscope``), so both run in this interpreter with the same libraries.

Each side is a subprocess running this file by path (``--one PATH``: only headscope's public
API, so any version of it runs it): it opens the checkpoint (``bench.checkpoints`` shape,
``llama-1b-gqa`` by default: 32 query heads sharing 4 key/value heads), then times
``Model.patch`` of every head of ``--layers`` alone at each of ``--sites`` (the first call also
reads the weights), and reports each call's wall and CPU time and values; the table gives the
fastest of ``--repeat`` runs per side and the largest difference between the sides' values.
The prompt is ``bench.patching``'s (seeded ids, every other id of the second half redrawn).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ANSWER, WRONG = 1, 2


def prompts(d_vocab: int, n: int, seed: int = 0) -> tuple[list[int], list[int]]:
    """As ``bench.patching.prompts`` (kept here: this file runs without the bench package)."""
    import random

    rng = random.Random(seed)
    clean = [rng.randrange(3, d_vocab) for _ in range(n)]
    corrupt = [rng.randrange(3, d_vocab) if i >= n // 2 and i % 2 else t for i, t in enumerate(clean)]
    return clean, corrupt


def one(path: str, tokens: int, layers: list[int], sites: list[str]) -> dict[str, Any]:
    import resource

    from headscope.engine.api.model import open_model

    model = open_model(path)
    clean, corrupt = prompts(model.cfg.d_vocab, tokens)
    heads = [[(layer, h)] for layer in layers for h in range(model.cfg.n_heads)]
    out: dict[str, Any] = {}
    for site in sites:
        wall, cpu = time.perf_counter(), time.process_time()
        result = model.patch([clean], [corrupt], answer=ANSWER, wrong=WRONG, site=site, heads=heads)
        out[site] = {"seconds": time.perf_counter() - wall, "cpu_seconds": time.process_time() - cpu,
                     "values": [row.patched for row in result.rows]}
    out["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["code"] = str(Path(sys.modules["headscope.engine"].__file__ or "").parent)  # which headscope ran
    return out


def table(found: dict[str, list[dict[str, Any]]], head: str, sites: list[str]) -> str:
    """The markdown table of each side's runs (``one``'s results; ``before`` optional)."""
    lines = [head, "",
             "| site | before (s) | after (s) | after / before | CPU before (s) | CPU after (s) | max abs diff |",
             "|---|---|---|---|---|---|---|"]
    for site in sites:
        best = {side: min(runs, key=lambda r: r[site]["seconds"])[site] for side, runs in found.items()}
        cpu = {side: min(r[site]["cpu_seconds"] for r in runs) for side, runs in found.items()}
        if "before" in best:
            diff = max(abs(a - b) for a, b in zip(best["before"]["values"], best["after"]["values"], strict=True))
            lines.append(f"| {site} | {best['before']['seconds']:.1f} | {best['after']['seconds']:.1f} | "
                         f"{best['after']['seconds'] / best['before']['seconds']:.2f} | {cpu['before']:.1f} | "
                         f"{cpu['after']:.1f} | {diff:.1e} |")
        else:
            lines.append(f"| {site} | – | {best['after']['seconds']:.1f} | – | – | {cpu['after']:.1f} | – |")
    rss = {side: max(r["rss_mb"] for r in runs) for side, runs in found.items()}
    lines += ["", "peak RSS (MB): " + ", ".join(f"{k} {v:.0f}" for k, v in rss.items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.patching_gqa", description=__doc__.splitlines()[0])
    p.add_argument("--one", metavar="PATH", help="run here, print JSON")
    p.add_argument("--dir", type=Path, help="where the checkpoint is written / reused")
    p.add_argument("--shape", default="llama-1b-gqa")
    p.add_argument("--n-layers", type=int, help="the shape cut to this many layers (a smaller checkpoint, "
                   "the same per-layer work)")
    p.add_argument("--tokens", type=int, default=20)
    p.add_argument("--layers", default="0", help="the layers whose heads are patched (default 0)")
    p.add_argument("--sites", default="out,k")
    p.add_argument("--before", help="a directory holding the headscope before (see above)")
    p.add_argument("--after", help="a directory holding the headscope after (default: the installed one)")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--out", type=Path, help="also write the table here")
    args = p.parse_args(argv)
    layers = [int(x) for x in args.layers.split(",")]
    sites = args.sites.split(",")
    if args.one:
        print(json.dumps(one(args.one, args.tokens, layers, sites)))
        return 0
    import dataclasses
    import tempfile

    from bench.checkpoints import SHAPES, write_checkpoint

    shape = SHAPES[args.shape]
    if args.n_layers:
        shape = dataclasses.replace(shape, name=f"{shape.name}-{args.n_layers}l", n_layers=args.n_layers)
    path = write_checkpoint(shape, args.dir or Path(tempfile.mkdtemp(prefix="headscope-bench-")))
    sides = {"before": args.before, "after": args.after or ""} if args.before else {"after": args.after or ""}
    found: dict[str, list[dict[str, Any]]] = {k: [] for k in sides}
    for _ in range(args.repeat):
        for side, where in sides.items():
            cmd = [sys.executable, str(Path(__file__).resolve()), "--one", str(path), "--tokens", str(args.tokens),
                   "--layers", args.layers, "--sites", args.sites]
            env = {**os.environ, "PYTHONPATH": where} if where else None
            done = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd="/", env=env)
            found[side].append(json.loads(done.stdout.strip().splitlines()[-1]))
    text = table(found, f"{shape.name}, {args.tokens} tokens, every head of layer(s) {args.layers} alone, "
                        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, best of {args.repeat}:", sites)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
