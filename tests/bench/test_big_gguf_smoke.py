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


def test_report_gguf_puts_the_bf16_row_against_the_same_floor():
    res = {"plain-floor@warm": {"seconds": 100.0, "rss_mb": 1500},
           "heads@warm": {"seconds": 140.0, "rss_mb": 2100},
           "heads-q8_0@warm": {"seconds": 160.0, "rss_mb": 2200}}
    text = big.report_gguf("s", res, {"Q8_0": 7e9}, ["warm"], 3)
    assert "| **warm, bf16: `heads` / independent floor** | 1.40× |" in text
    assert "| **warm, Q8_0: `heads` / bf16 independent floor** | 1.60× |" in text
    assert "bf16: `heads`" not in big.report_gguf("s", {k: v for k, v in res.items() if k != "heads@warm"},
                                                  {"Q8_0": 7e9}, ["warm"], 3)
