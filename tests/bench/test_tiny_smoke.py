"""The benchmark harness runs end to end on toy shapes and prints its table."""

from __future__ import annotations

import json

from bench.__main__ import main
from bench.checkpoints import SHAPES, write_checkpoint
from headscope.engine.model.loading import read_structure


def test_bench_checkpoints_are_readable(tmp_path):
    path = write_checkpoint(SHAPES["tiny-llama"], tmp_path)
    s = read_structure(path)
    assert (s["family"], s["n_layers"], s["n_heads"], s["n_kv_heads"]) == ("llama", 2, 4, 2)
    assert s["dtype"] == "bfloat16"
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 3  # one shard per layer + embeddings


def test_bench_harness_smoke(tmp_path, capsys):
    out = tmp_path / "table.md"
    code = main(["--shapes", "tiny-gpt2", "--impls", "headscope,dense", "--tasks", "view",
                 "--dir", str(tmp_path / "ck"), "--out", str(out), "--timeout", "60"])
    assert code == 0
    text = out.read_text()
    assert "| time to structure (s) |" in text and "dense baseline / headscope" in text
    assert "failed" not in text
    assert text in capsys.readouterr().out


def test_bench_firstframe_smoke() -> None:
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "bench.firstframe", "--tiny", "--repeat", "1"],
                          cwd=root, capture_output=True, text=True, timeout=120, check=True)
    row = next(line for line in done.stdout.splitlines() if line.startswith("| attn-only-2l"))
    seconds = float(row.split("|")[3])
    assert seconds > 0 and row.rstrip().endswith("× |") and "empty Textual app" in done.stdout


def test_bench_stall_smoke(capsys) -> None:
    from bench.stall import main as stall_main

    assert stall_main(["--tiny"]) == 0
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): int(line.split("|")[2]) for line in out.splitlines()
            if line.startswith(("| idle", "| sweeping"))}
    assert set(rows) == {"idle", "sweeping"} and rows["idle"] > 0 and rows["sweeping"] > 0
    assert "sweeping / idle" in out
