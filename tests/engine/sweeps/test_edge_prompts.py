"""Edge attribution over a prompts file (engine/sweeps/edge_prompts.py, ``headscope edges
--prompts``): the averaged scores are the mean of each pair's own ``edge_scores`` (EAP-IG's
``attribute`` over a dataset: the scores summed over the examples / their number), each pair
is stored, and the file's mistakes are one line naming the line. The cluster path is checked
against this one in tests/engine/sweeps/test_cluster.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from headscope.engine.api.model import open_model
from headscope.engine.api.report import prompt_edges
from headscope.engine.core.errors import InvalidRequestError, PromptError
from headscope.engine.forward import edges as forward_edges
from headscope.engine.forward import patch_tasks
from headscope.engine.sweeps.edge_prompts import (
    PromptPair,
    edges_over_prompts,
    pair_requests,
    read_prompt_pairs,
)
from headscope.engine.sweeps.store import ResultStore
from tests.conftest import sample_model

ATTN2 = sample_model("attn-only-2l")
# three pairs of different lengths, each with its own answer and wrong token
PAIRS = [([1, 5, 9, 2, 33, 7, 5, 9], [1, 5, 9, 2, 40, 7, 11, 9], 3, 4),
         ([3, 4, 5, 6, 7, 8], [3, 4, 50, 6, 7, 9], 10, 11),
         ([20, 21, 22, 23, 24, 25, 26, 27, 28, 29], [20, 21, 22, 60, 24, 25, 26, 61, 28, 29], 7, 8)]


def write_jsonl(path: Path, pairs: list = PAIRS) -> Path:
    path.write_text("\n".join(json.dumps({"clean": c, "corrupt": x, "answer": a, "wrong": w})
                              for c, x, a, w in pairs) + "\n")
    return path


@pytest.fixture(scope="module")
def model():
    return open_model(ATTN2)


@pytest.mark.parametrize("method", ["eap", "eap-ig"])
def test_the_average_is_the_mean_of_each_pairs_scores(model, tmp_path: Path, method: str) -> None:
    result = prompt_edges(model, write_jsonl(tmp_path / "pairs.jsonl"), method=method, steps=3).scores
    alone = [forward_edges.edge_scores(model.weights, [c], [x], patch_tasks.LogitDiff(a, w), method=method, steps=3)
             for c, x, a, w in PAIRS]
    want = np.mean([r.scores for r in alone], axis=0)
    # the same float32 runs, averaged in float64: only the order of the sum differs
    np.testing.assert_allclose(result.scores, want, rtol=0, atol=1e-12 * np.abs(want).max())
    assert np.abs(want).max() > 0
    assert result.clean == pytest.approx(np.mean([r.clean for r in alone]), abs=1e-12)
    assert result.corrupt == pytest.approx(np.mean([r.corrupt for r in alone]), abs=1e-12)
    assert (result.batch, result.tokens, result.method) == (3, 10, method)


def test_each_pair_is_stored_and_read_back(model, tmp_path: Path) -> None:
    pairs = write_jsonl(tmp_path / "pairs.jsonl")
    requests = pair_requests(model, read_prompt_pairs(pairs), method="eap")
    first = edges_over_prompts(model, requests, store=ResultStore(tmp_path / "cache").for_model(model))
    fractions: list[float] = []
    entry = ResultStore(tmp_path / "cache").for_model(model)  # another process, the same directory
    again = edges_over_prompts(model, requests, store=entry, progress=fractions.append)
    assert (entry.loaded, entry.computed) == (3, 0)  # every pair from the store
    assert fractions[0] == 1.0  # all found before any computing
    np.testing.assert_array_equal(again.scores, first.scores)
    # one more pair computes only that one
    more = ResultStore(tmp_path / "cache").for_model(model)
    extra = pair_requests(model, [PromptPair((9, 8, 7, 6), (9, 8, 70, 6), 1, 2, line=1)], method="eap")
    edges_over_prompts(model, [*requests, *extra], store=more)
    assert (more.loaded, more.computed) == (3, 1)


def test_tab_separated_text_pairs_equal_the_same_pairs_as_json(model, tmp_path: Path) -> None:
    text = [("cake card kite cup hotel mouse cake card kite cup hotel",
             "cake card kite cup hotel mouse Ivy Jack shoe Ryan Lily", "mouse", "Ivy")]
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("clean\tcorrupt\tanswer\twrong\n# a comment\n\n" + "\t".join(text[0]) + "\n")
    jsonl = write_jsonl(tmp_path / "pairs.jsonl", text)
    pairs = read_prompt_pairs(tsv)
    assert [(p.clean, p.answer, p.line) for p in pairs] == [(text[0][0], "mouse", 4)]
    a = prompt_edges(model, tsv, method="eap").scores
    b = prompt_edges(model, jsonl, method="eap").scores
    np.testing.assert_array_equal(a.scores, b.scores)


@pytest.mark.parametrize(("content", "says"), [
    ("", "no prompt pair"),
    ('{"clean": [1, 2], "corrupt": [1, 3], "answer": 1}\n', "line 1: missing wrong"),
    ('# pairs\n{"clean": [1, 2], "corrupt": [1, 3], "answer": 1, "wrong": 2, "why": 0}\n', "line 2: unknown key"),
    ("a\tb\tc\n", "line 1: expected 4 tab-separated columns"),
    ('{"clean": [1, 2], "corrupt": [1, 3], "answer": 1, "wrong": 2\n', "line 1: not JSON"),
    ('{"clean": [1.5, 2], "corrupt": [1, 3], "answer": 1, "wrong": 2}\n', "line 1: clean must be text or"),
])
def test_a_bad_file_is_one_line_naming_the_line(tmp_path: Path, content: str, says: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(PromptError, match=says) as err:
        read_prompt_pairs(path)
    assert str(path) in err.value.one_line() and "\n" not in err.value.one_line()


def test_a_bad_pair_names_its_line(model, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "pairs.jsonl", [PAIRS[0], ([1, 2, 3], [1, 2], 3, 4)])
    with pytest.raises(InvalidRequestError, match=r"pairs.jsonl line 2: .*length"):
        prompt_edges(model, path, method="eap")


def test_cli_prompts_json_and_refusals(model, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from headscope.tui.cli.main import main

    monkeypatch.setenv("HEADSCOPE_CONFIG", str(tmp_path / "none.toml"))
    pairs = write_jsonl(tmp_path / "pairs.jsonl")
    code = main(["edges", str(ATTN2), "--prompts", str(pairs), "--method", "eap", "--top", "5", "--json",
                 "--no-cache", "--quiet"])
    out, _ = capsys.readouterr()
    assert code == 0
    report = json.loads(out)
    want = prompt_edges(model, pairs, method="eap").scores
    assert report["prompts"] == 3 and len(report["edges"]) == 5
    top = report["edges"][0]
    assert top["score"] == pytest.approx(want.score(top["edge"]), abs=0) and top["exact"] is None
    for extra in (["--task", "induction"], ["--verify", "2"], ["--answer", "3"]):
        assert main(["edges", str(ATTN2), "--prompts", str(pairs), *extra, "--no-cache"]) == 2
        _, err = capsys.readouterr()
        assert "--prompts FILE gives every pair's inputs" in err and err.count("\n") == 1
    assert main(["edges", str(ATTN2), "--prompts", str(tmp_path / "absent.jsonl"), "--no-cache"]) == 2
    _, err = capsys.readouterr()
    assert "absent.jsonl" in err and err.count("\n") == 1
