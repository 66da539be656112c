"""``bench.versus`` (this checkout against another, same run) runs end to end: here against
itself, so the numbers must agree exactly and every scenario must produce a row."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench.versus import largest_difference, main

ROOT = Path(__file__).resolve().parents[2]


def test_largest_difference_finds_the_changed_number() -> None:
    before = json.dumps({"heads": [{"copying_score": 0.5, "z": None}, {"copying_score": 0.25}]})
    after = json.dumps({"heads": [{"copying_score": 0.5, "z": None}, {"copying_score": 0.2500003}]})
    worst, where = largest_difference(before, after)
    assert worst == pytest.approx(3e-7) and where == ".heads[1].copying_score"
    assert largest_difference(before, before) == (0.0, "")
    nan = json.dumps({"x": float("nan")})
    assert largest_difference(nan, nan) == (0.0, "")
    assert largest_difference(nan, json.dumps({"x": 1.0}))[0] == float("inf")


def test_versus_against_itself(tmp_path, capsys) -> None:
    if not (ROOT / ".venv" / "bin" / "headscope").exists() or not sys.prefix.startswith(str(ROOT)):
        pytest.skip("needs this checkout's own .venv (make test makes it)")
    code = main(["--base", str(ROOT), "--shapes", "", "--bundled", "attn-only-2l", "--no-engine",
                 "--only", "info,heads --no-behaviour", "--repeat", "1", "--dir", str(tmp_path)])
    table = capsys.readouterr().out
    assert code == 0, table
    rows = [line for line in table.splitlines() if line.startswith("| info") or line.startswith("| heads")]
    assert len(rows) == 2 and all(line.rstrip().endswith("| 0 |") for line in rows), table
