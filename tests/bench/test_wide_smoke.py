"""``python -m bench.wide`` runs end to end on a toy shape with the MLP forced into blocks
(in this process: no timing checked, only that every piece is measured and reported)."""

from __future__ import annotations

from bench import wide
from headscope.engine.forward import blocked_mlp


def test_bench_wide_smoke(tmp_path, capsys) -> None:
    budget = blocked_mlp.MLP_BLOCK_BYTES
    out = tmp_path / "wide.md"
    assert wide.main(["--tiny", "--inline", "--tokens", "8", "--dir", str(tmp_path), "--out", str(out)]) == 0
    assert budget == blocked_mlp.MLP_BLOCK_BYTES  # restored
    text = out.read_text()
    assert text in capsys.readouterr().out
    assert "### tiny-llama" in text and "error" not in text
    for row in ("| `heads` spectral, layer 1 |", "| `heads` forward (", "| attribution backward, layer 1 |",
                "| spectral middles (once per model) |", "full 70B `heads` from the slice"):
        assert row in text
    assert "| – |" not in text  # every piece was timed
