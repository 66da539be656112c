"""README.md's tour holds: every command it quotes is run, and every number it quotes is
read from README.md itself and checked against what the command prints, or, for the
explorer's steps, against the engine calls the explorer makes (engine.sweeps.dispatch.compute, the
same functions its panes show). The 80×24 pooling it quotes is checked on the drawn heatmap
(tests/e2e/test_explorer_small_terminal.py). Rewording a claim fails here until this test follows it; a
number that drifts fails here first.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from headscope.tui.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
TOUR = README.split("## A two-minute tour", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
MODEL = "sample_models/attn-only-2l"


@pytest.fixture(autouse=True)
def _own_store(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    monkeypatch.setenv("HEADSCOPE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tour-store"))


def claim(pattern: str) -> re.Match[str]:
    """The one place in the tour that matches ``pattern`` (the tour must still say it)."""
    found = list(re.finditer(pattern, TOUR))
    assert len(found) >= 1, f"the tour no longer says {pattern!r}"
    return found[0]


def commands() -> list[tuple[list[str], str]]:
    """The tour's shell block: (headscope argv, its comment)."""
    block = TOUR.split("```sh\n", 1)[1].split("```", 1)[0]
    out = []
    for line in block.splitlines():
        command, _, comment = line.partition("#")
        words = shlex.split(command)
        if words and words[0].endswith("bin/headscope"):
            out.append((words[1:], comment.strip()))
    return out


def run_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> Any:
    capsys.readouterr()
    assert main([*argv, "--json", *(["--quiet"] if argv[0] in ("heads", "composition") else [])]) == 0
    return json.loads(capsys.readouterr().out)


def head_row(rows: list[dict[str, Any]], name: str) -> dict[str, Any]:
    layer, head = (int(x) for x in re.fullmatch(r"L(\d+)\.H(\d+)", name).groups())  # type: ignore[union-attr]
    return next(r for r in rows if (r["layer"], r["head"]) == (layer, head))


def test_the_tour_quotes_three_commands_and_make_run() -> None:
    assert [argv[0] for argv, _ in commands()] == ["heads", "composition", "heads"]
    assert "make run" in TOUR.split("```sh\n", 1)[1].split("```", 1)[0]
    steps = re.findall(r"^ ?(\d+)\. \*\*", TOUR, flags=re.M)
    assert steps == [str(i) for i in range(1, len(steps) + 1)] and len(steps) >= 10
    assert "120 columns" in TOUR and "80×24" in TOUR


def test_the_commands_print_what_their_comments_say(capsys: pytest.CaptureFixture[str]) -> None:
    (by_induction, c1), (composition, c2), (by_ablation, c3) = commands()
    rows = run_json(capsys, by_induction)
    top, value = re.fullmatch(r"(L\d\.H\d) on top: ([\d.]+)", c1).groups()  # type: ignore[union-attr]
    assert (rows[0]["layer"], rows[0]["head"]) == (head_row(rows, top)["layer"], head_row(rows, top)["head"])
    assert f"{rows[0]['induction_score']:.2f}" == value

    report = run_json(capsys, composition)
    source, target, above = re.fullmatch(r"(L\d\.H\d) → (L\d\.H\d) ([+-][\d.]+)", c2).groups()  # type: ignore[union-attr]
    edge = report["top_edges"][0]
    assert f"L{edge['source'][0]}.H{edge['source'][1]}" == source
    assert f"L{edge['target'][0]}.H{edge['target'][1]}" == target
    assert f"{edge['above_baseline']:+.3f}" == above

    rows = run_json(capsys, by_ablation)
    claims = re.findall(r"(L\d\.H\d) ([+-][\d.]+)", c3)
    assert claims and (rows[0]["layer"], rows[0]["head"]) == (head_row(rows, claims[0][0])["layer"],
                                                              head_row(rows, claims[0][0])["head"])
    for name, value in claims:
        assert f"{head_row(rows, name)['ablation_effect']:+.2f}" == value


def test_the_explorer_steps_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    """Each number of the walk, from the engine calls behind the pane that shows it."""
    from headscope.engine.api.model import open_model
    from headscope.engine.api.report import circuit_report
    from headscope.engine.core.requests import SpectrumRequest
    from headscope.tui.base.labels import z_text
    from headscope.tui.plots.figures import diagonal_summary
    from headscope.tui.widgets.reading import N_DIRECTIONS, N_TOKENS

    rows = run_json(capsys, ["heads", MODEL, "--ablation"])
    l1h2 = head_row(rows, "L1.H2")
    # 2 (and 10, the filter): the focus line's `ind +0.95 z=219` and `copy +1.00`
    ind, z = claim(r"`ind ([+-][\d.]+) (z=[\d.]+)`").groups()
    assert f"{l1h2['induction_score']:+.2f}" == ind and z_text(l1h2["induction_score_z"]) == z
    assert f"{l1h2['copying_score']:+.2f}" == claim(r"`copy ([+-][\d.]+)`").group(1)
    value, z = claim(r"`(\d\.\d\d) (z=[\d.]+)`\)").groups()
    assert f"{l1h2['induction_score']:.2f}" == value and z_text(l1h2["induction_score_z"]) == z

    # 4: the OV heatmap's key (the full OV block the explorer draws, its diagonal summary)
    model = open_model(MODEL)
    block = circuit_report(model, 1, 2, "ov")
    assert diagonal_summary(np.asarray(block["values"])) == \
        " ".join(claim(r"`(diag [^`]+)`").group(1).split())
    # 4-5: the directions panel (k = N_DIRECTIONS, N_TOKENS tokens a side) and `svd`
    assert f"OV direction 1/{N_DIRECTIONS}" in TOUR
    found = model.singular_directions(1, 2, "ov", k=N_DIRECTIONS, top=N_TOKENS)
    first, whole = claim(r"`overlap ([+-][\d.]+) · head ([+-][\d.]+)`").groups()
    assert f"{found['directions'][0]['overlap']:+.2f}" == first
    assert f"{found['overlap']:+.2f}" == whole
    svd = run_json(capsys, ["svd", MODEL, "1", "2", "--kind", "ov"])
    assert f"({svd['overlap']:.1f})" in claim(r"prints as `overlap` \([\d.]+\)").group(0)
    assert [d["direction"] for d in svd["directions"]] == list(range(1, N_DIRECTIONS + 1))
    # 6: the Spectrum pane's title
    assert f"{model.get(SpectrumRequest(1, 2, 'ov')).score:+.3f}" == \
        claim(r"`copying ([+-][\d.]+)`").group(1)
    # 7: the Prompt tab's cell line, the cursor at first on the last query's strongest key
    # (what 80×24 shows of the stripe, its pattern pooled to about 5 rows)
    from headscope.engine.core.requests import PromptRequest
    from headscope.tui.base.prompt_words import REPEATED_PHRASE

    view = model.get(PromptRequest.of(model.structure(), REPEATED_PHRASE)).view(1, 2)
    q, tok_q, k, tok_k, weight = claim(r"`cell q=(\d+) '([^']*)' → k=(\d+) '([^']*)' ([\d.]+)`").groups()
    last = np.asarray(view.pattern)[-1]
    assert (int(q), int(k)) == (len(view.tokens) - 1, int(np.argmax(last)))
    assert (view.tokens[int(q)], view.tokens[int(k)]) == (tok_q, tok_k)
    assert view.tokens[int(k) - 1] == tok_q  # the token after the earlier occurrence
    assert f"{last[int(k)]:.2f}" == weight
    # 8: the edge and its virtual heads (the pop-up shows a PathRequest)
    comp = run_json(capsys, ["composition", MODEL, "--kind", "k", "--top", "1"])
    assert f"{comp['top_edges'][0]['above_baseline']:+.3f}" == \
        claim(r"`([+-][\d.]+)` above the baseline").group(1)
    path = run_json(capsys, ["path", MODEL, "L0.H1", "L1.H2"])
    positivity, diagonal = claim(r"`K-path positivity ([+-][\d.]+) · diagonal ([\d.]+)`").groups()
    assert f"{path['k_composition']['positivity']:+.3f}" == positivity
    assert f"{path['k_composition']['diagonal']:.2f}" == diagonal
    assert f"{path['v_composition']['copying_score']:+.3f}" == \
        claim(r"`V-path copying ([+-][\d.]+)`").group(1)
    # 9: the Summary's ablation column (three decimals)
    for name, value in re.findall(r"(L\d\.H\d) `([+-][\d.]+)`", claim(r"zero-ablated: [^.]+\.").group(0)):
        assert f"{head_row(rows, name)['ablation_effect']:+.3f}" == value

