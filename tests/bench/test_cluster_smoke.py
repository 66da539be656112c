"""The cluster benchmark runs end to end on a toy shape with 1 and 2 local workers (no timing
checked: the numbers are the benchmark's to report, not the suite's to judge)."""

from __future__ import annotations

import pytest

pytest.importorskip("distributed")

from bench import cluster


def test_bench_cluster_smoke(tmp_path, capsys):
    out = tmp_path / "cluster.md"
    assert cluster.main(["--tiny", "--dir", str(tmp_path / "ck"), "--out", str(out)]) == 0
    text = out.read_text()
    assert "### tiny-llama-mha" in text and "| in-process / first |" in text
    rows = [line for line in text.splitlines() if line.startswith(("| heads |", "| composition-k |"))]
    assert [r.split("|")[3].strip() for r in rows] == ["1", "2", "1", "2"]
    assert text in capsys.readouterr().out
