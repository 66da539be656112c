"""`headscope timeline`: the JSON's shape, the table, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headscope.engine.core.errors import (
    ShapeMismatchError,
)
from headscope.engine.core.validation import SCORE_NAMES as HEAD_SCORE_KEYS
from headscope.engine.sweeps import timeline as tl
from headscope.sample_models import corpus
from headscope.sample_models.model import ModelShape
from tests.engine.sweeps import test_timeline
from tests.engine.sweeps.test_timeline import _write_step, run_cli

tiny_series = test_timeline.tiny_series  # test_timeline's pytest fixture


def test_the_json_has_the_documented_shape(tiny_series: Path, capsys) -> None:
    code, out, err = run_cli(capsys, "timeline", str(tiny_series), "--json")
    assert code == 0, err
    data = json.loads(out)
    assert {"steps", "paths", "heads", "phase_changes"} <= set(data)
    assert data["steps"] == [0, 100, 200]
    assert data["paths"] == [str(tiny_series / f"checkpoint-{s}") for s in (0, 100, 200)]
    assert [(h["layer"], h["head"]) for h in data["heads"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    keys = [*HEAD_SCORE_KEYS, "q_composition_max", "k_composition_max", "v_composition_max"]
    for h in data["heads"]:
        assert list(h) == ["layer", "head", *keys]
        assert all(len(h[k]) == 3 for k in keys)
    for c in data["phase_changes"]:
        assert {"layer", "head", "score", "step", "before", "after"} <= set(c)
        assert c["score"] in keys and c["step"] in data["steps"]
    # The same names as `headscope heads --json`.
    code, out, _ = run_cli(capsys, "heads", data["paths"][0], "--json")
    assert set(HEAD_SCORE_KEYS) <= set(json.loads(out)[0])


def test_cli_errors_are_one_line(tmp_path: Path, tiny_series: Path, capsys) -> None:
    code, out, err = run_cli(capsys, "timeline", str(tmp_path / "nope"))
    assert code == 1 and out == "" and err.count("\n") == 1 and "no such file" in err
    code, _, err = run_cli(capsys, "timeline", str(tiny_series / "checkpoint-0"))
    assert code == 1 and err.count("\n") == 1 and "not a series" in err
    with pytest.raises(SystemExit) as usage:  # a usage error (exit 2), as in every command
        run_cli(capsys, "timeline", str(tiny_series / "checkpoint-0"),
                str(tiny_series / "checkpoint-100"), "--workers", "0")
    assert usage.value.code == 2 and "--workers" in capsys.readouterr().err
    _write_step(tiny_series / "checkpoint-300", seed=3,
                shape=ModelShape(n_layers=2, n_heads=4, d_model=16, d_head=4,
                                 d_vocab=len(corpus.VOCAB), n_ctx=16, layer_norm=True))
    with pytest.raises(ShapeMismatchError, match="2 layers × 4 heads"):
        tl.compute_timeline([tiny_series])
    code, _, err = run_cli(capsys, "timeline", str(tiny_series))
    assert code == 1 and err.count("\n") == 1 and "checkpoint-300" in err and "not one series" in err


def test_the_text_table_has_a_row_per_head(tiny_series: Path, capsys) -> None:
    code, out, err = run_cli(capsys, "timeline", str(tiny_series))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split("\t")[:3] == ["head", "copying", "qk_positivity"]
    assert [line.split("\t")[0] for line in lines[1:5]] == ["L0.H0", "L0.H1", "L1.H0", "L1.H1"]
    assert any(line.startswith("phase changes (") for line in lines)
