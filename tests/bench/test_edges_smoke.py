"""``python -m bench.edges`` runs end to end on a toy shape: every scenario (headscope's EAP and
EAP-IG, one forward pass, TransformerLens 4's edge attribution) timed, with its ratios."""

from __future__ import annotations

from bench.edges import main


def test_bench_edges_smoke(tmp_path, capsys) -> None:
    out = tmp_path / "table.md"
    code = main(["--shape", "tiny-gpt2", "--tokens", "8", "--repeat", "1", "--dir", str(tmp_path / "ck"),
                 "--out", str(out)])
    assert code == 0
    text = out.read_text()
    assert text in capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line.split("|") for line in text.splitlines() if line.startswith("| ")}
    assert "error" not in text
    for name in ("headscope EAP", "headscope EAP-IG (5 steps)"):
        assert rows[name][3].strip().endswith("×")  # / forward
        assert rows[name][4].strip().endswith("×")  # TransformerLens / headscope
    assert float(rows["TransformerLens 4 edge attribution (EAP)"][2]) > 0
