"""``e`` (export): the active tab's data as JSON, in the output directory. No Textual here.

What is written: the model, processed or raw weights, the tab, the focused head (not for the
tabs that show every head) and the tab's results as the engine returned them (``jsonable``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from headscope.engine.core.export import atomic_write_text
from headscope.tui.base.labels import jsonable

Head = tuple[int, int]
ALL_HEADS_TABS = ("composition", "summary", "patch")  # their export names no focused head


def export_document(model: str, raw: bool, tab: str, head: Head | None,
                    data: Any) -> dict[str, Any]:
    """The JSON document of an export."""
    shown = list(head) if head and tab not in ALL_HEADS_TABS else None
    return {"model": model, "processed": not raw, "view": tab, "head": shown,
            "data": jsonable(data)}


def write_export(path: Path, doc: dict[str, Any]) -> Path:
    """Write ``doc`` to ``path`` atomically (never a partial file); ``OSError`` on failure."""
    atomic_write_text(path, json.dumps(doc, indent=1))
    return path


def short_folder(folder: Path, home: Path | None = None) -> str:
    """``folder`` with the home directory written ``~`` (a toast is ~40 columns wide)."""
    try:
        home = home or Path.home()
    except (RuntimeError, KeyError):
        return f"{folder}/"
    if folder == home or home in folder.parents:
        return f"~/{folder.relative_to(home)}/".replace("~/./", "~/")
    return f"{folder}/"


def saved_where(path: Path, home: Path | None = None) -> str:
    """A notification naming the file, the directory it went to, and how to change it, each
    on its own line: a toast wraps at spaces, and "name in /long/folder/" broke the file name
    mid-word."""
    return (f"{path.name}\nin {short_folder(path.parent, home)}\n"
            "(change: ctrl+p → Set output directory, or output_dir in config.toml)")
