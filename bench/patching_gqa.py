"""``python -m bench.patching_gqa``: exact activation patching on a grouped-query shape,
before and after computing each key/value head once per group, in the same run, round robin.

The shape (``bench.checkpoints``, ``llama-1b-gqa`` by default: 22 layers, 32 query heads
sharing 4 key/value heads, 2.2 GB of bf16; ``--n-layers N`` cuts it) is written once into
``--dir`` and reused. The sides:

- **after**: the installed headscope (``--after DIR``: another one);
- **before** (``--before reference``, the default): the same installed headscope with
  ``forward.transformer.projections`` replaced, in the ``--one`` process only, by
  ``per_query_head_projections`` below, the engine's projections before d58333b (every query
  head's keys and values projected from its own copy of its group's weights): the engine no
  longer has that path, so the bench keeps it. Only the projections differ between the sides.
  ``--before DIR``: a directory holding an older ``headscope`` package, put first on
  ``PYTHONPATH`` (``mkdir -p DIR/headscope && git archive COMMIT engine tui themes
  sample_models | tar -x -C DIR/headscope``; bf6d201 is the commit before d58333b), which
  also measures whatever else changed since; ``--before none``: the after side alone.

Each side is a subprocess running this file by path (``--one PATH``: headscope's public API,
plus ``transformer.projections`` for the reference, so an older version runs it too): it opens
the checkpoint, then times ``Model.patch`` of every head of ``--layers`` alone at each of
``--sites`` (the first call also reads the weights), and reports each call's wall and CPU time
and values; the table gives the fastest of ``--repeat`` runs per side and the largest
difference between the sides' values. The prompt is ``bench.patching``'s (seeded ids, every
other id of the second half redrawn).
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
# the engine's modules that import ``projections`` by name (``install_reference``)
USERS = ("headscope.engine.forward.patching", "headscope.engine.forward.edges")


def prompts(d_vocab: int, n: int, seed: int = 0) -> tuple[list[int], list[int]]:
    """As ``bench.patching.prompts`` (kept here: this file runs without the bench package)."""
    import random

    rng = random.Random(seed)
    clean = [rng.randrange(3, d_vocab) for _ in range(n)]
    corrupt = [rng.randrange(3, d_vocab) if i >= n // 2 and i % 2 else t for i, t in enumerate(clean)]
    return clean, corrupt


def per_query_head_projections(w: Any, layer: int, x: Any) -> tuple[Any, Any, Any]:
    """``forward.transformer.projections`` as it was before d58333b: every head's queries,
    keys and values projected with its own ``[d_model, d_head]`` weights, so under grouped-query
    attention each stored key/value head is projected once per query head of its group (the
    canonical K/V tensors repeat it). The same values as the engine's (the same product per
    head), ``n_heads / kv_heads`` times the K/V work."""
    import torch

    from headscope.engine.forward.torch_weights import torch_weights

    w = torch_weights(w)
    pre = f"blocks.{layer}.attn"
    spec = "bpd,hde->bhpe" if x.ndim == 3 else "bphd,hde->bhpe"

    def project(i: int, name: str) -> Any:  # [b, p, (h,) d_model] @ [h, d_model, d_head] -> [b, h, p, d_head]
        return (torch.einsum(spec, x if x.ndim == 3 else x[:, :, i], w.get(f"{pre}.W_{name}"))
                + w.get(f"{pre}.b_{name}")[:, None, :])

    return project(0, "Q"), project(1, "K"), project(2, "V")


def install_reference() -> dict[str, int]:
    """Put ``per_query_head_projections`` in place of the engine's ``projections`` in every
    loaded headscope module that holds it (``transformer`` and those that imported the name:
    patching, edges); ``{"calls": n}``, counted as the patch runs (0 would mean the engine no
    longer calls it by that name, and the "before" side measured nothing)."""
    import importlib

    from headscope.engine.forward import transformer

    for name in USERS:  # the modules that import the name bind it now, for the loop below
        importlib.import_module(name)

    original, calls = transformer.projections, {"calls": 0}

    def counted(w: Any, layer: int, x: Any) -> tuple[Any, Any, Any]:
        calls["calls"] += 1
        return per_query_head_projections(w, layer, x)

    for name, module in list(sys.modules.items()):
        if name.startswith("headscope.") and getattr(module, "projections", None) is original:
            module.projections = counted
    return calls


def one(path: str, tokens: int, layers: list[int], sites: list[str], reference: bool = False) -> dict[str, Any]:
    import importlib
    import resource

    from headscope.engine.api.model import open_model

    for name in USERS:  # torch and the forward modules imported on both sides before any timing
        importlib.import_module(name)
    calls = install_reference() if reference else None
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
    if calls is not None:
        out["reference_calls"] = calls["calls"]
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
    p.add_argument("--reference", action="store_true", help=argparse.SUPPRESS)  # with --one: the before side
    p.add_argument("--dir", type=Path, help="where the checkpoint is written / reused")
    p.add_argument("--shape", default="llama-1b-gqa")
    p.add_argument("--n-layers", type=int, help="the shape cut to this many layers (a smaller checkpoint, "
                   "the same per-layer work)")
    p.add_argument("--tokens", type=int, default=20)
    p.add_argument("--layers", default="0", help="the layers whose heads are patched (default 0)")
    p.add_argument("--sites", default="out,k")
    p.add_argument("--before", default="reference",
                   help="reference (the per-query-head projections kept here; default), a directory "
                        "holding an older headscope (see above), or none")
    p.add_argument("--after", help="a directory holding the headscope after (default: the installed one)")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--out", type=Path, help="also write the table here")
    args = p.parse_args(argv)
    layers = [int(x) for x in args.layers.split(",")]
    sites = args.sites.split(",")
    if args.one:
        print(json.dumps(one(args.one, args.tokens, layers, sites, args.reference)))
        return 0
    import dataclasses
    import tempfile

    from bench.checkpoints import SHAPES, write_checkpoint

    shape = SHAPES[args.shape]
    if args.n_layers:
        shape = dataclasses.replace(shape, name=f"{shape.name}-{args.n_layers}l", n_layers=args.n_layers)
    path = write_checkpoint(shape, args.dir or Path(tempfile.mkdtemp(prefix="headscope-bench-"))).resolve()  # run from /
    # side -> (PYTHONPATH, run the reference projections)
    sides = {"after": (args.after or "", False)}
    if args.before != "none":
        reference = args.before == "reference"
        sides = {"before": (args.after or "" if reference else args.before, reference), **sides}
    found: dict[str, list[dict[str, Any]]] = {k: [] for k in sides}
    for _ in range(args.repeat):
        for side, (where, reference) in sides.items():
            cmd = [sys.executable, str(Path(__file__).resolve()), "--one", str(path), "--tokens", str(args.tokens),
                   "--layers", args.layers, "--sites", args.sites, *(["--reference"] if reference else [])]
            env = {**os.environ, "PYTHONPATH": where} if where else None
            done = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd="/", env=env)
            found[side].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(side, {s: round(found[side][-1][s]["seconds"], 1) for s in sites}, file=sys.stderr, flush=True)
    before = {"reference": "before = the per-query-head projections kept in bench/patching_gqa.py",
              "none": "after only"}.get(args.before, f"before = {args.before}")
    text = table(found, f"{shape.name}, {args.tokens} tokens, every head of layer(s) {args.layers} alone, "
                        f"{before}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
                        f"best of {args.repeat}:", sites)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
