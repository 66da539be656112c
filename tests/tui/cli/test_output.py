"""What every command prints (tui/cli/output.py): any --rows spec gives a result or one line; tokens in TSV keep the columns; JSON keeps the real token strings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e import test_cli_hostile_args
from tests.e2e.test_cli_hostile_args import HOSTILE_IDS, HOSTILE_TOKENS, MODEL, run

hostile_vocab = test_cli_hostile_args.hostile_vocab  # test_cli_hostile_args's pytest fixture


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=st.text(alphabet=st.sampled_from("0123456789:,-²³٣ ab[]/\x1b"), max_size=12))
def test_any_rows_spec_is_a_result_or_a_one_line_error(
    capsys: pytest.CaptureFixture[str], spec: str
) -> None:
    code, out, err = run(capsys, "circuit", MODEL, "1", "2", "--kind", "ov", "--rows", spec,
                         "--cols", "0:3", "--json")
    assert "Traceback" not in err
    if code == 0:
        report = json.loads(out)
        assert report["rows"] and len(report["values"]) == len(report["rows"])
    else:
        assert code in (1, 2) and err.strip(), err
        if code == 1:
            assert len(err.strip().splitlines()) == 1


def test_tokens_in_tsv_keep_the_columns(
    hostile_vocab: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "forward", str(hostile_vocab), "--tokens", HOSTILE_IDS)
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 1 + len(HOSTILE_TOKENS)
    assert {line.count("\t") for line in lines} == {3}
    assert "a⇥b" in out and "line⏎break" in out and "\x1b" not in out


def test_json_keeps_the_real_token_strings(
    hostile_vocab: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "forward", str(hostile_vocab), "--tokens", HOSTILE_IDS, "--json")
    assert code == 0
    assert json.loads(out)["token_strings"] == HOSTILE_TOKENS
