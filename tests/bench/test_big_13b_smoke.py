"""``python -m bench.big --13b`` end to end on the toy shape with a page-cache budget smaller
than the checkpoint, so every scenario runs the streamed read plan (no timing checked)."""

from __future__ import annotations

from bench import big


def test_bench_big_13b_smoke(tmp_path, capsys):
    out = tmp_path / "big.md"
    assert big.main(["--13b", "--tiny", "--dir", str(tmp_path / "ck"), "--out", str(out),
                     "--timeout", "300"]) == 0
    text = out.read_text()
    assert "### tiny-llama-mha" in text and "(streamed)" in text
    assert "| `heads` / floor |" in text and "| composition k, the sweep (CLI, explorer) / GEMM floor |" in text
    for name in big.SCENARIOS_13B:
        assert f"| {name}: read from disk (GB) |" in text
    assert "error" not in text and "timeout" not in text
    assert text in capsys.readouterr().out
