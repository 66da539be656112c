"""CLI tables in a terminal never cut a number (tui/cli_table.py)."""

from __future__ import annotations

import io
import re
import sys
from typing import Any

import pytest
from rich.console import Console

from headscope.tui.cli import main
from headscope.tui.cli_table import fit_columns, print_table

MODEL = "sample_models/attn-only-2l"
NUMBER = re.compile(r"-?\d+\.\d{4}")


def run_in_terminal(monkeypatch: pytest.MonkeyPatch, capsys: Any, width: int, *argv: str) -> str:
    monkeypatch.setenv("COLUMNS", str(width))
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(list(argv)) == 0
    return re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)


def assert_whole_numbers(out: str, width: int) -> None:
    assert "…" not in out
    assert all(len(line) <= width for line in out.splitlines())


def test_heads_with_ablation_at_80(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    out = run_in_terminal(monkeypatch, capsys, 80, "heads", MODEL, "--ablation")
    assert_whole_numbers(out, 80)
    # every head's row carries all its numbers: 6 scores (5 + ablation effect)
    rows = [line for line in out.splitlines() if len(NUMBER.findall(line)) >= 6]
    assert len(rows) == 6


def test_circuit_without_rows_at_120(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    out = run_in_terminal(monkeypatch, capsys, 120, "circuit", MODEL, "1", "2", "--kind", "qk")
    assert_whole_numbers(out, 120)
    assert "columns left out" in out and "--json" in out
    assert len(NUMBER.findall(out)) >= 24 * 5


def test_diff_at_120(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    out = run_in_terminal(monkeypatch, capsys, 120, "diff", MODEL, MODEL)
    assert_whole_numbers(out, 120)


def test_fit_columns_drops_trailing_columns_only_when_needed() -> None:
    cells = [["label", *(f"{-0.1234:.4f}" for _ in range(20))]]
    columns = ["row", *(f"c{i}" for i in range(20))]
    keep = fit_columns(columns, cells, 120)
    assert 1 < keep < 21
    buf = io.StringIO()
    print_table(columns, cells, Console(file=buf, width=120))
    assert buf.getvalue().count("-0.1234") == keep - 1
    assert fit_columns(columns[:3], [cells[0][:3]], 120) == 3
