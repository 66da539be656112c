"""README.md's "Confirming with patching": its commands print the numbers it quotes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from headscope.tui.cli.main import main
from tests.conftest import sample_model

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
SECTION = README.split("## Confirming with patching", 1)[1].split("\n## ", 1)[0]
MODEL = str(sample_model("attn-only-2l"))
CLEAN = "cake card kite cup hotel mouse cake card kite cup hotel"
CORRUPT = "cake card kite cup hotel mouse Ivy Jack shoe Ryan Lily"
FIRST_CORRUPT = "cake card kite cup lamp mouse cake card kite cup hotel"
SPAN = ["--clean", CLEAN, "--corrupt", CORRUPT, "--answer", "mouse", "--wrong", "Ivy"]
FIRST = ["--clean", CLEAN, "--corrupt", FIRST_CORRUPT, "--answer", "mouse", "--wrong", "lamp"]


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main([*argv, "--json", "--no-cache"]) == 0
    return json.loads(capsys.readouterr().out)


def quoted(text: str) -> None:
    assert text in SECTION, f"README's patching section no longer says {text!r}"


def test_the_sections_commands_are_the_tested_ones() -> None:
    for prompt in (CLEAN, CORRUPT, FIRST_CORRUPT):
        quoted(f'"{prompt}"')
    quoted("--heads L1.H0,L1.H1,L1.H2 --heads L1.H1,L1.H2")
    quoted("path-patch sample_models/attn-only-2l L0.H1 L1.H2 --patch k")
    assert re.search(r"--answer mouse --wrong Ivy", SECTION) and "--answer mouse --wrong lamp" in SECTION


def test_patching_the_span_prints_the_quoted_numbers(capsys) -> None:
    report = cli(capsys, "patch", MODEL, *SPAN)
    rec = {(r["layer"], r["head"]): r["recovered"] for r in report["heads"]}
    quoted(f"clean {report['clean']:.2f}, corrupt {report['corrupt']:.2f}")
    quoted(f"L1.H2 {rec[1, 2]:.2f}, L1.H1 {rec[1, 1]:.2f}, L1.H0 {rec[1, 0]:.2f}")
    assert max(abs(rec[0, h]) for h in range(3)) <= 0.01  # "layer 0 ≤ 0.01"
    quoted(f"their sum ({rec[1, 0] + rec[1, 1] + rec[1, 2]:.2f})")

    sets = cli(capsys, "patch", MODEL, *SPAN, "--heads", "L1.H0,L1.H1,L1.H2", "--heads", "L1.H1,L1.H2")
    together, pair = (r["recovered"] for r in sets["heads"])
    quoted(f"# {together:.2f} and {pair:.2f}")
    quoted(f"the three together {together:.2f}")

    noised = cli(capsys, "patch", MODEL, *SPAN, "--noising")
    rec = {(r["layer"], r["head"]): r["recovered"] for r in noised["heads"]}
    others = min(v for k, v in rec.items() if k != (1, 2))
    quoted(f"drops to {rec[1, 2]:.2f} with L1.H2 and keeps {others:.2f} or more with any other head")


def test_the_final_layernorm_scale_is_the_quoted_one() -> None:
    from headscope.engine.api.model import open_model

    model = open_model(MODEL)
    scales = [float(model.run(text, return_head_outputs=True).final_scale[0, -1, 0]) for text in (CORRUPT, CLEAN)]
    quoted(f"{scales[0]:.2f} on the corrupt run and\n{scales[1]:.2f} on the clean one")


def test_path_patching_prints_the_quoted_numbers(capsys) -> None:
    found = {}
    for sender, patch in (("L0.H1", "k"), ("L0.H1", "q"), ("L0.H1", "v"), ("L0.H0", "k")):
        (row,) = cli(capsys, "path-patch", MODEL, sender, "L1.H2", "--patch", patch, *FIRST)["heads"]
        found[sender, patch] = row["recovered"]
    quoted(f"L0.H1 → L1.H2 (k) recovers {found['L0.H1', 'k']:.2f}")
    assert f"{abs(found['L0.H1', 'q']):.2f}" == f"{abs(found['L0.H1', 'v']):.2f}" == "0.00"
    quoted("through q or v 0.00")
    quoted(f"L0.H0 → L1.H2 (k) {found['L0.H0', 'k']:.2f}")


def test_the_first_occurrence_task_prints_the_quoted_numbers(capsys) -> None:
    """The built-in first-occurrence task: the K edge's path effect (and nothing through q or
    v, nothing from L0.H0; 0.00 on the induction task), then every head."""
    task = ["--task", "first-occurrence"]
    quoted("path-patch sample_models/attn-only-2l L0.H1 L1.H2 --patch k --task first-occurrence")
    quoted("patch sample_models/attn-only-2l --task first-occurrence")
    found = {}
    for sender, patch in (("L0.H1", "k"), ("L0.H1", "q"), ("L0.H1", "v"), ("L0.H0", "k")):
        (row,) = cli(capsys, "path-patch", MODEL, sender, "L1.H2", "--patch", patch, *task)["heads"]
        found[sender, patch] = row["recovered"]
    (row,) = cli(capsys, "path-patch", MODEL, "L0.H1", "L1.H2", "--patch", "k")["heads"]
    quoted(f"L0.H1 → L1.H2 (k) recovers {found['L0.H1', 'k']:.2f} (induction task: {abs(row['recovered']):.2f})")
    assert {f"{abs(found[k]):.2f}" for k in (("L0.H1", "q"), ("L0.H1", "v"), ("L0.H0", "k"))} == {"0.00"}
    quoted("through q or v 0.00; L0.H0 → L1.H2 (k) 0.00")
    quoted(f"(K) {found['L0.H1', 'k']:+.2f}, used")
    report = cli(capsys, "patch", MODEL, *task)
    rec = {(r["layer"], r["head"]): r["recovered"] for r in report["heads"]}
    quoted(f"L0.H1 {rec[0, 1]:.2f}, L1.H2 {rec[1, 2]:.2f}, L1.H1 {rec[1, 1]:.2f}, L1.H0 {rec[1, 0]:.2f}")
    assert max(abs(rec[0, 0]), abs(rec[0, 2])) <= 0.01  # "L0.H0 and L0.H2 ≤ 0.01"
