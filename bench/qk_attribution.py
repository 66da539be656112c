"""``python -m bench.qk_attribution``: the QK attribution of one query row against one forward
pass to that layer, in the same process, on the same tokens (issue 38: at most 1.3×).

For each ``--shapes`` entry, writes (or reuses, ``--dir``) the random checkpoint of
``bench.checkpoints`` and runs, in a fresh subprocess (``--one SHAPE PATH``):

- ``forward``: the plain forward pass to the last layer ``L`` (the embedding, then
  ``forward.transformer.blocks`` up to ``L``) on a ``--tokens``-token seeded prompt;
- ``qk_attribution``: ``forward.qk_attribution.qk_attribution`` of head ``L``.0 at the last
  position: every key of the row (all ``--tokens`` of them), every (query source, key source)
  term.

Both are run once to read and process the weights, then ``--repeat`` times in turn; the
fastest of each is reported, with their ratio, the terms' size and the process's peak RSS
(read before the next part).

Then ``move``: the explorer's "why" view (``tui.widgets.why.WhyView``) in a headless Textual
app (``run_test`` at 120×40) is shown the row, and ``→`` is pressed ``--moves`` times along
it: each move is timed from the key press until the view shows the next key with its grid
drawn (the cached row re-sliced, no engine call); the median and the slowest wall time and
the median CPU time of this process are reported (the issue: < 100 ms a key).
``--synthetic-row C`` times only the moves, on a random row of ``C`` components (7B's last
layer: 1056) and ``--tokens`` keys, without a checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import publish, ratio, rss_mb, run_json

SHAPES = ("gpt2-small",)


def prompt(d_vocab: int, n: int, seed: int = 0) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(3, d_vocab) for _ in range(n)]


def moves(found: Any, n: int) -> list[tuple[float, float]]:
    """Seconds per ``→`` in the why view over the cached row ``found`` (module docstring):
    ``(wall, CPU)`` each (this process's CPU time: on a shared box the wall time includes the
    waits for a core)."""
    import asyncio

    from textual.app import App, ComposeResult

    from headscope.tui.widgets.chart import Chart
    from headscope.tui.widgets.why import WhyView

    class WhyApp(App[None]):
        def compose(self) -> ComposeResult:
            yield WhyView()

    async def run() -> list[tuple[float, float]]:
        app = WhyApp()
        out: list[tuple[float, float]] = []
        async with app.run_test(size=(120, 40)) as pilot:
            view = app.query_one(WhyView)
            chart = app.query_one("#why-grid", Chart)

            async def drawn(key: int) -> None:
                while view.key != key or chart.rendered is None:
                    await pilot.pause()
                await pilot.pause()  # painted

            view.show(found, key=found.keys[0])
            await drawn(found.keys[0])
            for key in found.keys[1: n + 1]:
                t, cpu = time.perf_counter(), time.process_time()
                await pilot.press("right")
                await drawn(key)
                out.append((time.perf_counter() - t, time.process_time() - cpu))
        return out

    return asyncio.run(run())


def synthetic_row(n_components: int, n_keys: int) -> Any:
    """A random ``QKAttribution`` of ``n_components`` sources and ``n_keys`` keys, laid out as
    ``forward.qk_attribution`` lays out its terms (key by key), a few sources much larger."""
    import numpy as np

    from headscope.engine.core.attribution import QKAttribution

    rng = np.random.default_rng(0)
    size = rng.random((1, n_components, 1), dtype=np.float32) ** 4
    by_key = rng.standard_normal((n_keys, n_components, n_components), dtype=np.float32) * size
    by_key.setflags(write=False)
    terms = by_key.transpose(1, 2, 0)
    names = ("embed", *(f"a{i // 32}.h{i % 32}" for i in range(n_components - 2)), "bias")
    return QKAttribution(layer=1, head=0, query=n_keys - 1, keys=tuple(range(n_keys)), names=names,
                         score=terms.sum((0, 1)), terms=terms, query_totals=terms.sum(1, dtype=np.float64),
                         key_totals=terms.sum(0, dtype=np.float64), nonfinite=False)


def harness_seconds(n: int) -> list[float]:
    """The baseline of ``moves``, same run: the pilot's own latency for one key press and the
    pauses ``moves`` waits after it, in an empty Textual app of the same size (``run_test``
    waits for the app to be idle and for a refresh after each press: ~60 ms on an idle box,
    none of it the why view's)."""
    import asyncio

    from textual.app import App, ComposeResult
    from textual.widgets import Static

    class EmptyApp(App[None]):
        def compose(self) -> ComposeResult:
            yield Static("")

    async def run() -> list[float]:
        out: list[float] = []
        async with EmptyApp().run_test(size=(120, 40)) as pilot:
            for _ in range(n):
                t = time.perf_counter()
                await pilot.press("right")
                await pilot.pause()
                await pilot.pause()
                out.append(time.perf_counter() - t)
        return out

    return asyncio.run(run())


def move_stats(found: Any, n_moves: int) -> dict[str, Any]:
    """``moves`` summed up: how many, the median and slowest wall time, the median CPU time,
    and the median wall time of the same presses in an empty app (``harness_seconds``)."""
    import statistics

    took = moves(found, n_moves)
    wall, cpu = [t for t, _ in took], [c for _, c in took]
    harness = 1000 * statistics.median(harness_seconds(max(n_moves, 5)))
    return {"moves": len(took), "move_ms": 1000 * statistics.median(wall), "move_max_ms": 1000 * max(wall),
            "move_cpu_ms": 1000 * statistics.median(cpu), "harness_ms": harness,
            "move_net_ms": 1000 * statistics.median(wall) - harness}


def one(path: Path, n_tokens: int, repeat: int, n_moves: int = 0) -> dict[str, Any]:
    """Both measurements in this process (module docstring)."""
    import torch

    from headscope.engine.forward.qk_attribution import qk_attribution
    from headscope.engine.forward.torch_weights import torch_weights
    from headscope.engine.forward.transformer import blocks, embed, token_ids
    from headscope.engine.model.loading import load_model

    model = load_model(path)
    cfg = model.cfg
    tokens = prompt(cfg.d_vocab, n_tokens)
    layer, head, query = cfg.n_layers - 1, 0, n_tokens - 1
    tw = torch_weights(model.weights)

    def forward() -> Any:
        with torch.inference_mode():
            return blocks(tw, embed(tw, token_ids(tokens, cfg, None)), 0, layer)

    def attribution() -> Any:
        return qk_attribution(model.weights, tokens, layer, head, query)

    out: dict[str, Any] = {"layer": layer, "keys": n_tokens, "threads": torch.get_num_threads()}
    t = time.perf_counter()
    found = attribution()  # cold: reads and processes the weights
    out["cold_seconds"] = time.perf_counter() - t
    forward()
    best = {"forward": float("inf"), "qk_attribution": float("inf")}
    for _ in range(repeat):
        for name, fn in (("forward", forward), ("qk_attribution", attribution)):
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    out.update({f"{k}_seconds": v for k, v in best.items()})
    out["components"] = len(found.names)
    out["terms_mb"] = found.terms.nbytes / 2**20
    out["rss_mb"] = rss_mb()
    if n_moves:
        out.update(move_stats(found, n_moves))
    return out


def table(results: dict[str, dict[str, Any]], n_tokens: int) -> str:
    lines = [f"| shape | last layer | components | forward to it (s) | one query row, {n_tokens} keys (s) | "
             "row / forward | terms (MB) | peak RSS (MB) | why view, next key: median wall (max), median CPU ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    for shape, r in results.items():
        if "error" in r:
            lines.append(f"| {shape} | {r['error']} | | | | | | | |")
            continue
        lines.append(f"| {shape} | {r['layer']} | {r['components']} | {r['forward_seconds']:.3f} | "
                     f"{r['qk_attribution_seconds']:.3f} | "
                     f"**{ratio(r['qk_attribution_seconds'], r['forward_seconds'])}** | "
                     f"{r['terms_mb']:.1f} | {r['rss_mb']:.0f} | "
                     + (f"{r['move_ms']:.0f} ({r['move_max_ms']:.0f}), {r['move_cpu_ms']:.0f} over {r['moves']} |"
                        if "move_ms" in r else "– |"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.qk_attribution", description=__doc__.splitlines()[0])
    p.add_argument("--one", metavar="PATH", help="measure PATH in this process, print JSON")
    p.add_argument("--dir", type=Path, help="where the checkpoints are written / reused")
    p.add_argument("--shapes", default=",".join(SHAPES), help="bench.checkpoints shapes (default gpt2-small)")
    p.add_argument("--tokens", type=int, default=64, help="prompt length = keys of the row (default 64)")
    p.add_argument("--repeat", type=int, default=5, help="timed runs of each (the fastest is shown)")
    p.add_argument("--moves", type=int, default=10, help="→ presses timed in the why view (0: none)")
    p.add_argument("--synthetic-row", type=int, metavar="C",
                   help="only the key moves, on a random row of C components (no checkpoint)")
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--out", type=Path, help="also write the table here")
    args = p.parse_args(argv)
    if args.synthetic_row:
        r = move_stats(synthetic_row(args.synthetic_row, args.tokens), args.moves)
        return publish(f"why view, a random row of {args.synthetic_row} components × {args.tokens} keys, "
                       f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
                       f"{os.getloadavg()[0]:.1f}: next key median {r['move_ms']:.0f} ms wall (max "
                       f"{r['move_max_ms']:.0f}), median {r['move_cpu_ms']:.0f} ms CPU, over {r['moves']} moves; "
                       f"the same presses in an empty app {r['harness_ms']:.0f} ms wall: the view's own "
                       f"{r['move_net_ms']:.0f} ms\n",
                       args.out)
    if args.one:
        print(json.dumps(one(Path(args.one), args.tokens, args.repeat, args.moves)))
        return 0

    from .checkpoints import SHAPES as ALL
    from .checkpoints import write_checkpoint

    root = args.dir or Path(tempfile.mkdtemp(prefix="headscope-bench-"))
    results = {}
    for shape in args.shapes.split(","):
        path = write_checkpoint(ALL[shape], root)
        results[shape] = run_json(["-m", "bench.qk_attribution", "--one", str(path), "--tokens",
                                   str(args.tokens), "--repeat", str(args.repeat), "--moves", str(args.moves)],
                                  args.timeout)
        print(shape, json.dumps(results[shape]), file=sys.stderr, flush=True)
    head = (f"{args.tokens} tokens, head L.0 at the last layer, query = the last position, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, "
            f"load average {os.getloadavg()[0]:.1f} at the end, Python {platform.python_version()}, "
            f"best of {args.repeat}, {args.moves} key moves")
    return publish(f"{head}\n\n{table(results, args.tokens)}\n", args.out)


if __name__ == "__main__":
    sys.exit(main())
