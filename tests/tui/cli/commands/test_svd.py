"""`headscope svd`: the JSON of a head's singular directions as tokens."""

from __future__ import annotations

from tests.conftest import INDUCTION_HEAD, PREV_TOKEN_HEAD
from tests.engine.circuits.test_directions import MODEL_PATH, cli_json


def test_svd_json_schema_and_the_copying_head_reads_what_it_writes(capsys) -> None:
    got = cli_json(["svd", str(MODEL_PATH), *map(str, INDUCTION_HEAD), "--kind", "ov", "--k", "5",
                    "--top", "10"], capsys)
    assert {"layer", "head", "kind", "singular_values", "directions"} <= set(got)
    assert (got["layer"], got["head"], got["kind"]) == (*INDUCTION_HEAD, "ov")
    assert len(got["singular_values"]) == len(got["directions"]) == 5
    first = got["directions"][0]
    assert {"direction", "sigma", "in_tokens", "out_tokens"} <= set(first)
    assert [d["direction"] for d in got["directions"]] == [1, 2, 3, 4, 5]  # as the panel: 1/5
    assert set(first["in_tokens"][0]) == {"id", "token", "value"} and len(first["in_tokens"]) == 10
    magnitudes = [abs(t["value"]) for t in first["in_tokens"]]
    assert magnitudes == sorted(magnitudes, reverse=True)
    prev = cli_json(["svd", str(MODEL_PATH), *map(str, PREV_TOKEN_HEAD), "--kind", "ov"], capsys)
    assert got["overlap"] > 0.4  # the induction head copies: it writes the tokens it reads
    assert prev["overlap"] < 0.1  # the previous-token head's OV does not
