"""``python -m bench.big --13b`` end to end on the toy shape with a page-cache budget smaller
than the checkpoint, so every scenario runs the streamed read plan, through the 7B's runner
(page cache cold by default), the independent floor included (no timing checked)."""

from __future__ import annotations

from bench import big


def test_bench_big_13b_smoke(tmp_path, capsys):
    out = tmp_path / "big.md"
    assert big.main(["--13b", "--tiny", "--dir", str(tmp_path / "ck"), "--out", str(out),
                     "--timeout", "300"]) == 0
    text = out.read_text()
    assert "### tiny-llama-mha: page cache cold" in text and "(streamed)" in text
    assert "| **cold: `heads` / independent floor** |" in text
    assert "| cold: … of which reading + bf16 → float32 (s) |" in text
    assert "| cold: `heads` / headscope-reader floor |" in text
    assert "| composition k, the sweep (CLI, explorer) / GEMM floor |" in text
    for name in big.SCENARIOS_13B:
        assert f"| cold: {name}, read from disk (GB) |" in text
    assert "error" not in text and "timeout" not in text
    assert text in capsys.readouterr().out
