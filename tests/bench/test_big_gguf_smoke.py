"""``python -m bench.big --gguf`` end to end on the tiny K-quant shape (no timing checked): the
GGUF files are written once (reused on the second call) and read by headscope."""

from __future__ import annotations

from bench import big


def test_bench_big_gguf_smoke(tmp_path, capsys):
    out = tmp_path / "big.md"
    ck = tmp_path / "ck"
    only = "plain-floor,gguf-read-q8_0,info-q8_0,first_view-q4_k,heads-q4_k"
    assert big.main(["--gguf", "--tiny", "--dir", str(ck), "--only", only, "--out", str(out),
                     "--timeout", "300"]) == 0
    text = out.read_text()
    assert "### tiny-llama-256: GGUF against the bf16 independent floor; page cache warm" in text
    assert "| **warm, Q4_K: `heads` / bf16 independent floor** |" in text
    assert "| warm, Q8_0: `info --json`, whole process (s) |" in text
    assert "| warm, Q8_0: read + dequantise with `gguf` (GGUFReader, gguf.quants.dequantize) (s) | –" not in text
    assert "error" not in text and "timeout" not in text
    assert text in capsys.readouterr().out
    files = sorted(p.name for p in ck.glob("*.gguf"))
    assert files == ["tiny-llama-256-q4_k.gguf", "tiny-llama-256-q8_0.gguf"]
    stamp = {p: p.stat().st_mtime_ns for p in ck.glob("*.gguf")}
    assert big.main(["--gguf", "--tiny", "--dir", str(ck), "--only", "info-q8_0", "--timeout", "300"]) == 0
    assert stamp == {p: p.stat().st_mtime_ns for p in ck.glob("*.gguf")}  # written once
