"""Save one SVG screenshot per main view, headless: ``python -m tui.screenshots OUT [MODEL]``.

Drives the real app (real engine) with Textual's pilot, waits for every worker before each
shot, and writes ``OUT/<view>.svg`` (120×40 dark, 80×24 light) and the compare-mode views against a copy
with the focused head pruned. ``docs/screenshots`` is made with this, on the bundled
``attn-only-2l``, focused on its induction head L1.H7.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from tui.app import HeadscopeApp
from tui.settings import Settings

VIEWS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("qk", ("1",)),
    ("ov", ("2",)),
    ("spectrum", ("3",)),
    ("prompt", ("4",)),
    ("composition", ("5",)),  # opens on K-composition: the induction circuit
    ("summary", ("6",)),
    ("help", ("question_mark",)),
)


async def shoot(model: Path | None, out: Path, size: tuple[int, int], head: tuple[int, int],
                prompt: str, theme: str | None = None, suffix: str = "") -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    app = HeadscopeApp(model, settings=Settings(), prompt=prompt, output_dir=out,
                       theme=theme)
    written = []
    async with app.run_test(size=size) as pilot:

        async def settle() -> None:
            for _ in range(4):
                await pilot.pause(0.1)
                await app.workers.wait_for_complete()

        await settle()
        app.goto_head(head, immediate=True)
        await settle()
        for name, keys in VIEWS:
            for key in keys:
                await pilot.press(key)
                await settle()
            app.clear_notifications()
            await pilot.pause(0.05)
            path = out / f"{name}{suffix}.svg"
            app.save_screenshot(filename=path.name, path=str(out))
            written.append(path)
            if name == "help":
                await pilot.press("escape")
                await settle()
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("model", type=Path, nargs="?", default=None)
    parser.add_argument("--head", default="1.7", help="layer.head to focus (default 1.7)")
    parser.add_argument("--prompt", default="When Mary and John went to the store , John gave a "
                        "drink to Mary . When Mary and John went to the store , John gave")
    args = parser.parse_args()
    layer, head = (int(x) for x in args.head.split("."))
    paths = asyncio.run(shoot(args.model, args.out, (120, 40), (layer, head), args.prompt))
    paths += asyncio.run(shoot(args.model, args.out, (80, 24), (layer, head), args.prompt,
                               theme="headscope-light", suffix="-80x24-light"))
    # Compare mode: the model against a copy with the focused head pruned.
    from tui.app import bundled_model
    from tui.compare import pruned_copy
    from tui.compare import shoot as shoot_compare

    with tempfile.TemporaryDirectory() as tmp:
        pruned = pruned_copy(args.model or bundled_model(), Path(tmp), layer, head)
        for size in ((120, 40), (80, 24)):
            paths += asyncio.run(shoot_compare(args.out, pruned, args.model, size=size,
                                               head=(layer, head)))
    for p in paths:
        print(p)


if __name__ == "__main__":
    main()
