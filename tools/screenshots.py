"""Save one SVG screenshot per main view, headless: ``python -m tools.screenshots OUT [MODEL]``.

Drives the real app (real engine) with Textual's pilot, waits for every worker before each
shot, and writes ``OUT/<view>.svg`` (120×40 dark, 80×24 light) and the compare-mode views against a copy
with the focused head pruned. ``docs/screenshots`` is made with this, on the bundled
``attn-only-2l``, focused on its strongest induction head (``--head`` picks another), and
the Timeline tab of its training series at the phase change.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

from headscope.tui.app import HeadscopeApp
from headscope.tui.base.settings import Settings

VIEWS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("qk", ("1",)),
    ("ov", ("2",)),
    ("spectrum", ("3",)),
    ("prompt", ("4",)),
    ("composition", ("5",)),  # opens on K-composition: the induction circuit
    ("path", ("enter",)),  # enter on the strongest edge (L0.H1 → L1.H2): its virtual heads
    ("summary", ("6", "a")),  # with the ablation sweep: the zero-abl column filled
    ("help", ("question_mark",)),
)


async def _settle(pilot: Any) -> None:
    """Let every worker (engine calls, chart builds) finish before a shot."""
    from textual.worker import WorkerCancelled

    for _ in range(4):
        await pilot.pause(0.1)
        with contextlib.suppress(WorkerCancelled):  # a newer build replaced it: wait again
            await pilot.app.workers.wait_for_complete()


async def shoot(model: Path | None, out: Path, size: tuple[int, int], head: tuple[int, int],
                prompt: str, theme: str | None = None, suffix: str = "") -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    app = HeadscopeApp(model, settings=Settings(), prompt=prompt, output_dir=out,
                       theme=theme)
    written = []
    async with app.run_test(size=size) as pilot:
        settle = partial(_settle, pilot)
        await settle()
        app.explorer.goto_head(head, immediate=True)
        await settle()
        for name, keys in VIEWS:
            if name == "path":  # the edge list, its cursor on the strongest edge
                app.explorer.query_one("#comp-edges").focus()
            for key in keys:
                await pilot.press(key)
                await settle()
            app.clear_notifications()
            await pilot.pause(0.05)
            path = out / f"{name}{suffix}.svg"
            app.save_screenshot(filename=path.name, path=str(out))
            written.append(path)
            if name in ("help", "path"):
                await pilot.press("escape")
                await settle()
                app.explorer.query_one("#tree").focus()
    return written


def pruned_copy(model: Path, out: Path, layer: int, head: int,
                names: tuple[str, ...] = ("W_Q", "W_K", "W_V", "W_O")) -> Path:
    """A copy of a native checkpoint directory with head ``layer.head`` zeroed (pruned)."""
    import shutil

    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    dst = out / f"{model.name}-pruned-L{layer}H{head}"
    shutil.copytree(model, dst, dirs_exist_ok=True)
    src = model / "model.safetensors"
    with safe_open(str(src), "np") as f:
        metadata = f.metadata()
    tensors = load_file(str(src))
    for name in names:
        tensors[f"blocks.{layer}.attn.{name}"][head] = 0
    save_file(tensors, str(dst / "model.safetensors"), metadata=metadata)
    return dst


async def shoot_compare(out: Path, compare: Path, model: Path | None, *,
                        head: tuple[int, int], size: tuple[int, int] = (120, 40)) -> list[Path]:
    """SVGs of compare mode: A|B QK, OV as B − A, and the Changes tab (real engines)."""
    app = HeadscopeApp(model, compare=compare, settings=Settings(), output_dir=out)
    written = []
    async with app.run_test(size=size) as pilot:
        settle = partial(_settle, pilot)
        for _ in range(60):  # the diff scores both models: wait for it
            await settle()
            if app.compare.diff is not None or app.errors:
                break
        app.explorer.goto_head(head, immediate=True)
        await settle()
        for name, keys in (("compare-qk", ()), ("compare-ov-diff", ("2", "d")),
                           ("compare-changes", ("7",))):
            for key in keys:
                await pilot.press(key)
                await settle()
            app.clear_notifications()
            await pilot.pause(0.05)
            suffix = "" if size == (120, 40) else f"-{size[0]}x{size[1]}"
            path = out / f"{name}{suffix}.svg"
            app.save_screenshot(filename=path.name, path=str(out))
            written.append(path)
    return written


async def shoot_timeline(out: Path, series: Path, *, head: tuple[int, int], step: int = 675,
                         size: tuple[int, int] = (120, 40)) -> list[Path]:
    """The Timeline tab of ``headscope --timeline series``, scrubbed to ``step`` (real engines)."""
    from headscope.tui.screens.timeline import open_timeline

    mode = open_timeline(series)
    app = HeadscopeApp(timeline=mode, settings=Settings(), output_dir=out)
    async with app.run_test(size=size) as pilot:
        settle = partial(_settle, pilot)
        for _ in range(300):  # every step is scored: wait for it
            await settle()
            if mode.timeline is not None or app.errors:
                break
        app.explorer.goto_head(head, immediate=True)
        await pilot.press("8")
        mode.scrub(app, to=[s.step for s in mode.sources].index(step))
        for _ in range(60):
            await settle()
            if mode.opened == mode.index and app.model_ready.is_set():
                break
        await settle()
        app.clear_notifications()
        await pilot.pause(0.05)
        path = out / "timeline.svg"
        app.save_screenshot(filename=path.name, path=str(out))
    return [path]


def strongest_induction_head(model: Path) -> tuple[int, int]:
    """(layer, head) with the highest induction score (engine.forward.behaviour, seed 0)."""
    from headscope.engine.forward.behaviour import behaviour_scores
    from headscope.engine.model.loading import load_model

    scores = behaviour_scores(load_model(model).weights, seed=0)["induction"].nan_to_num(-1.0)
    layer, head = divmod(int(scores.argmax()), scores.shape[1])
    return layer, head


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("model", type=Path, nargs="?", default=None)
    parser.add_argument("--head", default=None,
                        help="layer.head to focus (default: the strongest induction head)")
    parser.add_argument("--prompt", default="When Mary and John went to the store , John gave a "
                        "drink to Mary . When Mary and John went to the store , John gave")
    args = parser.parse_args()
    from headscope.sample_models import bundled_model

    model = args.model or bundled_model()
    layer, head = (tuple(int(x) for x in args.head.split(".")) if args.head
                   else strongest_induction_head(model))
    paths = asyncio.run(shoot(args.model, args.out, (120, 40), (layer, head), args.prompt))
    paths += asyncio.run(shoot(args.model, args.out, (80, 24), (layer, head), args.prompt,
                               theme="headscope-light", suffix="-80x24-light"))
    # Compare mode: the model against a copy with the focused head pruned.
    with tempfile.TemporaryDirectory() as tmp:
        pruned = pruned_copy(model, Path(tmp), layer, head)
        for size in ((120, 40), (80, 24)):
            paths += asyncio.run(shoot_compare(args.out, pruned, args.model, size=size,
                                               head=(layer, head)))
    if args.model is None:  # the bundled model's training series, at its phase change
        series = model.parent / "attn-only-2l-training"
        paths += asyncio.run(shoot_timeline(args.out, series, head=(layer, head)))
    for p in paths:
        print(p)


if __name__ == "__main__":
    main()
