"""One-off: move imports of the top-level packages under the `headscope` namespace.

Idempotent (already-renamed text is left alone), so it can be re-applied to branches started
before the rename before they are merged.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

PKGS = "engine|tui|themes|sample_models"
RULES = [
    # from engine.x import y / from engine import y
    (re.compile(rf"^(\s*)from ({PKGS})(\.|\s)", re.M), r"\1from headscope.\2\3"),
    # import engine.x as y
    (re.compile(rf"^(\s*)import ({PKGS})((?:\.\w+)+) as (\w+)", re.M), r"\1import headscope.\2\3 as \4"),
    # import sample_models  -> from headscope import sample_models
    (re.compile(rf"^(\s*)import ({PKGS})\s*$", re.M), r"\1from headscope import \2"),
    # import tui.app  -> import headscope.tui.app  (callers use the full dotted name; fixed by hand)
    (re.compile(rf"^(\s*)import ({PKGS})((?:\.\w+)+)\s*$", re.M), r"\1import headscope.\2\3"),
    # "engine.loading", "tui.cli" as strings (monkeypatch targets, -m module names)
    (re.compile(rf"""(["'])({PKGS})((?:\.\w+)+)(["'])"""), r"\1headscope.\2\3\4"),
    # python -m tui.cli / sample_models.train in docs and help text
    (re.compile(rf"(-m )({PKGS})\."), r"\1headscope.\2."),
]


def rename(text: str) -> str:
    for pattern, repl in RULES:
        text = pattern.sub(repl, text)
    return text


if __name__ == "__main__":
    for name in sys.argv[1:]:
        path = Path(name)
        old = path.read_text()
        new = rename(old)
        if new != old:
            path.write_text(new)
            print("renamed", path)
