"""The timeline benchmark runs end to end on a toy shape and two steps (no timing checked)."""

from __future__ import annotations

from bench import timeline


def test_bench_timeline_smoke(tmp_path, capsys):
    out = tmp_path / "timeline.md"
    assert timeline.main(["--tiny", "--composition-steps", "1", "--dir", str(tmp_path / "ck"),
                          "--out", str(out)]) == 0
    text = out.read_text()
    assert "### tiny-neox, 2 steps" in text
    rows = [line.split("|") for line in text.splitlines() if line.startswith(("| cold", "| warm"))]
    assert [(r[1].strip(), r[3].strip()) for r in rows] == [("cold", "2"), ("warm", "2")]
    assert len(list((tmp_path / "ck" / "tiny-neox-series").iterdir())) == 2
    assert text in capsys.readouterr().out
