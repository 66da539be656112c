"""The 7B-shape and import-speed benchmarks run end to end on toy shapes (no timing checked)."""

from __future__ import annotations

from bench import big, importspeed


def test_bench_big_smoke(tmp_path, capsys):
    out = tmp_path / "big.md"
    only = "info,first_view,plain-floor,floor,heads,composition-floor-k,composition-numpy-k,composition-k"
    assert big.main(["--tiny", "--dir", str(tmp_path / "ck"), "--only", only, "--out", str(out),
                     "--timeout", "300", "--cache", "cold", "--lock", str(tmp_path / "lock")]) == 0
    text = out.read_text()
    assert "### tiny-llama-mha: page cache cold" in text
    assert "| **cold: `heads` / independent floor** |" in text
    assert "| cold: … of which the forward pass, 330 tokens in 8 sequences (s) |" in text
    assert "| cold: `heads` / headscope-reader floor |" in text
    assert "| composition k, the sweep (numpy-) / GEMM floor |" in text
    assert "| composition k, the sweep (CLI, explorer) / GEMM floor |" in text
    assert "error" not in text and "timeout" not in text
    assert text in capsys.readouterr().out


def test_bench_importspeed_smoke(tmp_path, capsys):
    out = tmp_path / "import.md"
    assert importspeed.main(["--tiny", "--no-tl", "--dir", str(tmp_path / "ck"), "--out", str(out)]) == 0
    text = out.read_text()
    assert "| `heads --no-behaviour` (copying, QK positivity) |" in text
    assert "| `composition --kind k` |" in text and "error" not in text
