"""``headscope patch`` / ``path-patch`` and ``Model.patch`` / ``path_patch`` (issue #27): the
JSON of the issue, the table, the results store, the bad inputs (one line each; exit 2 for
the command line, 1 for the model) and the progress bar."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from headscope.engine.api.model import open_model
from headscope.engine.api.store import default_store
from headscope.tui.cli.main import main
from tests.conftest import sample_model
from tests.tui.cli.test_store import _run_with_tty_stderr, run, run_json

MODEL = str(sample_model("attn-only-2l"))
CLEAN = "cake card kite cup hotel mouse cake card kite cup hotel"
CORRUPT = "cake card kite cup hotel mouse Ivy Jack shoe Ryan Lily"
PROMPTS = ["--clean", CLEAN, "--corrupt", CORRUPT, "--answer", "mouse", "--wrong", "Ivy"]


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


def test_sets_attribution_positions_and_paths_in_json(capsys) -> None:
    sets = run_json(capsys, "patch", MODEL, *PROMPTS, "--heads", "L1.H0,L1.H1,L1.H2", "--heads", "1.1,1.2")
    assert [row["heads"] for row in sets["heads"]] == [[[1, 0], [1, 1], [1, 2]], [[1, 1], [1, 2]]]
    assert sets["heads"][0]["recovered"] > 0.85 > sets["heads"][1]["recovered"] > 0.45

    attribution = run_json(capsys, "patch", MODEL, *PROMPTS, "--method", "attribution", "--verify", "2")
    assert attribution["method"] == "attribution"
    verified = [row for row in attribution["heads"] if row["exact"] is not None]
    assert len(verified) == 2
    for row in attribution["heads"]:
        assert row["patched"] == pytest.approx(attribution["corrupt"] + row["estimate"])

    positions = run_json(capsys, "patch", MODEL, *PROMPTS, "--site", "v", "--by-position")
    assert all(len(row["positions"]) == 11 for row in positions["heads"])

    path = run_json(capsys, "path-patch", MODEL, "L0.H1", "L1.H2", "--patch", "k")
    assert (path["method"], path["site"], path["metric"]) == ("path", "k", "induction")
    (row,) = path["heads"]
    assert row["sender"] == [0, 1] and row["receiver"] == [1, 2]
    found = open_model(MODEL).path_patch((0, 1), (1, 2), patch="k")
    assert row["patched"] == found.rows[0].patched


def test_the_induction_task_is_the_default(capsys) -> None:
    report = run_json(capsys, "patch", MODEL, "--seq-len", "8", "--batch", "2")
    assert report["metric"] == "induction" and report["tokens"] == 16 and report["batch"] == 2
    assert report["clean"] > report["corrupt"]
    best = max(report["heads"], key=lambda r: r["recovered"])
    assert (best["layer"], best["head"]) == (1, 2)
    assert run_json(capsys, "patch", MODEL, "--task", "induction", "--seq-len", "8", "--batch", "2") == report


def test_a_second_run_is_served_from_the_store(capsys, monkeypatch, _results_store_in_tmp) -> None:
    first = run_json(capsys, "patch", MODEL, *PROMPTS, "--method", "attribution", "--verify", "1")
    from headscope.engine.forward import patching

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("patched again")

    monkeypatch.setattr(patching, "attribute_heads", fail)
    assert run_json(capsys, "patch", MODEL, *PROMPTS, "--method", "attribution", "--verify", "1") == first
    code, out, _ = run(capsys, "cache", "ls", MODEL, "--json")
    assert code == 0 and json.loads(out)
    # another input is another part; --no-cache neither reads nor writes
    with pytest.raises(AssertionError, match="patched again"):
        main(["patch", MODEL, *PROMPTS, "--method", "attribution", "--verify", "1", "--noising"])
    with pytest.raises(AssertionError, match="patched again"):
        main(["patch", MODEL, *PROMPTS, "--method", "attribution", "--verify", "1", "--no-cache"])
    capsys.readouterr()
    # through the API too, with a store
    store = default_store()
    model = open_model(MODEL)
    again = model.patch(CLEAN, CORRUPT, answer="mouse", wrong="Ivy", method="attribution", verify=1, store=store)
    assert [r.estimate for r in again.rows] == [row["estimate"] for row in first["heads"]]


@pytest.mark.parametrize(("argv", "message"), [
    (["--clean", "Mary John", "--corrupt", "Mary John Tom", "--answer", "Tom", "--wrong", "Mary"],
     "must have the same length: clean is 2 tokens, corrupt 3"),
    (["--clean", " ", "--corrupt", "Mary", "--answer", "Tom", "--wrong", "Mary"], "the clean prompt is empty"),
    (["--clean", "Mary John", "--corrupt", "Mary Tom", "--answer", "Tom Mary", "--wrong", "Mary"],
     "the answer token 'Tom Mary' is 2 tokens (Tom, Mary): give one token"),
    (["--clean-tokens", "1,2,999", "--corrupt-tokens", "1,2,3", "--answer", "3", "--wrong", "4"],
     "clean token id 999 out of range 0..413"),
    (["--clean-tokens", "1,2,3", "--corrupt-tokens", "1,2,4", "--answer", "3", "--wrong", "414"],
     "wrong token id 414 out of range"),
    (["--clean", "Mary John", "--corrupt", "Mary Tom"], "give the metric's --answer and --wrong"),
    (["--clean", "Mary John"], "give both a clean and a corrupt input"),
    (["--clean", "a", "--clean-tokens", "1", "--corrupt", "b"], "not both"),
    (["--answer", "Tom", "--wrong", "Mary"], "go with --clean and --corrupt"),
    (["--task", "induction", *PROMPTS], "makes its own inputs"),
    (["--verify", "2"], "add --method attribution"),
    (["--method", "attribution", "--heads", "L1.H1"], "no --heads or --by-position"),
    (["--heads", "L2.H0"], "layer 2 out of range"),
    (["--heads", "L1.H1,one"], "'one' is not a head"),
    (["--seq-len", "40"], "--seq-len must be between 2 and 32"),
])
def test_bad_inputs_are_one_line_usage_errors(capsys, argv: list[str], message: str) -> None:
    code, out, err = run(capsys, "patch", MODEL, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("headscope: ") and message in err, err


def test_bad_paths_and_usage(capsys) -> None:
    code, _, err = run(capsys, "path-patch", MODEL, "L1.H0", "L1.H2")
    assert code == 2 and "earlier layer to a later one" in err
    for argv in (["path-patch", MODEL, "L0.H1", "L1.H2", "--patch", "out"], ["patch", MODEL, "--site", "z"]):
        with pytest.raises(SystemExit) as exit_info:  # argparse: invalid choice
            main(argv)
        assert exit_info.value.code == 2
        assert "invalid choice" in capsys.readouterr().err


def test_text_for_a_model_without_a_tokenizer(capsys, llama_dir: tuple[Path, Any]) -> None:
    path = str(llama_dir[0])
    code, _, err = run(capsys, "patch", path, "--clean", "the cat", "--corrupt", "the dog",
                       "--answer", "3", "--wrong", "4")
    assert code == 2 and err.count("\n") == 1 and "this model has no tokenizer: type token ids" in err
    report = run_json(capsys, "patch", path, "--clean", "1 5 9 2", "--corrupt", "1 5 7 2",
                      "--answer", "3", "--wrong", "4")
    assert len(report["heads"]) == 8


def test_encoders_are_refused_clearly(capsys, bert_mlm_dir: tuple[Path, Any]) -> None:
    code, out, err = run(capsys, "patch", str(bert_mlm_dir[0]))
    assert code == 1 and out == "" and err.count("\n") == 1
    assert "is an encoder" in err and "only a causal model has" in err
    with pytest.raises(Exception, match="encoder"):
        open_model(bert_mlm_dir[0]).patch()


def test_identical_inputs_leave_recovered_undefined(capsys) -> None:
    code, out, err = run(capsys, "patch", MODEL, "--clean", CLEAN, "--corrupt", CLEAN, "--answer", "mouse",
                         "--wrong", "Ivy", "--json")
    assert code == 0
    report = json.loads(out)
    assert "recovered is undefined" in report["note"] and "recovered is undefined" in err
    assert all(row["recovered"] is None and isinstance(row["patched"], float) for row in report["heads"])


def test_non_finite_activations_are_one_line(capsys, tmp_path: Path) -> None:
    import shutil

    from safetensors.torch import load_file, save_file

    source = sample_model("attn-only-2l")
    for name in ("headscope.json", "vocab.txt"):
        shutil.copy(source / name, tmp_path / name)
    tensors = load_file(source / "model.safetensors")
    tensors["blocks.0.attn.W_Q"][1, 0, 0] = math.inf
    save_file(tensors, tmp_path / "model.safetensors")
    code, out, err = run(capsys, "patch", str(tmp_path), "--raw", "--seq-len", "4", "--batch", "1")
    assert code == 1 and out == "" and err.count("\n") == 1
    assert "non-finite activations in the clean run from layer 0" in err


def test_progress_is_drawn_on_a_terminal_and_stdout_stays_json() -> None:
    argv = ["patch", MODEL, "--seq-len", "8", "--batch", "2", "--json", "--no-cache"]
    code, out, terminal = _run_with_tty_stderr(argv)
    assert code == 0, terminal
    assert json.loads(out)["metric"] == "induction"
    assert b"\x1b[" in terminal
