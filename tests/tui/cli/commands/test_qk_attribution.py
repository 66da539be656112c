"""``headscope qk-attribution``: its JSON against the engine's ``qk_attribution`` (itself checked
against TransformerLens in test_qk_attribution.py), the sums, ``--top``, the table, and the
one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from headscope.engine.api.model import open_model
from headscope.engine.core.errors import IndexOutOfRangeError, InvalidRequestError
from headscope.engine.core.requests import QKAttributionRequest
from headscope.engine.forward.behaviour import repeated_tokens
from headscope.engine.forward.qk_attribution import qk_attribution
from headscope.engine.model.loading import load_model
from headscope.tui.cli.main import main
from tests import family_fixtures
from tests.conftest import INDUCTION_HEAD, PREV_TOKEN_HEAD, sample_model

ATTN2 = str(sample_model("attn-only-2l"))
TOKENS = [1, 5, 9, 2, 33, 7, 5, 9, 12, 40, 3, 9]
IDS = ",".join(map(str, TOKENS))
EPS = float(np.finfo(np.float32).eps)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code, out, err = cli(capsys, "qk-attribution", *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def induction_prompt() -> tuple[list[int], int, int]:
    """attn-only-2l's repeated sequence, a query in its second copy and its induction key."""
    cfg = load_model(sample_model("attn-only-2l")).cfg
    half = 20
    tokens = repeated_tokens(cfg.d_vocab, cfg.n_ctx, seed=0, seq_len=half, batch=1)[0].tolist()
    query = half + 7
    return tokens, query, query - half + 1


def test_json_is_the_engine_row_at_the_key(capsys: pytest.CaptureFixture[str], gpt2_dir: Any) -> None:
    path = str(gpt2_dir[0])
    out = cli_json(capsys, path, "L1.H2", "--tokens", IDS, "--query", "9", "--key", "4")
    assert list(out) == ["layer", "head", "query", "key", "score", "terms", "query_totals", "key_totals"]
    assert (out["layer"], out["head"], out["query"], out["key"]) == (1, 2, 9, 4)
    found = qk_attribution(load_model(gpt2_dir[0]).weights, TOKENS, 1, 2, 9)
    names = found.names
    assert out["score"] == pytest.approx(float(found.score[4]), rel=1e-6)
    assert len(out["terms"]) == len(names) ** 2  # every term, each once
    assert {(t["query_src"], t["key_src"]) for t in out["terms"]} == {(q, k) for q in names for k in names}
    sizes = [abs(t["value"]) for t in out["terms"]]
    assert sizes == sorted(sizes, reverse=True)
    i, j = names.index("a0.h1"), names.index("m0")
    term = next(t["value"] for t in out["terms"] if (t["query_src"], t["key_src"]) == ("a0.h1", "m0"))
    assert term == pytest.approx(float(found.terms[i, j, 4]), rel=1e-6, abs=1e-7)
    # the sums: n² float32 terms add up to the score within a few ulps of the largest each
    largest = max(sizes)
    assert sum(t["value"] for t in out["terms"]) == pytest.approx(out["score"], abs=16 * EPS * largest * len(names))
    assert list(out["query_totals"]) == list(out["key_totals"]) == list(names)
    for side in ("query_totals", "key_totals"):
        assert sum(out[side].values()) == pytest.approx(out["score"], abs=16 * EPS * largest * len(names))
    assert out["key_totals"]["a0.h1"] == pytest.approx(
        sum(t["value"] for t in out["terms"] if t["key_src"] == "a0.h1"), abs=16 * EPS * largest * len(names))


def test_top_limits_the_terms_never_the_totals(capsys: pytest.CaptureFixture[str], gpt2_dir: Any) -> None:
    path = str(gpt2_dir[0])
    every = cli_json(capsys, path, "1.2", "--tokens", IDS, "--query", "9", "--key", "4")
    top = cli_json(capsys, path, "1.2", "--tokens", IDS, "--query", "9", "--key", "4", "--top", "3")
    assert top["terms"] == every["terms"][:3]
    assert top["query_totals"] == every["query_totals"] and top["key_totals"] == every["key_totals"]
    code, table, _ = cli(capsys, "qk-attribution", path, "1.2", "--tokens", IDS, "--query", "9",
                         "--key", "4", "--top", "3")
    assert code == 0
    lines = table.splitlines()
    assert lines[0].startswith("L1.H2 q=9") and "score " in lines[0]
    first = every["terms"][0]
    assert f"{first['query_src']}\t{first['key_src']}\t{first['value']:+.4f}" in lines
    assert f"(+{len(every['terms']) - 3} smaller terms; --top N lists more)" in lines
    # the totals table lists every source
    assert sum(1 for line in lines if line.split("\t")[0] in every["key_totals"]) >= len(every["key_totals"])


def test_a_text_prompt_is_tokenised_as_the_prompt_tab(capsys: pytest.CaptureFixture[str]) -> None:
    model = open_model(ATTN2)
    text = "When Mary and John went to the store, Mary"
    ids = model.tokenizer.encode(text)
    ids = [int(i) for i in getattr(ids, "ids", ids)]
    by_text = cli_json(capsys, ATTN2, "L1.H2", "--prompt", text, "--query", str(len(ids) - 1), "--key", "2")
    by_ids = cli_json(capsys, ATTN2, "L1.H2", "--tokens", ",".join(map(str, ids)),
                      "--query", str(len(ids) - 1), "--key", "2")
    assert by_text == by_ids


def test_the_induction_cell_names_the_previous_token_head(capsys: pytest.CaptureFixture[str]) -> None:
    tokens, query, key = induction_prompt()
    out = cli_json(capsys, ATTN2, "L{}.H{}".format(*INDUCTION_HEAD), "--tokens", ",".join(map(str, tokens)),
                   "--query", str(query), "--key", str(key))
    totals = out["key_totals"]
    assert max(totals, key=lambda c: abs(totals[c])) == "a{}.h{}".format(*PREV_TOKEN_HEAD)


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--query", "12", "--key", "0"], r"query 12 out of range \(the prompt has 12 tokens: 0\.\.11\)"),
    (["--query", "5", "--key", "8"], r"key 8 is after the query \(causal attention\): query 5 sees keys 0\.\.5"),
    (["--query", "5", "--key", "2", "--head-override", "L2.H0"], r"layer 2 out of range"),
])
def test_bad_positions_are_one_line_errors(capsys: pytest.CaptureFixture[str], gpt2_dir: Any,
                                           argv: list[str], fragment: str) -> None:
    import re

    head = "L1.H0"
    if "--head-override" in argv:
        head, argv = argv[-1], argv[:-2]
    code, out, err = cli(capsys, "qk-attribution", str(gpt2_dir[0]), head, "--tokens", IDS, *argv)
    assert code == 1 and out == ""  # a request the model refuses (exit 2: a usage error)
    assert re.search(fragment, err) and err.count("\n") == 1 and "Traceback" not in err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["L1.H2", "--query", "3", "--key", "1"],  # no prompt
                 ["L1.H2", "--prompt", "a b", "--tokens", "1,2", "--query", "1", "--key", "0"],
                 ["head1", "--tokens", "1,2", "--query", "1", "--key", "0"],
                 ["L1.H2", "--tokens", "1,2", "--query", "-1", "--key", "0"]):
        with pytest.raises(SystemExit) as info:
            main(["qk-attribution", ATTN2, *argv])
        assert info.value.code == 2
        capsys.readouterr()


def test_layer_zero_says_it_reads_the_embeddings_only(capsys: pytest.CaptureFixture[str], gpt2_dir: Any) -> None:
    out = cli_json(capsys, str(gpt2_dir[0]), "L0.H1", "--tokens", IDS, "--query", "4", "--key", "4")
    assert list(out["key_totals"]) == ["embed", "pos", "bias"] and len(out["terms"]) == 9
    code, table, _ = cli(capsys, "qk-attribution", str(gpt2_dir[0]), "L0.H1", "--tokens", IDS,
                         "--query", "4", "--key", "4")
    assert code == 0 and "layer 0 reads the embeddings only: embed, pos, bias" in table.splitlines()[1]


def test_out_of_scope_models_are_refused_in_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                     bert_mlm_dir: Any) -> None:
    gemma2 = family_fixtures.build_gemma2(tmp_path / "gemma2")[0]
    capsys.readouterr()  # the fixture's own progress bar
    for path, words in ((gemma2, "soft-capped"), (bert_mlm_dir[0], "post-LN")):
        code, out, err = cli(capsys, "qk-attribution", str(path), "L1.H0", "--tokens", "1,5,9,2",
                             "--query", "3", "--key", "1")
        assert code == 1 and out == "" and err.count("\n") == 1
        assert "QK attribution of" in err and words in err, err
        with pytest.raises(InvalidRequestError, match=words):  # the API: the same refusal
            open_model(path).qk_attribution("L1.H0", tokens=[1, 5, 9, 2], query=3)


def test_raw_equals_processed(capsys: pytest.CaptureFixture[str], gpt2_dir: Any) -> None:
    argv = [str(gpt2_dir[0]), "L1.H3", "--tokens", IDS, "--query", "10", "--key", "7"]
    processed, raw = cli_json(capsys, *argv), cli_json(capsys, *argv, "--raw")
    largest = max(abs(t["value"]) for t in processed["terms"])
    assert raw["score"] == pytest.approx(processed["score"], abs=1e-4 * largest)
    raw_terms = {(t["query_src"], t["key_src"]): t["value"] for t in raw["terms"]}
    for t in processed["terms"]:
        assert raw_terms[(t["query_src"], t["key_src"])] == pytest.approx(t["value"], abs=1e-4 * largest)
    for side in ("query_totals", "key_totals"):
        for c, v in processed[side].items():
            assert raw[side][c] == pytest.approx(v, abs=1e-4 * largest)


def test_the_api_and_the_request(gpt2_dir: Any) -> None:
    model = open_model(gpt2_dir[0])
    found = model.qk_attribution((1, 2), tokens=TOKENS, query=9)
    assert found.keys == tuple(range(10)) and (found.layer, found.head) == (1, 2)
    np.testing.assert_array_equal(found.terms, qk_attribution(model.weights, TOKENS, 1, 2, 9).terms)
    request = QKAttributionRequest.of(model.structure(), 1, 2, TOKENS, 9, 3)
    assert request.head == (1, 2)  # the Engine prioritises it with the head's other views
    assert request.key() == QKAttributionRequest.of(model.structure(), 1, 2, TOKENS, 9, 5).key()  # one row
    with pytest.raises(IndexOutOfRangeError, match=r"key 10 is after the query"):
        model.qk_attribution("L1.H2", tokens=TOKENS, query=9, key=10)
    with pytest.raises(IndexOutOfRangeError, match=r"token 99999 out of range"):
        QKAttributionRequest.of(model.structure(), 1, 2, [1, 99999], 1)
    with pytest.raises(InvalidRequestError, match="one of the two"):
        model.qk_attribution("L1.H2", query=1)


def test_confirm_prints_the_exact_removals_beside_the_totals(capsys: pytest.CaptureFixture[str]) -> None:
    """``--confirm N``: each side's top N sources at the key (never ``bias``) removed exactly;
    with the scale frozen the drop is the total (the engine's removal is checked against
    TransformerLens in tests/engine/forward/test_qk_attribution.py). A plain row's request key
    is the one it had before ``confirm`` existed."""
    out = cli_json(capsys, ATTN2, "L1.H2", "--tokens", IDS, "--query", "9", "--key", "4", "--confirm", "2")
    assert list(out)[-1] == "exact" and list(out["exact"]) == ["query", "key"]
    largest = max(abs(t["value"]) for t in out["terms"])
    for side in ("query", "key"):
        totals = out[f"{side}_totals"]
        top = sorted((c for c in totals if c != "bias"), key=lambda c: -abs(totals[c]))[:2]
        assert sorted(out["exact"][side]) == sorted(top)
        for c, drops in out["exact"][side].items():
            assert list(drops) == ["frozen", "recomputed"]
            assert drops["frozen"] == pytest.approx(totals[c], abs=1e-4 * largest)
    code, text, _ = cli(capsys, "qk-attribution", ATTN2, "L1.H2", "--tokens", IDS, "--query", "9", "--key", "4",
                        "--confirm", "2")
    assert code == 0 and "removed, frozen" in text and "recomputed" in text
    model = load_model(sample_model("attn-only-2l"))
    plain = QKAttributionRequest.of(model.structure(), 1, 2, TOKENS, 9)
    assert plain.key() == json.dumps(["qk_attribution", 1, 2, TOKENS, 9], separators=(",", ":"))
    assert QKAttributionRequest.of(model.structure(), 1, 2, TOKENS, 9, confirm=3).key() != plain.key()
    with pytest.raises(InvalidRequestError, match="--confirm must be"):
        QKAttributionRequest.of(model.structure(), 1, 2, TOKENS, 9, confirm=-1)
