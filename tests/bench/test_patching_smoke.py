"""``python -m bench.patching`` runs end to end on a toy shape: headscope and TransformerLens
patch every head of the same checkpoint with the same numbers, the ratio is in the table."""

from __future__ import annotations

from bench.patching import main


def test_bench_patching_smoke(tmp_path, capsys) -> None:
    out = tmp_path / "table.md"
    code = main(["--shape", "tiny-gpt2", "--scenarios", "headscope,tl,torch,attribution,forward",
                 "--tokens", "8", "--dir", str(tmp_path / "ck"), "--out", str(out), "--timeout", "900"])  # a busy box: TL alone can take minutes
    assert code == 0
    text = out.read_text()
    assert text in capsys.readouterr().out
    rows = {line.split("|")[2].strip(): line.split("|") for line in text.splitlines()
            if line.startswith("| exact patching")}
    assert rows["whole process (s)"][5].strip().endswith("×")  # TransformerLens / headscope
    after = rows["whole process after importing torch (s)"]
    # a ratio, unless on a busy box torch's import in another process took longer than the
    # whole tiny run (then there is nothing left to divide: "–")
    assert after[5].strip().endswith("×") or (float(after[3]) <= 0 and after[5].strip() == "–")
    assert float(rows["max abs difference of the values"][3]) < 1e-4
    assert "| attribution / forward |" in text and "error" not in text and "not run" not in text
