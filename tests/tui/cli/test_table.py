"""CLI tables in a terminal never cut a number (tui/cli_table.py)."""

from __future__ import annotations

import io
import json
import re
import sys
from typing import Any

import pytest
from rich.console import Console

from headscope.tui.cli.main import main
from headscope.tui.cli.table import fit_columns, print_table

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
    assert "choose fewer with --cols" in out  # circuit's option (svd has none: not named there)
    assert len(NUMBER.findall(out)) >= 24 * 5


@pytest.mark.parametrize("width", [120, 80])
def test_svd_wraps_its_tokens_and_prints_the_head_overlap(
        monkeypatch: pytest.MonkeyPatch, capsys: Any, width: int) -> None:
    """`svd` dropped both token columns at 120 columns, pointed at `--rows/--cols` (which it
    does not have), and its head overlap (the README tour's 0.6) was only in `--json`."""
    assert main(["svd", MODEL, "1", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    out = run_in_terminal(monkeypatch, capsys, width, "svd", MODEL, "1", "2")
    assert_whole_numbers(out, width)
    assert "left out" not in out and "--rows" not in out
    for d in report["directions"]:  # every token each side, whole, with its value
        for t in d["in_tokens"] + d["out_tokens"]:
            assert f"{t['token']!r}({t['value']:+.2f})" in out
    assert f"overlap {report['overlap']:.2f} (the head's" in out
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)  # TSV: one row per direction
    assert main(["svd", MODEL, "1", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines[0].split("\t")) == 5 and len(lines[1:6]) == len(report["directions"])
    assert all(len(line.split("\t")) == 5 for line in lines[1:6])
    assert lines[-1].startswith(f"overlap {report['overlap']:.2f} ")


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


def test_diff_text_names_the_b_head_and_every_edge_lost_or_gained(capsys: Any) -> None:
    import json

    a, b = "sample_models/attn-only-2l-training/step-000000", MODEL
    assert main(["diff", a, b, "--match-heads", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert main(["diff", a, b, "--match-heads"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split("\t")
    assert header[:3] == ["layer", "head", "B head"]
    rows = {(r[0], r[1]): r for r in (line.split("\t") for line in lines[1:])}
    for h in report["heads"]:
        assert rows[(str(h["layer"]), str(h["head"]))][2] == str(h["matched_head"])
    edges = [(kind, status, e) for kind, d in report["composition"].items()
             for status in ("lost", "gained") for e in d[status]]
    assert edges, "the untrained checkpoint gains the trained model's composition edges"
    for kind, status, e in edges:
        key = (f"{kind.upper()}-edge {status}",
               f"{e['source'][0]}.{e['source'][1]}→{e['target'][0]}.{e['target'][1]}")
        assert key in rows, key


def test_readme_synopsis_has_every_export_and_open_option() -> None:
    from pathlib import Path

    from headscope.tui.cli.main import build_parser

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text(encoding="utf-8")
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for command in ("export", "open"):
        parser = sub.choices[command]  # type: ignore[index]
        for action in parser._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help":
                    assert flag in readme, f"README lacks {command} {flag}"


@pytest.mark.parametrize("width", [120, 80])
def test_headers_wrap_between_words_never_inside_one(
    monkeypatch: pytest.MonkeyPatch, capsys: Any, width: int
) -> None:
    """At 120 columns Rich folded `copying_score` into `copying_sc`/`ore`. Headers wrap
    after a `_` and their long words are shortened (ABBREVIATIONS); numbers stay whole."""
    from headscope.engine.core.validation import ABLATION_EFFECT, SCORE_NAMES
    from headscope.tui.cli.table import ABBREVIATIONS

    out = run_in_terminal(monkeypatch, capsys, width, "heads", MODEL, "--ablation")
    assert_whole_numbers(out, width)
    lines = out.splitlines()
    rule = next(i for i, line in enumerate(lines) if "───" in line)
    words = {w for name in ["layer", "head", "nonfinite", *SCORE_NAMES, ABLATION_EFFECT]
             for w in name.split("_")} | set(ABBREVIATIONS.values())
    header_tokens = [t for line in lines[:rule] for t in line.split()]
    assert header_tokens and all(t.rstrip("_") in words for t in header_tokens), header_tokens
    rows = [line for line in lines[rule + 1:] if NUMBER.search(line)]
    assert len(rows) == 6 and all(len(NUMBER.findall(r)) >= 5 for r in rows)
    if width == 120:  # every column fits once the headers wrap
        assert "left out" not in out and "nonfinite" in out
