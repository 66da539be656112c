"""A path on the command line that names no checkpoint: one line, exit 2, before any screen
opens, naming the path, the problem and the nearest checkpoint folder (a close name in the
same folder for a typo; the checkpoint folders under it, or near it, for a folder or file
that is not one)."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from headscope.engine.core.errors import UnsafeFormatError, UnsupportedFormatError
from headscope.tui.cli.output import COMMANDS, PathUsageError

WEIGHT_SUFFIXES = (".safetensors", ".gguf")
MAX_VISITED = 200  # folders looked into for a suggestion (a home directory is not crawled)
MAX_SHOWN = 3


def check_checkpoint(given: str) -> None:
    """``given`` opens as a checkpoint (headers only), or a ``PathUsageError`` (exit 2) when it
    is missing or not a checkpoint at all; a checkpoint that is broken is the model's fault
    (its typed error, exit 1)."""
    from headscope.engine.api.model import read_structure

    p = Path(given)
    if not p.exists():
        raise PathUsageError(f"{given}: no such file or directory{missing_hint(p)}")
    try:
        read_structure(p)
    except (UnsupportedFormatError, UnsafeFormatError) as err:
        if has_weights(p):
            raise  # a checkpoint that cannot be read: the model's fault
        near = nearest_checkpoints(p)
        hint = f"; checkpoint folders near it: {', '.join(near)}" if near else ""
        raise PathUsageError(f"{err.one_line()}{hint}") from None


def has_weights(p: Path) -> bool:
    """A weight file, or a folder holding one directly."""
    if p.is_file():
        return p.suffix.lower() in WEIGHT_SUFFIXES
    try:
        return any(e.suffix.lower() in WEIGHT_SUFFIXES for e in p.iterdir())
    except OSError:
        return False


def missing_hint(p: Path) -> str:
    """A close local name (``attn-only-2`` → ``attn-only-2l``), else the commands."""
    parent = p.parent
    try:
        names = [e.name for e in parent.iterdir()] if parent.is_dir() else []
    except OSError:
        names = []
    close = difflib.get_close_matches(p.name, names, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {os.fspath(parent / close[0])!r}?"
    return " (commands: " + ", ".join(COMMANDS) + ")"


def nearest_checkpoints(p: Path) -> list[str]:
    """The checkpoint folders closest below ``p`` (a folder) or its folder (a file): breadth
    first, hidden folders and symlinks skipped, the first depth that has any."""
    level = [p if p.is_dir() else p.parent]
    visited = 0
    while level and visited < MAX_VISITED:
        found, below = [], []
        for folder in level:
            try:
                entries = sorted(e for e in folder.iterdir()
                                 if e.is_dir() and not e.is_symlink() and not e.name.startswith("."))
            except OSError:
                continue
            for entry in entries:
                visited += 1
                (found if has_weights(entry) else below).append(entry)
        if found:
            return [os.fspath(f) for f in found[:MAX_SHOWN]]
        level = below
    return []
