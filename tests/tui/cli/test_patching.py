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
