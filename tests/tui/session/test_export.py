"""tui/session/export.py without Textual: the document ``e`` writes."""

from __future__ import annotations

import json
import math
from pathlib import Path

from headscope.tui.session.export import export_document, write_export


def test_a_per_head_tab_names_the_head_and_the_weights() -> None:
    doc = export_document("m/model", False, "qk", (1, 2), {"x": [1.0, math.nan]})
    assert doc["model"] == "m/model" and doc["processed"] is True and doc["view"] == "qk"
    assert doc["head"] == [1, 2]
    assert doc["data"] == {"x": [1.0, None]}  # jsonable: NaN becomes null


def test_tabs_of_every_head_name_no_focused_head() -> None:
    for tab in ("composition", "summary"):
        assert export_document("m", True, tab, (0, 0), [])["head"] is None
    assert export_document("m", True, "qk", None, [])["processed"] is False


def test_write_export_writes_the_json(tmp_path: Path) -> None:
    doc = export_document("m", False, "ov", (0, 1), {"a": 1})
    path = write_export(tmp_path / "x.json", doc)
    assert json.loads(path.read_text()) == doc
