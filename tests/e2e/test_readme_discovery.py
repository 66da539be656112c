"""README.md's "Finding the circuit, and why a head attends there": the numbers it quotes are
the ones `headscope edges`, `faithfulness` and `qk-attribution` print (read from the README
itself, so rewording a number fails here until the command agrees)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headscope.tui.cli.main import main
from tests.conftest import sample_model

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
SECTION = " ".join(README.split("## Finding the circuit, and why a head attends there", 1)[1]
                   .split("\n## ", 1)[0].split())  # lines joined: a number may wrap
MODEL = str(sample_model("attn-only-2l"))
PROMPT = "cake card kite cup hotel mouse shoe"
TASK = ["--task", "first-occurrence"]


def cli(capsys: pytest.CaptureFixture[str], *argv: str, stored: bool = True) -> object:
    assert main([*argv, "--json", *(["--no-cache"] if stored else [])]) == 0
    return json.loads(capsys.readouterr().out)


def quoted(text: str) -> None:
    assert " ".join(text.split()) in SECTION, f"README's discovery section no longer says {text!r}"


def signed(value: float) -> str:
    return f"{value:.2f}".replace("-", "−")


def test_edge_attribution_finds_the_tours_k_composition(capsys) -> None:
    found = cli(capsys, "edges", MODEL, *TASK, "--verify", "3")
    edges = found["edges"]
    names = [e["edge"] for e in edges]
    k_edge = edges[names.index("a0.h1->a1.h2<k>")]
    quoted(f"2nd of {found['n_edges']} edges")
    assert names.index("a0.h1->a1.h2<k>") == 1
    quoted(f"estimate {signed(k_edge['score'])} beside its exact effect {signed(k_edge['exact'])}")
    quoted(f"the top 3 edges are `{names[0]}`, `{names[1]}`, `{names[2]}`")
    circuits = cli(capsys, "faithfulness", MODEL, *TASK, "--top", "3,10")
    top3, top10 = circuits
    quoted(f"keep {top3['faithfulness']:.2f} of the behaviour")
    quoted(f"(top 10, {top10['edges']} after pruning: {top10['faithfulness']:.2f})")


def test_the_induction_heads_key_side_is_the_previous_token_head(capsys) -> None:
    found = cli(capsys, "qk-attribution", MODEL, "L1.H2", "--prompt", f"{PROMPT} {PROMPT}",
                "--query", "9", "--key", "3", stored=False)  # not a stored request
    quoted(f"`{PROMPT}` typed twice")
    quoted(f"is +{found['score']:.2f}")
    key_side = found["key_totals"]
    assert max(key_side, key=key_side.get) == "a0.h1"
    quoted(f"`a0.h1` (+{key_side['a0.h1']:.2f} of it)")
