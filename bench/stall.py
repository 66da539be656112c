"""``python -m bench.stall``: how long the explorer's event loop stalls while the engine sweeps.

A probe coroutine sleeps 5 ms at a time inside the running app and records each gap. First
the idle app (model open, nothing running: the harness's own floor on this machine), then the
same app while every head score and all Q/K/V composition scores are computed. The table
reports the longest gap and the 99th percentile of each, and busy / idle. Budget (a quiet
machine): the longest gap while sweeping stays under 50 ms. The test suite only checks that
the loop keeps turning (a count): a busy CI box cannot time this fairly.

    python -m bench.stall [--shape gpt2-small] [--dir DIR]
    python -m bench.stall --tiny        # the bundled attn-only-2l (smoke test)
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = ROOT / "sample_models" / "attn-only-2l"


async def _gaps_while(app, work) -> np.ndarray:
    gaps: list[float] = []
    stop = False
    loop = asyncio.get_running_loop()

    async def probe() -> None:
        last = loop.time()
        while not stop:
            await asyncio.sleep(0.005)
            now = loop.time()
            gaps.append(now - last - 0.005)
            last = now

    task = asyncio.create_task(probe())
    await work()
    stop = True
    await task
    return np.asarray(gaps)


async def measure(path: Path) -> dict[str, np.ndarray]:
    from headscope.tui.app import HeadscopeApp
    from headscope.tui.base.settings import Settings

    app = HeadscopeApp(path, settings=Settings(), debounce=0.01, sweep=False)
    async with app.run_test(size=(120, 40)) as pilot:
        while app.engine is None:
            await pilot.pause(0.05)
        await app.workers.wait_for_complete()

        async def idle() -> None:
            await asyncio.sleep(2.0)

        async def sweeps() -> None:
            app.explorer.start_sweep()
            from headscope.engine.core.requests import CompositionRequest

            await asyncio.gather(*(app.engine.get(CompositionRequest.of(app.engine.structure, k)) for k in "qkv"))
            await app.workers.wait_for_complete()

        return {"idle": await _gaps_while(app, idle), "sweeping": await _gaps_while(app, sweeps)}


def report(gaps: dict[str, np.ndarray]) -> str:
    ms = {k: (1000 * float(v.max(initial=0)), 1000 * float(np.percentile(v, 99)) if v.size else 0.0)
          for k, v in gaps.items()}
    lines = ["| loop | ticks | longest gap | p99 gap |", "|---|---|---|---|"]
    lines += [f"| {k} | {gaps[k].size} | {m:.1f} ms | {p:.1f} ms |" for k, (m, p) in ms.items()]
    ratio = ms["sweeping"][0] / max(ms["idle"][0], 1e-3)
    lines.append(f"\nlongest gap sweeping / idle: {ratio:.1f}× (budget: sweeping < 50 ms)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.stall", description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="gpt2-small")
    p.add_argument("--dir", type=Path, help="reuse checkpoints written here")
    p.add_argument("--tiny", action="store_true", help="the bundled attn-only-2l only")
    args = p.parse_args(argv)
    if args.tiny:
        path = BUNDLED
    else:
        from bench.checkpoints import SHAPES, write_checkpoint

        root = args.dir or Path(tempfile.mkdtemp(prefix="headscope-bench-"))
        path = write_checkpoint(SHAPES[args.shape], root)
    print(report(asyncio.run(measure(path))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
