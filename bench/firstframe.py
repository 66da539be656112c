"""``python -m bench.firstframe``: process start → the explorer's first frame, then the explorer.

Each measurement is a fresh subprocess (``--one KIND PATH``), so imports are cold, as for a
user typing ``headscope``. It starts the app headless at 120×40 with Textual's test
harness and stops the first clock when the first frame is painted: the opening screen
(tui/screens/opening.py: the status bar naming the model and "opening PATH …", a line on what comes
next, the footer bar, whose keys Textual draws a frame or two later);
the explorer, numpy and plotext are imported after it, the engine and torch after the
explorer. The same process then times the explorer being up (its head tree, from the
checkpoint's header) and the first head view (L0.H0's token QK heatmap drawn, the model
open). The baseline is the same harness on an empty Textual app (one ``Static``), measured in
the same run: Textual's own floor on this machine. The table reports medians and
first frame / baseline.

    python -m bench.firstframe [--dir DIR] [--shapes gpt2-small,llama-1b-gqa] [--repeat 5]
    python -m bench.firstframe --tiny           # the bundled attn-only-2l only (smoke test)
    python -m bench.firstframe --tiny --first-frame-only --repeat 15   # the ratio alone
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = ROOT / "sample_models" / "attn-only-2l"
SIZE = (120, 40)


def one(kind: str, path: str) -> dict[str, float]:
    """Seconds from this process's start to the first painted frame of ``kind``'s app
    (``seconds``) and, for headscope, to the explorer (``explorer``) and the first head view
    (``head_view``)."""
    import asyncio

    from textual.app import App, ComposeResult
    from textual.widgets import Static

    if kind.startswith("headscope"):  # "headscope-frame": the first frame only
        from headscope.tui.app import HeadscopeApp
        from headscope.tui.base.settings import Settings

        app: App = HeadscopeApp(path, settings=Settings())
    else:

        class Empty(App):
            def compose(self) -> ComposeResult:
                yield Static("empty")

        app = Empty()

    async def main() -> dict[str, float]:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause(0)
            out = {"seconds": time.perf_counter() - T0}
            if kind == "headscope":
                out.update(await _explorer_times(app, pilot))
            return out

    return asyncio.run(main())


async def _explorer_times(app: object, pilot: object, timeout: float = 120.0) -> dict[str, float]:
    """After the first frame: when the explorer screen is current, and when L0.H0's token QK
    heatmap is drawn (the chart's rendered text; checked every 10 ms)."""
    out: dict[str, float] = {}
    end = time.perf_counter() + timeout
    while time.perf_counter() < end and "head_view" not in out:
        screen = app.screen  # type: ignore[attr-defined]
        if "explorer" not in out and type(screen).__name__ == "ExplorerScreen":
            out["explorer"] = time.perf_counter() - T0
        charts = screen.query("#qk-token") if "explorer" in out else ()  # (once composed)
        for chart in charts:
            rendered = chart.rendered
            if rendered is not None and "token QK L0.H0" in rendered.plain:
                out["head_view"] = time.perf_counter() - T0
        await pilot.pause(0.01)  # type: ignore[attr-defined]
    return out


def measure(kind: str, path: Path) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-m", "bench.firstframe", "--one", kind, str(path)],
                          cwd=ROOT, capture_output=True, text=True, check=True, timeout=300)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _median(runs: list[dict[str, float]], key: str) -> str:
    values = [r[key] for r in runs if key in r]
    return f"{statistics.median(values):.3f}" if values else "–"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--one", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    p.add_argument("--tiny", action="store_true", help="the bundled attn-only-2l only")
    p.add_argument("--shapes", default="gpt2-small,llama-1b-gqa",
                   help="bench.checkpoints shapes besides attn-only-2l (comma-separated)")
    p.add_argument("--dir", type=Path, default=None, help="where the checkpoints are (reused)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--first-frame-only", action="store_true",
                   help="do not wait for the explorer and the first head view (quicker)")
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(one(*args.one)), flush=True)
        # As the CLI after the explorer closes: no interpreter teardown under torch's threads
        # (the engine is open and may be sweeping by the first head view; the teardown aborts).
        os._exit(0)
    models = [("attn-only-2l", BUNDLED)]
    tmp = None
    if not args.tiny:
        from .checkpoints import SHAPES, write_checkpoint

        root = args.dir or Path(tmp := tempfile.mkdtemp(prefix="headscope-bench-"))
        for name in filter(None, args.shapes.split(",")):
            models.append((name, write_checkpoint(SHAPES[name], root)))
    # Interleaved (empty app, then each model, repeat times): on a shared box the load drifts,
    # and both sides of the ratio should see the same drift.
    baseline: list[float] = []
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in models}
    for _ in range(args.repeat):
        baseline.append(measure("empty", BUNDLED)["seconds"])
        for name, path in models:
            runs[name].append(measure("headscope-frame" if args.first_frame_only
                                      else "headscope", path))
    base = statistics.median(baseline)
    lines = [f"first frame at {SIZE[0]}×{SIZE[1]}, median of {args.repeat} fresh processes "
             f"(empty Textual app: {base:.3f} s, range {min(baseline):.3f}-{max(baseline):.3f})",
             "", "| model | heads | headscope first frame (s) | range (s) | explorer up (s) | "
             "first head view (s) | first frame / empty app |",
             "|---|---|---|---|---|---|---|"]
    from headscope.engine.model.loading import read_structure

    for name, path in models:
        s = read_structure(path)
        times = [r["seconds"] for r in runs[name]]
        mid = statistics.median(times)
        lines.append(f"| {name} | {s['n_layers']}×{s['n_heads']} | {mid:.3f} | "
                     f"{min(times):.3f}-{max(times):.3f} | {_median(runs[name], 'explorer')} | "
                     f"{_median(runs[name], 'head_view')} | {mid / base:.2f}× |")
    print("\n".join(lines))
    if tmp is not None:
        print(f"\n(checkpoints in {tmp}; pass --dir to reuse them)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
