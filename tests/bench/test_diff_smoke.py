"""`python -m bench.diff --tiny` keeps working (the full run lives outside the suite)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bench_diff_runs_on_toy_shapes() -> None:
    out = subprocess.run([sys.executable, "-m", "bench.diff", "--tiny"], cwd=REPO, check=True,
                         capture_output=True, text=True, timeout=120).stdout
    assert "all-pairs OV+QK similarity" in out and "peak RSS" in out
