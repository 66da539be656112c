"""``python -m bench.firstframe``: process start → the explorer's first frame with its head tree.

Each measurement is a fresh subprocess (``--one KIND PATH``), so imports are cold, as for a
user typing ``headscope``. It starts the app headless at 120×40 with Textual's test
harness and stops the clock when the first frame is painted (the head tree comes from the
checkpoint's header; the engine and torch load after it). The baseline is the same
harness on an empty Textual app (one ``Static``), measured in the same run: Textual's own
floor on this machine. The table reports medians and headscope / baseline.

    python -m bench.firstframe [--dir DIR] [--shapes gpt2-small,llama-1b-gqa] [--repeat 5]
    python -m bench.firstframe --tiny           # the bundled attn-only-2l only (smoke test)
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = ROOT / "sample_models" / "attn-only-2l"
SIZE = (120, 40)


def one(kind: str, path: str) -> float:
    """Seconds from this process's start to the first painted frame of ``kind``'s app."""
    import asyncio

    from textual.app import App, ComposeResult
    from textual.widgets import Static

    if kind == "headscope":
        from headscope.tui.app import HeadscopeApp
        from headscope.tui.settings import Settings

        app: App = HeadscopeApp(path, settings=Settings())
    else:

        class Empty(App):
            def compose(self) -> ComposeResult:
                yield Static("empty")

        app = Empty()

    async def main() -> float:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause(0)
            return time.perf_counter() - T0

    return asyncio.run(main())


def measure(kind: str, path: Path, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        done = subprocess.run([sys.executable, "-m", "bench.firstframe", "--one", kind, str(path)],
                              cwd=ROOT, capture_output=True, text=True, check=True, timeout=120)
        out.append(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--one", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    p.add_argument("--tiny", action="store_true", help="the bundled attn-only-2l only")
    p.add_argument("--shapes", default="gpt2-small,llama-1b-gqa",
                   help="bench.checkpoints shapes besides attn-only-2l (comma-separated)")
    p.add_argument("--dir", type=Path, default=None, help="where the checkpoints are (reused)")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps({"seconds": one(*args.one)}))
        return 0
    models = [("attn-only-2l", BUNDLED)]
    tmp = None
    if not args.tiny:
        from .checkpoints import SHAPES, write_checkpoint

        root = args.dir or Path(tmp := tempfile.mkdtemp(prefix="headscope-bench-"))
        for name in filter(None, args.shapes.split(",")):
            models.append((name, write_checkpoint(SHAPES[name], root)))
    baseline = measure("empty", BUNDLED, args.repeat)
    base = statistics.median(baseline)
    lines = [f"first frame at {SIZE[0]}×{SIZE[1]}, median of {args.repeat} fresh processes "
             f"(empty Textual app: {base:.3f} s, range {min(baseline):.3f}-{max(baseline):.3f})",
             "", "| model | heads | headscope (s) | range (s) | headscope / empty app |",
             "|---|---|---|---|---|"]
    from headscope.engine.loading import read_structure

    for name, path in models:
        s = read_structure(path)
        times = measure("headscope", path, args.repeat)
        mid = statistics.median(times)
        lines.append(f"| {name} | {s['n_layers']}×{s['n_heads']} | {mid:.3f} | "
                     f"{min(times):.3f}-{max(times):.3f} | {mid / base:.2f}× |")
    print("\n".join(lines))
    if tmp is not None:
        print(f"\n(checkpoints in {tmp}; pass --dir to reuse them)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
