"""``headscope edges`` / ``faithfulness`` and ``Model.edges`` / ``faithfulness`` (issue #37):
the JSON shapes, sorting, ``--top``, ``--verify`` against ``path-patch``, several N, the
curve, the results store, the progress bar, and each bad input (one line, exit 2)."""

from __future__ import annotations

import json
import math

import pytest

from headscope.engine.api.model import open_model
from headscope.engine.core.edge_results import CURVE_FRACTIONS
from headscope.engine.core.requests import EdgesRequest, FaithfulnessRequest, edge_count
from headscope.engine.sweeps.edges import edge_structure
from tests.conftest import sample_model
from tests.tui.cli.test_store import _run_with_tty_stderr, run, run_json

MODEL = str(sample_model("attn-only-2l"))
TASK = ["--task", "first-occurrence"]
CLEAN = "cake card kite cup hotel mouse cake card kite cup hotel"
CORRUPT = "cake card kite cup hotel mouse Ivy Jack shoe Ryan Lily"
PROMPTS = ["--clean", CLEAN, "--corrupt", CORRUPT, "--answer", "mouse", "--wrong", "Ivy"]
K_EDGE = "a0.h1->a1.h2<k>"


@pytest.fixture(scope="module")
def model():
    return open_model(MODEL)


def test_edges_json_lists_every_edge_by_abs_score_as_the_api(capsys, model) -> None:
    report = run_json(capsys, "edges", MODEL, *TASK, "--method", "eap")
    assert {"method", "steps", "metric", "clean", "corrupt", "edges"} <= set(report)
    assert (report["method"], report["steps"], report["metric"]) == ("eap", 0, "first-occurrence")
    n_edges = edge_count(edge_structure(model))
    assert len(report["edges"]) == n_edges == report["n_edges"] == 52
    assert all(set(row) == {"edge", "score", "exact"} and row["exact"] is None for row in report["edges"])
    magnitudes = [abs(row["score"]) for row in report["edges"]]
    assert magnitudes == sorted(magnitudes, reverse=True)
    found = model.edges(task="first-occurrence", method="eap").scores
    assert report["clean"] == found.clean and report["corrupt"] == found.corrupt
    assert {row["edge"]: row["score"] for row in report["edges"]} == {
        name: found.score(name) for name in found.graph.edges}


def test_edges_top_and_eap_ig_steps(capsys) -> None:
    report = run_json(capsys, "edges", MODEL, *TASK, "--steps", "3", "--top", "4")
    assert (report["method"], report["steps"]) == ("eap-ig", 3)
    assert len(report["edges"]) == 4
    # the tour's K-composition is found, not just confirmed
    assert K_EDGE in [row["edge"] for row in report["edges"]]


def test_verify_puts_exact_beside_the_estimate_and_matches_path_patch(capsys) -> None:
    report = run_json(capsys, "edges", MODEL, *TASK, "--verify", "3", "--top", "5")
    checked = [row for row in report["edges"] if row["exact"] is not None]
    assert [row["edge"] for row in checked] == [row["edge"] for row in report["edges"][:3]]
    by_edge = {row["edge"]: row for row in checked}
    assert K_EDGE in by_edge
    # the edge alone corrupted on the clean run = path patching it with --noising, by the
    # graph's node names (one implementation: the same number), for every checked edge, the
    # ones from the input and into the logits too
    assert set(by_edge) == {"input->a0.h1<v>", K_EDGE, "a1.h2->logits"}
    for name, row in by_edge.items():
        sender, receiver = name.split("->")
        path = run_json(capsys, "path-patch", MODEL, sender, receiver, *TASK, "--noising")
        assert path["clean"] == report["clean"] and path["heads"][0]["edge"] == name
        assert row["exact"] == pytest.approx(path["heads"][0]["patched"] - path["clean"], abs=1e-6), name
    # the head form of the K-composition edge is the same path
    path = run_json(capsys, "path-patch", MODEL, "L0.H1", "L1.H2", "--patch", "k", *TASK, "--noising")
    assert path["heads"][0]["sender"] == [0, 1] and path["heads"][0]["edge"] == K_EDGE
    assert by_edge[K_EDGE]["exact"] == pytest.approx(path["heads"][0]["patched"] - path["clean"], abs=1e-6)
    # the estimate has the sign and size of the exact effect
    assert by_edge[K_EDGE]["score"] < 0 and by_edge[K_EDGE]["exact"] < 0


def test_table_lists_the_runs_then_the_edges(capsys) -> None:
    code, out, err = run(capsys, "edges", MODEL, *TASK, "--method", "eap", "--top", "3", "--verify", "1")
    assert code == 0, err
    lines = [line.split("\t") for line in out.strip().splitlines()]
    assert lines[0] == ["edge", "eap score", "exact"]
    assert [line[0] for line in lines[1:3]] == ["clean run", "corrupt run"]
    assert len(lines) == 6 and lines[3][2] != "" and lines[4][2] == ""


def test_faithfulness_of_one_and_several_n(capsys, model) -> None:
    one = run_json(capsys, "faithfulness", MODEL, *TASK, "--top", "5")
    assert set(one) == {"top", "clean", "corrupt", "circuit", "faithfulness", "edges"}
    assert one["top"] == 5 and 0 <= one["edges"] <= 5
    assert one["faithfulness"] == pytest.approx(
        (one["circuit"] - one["corrupt"]) / (one["clean"] - one["corrupt"]))
    several = run_json(capsys, "faithfulness", MODEL, *TASK, "--top", "1,5,52")
    assert [p["top"] for p in several] == [1, 5, 52]
    assert several[1] == one
    # every edge in the circuit: the clean run
    assert several[2]["faithfulness"] == pytest.approx(1.0, abs=1e-5) and several[2]["edges"] == 52
    found = model.faithfulness(task="first-occurrence", top=[1, 5, 52])
    assert [p.faithfulness for p in found.points] == [p["faithfulness"] for p in several]


def test_curve_has_its_points_and_area(capsys) -> None:
    report = run_json(capsys, "faithfulness", MODEL, *TASK, "--top", "5", "--curve")
    curve = report["curve"]
    assert [p["fraction"] for p in curve["points"]] == list(CURVE_FRACTIONS)
    assert [p["top"] for p in curve["points"]] == [int(f * 52) for f in CURVE_FRACTIONS]
    assert curve["points"][0]["faithfulness"] == 0.0  # 0 edges: the corrupt run
    assert curve["points"][-1]["faithfulness"] == pytest.approx(1.0, abs=1e-5)
    x = [p["fraction"] for p in curve["points"]]
    y = [p["faithfulness"] for p in curve["points"]]
    area = sum((x[i + 1] - x[i]) * (y[i] + y[i + 1]) / 2 for i in range(len(x) - 1))
    assert curve["area"] == pytest.approx(area)
    several = run_json(capsys, "faithfulness", MODEL, *TASK, "--top", "2,5", "--curve")
    assert [p["top"] for p in several["circuits"]] == [2, 5] and several["curve"] == curve


def test_results_are_stored_and_read_back(capsys, model) -> None:
    first = run_json(capsys, "edges", MODEL, *TASK, "--method", "eap", "--verify", "2")
    again = run_json(capsys, "edges", MODEL, *TASK, "--method", "eap", "--verify", "2")
    assert again == first
    faith = run_json(capsys, "faithfulness", MODEL, *TASK, "--method", "eap", "--top", "3,7")
    assert run_json(capsys, "faithfulness", MODEL, *TASK, "--method", "eap", "--top", "3,7") == faith


def test_logit_diff_prompts(capsys) -> None:
    report = run_json(capsys, "edges", MODEL, *PROMPTS, "--method", "eap", "--top", "3")
    assert report["metric"] == "logit_diff" and len(report["edges"]) == 3
    assert all(math.isfinite(row["score"]) for row in report["edges"])


@pytest.mark.parametrize(("argv", "message"), [
    (["edges", MODEL, *TASK, "--top", "53"], "--top 53 is larger than the graph's 52 edges"),
    (["edges", MODEL, *TASK, "--steps", "0"], "--steps must be a whole number of at least 1, not 0"),
    (["edges", MODEL, *TASK, "--verify", "99"], "--verify must be between 0 and the graph's 52 edges"),
    (["faithfulness", MODEL, *TASK, "--top", "53"], "--top 53 is not within the graph's 52 edges"),
    (["faithfulness", MODEL, *TASK], "give --top N"),
    (["edges", MODEL, "--clean", CLEAN, "--corrupt", CLEAN, "--answer", "mouse", "--wrong", "Ivy"],
     "the clean and corrupt inputs are the same"),
    (["faithfulness", MODEL, "--clean", CLEAN, "--corrupt", CLEAN, "--answer", "mouse", "--wrong", "Ivy",
      "--top", "3"], "the clean and corrupt inputs are the same"),
    # every mistake patch refuses
    (["edges", MODEL, "--clean", CLEAN, "--corrupt", "cake card"], "give the metric's --answer and --wrong"),
    (["edges", MODEL, "--clean", CLEAN], "give both a clean and a corrupt input"),
    (["edges", MODEL, *TASK, "--clean", CLEAN, "--corrupt", CORRUPT], "makes its own inputs"),
    (["edges", MODEL, "--clean", CLEAN, "--corrupt", "cake card", "--answer", "mouse", "--wrong", "Ivy"],
     "must have the same length"),
    (["edges", MODEL, "--clean", CLEAN, "--corrupt", CORRUPT, "--answer", "mouse house", "--wrong", "Ivy"],
     "the answer token"),
    (["faithfulness", MODEL, "--clean-tokens", "1,2", "--corrupt-tokens", "1,99999", "--answer", "1",
      "--wrong", "2", "--top", "2"], "99999"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err, err


def test_requests_validate_as_patch_does(model) -> None:
    structure = edge_structure(model)
    req = EdgesRequest.of(structure, task="first-occurrence", method="eap", steps=9)
    assert req.steps == 0 and req.key().startswith("edges-")  # eap has no steps: one key
    assert req.key() == EdgesRequest.of(structure, task="first-occurrence", method="eap").key()
    faith = FaithfulnessRequest.of(structure, task="first-occurrence", tops=5)
    assert faith.tops == (5,) and faith.scores_request() == EdgesRequest.of(structure, task="first-occurrence")
    with pytest.raises(Exception, match="--method must be eap or eap-ig"):
        EdgesRequest.of(structure, task="first-occurrence", method="acdc")


def test_progress_is_drawn_on_a_terminal_and_stdout_stays_json() -> None:
    argv = ["edges", MODEL, *TASK, "--method", "eap", "--top", "2", "--json", "--no-cache"]
    code, out, terminal = _run_with_tty_stderr(argv)
    assert code == 0, terminal
    assert len(json.loads(out)["edges"]) == 2
    assert b"\x1b[" in terminal


def test_help_says_what_it_does_with_the_example(capsys) -> None:
    from headscope.tui.cli.main import main

    for command in ("edges", "faithfulness"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = capsys.readouterr().out
        assert "--task first-occurrence" in out and "attn-only-2l" in out


def test_non_finite_gradients_are_flagged_never_printed_as_nan(capsys, monkeypatch) -> None:
    import dataclasses

    import numpy as np

    from headscope.engine.core.edge_results import edge_scores_result
    from headscope.engine.forward import edges as forward_edges

    real = forward_edges.edge_scores

    def some_nan(*args, **kwargs):
        found = real(*args, **kwargs)
        values = np.array(found.scores)
        values[found.graph.index[K_EDGE]] = np.nan
        fields = {f.name: getattr(found, f.name) for f in dataclasses.fields(found)}
        fields.pop("nonfinite")
        return edge_scores_result(**{**fields, "scores": values})

    monkeypatch.setattr(forward_edges, "edge_scores", some_nan)
    code, out, err = run(capsys, "edges", MODEL, *TASK, "--method", "eap", "--json", "--no-cache")
    assert code == 0 and "NaN" not in out
    report = json.loads(out)
    assert report["nonfinite"] == [K_EDGE]
    assert report["edges"][-1] == {"edge": K_EDGE, "score": None, "exact": None}  # ranked last
    assert "non-finite gradients" in err
