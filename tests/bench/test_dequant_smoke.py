"""The dequantisation kernel benchmark runs end to end on a tiny matrix (no timing checked)."""

from __future__ import annotations

from bench import dequant


def test_bench_dequant_smoke(tmp_path, capsys):
    out = tmp_path / "dequant.md"
    assert dequant.main(["--tiny", "--out", str(out)]) == 0
    text = out.read_text()
    assert "### GGUF dequantisation, one 256×256 matrix" in text and "Load average" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| type")]
    assert [r.split(" | ")[0][2:] for r in rows] == list(dequant.TYPES)
    assert all(r.endswith("| yes |") for r in rows), text
    assert text in capsys.readouterr().out
