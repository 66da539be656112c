"""``python -m bench.qk_attribution`` runs end to end on toy shapes: one query row against one
forward pass to the last layer, the ratio in the table, and the why view's key moves."""

from __future__ import annotations

from bench.qk_attribution import main


def test_bench_qk_attribution_smoke(tmp_path, capsys) -> None:
    out = tmp_path / "table.md"
    code = main(["--shapes", "tiny-gpt2,tiny-llama", "--tokens", "16", "--repeat", "1",
                 "--dir", str(tmp_path / "ck"), "--out", str(out), "--timeout", "120", "--moves", "2"])
    assert code == 0
    text = out.read_text()
    assert text in capsys.readouterr().out
    rows = [line.split("|") for line in text.splitlines() if line.startswith("| tiny-")]
    assert [r[1].strip() for r in rows] == ["tiny-gpt2", "tiny-llama"]
    for r in rows:
        assert r[2].strip() == "1" and r[6].strip().strip("*").endswith("×"), r  # row / forward
        assert r[9].strip().endswith("over 2"), r  # the why view's moves
    assert rows[0][3].strip() == str(1 + 1 + 4 + 1 + 1 + 1)  # embed, pos, a0.h0..3, a0.bias, m0, bias
    assert "error" not in text
