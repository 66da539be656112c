"""``python -m bench.theme_switch``: how long the explorer takes to settle after ``t`` (the next
theme), against the same presses in a minimal Textual app, same run (issue 39 §3: 1.8-2.3 s).

Each app runs in a fresh process (``--one KIND``), headless at ``--size`` (120×40) in Textual's
test harness: ``headscope`` is the explorer on the bundled attn-only-2l with the real engine,
once the model is open, the score sweep done and the process quiet (the engine's threads idle);
``headscope-all-tabs`` the same after every tab was shown once (3 … 0: the tabs built on
first show are built, their loads done), back on 1 QK; ``minimal`` is one ``Static`` with
headscope's four themes and ``t`` cycling them: Textual's own cost of re-applying a theme's
stylesheet, on this machine, now. ``t`` is pressed ``--presses``
times, each timed from the press until the app is idle again with its frame composited (two
``pilot.pause()``: every widget's queue empty, then a refresh), as wall time and as CPU time of
the UI thread (on a shared box the wall time includes the waits for a core). The first three
presses are the first use of a theme in the process (light, contrast, colour-blind), the later
ones reuse one. Headless Textual composites the frame but writes nothing to a terminal (tmux's
own time is not in these numbers).

    python -m bench.theme_switch [--size 120x40] [--presses 12] [--repeat 3]
    python -m bench.theme_switch --tiny      # fewer presses, one process each (smoke test)
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from . import ROOT, publish, ratio, run_json

BUNDLED = ROOT / "sample_models" / "attn-only-2l"
FIRST_USES = 3  # presses 1-3 show a theme for the first time (the app starts on the 4th)
KINDS = ("minimal", "headscope", "headscope-all-tabs")


def minimal_app() -> Any:
    """The baseline: one ``Static``, headscope's themes, ``t`` cycles them as the explorer does."""
    from textual.app import App, ComposeResult
    from textual.widgets import Static

    from headscope.themes import DEFAULT_THEME, THEME_NAMES, THEMES

    class Minimal(App[None]):
        BINDINGS = [("t", "cycle_theme", "Theme")]  # noqa: RUF012 (Textual's own idiom)

        def __init__(self) -> None:
            super().__init__()
            for theme in THEMES:
                self.register_theme(theme)
            self.theme = DEFAULT_THEME

        def compose(self) -> ComposeResult:
            yield Static("minimal")

        def action_cycle_theme(self) -> None:
            self.theme = THEME_NAMES[(THEME_NAMES.index(self.theme) + 1) % len(THEME_NAMES)]

    return Minimal()


def headscope_app(path: Path = BUNDLED) -> Any:
    from headscope.tui.app import HeadscopeApp
    from headscope.tui.base.settings import Settings

    return HeadscopeApp(path, settings=Settings())


async def _quiet(seconds: float = 0.3, timeout: float = 30.0) -> None:
    """Until this process used under 10 % of a core over ``seconds`` (the engine's threads,
    e.g. writing the results store after the sweep, are done), at most ``timeout``."""
    import asyncio

    end = time.perf_counter() + timeout
    while time.perf_counter() < end:
        cpu = time.process_time()
        await asyncio.sleep(seconds)
        if time.process_time() - cpu < 0.1 * seconds:
            return


async def presses(app: Any, n: int, size: tuple[int, int], ready: Any = None) -> dict[str, Any]:
    """``t`` pressed ``n`` times in ``app`` (``ready``: awaited with the pilot before the first
    press): per press (``presses``), the theme shown, the wall and UI-thread CPU seconds to
    settle; and the number of widgets on the screen (``widgets``)."""
    out: list[dict[str, Any]] = []
    async with app.run_test(size=size) as pilot:
        if ready is not None:
            await ready(app, pilot)
        await pilot.pause()
        await _quiet()
        widgets = len(list(app.screen.walk_children()))
        for _ in range(n):
            t, cpu = time.perf_counter(), time.thread_time()
            await pilot.press("t")
            await pilot.pause()
            await pilot.pause()
            out.append({"theme": app.theme, "wall": time.perf_counter() - t,
                        "cpu": time.thread_time() - cpu})
    return {"presses": out, "widgets": widgets}


async def explorer_ready(app: Any, pilot: Any, timeout: float = 120.0) -> None:
    """The model open, the explorer's first loads and the score sweep done."""
    end = time.perf_counter() + timeout
    while not app.model_ready.is_set() and not app.ready_failed and time.perf_counter() < end:
        await pilot.pause(0.05)
    await app.workers.wait_for_complete()


async def every_tab_shown(app: Any, pilot: Any) -> None:
    """``explorer_ready``, then every tab shown once and loaded (3 … 0), back to 1 QK."""
    await explorer_ready(app, pilot)
    for key in "345690":
        await pilot.press(key)
        await app.workers.wait_for_complete()
    await pilot.press("1")
    await app.workers.wait_for_complete()


def one(kind: str, n: int, size: tuple[int, int]) -> dict[str, Any]:
    import asyncio

    if kind == "minimal":
        return asyncio.run(presses(minimal_app(), n, size))
    ready = every_tab_shown if kind == "headscope-all-tabs" else explorer_ready
    return asyncio.run(presses(headscope_app(), n, size, ready))


def summary(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Medians of the first uses of a theme and of the later ones (wall and CPU, seconds)."""
    first, later = runs[:FIRST_USES], runs[FIRST_USES:]
    out: dict[str, float] = {}
    for name, part in (("first", first), ("later", later)):
        if part:
            out[f"{name}_wall"] = statistics.median(r["wall"] for r in part)
            out[f"{name}_cpu"] = statistics.median(r["cpu"] for r in part)
    return out


def table(results: dict[str, list[dict[str, Any]]], size: tuple[int, int], n: int) -> str:
    """Medians over every process of each kind, and headscope / minimal."""
    med = {kind: summary([p for r in rs for p in r["presses"]]) for kind, rs in results.items()}
    widgets = {kind: rs[0]["widgets"] for kind, rs in results.items()}
    lines = [f"`t` at {size[0]}×{size[1]}: {len(results['minimal'])} process(es) of each, "
             f"{n} presses each (the first {FIRST_USES}: a theme's first use), medians", "",
             "| app | widgets | first use: wall (s) | CPU (s) | later: wall (s) | CPU (s) |",
             "|---|---|---|---|---|---|"]
    b = med["minimal"]
    for kind, m in med.items():
        lines.append(f"| {kind} | {widgets[kind]} | {m.get('first_wall', 0):.3f} | "
                     f"{m.get('first_cpu', 0):.3f} | {m.get('later_wall', 0):.3f} | "
                     f"{m.get('later_cpu', 0):.3f} |")
    for kind, m in med.items():
        if kind != "minimal":
            lines.append(f"| {kind} / minimal | | {ratio(m.get('first_wall'), b.get('first_wall'))} | "
                         f"{ratio(m.get('first_cpu'), b.get('first_cpu'))} | "
                         f"{ratio(m.get('later_wall'), b.get('later_wall'))} | "
                         f"{ratio(m.get('later_cpu'), b.get('later_cpu'))} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--one", choices=KINDS, help=argparse.SUPPRESS)
    p.add_argument("--size", default="120x40", help="terminal size, COLSxROWS")
    p.add_argument("--presses", type=int, default=12)
    p.add_argument("--repeat", type=int, default=3, help="processes of each app, interleaved")
    p.add_argument("--tiny", action="store_true", help="5 presses, one process each")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    cols, rows = (int(x) for x in args.size.lower().split("x"))
    if args.tiny:
        args.presses, args.repeat = FIRST_USES + 2, 1
    if args.one:
        import json
        import os
        import sys

        print(json.dumps(one(args.one, args.presses, (cols, rows))), flush=True)
        sys.stdout.flush()
        os._exit(0)  # no interpreter teardown under the engine's threads (as the CLI)
    results: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    for _ in range(args.repeat):  # interleaved: the box's load drifts alike for both
        for kind in results:
            r = run_json(["-m", "bench.theme_switch", "--one", kind, "--size", args.size,
                          "--presses", str(args.presses)], args.timeout)
            if "error" in r:
                return publish(f"{kind}: {r['error']}", args.out) or 1
            results[kind].append(r)
    return publish(table(results, (cols, rows), args.presses), args.out)


if __name__ == "__main__":
    raise SystemExit(main())
