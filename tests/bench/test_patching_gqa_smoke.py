"""``bench.patching_gqa`` on the tiny grouped-query shape, in this process (its driver only
runs the same ``one`` in subprocesses): the timed calls, their values, the table."""

from __future__ import annotations

from bench.checkpoints import SHAPES, write_checkpoint
from bench.patching_gqa import one, table


def test_bench_patching_gqa_smoke(tmp_path) -> None:
    path = write_checkpoint(SHAPES["tiny-llama"], tmp_path)
    found = one(str(path), 8, [1], ["out", "k"])
    assert len(found["k"]["values"]) == 4 and found["code"].endswith("engine")
    text = table({"before": [found], "after": [found]}, "tiny-llama", ["out", "k"])
    rows = {line.split("|")[1].strip(): line.split("|") for line in text.splitlines() if line.startswith("| ")}
    assert float(rows["k"][4]) == 1.0 and float(rows["k"][7]) == 0.0  # after / before, max abs diff
