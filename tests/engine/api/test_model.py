"""The notebook API: README's example runs, and Model's conveniences equal the engine functions."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from headscope.engine import open_model
from headscope.engine.circuits import composition, spectral
from headscope.engine.circuits import head_circuits as circuits
from headscope.engine.core.errors import IndexOutOfRangeError, InvalidRequestError
from headscope.engine.sweeps import scores as score_sweeps

README = Path(__file__).resolve().parents[3] / "README.md"


def test_readme_python_example_runs(monkeypatch, capsys) -> None:
    block = re.search(r"## Python API\n\n```python\n(.*?)```", README.read_text(), re.S)
    assert block, "README has a Python API example"
    monkeypatch.chdir(README.parent)
    exec(compile(block.group(1), "README.md", "exec"), {})
    assert capsys.readouterr().out.strip()


def test_model_conveniences_equal_engine_functions(gpt2_dir) -> None:
    path, _ = gpt2_dir
    model = open_model(path)
    w = model.weights
    fm = model.circuit(1, 2, "full_ov")
    np.testing.assert_array_equal(fm.block([1, 2], [3]), circuits.full_ov(w, 1, 2).block([1, 2], [3]))
    heads = model.heads()
    copying = spectral.spectral_scores(w)["copying_score"]
    # one code path: the same numbers, bit for bit
    assert [h["copying_score"] for h in heads] == copying.flatten().tolist()
    comp = model.composition("k")
    np.testing.assert_array_equal(comp.scores, composition.composition_scores(w, "k").scores)
    # the `composition` command's sweep: its numbers exactly
    assert np.array_equal(comp.scores, score_sweeps.composition(model, "k").scores)
    assert comp.baseline == score_sweeps.composition(model, "k").baseline
    result = model.run([1, 2, 3])
    assert result.logits.shape == (1, 3, model.cfg.d_vocab)


def test_model_conveniences_check_their_arguments(gpt2_dir) -> None:
    model = open_model(gpt2_dir[0])
    with pytest.raises(InvalidRequestError, match="unknown circuit"):
        model.circuit(0, 0, "xy")
    with pytest.raises(IndexOutOfRangeError):
        model.circuit(0, 99, "ov")
    with pytest.raises(InvalidRequestError, match="q, k or v"):
        model.composition("z")
