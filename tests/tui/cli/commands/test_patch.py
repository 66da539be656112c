"""`headscope patch`: the JSON and the table, the default task."""

from __future__ import annotations

from headscope.engine.api.model import open_model
from tests.tui.cli.test_patching import CLEAN, CORRUPT, MODEL, PROMPTS
from tests.tui.cli.test_store import run, run_json


def test_json_has_the_issue_shape_and_the_api_numbers(capsys) -> None:
    report = run_json(capsys, "patch", MODEL, *PROMPTS)
    assert {"method", "site", "metric", "clean", "corrupt", "heads"} <= set(report)
    assert (report["method"], report["site"], report["metric"]) == ("exact", "out", "logit_diff")
    assert report["tokens"] == 11 and report["batch"] == 1 and report["note"] is None
    assert len(report["heads"]) == 6
    assert all(set(row) == {"layer", "head", "patched", "recovered"} for row in report["heads"])
    found = open_model(MODEL).patch(CLEAN, CORRUPT, answer="mouse", wrong="Ivy")
    assert report["clean"] == found.clean and report["corrupt"] == found.corrupt
    for row, expected in zip(report["heads"], found.rows, strict=True):
        assert (row["layer"], row["head"]) == expected.heads[0]
        assert row["patched"] == expected.patched and row["recovered"] == expected.recovered
    # ids given as ids are the same request
    model = open_model(MODEL)
    ids = [str(model.tokenizer.token_to_id(t)) for t in ("mouse", "Ivy")]
    tokens = ["--clean-tokens", ",".join(map(str, model.tokenizer.encode(CLEAN))),
              "--corrupt-tokens", ",".join(map(str, model.tokenizer.encode(CORRUPT))),
              "--answer", ids[0], "--wrong", ids[1]]
    assert run_json(capsys, "patch", MODEL, *tokens, "--no-cache")["heads"] == report["heads"]


def test_table_lists_both_runs_then_the_heads_most_recovered_first(capsys) -> None:
    code, out, err = run(capsys, "patch", MODEL, *PROMPTS, "--top", "3")
    assert code == 0, err
    lines = [line.split("\t") for line in out.strip().splitlines()]
    assert lines[0] == ["heads", "logit_diff (patched)", "recovered"]
    assert [line[0] for line in lines[1:3]] == ["clean run", "corrupt run"]
    assert [line[0] for line in lines[3:]] == ["L1.H2", "L1.H1", "L1.H0"]
    recovered = [float(line[2]) for line in lines[3:]]
    assert recovered == sorted(recovered, reverse=True)


def test_the_induction_task_is_the_default(capsys) -> None:
    report = run_json(capsys, "patch", MODEL, "--seq-len", "8", "--batch", "2")
    assert report["metric"] == "induction" and report["tokens"] == 16 and report["batch"] == 2
    assert report["clean"] > report["corrupt"]
    best = max(report["heads"], key=lambda r: r["recovered"])
    assert (best["layer"], best["head"]) == (1, 2)
    assert run_json(capsys, "patch", MODEL, "--task", "induction", "--seq-len", "8", "--batch", "2") == report
